"""Derive ``Efficiency.unaligned_gemm``, the rate of a GEMM whose leading dimensions are not 16-byte multiples
against an aligned one, from a published measurement of the same model run both ways; print it and its inputs.

The measurement: nanoGPT commit be610d8b (karpathy/nanoGPT, 2023-02-04, cherry-picked from Karpathy's f529c551),
whose message reads that padding the vocabulary 50257 -> 50304, "the nearest multiple of 64", made training "about
25% faster", because "the last layer is a major latency bottleneck consuming about 40% of latency". The run is the
repository's GPT-2 (124M) recipe at that commit (config/train_gpt2.py): 12 layers of 768, 1024 tokens, micro-batch
12, 5 micro-batches per step on each of 8 A100 40GB (one DGX node, DDP), bf16 autocast, the whole model under
torch.compile, PyTorch's flash SDPA (dropout 0), no biases. Only the output layer's shape changes between the two
runs: its three GEMMs (forward, input and weight gradients) have the vocabulary as a leading dimension, 50257
elements of 2 bytes is not a multiple of 16 bytes, 50304 is.

"25 % faster" is read as 1.25x the throughput: the unaligned step takes 1.25 T, T the aligned step. The extra
0.25 T is the head GEMMs' H seconds run at a fraction r of the aligned rate: H/r - H = 0.25 T, so
r = H / (H + 0.25 T), with H and T meshplan's own estimate of the aligned run (no alignment factor enters it).
The commit's second figure checks it: the head's GEMMs and loss then take (H/r + loss) / 1.25 T of the unaligned
step, against the "about 40 %" it states.

The loss is priced as PyTorch's cross-entropy (``cross_entropy = "pytorch"``): Inductor compiles it with the
model and may fuse part of it, which would shorten T and raise r by a few per cent.

Run: python benchmarks/unaligned_gemm.py
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

SPEEDUP = 1.25  # "about 25% faster" (nanoGPT be610d8b): throughput, unaligned vocabulary -> aligned
PADDED_VOCAB = 50304


def nanogpt_step() -> tuple[float, float, float]:
    """meshplan's estimate of nanoGPT's GPT-2 (124M) step at be610d8b with the padded vocabulary: (step seconds,
    the output layer's GEMM seconds, its loss seconds), per step of 5 micro-batches."""
    model = replace(load_model("gpt2"), vocab_size=PADDED_VOCAB, linear_bias=False, qkv_bias=False, dropout=False)
    stack = load_stack("pytorch-fsdp").with_(name="nanogpt", fsdp="none", compiled=True)
    plan = Plan(dp=8, micro_batch=12, global_batch=12 * 5 * 8, zero=0, precision="bf16", optimizer="adamw")
    est = estimate(model, load_system("a100-40gb").cluster(8), plan, stack, DEFAULT)
    head = sum(op.seconds * op.count for op in est.ops if op.name == "head/logits")
    loss = sum(op.seconds * op.count for op in est.ops if op.name.startswith("head/loss"))
    return est.step_time, head, loss


def derive() -> tuple[float, float, float, float, float]:
    """(r, step, head GEMMs, loss, the head's share of the unaligned step)."""
    step, head, loss = nanogpt_step()
    rate = head / (head + (SPEEDUP - 1) * step)
    share = (head / rate + loss) / (SPEEDUP * step)
    return rate, step, head, loss, share


def main() -> None:
    rate, step, head, loss, share = derive()
    print(f"nanoGPT GPT-2 (124M), 8 x A100 40GB, vocabulary {PADDED_VOCAB}: step {1e3 * step:.1f} ms, "
          f"output-layer GEMMs {1e3 * head:.1f} ms, loss {1e3 * loss:.1f} ms")
    print(f"unaligned_gemm = {rate:.3f} (1.25x the throughput when aligned); the output layer then takes "
          f"{100 * share:.0f} % of the unaligned step (the commit: 'about 40%')")


if __name__ == "__main__":
    main()
