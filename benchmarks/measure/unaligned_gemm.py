"""Derive ``Efficiency.unaligned_gemm``, the rate of a GEMM whose leading dimensions are not 16-byte multiples
against an aligned one, from a published measurement of the same model run both ways; print it and its inputs.

The measurement: nanoGPT commit 77e7e04c (karpathy/nanoGPT, Andrej Karpathy, 2023-02-04), whose message reads that
padding the vocabulary 50257 -> 50304, "the nearest multiple of 64", made training "about 25% faster", because "the
last layer is a major latency bottleneck consuming about 40% of latency". The commit changes bench.py with the model,
so the run is bench.py's at that commit: GPT-2 (124M, 12 layers of 768, no biases, dropout 0: PyTorch's flash SDPA),
1024 tokens, batch 12, one forward, backward and AdamW step an iteration, on one GPU of Karpathy's 8 x A100 40GB node,
bf16 autocast, the whole model, loss included, under torch.compile. Only the output layer's shape changes between the
two runs: its three GEMMs (forward, input and weight gradients) have the vocabulary as a leading dimension, and 50257
elements of 2 bytes is not a multiple of 16 bytes, 50304 is.

"25 % faster" is read as 1.25x the throughput: the unaligned step takes 1.25 T, T the aligned step. The extra
0.25 T is charged to the head GEMMs' H seconds run at a fraction r of the aligned rate: H/r - H = 0.25 T, so
r = H / (H + 0.25 T), with H and T meshplan's own estimate of the aligned run (no alignment factor enters it).
Read as a 25 % shorter step instead, r would be lower (about 0.3); the cross-entropy kernels over the odd-width rows
lose their vector loads too, which this charges to the GEMMs (r a little low on that account). The commit's second
figure checks the result: the output layer's GEMMs and loss then take (H/r + loss) / 1.25 T of the unaligned step,
against the "about 40 %" it states.

The compiled loss is priced as a fused cross-entropy (``cross_entropy = "fused"``: one read of the logits, the fp32
softmax kept for the backward pass), the kernel Inductor generates for it, not as eager PyTorch's.

On a GPU with asynchronous MMA the constant is measured instead (``Efficiency.unaligned_gemm_async``): an H200 ran
the three passes of each unaligned GEMM beside its aligned twin (benchmarks/measure/unaligned_gemm_gpu.py, twice, on
fresh machines; data/measured/gpu/2026-11-26-nvidia-h200-unaligned-gemm.json). ``h200`` reads them: per shape, the
aligned twin's time per FLOP over the unaligned one's, summed over the three passes; the median over shapes and calls of
the odd (2-byte) dimensions is ``unaligned_gemm_async``, that of the 4- and 8-byte ones over it ``unaligned_wide_gain``.

Run: python benchmarks/measure/unaligned_gemm.py
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

SPEEDUP = 1.25  # "about 25% faster" (nanoGPT 77e7e04c): throughput, unaligned vocabulary -> aligned
PADDED_VOCAB = 50304
H200 = Path(__file__).resolve().parents[2] / "data" / "measured" / "gpu" / "2026-11-26-nvidia-h200-unaligned-gemm.json"
# (unaligned, aligned twin) shapes (M, K, N) of unaligned_gemm_gpu.py: odd N or K (2-byte leading dims), then N of 4 and
# 8 bytes (50,258 = 2 x 25,129; 50,260 = 4 x 12,565)
ODD = [((12288, k, 50257), (12288, k, 50304)) for k in (768, 1024, 1600)] + [
    ((8192, 4096, 32001), (8192, 4096, 32000)), ((8192, 2047, 8192), (8192, 2048, 8192))]
WIDE = [((12288, 768, n), (12288, 768, 50304)) for n in (50258, 50260)]


def nanogpt_step() -> tuple[float, float, float]:
    """meshplan's estimate of nanoGPT's bench.py iteration at 77e7e04c with the padded vocabulary: (step seconds,
    the output layer's GEMM seconds, its loss seconds)."""
    model = replace(load_model("gpt2"), vocab_size=PADDED_VOCAB, linear_bias=False, qkv_bias=False, dropout=False)
    stack = load_stack("pytorch-fsdp").with_(name="nanogpt", fsdp="none", compiled=True, cross_entropy="fused")
    plan = Plan(dp=1, micro_batch=12, global_batch=12, zero=0, precision="bf16", optimizer="adamw")
    est = estimate(model, load_system("a100-40gb").cluster(1), plan, stack, DEFAULT)
    head = sum(op.seconds * op.count for op in est.ops if op.name == "head/logits")
    loss = sum(op.seconds * op.count for op in est.ops if op.name.startswith("head/loss"))
    return est.step_time, head, loss


def derive() -> tuple[float, float, float, float, float]:
    """(r, step, head GEMMs, loss, the head's share of the unaligned step)."""
    step, head, loss = nanogpt_step()
    rate = head / (head + (SPEEDUP - 1) * step)
    share = (head / rate + loss) / (SPEEDUP * step)
    return rate, step, head, loss, share


def _ratio(call: dict, unaligned: tuple, aligned: tuple) -> float | None:
    """The aligned twin's seconds per FLOP over the unaligned GEMM's, the three passes summed (None: not measured)."""
    times: dict[tuple, float] = {}
    for row in call["gemms"]:
        key = (row["m"], row["k"], row["n"])
        times[key] = times.get(key, 0.0) + row["seconds"]
    if unaligned not in times:
        return None
    return (times[aligned] / (aligned[0] * aligned[1] * aligned[2])) / (
        times[unaligned] / (unaligned[0] * unaligned[1] * unaligned[2]))


def h200(path: Path = H200) -> tuple[list[float], list[float]]:
    """The measured rate ratios of the odd (2-byte) and of the 4- and 8-byte leading dimensions, every call's."""
    calls = json.loads(path.read_text())["calls"]
    pick = [[r for call in calls for u, a in shapes if (r := _ratio(call, u, a)) is not None] for shapes in (ODD, WIDE)]
    return pick[0], pick[1]


def main() -> None:
    rate, step, head, loss, share = derive()
    print(f"nanoGPT bench.py, GPT-2 (124M), batch 12 x 1024, one A100 40GB, vocabulary {PADDED_VOCAB}: step "
          f"{1e3 * step:.1f} ms, "
          f"output-layer GEMMs {1e3 * head:.1f} ms, loss {1e3 * loss:.1f} ms")
    print(f"unaligned_gemm = {rate:.3f} (1.25x the throughput when aligned); the output layer then takes "
          f"{100 * share:.0f} % of the unaligned step (the commit: 'about 40%')")
    odd, wide = h200()
    print(f"H200 (asynchronous MMA), {len(odd)} odd shapes measured: "
          f"unaligned_gemm_async = {statistics.median(odd):.3f} "
          f"({min(odd):.3f}-{max(odd):.3f}); 4- and 8-byte dims: {statistics.median(wide):.3f}, "
          f"unaligned_wide_gain = {statistics.median(wide) / statistics.median(odd):.2f}")


if __name__ == "__main__":
    main()
