"""Where an eager GPT-2 training iteration's GPU time goes on an H200, measured kernel by kernel, beside meshplan's
per-op estimate of the same iteration: which op families meshplan prices long or short on one GPU.

The measurement: data/measured/gpu/2026-11-26-nvidia-h200-unaligned-gemm.json, ``profile`` (benchmarks/
unaligned_gemm_gpu.py): one iteration of GPT-2 (124M; 12 x 1024 tokens; bf16 weights; fused AdamW) in eager PyTorch
2.11 with the padded vocabulary (50,304), its CUDA kernels summed by family (the kernel names say which: cuBLAS's
nvjet GEMMs, cuDNN's SDPA, ATen's softmax, layer-norm, GELU, copy and reduction kernels). The estimate: ``--framework
pytorch-fsdp`` without FSDP on one H200, its op records summed by the same families (by name).

Run: python benchmarks/gpt2_breakdown_gpu.py
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

DATA = Path(__file__).resolve().parents[1] / "data" / "measured" / "gpu" / "2026-11-26-nvidia-h200-unaligned-gemm.json"
# a kernel's family by the first of these its name holds (the measurement) ...
KERNELS = (("gemm", ("nvjet", "gemm", "splitKreduce")), ("attention", ("sdpa", "cudnn", "flash")),
           ("loss", ("SoftMax", "nll_loss", "log_softmax")), ("norm", ("layer_norm", "GammaBeta")),
           ("optimizer", ("FusedOpti", "multi_tensor")), ("activation", ("Gelu", "gelu")),
           ("copy", ("copy", "Cat")))
# ... and an op record's by its kind and name (the estimate)
OPS = (("attention", ("attn/core",)), ("loss", ("head/loss",)), ("norm", ("norm",)), ("optimizer", ("optimizer",)),
       ("activation", ("act",)))


def _family(name: str, table: tuple) -> str:
    return next((family for family, keys in table for key in keys if key in name), "other")


def measured() -> dict[str, float]:
    """Seconds per family of the eager iteration's kernels at vocabulary 50,304."""
    profile = next(p for p in json.loads(DATA.read_text())["profile"] if p["vocab"] == 50304 and not p["compiled"])
    out: dict[str, float] = {}
    for kernel in profile["kernels"]:
        family = _family(kernel["kernel"], KERNELS)
        out[family] = out.get(family, 0.0) + kernel["seconds"]
    return out


def predicted() -> dict[str, float]:
    """Seconds per family of meshplan's estimate of the same iteration."""
    model = replace(load_model("gpt2"), vocab_size=50304, dropout=False)
    plan = Plan(micro_batch=12, global_batch=12, zero=0, recompute="none", precision="bf16", optimizer="adamw")
    est = estimate(model, load_system("h200").cluster(1), plan, load_stack("pytorch-fsdp").with_(fsdp="none"))
    out: dict[str, float] = {}
    for op in est.ops:
        family = "gemm" if op.kind == "gemm" else _family(op.name, OPS)
        out[family] = out.get(family, 0.0) + op.seconds * op.count
    return out


def table() -> list[str]:
    """The families side by side, largest measured first, as Markdown rows."""
    got, want = measured(), predicted()
    lines = ["| family | measured kernels (ms) | meshplan (ms) | meshplan / measured |", "|---|---:|---:|---:|"]
    for family in sorted(set(got) | set(want), key=lambda f: -got.get(f, 0.0)):
        m, p = got.get(family, 0.0) * 1e3, want.get(family, 0.0) * 1e3
        lines.append(f"| {family} | {m:.2f} | {p:.2f} | {p / m:.2f} |" if m else f"| {family} | - | {p:.2f} | - |")
    total_m, total_p = sum(got.values()) * 1e3, sum(want.values()) * 1e3
    return lines + [f"| all | {total_m:.2f} | {total_p:.2f} | {total_p / total_m:.2f} |"]


def main() -> None:
    print("\n".join(table()))


if __name__ == "__main__":
    main()
