"""The MI300X's per-kernel fixed time (``kernel_overhead``), from vLLM's own decode kernels timed on one MI300X, and
the check of its FP8 GEMMs against the same benchmark.

Source: Hugging Face and AMD, "Creating custom kernels for the AMD MI300" (huggingface/blog mi300kernels.md, July
2025; container rocm/vllm rocm6.3.1_mi300_ubuntu22.04_py3.12_vllm_0.6.6, the hf-rocm-kernels benchmark scripts):

- vLLM's fused residual-add + RMS norm on an [X, 16384] FP16 tensor (the RMS-norm table's "VLLM" column) and its
  SwiGLU (silu_and_mul) on an [X, 16384] FP16 input, gate and up of 8,192 each (the SwiGLU table's "VLLM" row), at
  X = 1 to 2,048 rows. A decode step runs 1 to 128 rows.
- Torch's FP8 GEMM (hipBLASLt) on Llama 3.1 405B's TP 8 projections, M = 1 to 32 rows: QKV (N 2,304, K 16,384),
  gate / up (N 13,312, K 16,384), down (N 16,384, K 6,656); "using CUDA graph and multiple weights to avoid cache
  hits".

The fixed time is measured as h100.toml's is: each kernel's duration less its bytes at the preset's streaming rate
(roofline.stream_bandwidth). Bytes: the fused add + norm reads x and the residual and writes both back in place,
8 B an element; silu_and_mul reads 2 B of each of its 16,384 inputs and writes 2 B of each of its 8,192 outputs.
Over the decode rows (1-128) of both kernels the remainder runs from 2.5 to 5.6 us: the median, 3.9 us, is
``kernel_overhead`` in mi300x.toml (Hopper's, measured the same way, is 2.4 us). At one row it is a single
block's latency (5.5 us for the norm's reduction over 16,384 columns), which a fixed time plus bytes only averages.

The GEMM rows are a check, not a fit: meshplan prices them with ``gemm_overhead`` (Hopper's 3.1 us, no MI300X
figure of its own), the split-K reduction at ``kernel_overhead`` and the weights at the streaming rate.

Run: python benchmarks/measure/mi300x_kernels.py
"""

from __future__ import annotations

import statistics

from meshplan.cost.records import OpCost
from meshplan.roofline import op_time, stream_bandwidth
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system

SOURCE = "huggingface/blog mi300kernels.md (vLLM 0.6.6, ROCm 6.3.1, one MI300X)"
DECODE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
# microseconds at DECODE_ROWS (the tables' 256-2,048 rows are prefill's, where the bytes dominate)
RMS_NORM_US = (5.5145, 5.65645, 5.6893, 5.72275, 5.85667, 6.08502, 6.4629, 7.49166)
SWIGLU_US = (3.84116, 3.86192, 3.92937, 3.94151, 4.01047, 4.02421, 4.08943, 4.20317)
HIDDEN = 16384
RMS_BYTES_PER_ROW = HIDDEN * 4 * 2  # read x and the residual, write both (FP16)
SWIGLU_BYTES_PER_ROW = HIDDEN * 2 + HIDDEN // 2 * 2  # read gate and up, write their product (FP16)
# (M, N, K) -> Torch's FP8 GEMM in microseconds (the skinny-GEMM table's "Torch time")
GEMM_US = {(1, 2304, 16384): 14.938, (8, 2304, 16384): 16.300, (16, 2304, 16384): 16.693, (32, 2304, 16384): 16.817,
           (1, 13312, 16384): 77.636, (8, 13312, 16384): 80.031, (16, 13312, 16384): 75.236,
           (32, 13312, 16384): 82.198, (1, 16384, 6656): 31.066, (8, 16384, 6656): 31.559,
           (16, 16384, 6656): 31.671, (32, 16384, 6656): 35.561}


def fixed_remainders(system: str = "mi300x") -> list[float]:
    """Each decode-sized vLLM kernel's duration less its bytes at the streaming rate, in microseconds."""
    rate = stream_bandwidth(load_system(system).accelerator, DEFAULT)
    return ([t - n * RMS_BYTES_PER_ROW / rate * 1e6 for n, t in zip(DECODE_ROWS, RMS_NORM_US, strict=True)]
            + [t - n * SWIGLU_BYTES_PER_ROW / rate * 1e6 for n, t in zip(DECODE_ROWS, SWIGLU_US, strict=True)])


def kernel_overhead_us(system: str = "mi300x") -> float:
    """The median remainder (module docstring), to 0.1 us as the preset states it."""
    return round(statistics.median(fixed_remainders(system)), 1)


def gemm_seconds(m: int, n: int, k: int, system: str = "mi300x") -> float:
    """meshplan's time for one FP8 GEMM of the benchmark's shape (FP8 operands, FP16 output)."""
    op = OpCost(name="gemm", phase="fwd", kind="gemm", flops=2.0 * m * n * k, nbytes=float(m * k + n * k + 2 * m * n),
                m=m, n=n, k=k)
    return float(op_time(op, load_system(system).accelerator, "fp8", DEFAULT))


def gemm_rows(system: str = "mi300x") -> list[tuple[tuple[int, int, int], float, float]]:
    """((M, N, K), measured us, meshplan us) per row of the GEMM table."""
    return [(shape, us, gemm_seconds(*shape, system=system) * 1e6) for shape, us in GEMM_US.items()]


def main() -> None:
    rest, acc = fixed_remainders(), load_system("mi300x").accelerator
    print(f"MI300X decode kernels, duration less bytes at {stream_bandwidth(acc, DEFAULT) / 1e12:.2f} TB/s ({SOURCE}):")
    print(f"  RMS norm, rows {DECODE_ROWS}: " + ", ".join(f"{r:.2f}" for r in rest[:8]) + " us")
    print("  SwiGLU, same rows: " + ", ".join(f"{r:.2f}" for r in rest[8:]) + " us")
    print(f"  median {statistics.median(rest):.2f} us -> kernel_overhead {kernel_overhead_us()} us "
          f"(preset: {acc.kernel_overhead * 1e6:.1f} us)")
    print("FP8 GEMMs (check): M N K measured meshplan error")
    rows = gemm_rows()
    for (m, n, k), us, pred in rows:
        print(f"  {m:>3} {n:>6} {k:>6} {us:7.1f} us {pred:7.1f} us {pred / us - 1:+6.1%}")
    measured, priced = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"  all rows: {measured:.0f} us measured, {priced:.0f} us meshplan ({priced / measured - 1:+.1%})")


if __name__ == "__main__":
    main()
