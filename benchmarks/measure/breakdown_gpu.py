"""Where an eager training iteration's GPU time goes on an H200, measured kernel by kernel, beside meshplan's per-op
estimate of the same iteration: which op families meshplan prices long or short on one GPU.

The measurements (profiled iterations in eager PyTorch 2.11, bf16 weights, fused AdamW, random tokens):
- GPT-2 (124M; 12 x 1024 tokens; vocabulary 50,304): ``profile`` of data/measured/gpu/2026-11-26-nvidia-h200-
  unaligned-gemm.json (benchmarks/measure/unaligned_gemm_gpu.py), priced under ``--framework pytorch-fsdp`` without
  FSDP;
- two Hugging Face Llama shapes (transformers' LlamaForCausalLM, SDPA attention, GQA, untied head):
  data/measured/gpu/2026-11-26-nvidia-h200-llama-profile.json (benchmarks/measure/llama_profile_gpu.py), priced the same
  way on the llama2-7b preset at their shapes (the last, four layers of Llama-2-7B at 16,384 tokens, in a second call
  whose GPU drew 625 W at 1,691 MHz on average while busy: the 700 W limit throttled it from 1,980 MHz).
Kernels fall into four families by name: GEMMs (cuBLAS's nvjet and CUTLASS kernels), attention (cuDNN's SDPA),
the optimizer (the fused AdamW's multi-tensor kernels) and everything else (norms, activations, rotary embeddings,
copies, the loss: memory-bound kernels); meshplan's op records by their kind and name the same way.

Run: python benchmarks/measure/breakdown_gpu.py
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from meshplan.estimate import Estimate, estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

GPU = Path(__file__).resolve().parents[2] / "data" / "measured" / "gpu"
GPT2 = GPU / "2026-11-26-nvidia-h200-unaligned-gemm.json"
LLAMA = GPU / "2026-11-26-nvidia-h200-llama-profile.json"
FAMILIES = ("gemm", "attention", "optimizer", "other")
KERNELS = (("gemm", ("nvjet", "gemm", "splitKreduce")), ("attention", ("sdpa", "cudnn", "flash")),
           ("optimizer", ("FusedOpti", "multi_tensor")))


def kernel_family(name: str) -> str:
    return next((family for family, keys in KERNELS for key in keys if key in name), "other")


def op_family(kind: str, name: str) -> str:
    if kind in ("gemm", "attention"):
        return kind
    return "optimizer" if name.startswith("optimizer") else "other"


def measured(kernels: list[dict]) -> dict[str, float]:
    out = dict.fromkeys(FAMILIES, 0.0)
    for kernel in kernels:
        out[kernel_family(kernel["kernel"])] += kernel["seconds"]
    return out


def predicted(est: Estimate) -> dict[str, float]:
    out = dict.fromkeys(FAMILIES, 0.0)
    for op in est.ops:
        out[op_family(op.kind, op.name)] += op.seconds * op.count
    return out


def _plan(batch: int) -> Plan:
    return Plan(micro_batch=batch, global_batch=batch, zero=0, recompute="none", precision="bf16", optimizer="adamw")


def runs(attention_kernel: str = "") -> list[tuple[str, dict[str, float], Estimate, float]]:
    """(name, measured seconds per family, meshplan's estimate, measured wall seconds) per profiled iteration, priced
    with the preset's attention family (cuDNN's, which PyTorch 2.11 ran) or another (``fa2``: releases before)."""
    stack = load_stack("pytorch-fsdp").with_(fsdp="none")
    stack = stack.with_(attention_kernel=attention_kernel) if attention_kernel else stack
    cluster = load_system("h200").cluster(1)
    gpt2 = next(p for p in json.loads(GPT2.read_text())["profile"] if p["vocab"] == 50304 and not p["compiled"])
    wall = [r["wall_s"] for c in json.loads(GPT2.read_text())["calls"] for r in c["eager"] if r["vocab"] == 50304]
    model = replace(load_model("gpt2"), vocab_size=50304, dropout=False)
    out = [("GPT-2 124M, 12 x 1024", measured(gpt2["kernels"]), estimate(model, cluster, _plan(12), stack),
            sorted(wall)[len(wall) // 2])]
    for row in json.loads(LLAMA.read_text())["rows"]:
        model = replace(load_model("llama2-7b"), num_layers=row["layers"], hidden_size=row["hidden"],
                        num_heads=row["heads"], num_kv_heads=row["kv_heads"], head_dim=row["hidden"] // row["heads"],
                        ffn_hidden_size=row["ffn"], vocab_size=row["vocab"], seq_length=row["seq"],
                        max_position_embeddings=row["seq"])
        name = f"HF Llama h{row['hidden']} x {row['layers']}, {row['batch']} x {row['seq']}"
        out.append((name, measured(row["kernels"]), estimate(model, cluster, _plan(row["batch"]), stack),
                    row["wall_s"]))
    return out


def table() -> list[str]:
    """Per iteration: each family's measured kernel time against meshplan's, then the wall clock against the step."""
    lines = ["| iteration | " + " | ".join(FAMILIES) + " | kernels in all | wall clock | meshplan with "
             "FlashAttention-2 (PyTorch before 2.11) |", "|---|" + "---:|" * (len(FAMILIES) + 3)]
    for (name, got, est, wall), (_, _, fa2, _) in zip(runs(), runs("fa2"), strict=True):
        want = predicted(est)
        cells = [f"{got[f] * 1e3:.1f} / {want[f] * 1e3:.1f} ms" for f in FAMILIES]
        total = f"{sum(got.values()) * 1e3:.1f} / {sum(want.values()) * 1e3:.1f} ms"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {total} | {wall * 1e3:.1f} / "
                     f"{est.step_time * 1e3:.1f} ms ({est.step_time / wall - 1:+.1%}) | "
                     f"{fa2.step_time * 1e3:.1f} ms ({fa2.step_time / wall - 1:+.1%}) |")
    return lines


def main() -> None:
    print("measured / meshplan")
    print("\n".join(table()))


if __name__ == "__main__":
    main()
