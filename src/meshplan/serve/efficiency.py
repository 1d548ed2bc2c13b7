"""The efficiency of inference kernels: the training model's (specs/efficiency.py), with the GEMM kernels that
inference runs on few rows.

A decode GEMM has as many rows as sequences in the batch (1 to a few hundred) against thousands of weight columns.
The 128- and 256-row output tiles of training GEMMs would waste most of their rows on it, and its few tiles would
leave most SMs idle for a whole wave; the kernels inference runs instead take row tiles down to 16 (the tensor cores'
mma.sync m16n8k16 on every NVIDIA GPU since Ampere, as Marlin's W4A16 kernel does, Frantar et al. 2024 §3; Hopper's
small-M kernels swap the operands so that the batch is wgmma's N, a multiple of 8: PTX ISA, "wgmma.mma_async" shapes
m64nNk16) and split the reduction over several CTAs when the output has fewer tiles than the GPU has SMs (split-K,
CUTLASS's stream-K, Osama et al. 2023, "Stream-K: Work-centric Parallel Decomposition for Dense Matrix-Matrix
Multiplication on the GPU", §4). So for tiles t_m × t_n in ``SERVE_TILES``:
    tiles = g·⌈m/t_m⌉·⌈n/t_n⌉;   split s = ⌊S / tiles⌋ when tiles < S (at most k / 128), else 1
    occupancy = tiles·s / S for a single partial wave, tiles / (⌈tiles/S⌉·S) otherwise
    efficiency = gemm · max_t [ g·m·n / (tiles·t_m·t_n) · occupancy ] · (k/s) / (k/s + k_0)
which is the training model's ``gemm_efficiency`` for a GEMM of many tiles (the same tiles among the candidates, no
split), so a prefill of thousands of rows is priced as a training forward pass is.

``memory``, the share of the HBM bandwidth a streaming kernel sustains (0.85, specs/efficiency.py), prices the
weights a decode step streams. Two constants of inference kernels are fitted (benchmarks/fit_inference.py, on the fit
half of the published serving runs, data/serving/README.md), as the training model fits its GEMM and attention
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

import numpy as np

from meshplan.specs.efficiency import TILES, Efficiency
from meshplan.xp import Num

SERVE_TILES: tuple[tuple[int, int], ...] = ((16, 128), (32, 128), (64, 128), *TILES)
SPLIT_DEPTH = 128.0  # a split-K slice is at least this deep (two 64-deep k-blocks of a CUTLASS mainloop)
# ServeEfficiency._choice's last question and answer (the objects themselves, so that their ids are not reused)
_LAST: list[tuple | None] = [None]


@dataclass(frozen=True, kw_only=True)
class ServeEfficiency(Efficiency):
    """``Efficiency`` with inference's GEMM kernels and its two fitted constants (module docstring)."""

    kv_read: float = 0.9978  # decode attention's share of the streaming rate (fitted)
    experts: float = 0.6477  # the MoE path's rate against dense GEMMs and uniform collectives (fitted)

    @cached_property
    def cache_reads(self) -> ServeEfficiency:
        """The efficiency the decode attention kernels stream the KV cache at: ``memory`` × ``kv_read``."""
        return replace(self, memory=self.memory * self.kv_read)

    def _choice(self, m: Num, n: Num, k: Num, num_sms: int, groups: Num) -> tuple[np.ndarray, ...]:
        """The best tile's (value, slice depth, split) for each GEMM (the module docstring). The last answer is kept:
        roofline.op_time asks for the same op's twice (its rate, then its kernels' fixed time)."""
        last = _LAST[0]
        if (last is not None and last[0] is self and last[1] is m and last[2] is n and last[3] is k
                and last[4] == num_sms and last[5] is groups):
            return last[6]
        out = self._tiles(m, n, k, num_sms, groups)
        _LAST[0] = (self, m, n, k, num_sms, groups, out)
        return out

    def _tiles(self, m: Num, n: Num, k: Num, num_sms: int, groups: Num) -> tuple[np.ndarray, ...]:
        m, n, k, g = (np.maximum(np.asarray(x, dtype=float), 1.0) for x in (m, n, k, groups))  # an empty GEMM: 0 FLOPs
        shape = np.broadcast(m, n, k, g).shape
        best, depth, chosen = np.zeros(shape), np.zeros(shape), np.ones(shape)
        for tm, tn in SERVE_TILES:
            tiles = g * np.ceil(m / tm) * np.ceil(n / tn)
            single = tiles < num_sms
            split = np.where(single, np.maximum(1.0, np.minimum(np.floor(num_sms / np.maximum(tiles, 1.0)),
                                                                np.floor(k / SPLIT_DEPTH))), 1.0)
            occupancy = np.where(single, tiles * split / num_sms,
                                 tiles / (np.ceil(tiles / num_sms) * num_sms))
            value = g * m * n / (tiles * tm * tn) * occupancy
            slice_depth = k / split
            better = value * slice_depth / (slice_depth + self.gemm_k0) > best * depth / (depth + self.gemm_k0)
            best, depth = np.where(better, value, best), np.where(better, slice_depth, depth)
            chosen = np.where(better, split, chosen)
        return best, depth, chosen

    def gemm_efficiency(self, m: Num, n: Num, k: Num, num_sms: int = 132, groups: Num = 1.0) -> Num:
        best, depth, _ = self._choice(m, n, k, num_sms, groups)
        out = self.gemm * np.minimum(best, 1.0) * depth / (depth + self.gemm_k0)
        return float(out) if out.ndim == 0 else out

    def split_k_reductions(self, m: Num, n: Num, k: Num, num_sms: int = 132, groups: Num = 1.0) -> Num:
        """1 where the chosen kernel splits k (its CTAs' fp32 partial sums are then summed by a reduction kernel
        of their own: cuBLAS's ``splitKreduce_kernel``, one after each split GEMM in the compiled decode steps
        profiled on an H100 and an H200, data/measured/gpu/2026-11-26d-*-decode.json), else 0. The kernel's fixed
        time is priced (roofline.overhead), not its bytes: s·m·n fp32 partials, under 0.1 % of a decode GEMM's
        weights at m ≤ 32."""
        out = (self._choice(m, n, k, num_sms, groups)[2] > 1.0).astype(float)
        return float(out) if out.ndim == 0 else out

SERVE_DEFAULT = ServeEfficiency()
