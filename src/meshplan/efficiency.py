"""Efficiency: the fraction of a datasheet peak that real kernels and collectives sustain.

This is the one place where such factors live, so that accuracy work and calibration can replace them.
Each value is a physical quantity with its provenance; none is tuned per run.

Defaults (before calibration):
- ``gemm``: large bf16 GEMMs reach ~70–80 % of dense peak on A100/H100 (NVIDIA's cuBLAS/Transformer Engine
  benchmarks; Megatron-LM reaches 52 % *end to end* on A100 per Narayanan et al. 2021 Table 1).
- ``attention``: FlashAttention-2 forward reaches 50–73 % of A100 peak, backward ~45–60 %
  (Dao 2023, "FlashAttention-2", Fig. 4–5); FlashAttention-3 ~75 % on H100 (Shah et al. 2024).
- ``memory``: streaming kernels sustain ~80–90 % of HBM peak (STREAM-like copy on A100/H100).
- ``nvlink`` / ``network``: NCCL all-reduce bus bandwidth vs link peak: ~80 % on NVLink/NVSwitch and
  ~90 % on InfiniBand NDR at large messages (nccl-tests bus bandwidth reports).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.xp import Num, maximum, minimum


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    gemm: float = 0.75
    attention: float = 0.55
    memory: float = 0.8
    nvlink: float = 0.8
    network: float = 0.9
    # GEMMs with few rows (small M) cannot fill the SMs: efficiency falls as M shrinks below this many rows.
    gemm_full_rows: float = 1024.0
    # Fraction of an overlapped collective's time that still shows (SM and HBM contention while overlapping).
    overlap_slowdown: float = 0.0

    def gemm_efficiency(self, m: Num, n: Num, k: Num) -> Num:
        """Efficiency of an (m×k)·(k×n) GEMM: the large-GEMM figure, reduced for skinny shapes.

        Simplification: a linear ramp in the smallest dimension up to ``gemm_full_rows`` (tile/wave
        quantisation is averaged out); the calibration module fits this curve per accelerator.
        """
        smallest = minimum(minimum(m, n), k)
        ramp = minimum(1.0, maximum(smallest / self.gemm_full_rows, 0.05))
        return self.gemm * (0.5 + 0.5 * ramp)

    def link(self, tier_name: str) -> float:
        return self.nvlink if tier_name == "nvlink" else self.network

    def with_(self, **changes: float) -> Efficiency:
        return replace(self, **changes)


DEFAULT = Efficiency()
