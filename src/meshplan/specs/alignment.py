"""GEMM alignment: the rate of a GEMM whose leading dimensions are not multiples of 16 bytes.

The tensor-core kernels cuBLAS picks first load operands in 16-byte vectors, so every leading dimension must be a
multiple of 16 bytes (8 fp16 / bf16 elements; NVIDIA "Matrix Multiplication Background User's Guide", §"Tensor Core
Requirements"); otherwise narrower-load kernels run the GEMM at ``unaligned_gemm`` of the aligned rate. Row-major
activations make the weight's two dims the leading ones in all three passes (``OpCost.align``; a traced GEMM reads its
tensors' strides, a traced convolution its channels). An unaligned FP8 GEMM runs in 16 bits (Transformer Engine asserts
fp8 dims divisible by 16; torchtitan's quantization/utils.py keeps such linears in bf16). Derived, not fitted: padding
GPT-2's vocabulary 50257 -> 50304 made nanoGPT "about 25% faster" (karpathy/nanoGPT 77e7e04c, bench.py, A100,
torch.compile), and only the output layer's GEMMs changed, so their rate r solves H/r - H = 0.25 T on meshplan's aligned
step T and head GEMMs H: 0.385 (benchmarks/measure/unaligned_gemm.py; an A100's, applied on every GPU without
asynchronous MMA). Measured on an H200 (benchmarks/measure/unaligned_gemm_gpu.py,
data/measured/gpu/2026-11-26-nvidia-h200-unaligned-gemm.json: the three passes of 5 shapes, vocabularies 50,257 and
32,001 and a width of 2,047, twice): cuBLAS runs an odd leading dimension with Turing-era align1 kernels (sm75 mma.sync)
at ``unaligned_gemm_async`` = 0.170 of the aligned rate (median of the passes' time-weighted ratios, 0.160-0.184), and a
leading dimension of 4 or 8 bytes (50,258, 50,260) at 0.326, so ``unaligned_wide_gain`` = 1.92 × the 2-byte rate,
applied on every GPU (at most the aligned rate). The A100's nanoGPT figure is an odd dimension's. Megatron pads the
vocabulary: ``Stack.vocab_multiple``.

The constants are ``Efficiency`` fields (specs/efficiency.py); ``OpCost.align`` (cost/records.py) is the elements that
divide every leading dimension of a GEMM's operands.
"""

from __future__ import annotations

from meshplan.specs.architectures import async_mma
from meshplan.specs.efficiency import Efficiency
from meshplan.xp import Num, where

# a GEMM runs at the aligned rate when its leading dimensions are multiples of 16 bytes
ALIGNED_BYTES = 16.0
WIDE_BYTES = 4.0  # from 4 bytes, narrower vector loads than 16 bytes' but wider than one element's


def unaligned_factor(lead_bytes: Num, acc: object, eff: Efficiency) -> Num:
    """Rate of a GEMM whose leading dimensions are multiples of ``lead_bytes`` bytes, relative to an aligned one: 1
    from 16 bytes; an odd 16-bit dimension's unaligned rate (its own on GPUs with asynchronous MMA);
    ``unaligned_wide_gain`` times that, at most 1, from 4 bytes."""
    if type(lead_bytes) in (int, float) and lead_bytes >= ALIGNED_BYTES:  # the common case, off the search's hot path
        return 1.0
    low = eff.unaligned_gemm_async if async_mma(acc) else eff.unaligned_gemm
    wide = min(1.0, low * eff.unaligned_wide_gain)
    return where(lead_bytes >= ALIGNED_BYTES, 1.0, where(lead_bytes >= WIDE_BYTES, wide, low))
