"""GPU architectures: the measured best-shape GEMM efficiency of each silicon configuration and what the tensor
cores of each architecture can do.

Symbols: MAMF the "maximum achievable matmul FLOPS" as a fraction of the dense datasheet peak.

``MATMUL`` holds the MAMF figures of the parts it was measured on (S. Bekman, ml-engineering, compute/accelerator
README, "Maximum Achievable Matmul FLOPS comparison table"; efficiency.py's module docstring says how the GEMM model
uses them). The hardware presets carry the MAMF figures (``Accelerator.matmul_bf16`` / ``matmul_fp8`` /
``matmul_watts`` / ``async_mma``, each beside its source). An accelerator defined without them gets its MAMF from a
continuous rule in its architecture and peak (``matmul_rule``: interpolated between the ``MATMUL`` parts of its
architecture), so that a GPU 3 % faster than a measured one is not priced as an unknown part, and its MMA kind from
its architecture (``ARCHITECTURES``, ``async_mma``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Matmul:
    """Measured best-shape GEMM efficiency (MAMF / dense peak) of one silicon configuration: its architecture, its
    dense 16-bit and FP8 peaks, SM count, and the board power it was measured at."""

    architecture: str
    half_peak: float  # dense bf16/fp16 FLOP/s
    fp8_peak: float  # dense fp8 FLOP/s (0: none)
    num_sms: int
    bf16: float
    fp8: float  # also used for fp4 (no published MAMF yet)
    watts: float
    source: str


MAMF_SOURCE = "stas00/ml-engineering compute/accelerator/README.md, Maximum Achievable Matmul FLOPS table"
MATMUL: tuple[Matmul, ...] = (
    Matmul("ampere", 312e12, 0.0, 108, 0.869, 0.869, 400, f"A100 SXM: 271.2 of 312 TFLOP/s BF16 ({MAMF_SOURCE})"),
    Matmul("hopper", 989e12, 1979e12, 132, 0.803, 0.709, 700,
           f"H100 SXM: 794.5 BF16, 1402.6 FP8 of 989 / 1979 ({MAMF_SOURCE})"),
    Matmul("blackwell", 2250e12, 4500e12, 148, 0.776, 0.763, 1000,
           f"B200 SXM: 1745.0 BF16, 3432.5 FP8 of 2250 / 4500 ({MAMF_SOURCE})"),
    Matmul("blackwell", 2500e12, 5000e12, 152, 0.729, 0.723, 1200,
           f"GB200: 1822.0 BF16, 3615.6 FP8 of 2500 / 5000 ({MAMF_SOURCE})"),
)
MAMF_UNKNOWN = 0.80  # an architecture without a measured part: the table's median BF16 efficiency
# Architectures (Accelerator.architecture) and whether their tensor cores take asynchronous warpgroup MMA with TMA
# (CUDA C++ programming guide, compute capabilities: wgmma from sm_90; Volta, Turing, Ampere and Ada have mma.sync
# only; AMD CDNA's MFMA instructions are issued synchronously by each wavefront, AMD CDNA 3 ISA reference)
ARCHITECTURES: dict[str, bool] = {"volta": False, "turing": False, "ampere": False, "ada": False, "hopper": True,
                                  "blackwell": True, "cdna2": False, "cdna3": False, "cdna4": False}


def matmul_rule(architecture: str, peak: float, low: bool) -> float:
    """The best-shape GEMM efficiency of a GPU without a measured one: a continuous rule in its peak, so that nearby
    GPUs get nearby rates. Among the ``MATMUL`` parts of its architecture (every part when the architecture is not
    stated; ``MAMF_UNKNOWN`` for an architecture none was measured on), interpolated linearly in log(peak) between
    the parts around it and held at the nearest part's value beyond them (``low``: the FP8 column against the FP8
    peak, else the 16-bit column against the 16-bit peak). Exact at every measured part. Between two parts the rate
    peak × MAMF still grows with the peak: MAMF falls at most as peak^-0.59 along the table (B200 to GB200), slower
    than the peak rises, which tests/test_architectures.py checks."""
    parts = [e for e in MATMUL if not architecture or e.architecture == architecture]
    points = sorted((e.fp8_peak if low else e.half_peak, e.fp8 if low else e.bf16) for e in parts)
    points = [(p, v) for p, v in points if p > 0]
    if not points or not peak > 0:
        return MAMF_UNKNOWN
    x = math.log(peak)
    xs = [math.log(p) for p, _ in points]
    if x <= xs[0]:
        return points[0][1]
    if x >= xs[-1]:
        return points[-1][1]
    i = next(j for j in range(1, len(xs)) if x <= xs[j])
    t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return math.exp((1 - t) * math.log(points[i - 1][1]) + t * math.log(points[i][1]))


def async_mma(accelerator: object) -> bool:
    """Whether the GPU has asynchronous warpgroup MMA (the preset's ``async_mma``, else its architecture's
    (``ARCHITECTURES``), else True: every GPU since Hopper has it)."""
    given = getattr(accelerator, "async_mma", None)
    if given is not None:
        return bool(given)
    return ARCHITECTURES.get(str(getattr(accelerator, "architecture", "") or ""), True)
