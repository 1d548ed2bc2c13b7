"""The efficiency of inference kernels: the training model's (specs/efficiency.py), with the GEMM kernels that
inference runs on few rows.

A decode GEMM has as many rows as sequences in the batch (1 to a few hundred) against thousands of weight columns.
The 128- and 256-row output tiles of training GEMMs would waste most of their rows on it, and its few tiles would
leave most SMs idle for a whole wave; the kernels inference runs instead take row tiles down to 16 (the tensor cores'
mma.sync m16n8k16 on every NVIDIA GPU since Ampere, as Marlin's W4A16 kernel does, Frantar et al. 2024 §3; Hopper's
small-M kernels swap the operands so that the batch is wgmma's N, a multiple of 8: PTX ISA, "wgmma.mma_async" shapes
m64nNk16) and split the reduction over several CTAs when the output has fewer tiles than the GPU has SMs (split-K,
CUTLASS's stream-K, Osama et al. 2023, "Stream-K: Work-centric Parallel Decomposition for Dense Matrix-Matrix
Multiplication on the GPU", §4). specs/gemm_shape.py prices the tiles, waves and splits of training's GEMMs and
inference's alike; inference's candidates add those small-row tiles (``SERVE_TILES``), and a GEMM of many tiles picks
training's, so a prefill of thousands of rows is priced as a training forward pass is. The smallest covers 64 of the
weight's output features: cuBLAS's small-row kernels on a lent H200 (nvjet_sm90_tst_64x8 … 64x48, the rows as wgmma's
N) ran most decode GEMMs on tiles 64 features wide, so an 8,192 x 1,024 weight is 128 tiles, one wave, not split
(data/measured/gpu/2026-11-27-nvidia-h200-gemm-rows.json, docs/GEMM_GPU.md: 864 decode GEMMs at 1-512 rows, p90
|error| 16.0 → 13.7 %; fp8 22.2 → 13.9 %).

``memory``, the share of the HBM bandwidth a streaming kernel sustains (0.85, specs/efficiency.py), prices the
weights a decode step streams. Two constants of inference kernels are fitted (benchmarks/measure/fit_inference.py, on
the fit half of the published serving runs, data/serving/README.md), as the training model fits its GEMM and attention
efficiencies:
- ``kv_read``: the share of that streaming rate the decode attention kernels reach reading the paged KV cache
  (scattered blocks of 16-64 tokens, GQA groups, fp8 dequantisation: FlashInfer's and TensorRT-LLM's XQA decode
  kernels are measured at 50-80 % of HBM bandwidth, against a GEMV's 80-90 %);
- ``experts``: the rate of the MoE path (the experts' grouped GEMMs, the token permutation and the dispatch and
  combine) against the same work priced as dense GEMMs and uniform collectives: real routers load the experts and
  the expert-parallel ranks unevenly (the busiest rank sets the pace, moe.py takes routing as uniform), and grouped
  GEMMs of fine-grained experts (Qwen3: 128 experts of 1,536) run below the dense GEMMs' rate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import ClassVar

from meshplan.specs.efficiency import Efficiency
from meshplan.specs.gemm_shape import TILES

SERVE_TILES: tuple[tuple[int, int], ...] = ((16, 64), (16, 128), (32, 128), *TILES)  # TILES holds (64, 128)


@dataclass(frozen=True, kw_only=True)
class ServeEfficiency(Efficiency):
    """``Efficiency`` with inference's GEMM kernels and its two fitted constants (module docstring)."""

    TILES: ClassVar[tuple[tuple[int, int], ...]] = SERVE_TILES  # small-row kernels among the candidates
    kv_read: float = 0.9978  # decode attention's share of the streaming rate (fitted)
    experts: float = 0.6477  # the MoE path's rate against dense GEMMs and uniform collectives (fitted)

    @cached_property
    def cache_reads(self) -> ServeEfficiency:
        """The efficiency the decode attention kernels stream the KV cache at: ``memory`` × ``kv_read``."""
        return replace(self, memory=self.memory * self.kv_read)


SERVE_DEFAULT = ServeEfficiency()
