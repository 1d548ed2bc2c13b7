"""A node's all-reduce as measured: nccl-tests' ``all_reduce_perf`` rows (ranks, bytes, time, bus bandwidth) of one
system, which then prices that system's tier-0 all-reduces in place of NCCL's tuner model (protocols.tier0_time).

NCCL's tuner (src/graph/tuning.cc; collectives/protocols.py) is what NCCL *predicts* a call costs, to pick a
protocol; nccl-tests times the calls as the node runs them (NVIDIA/nccl-tests src/common.cu: the mean of ``iters``
back-to-back launches between two CUDA events, its PERFORMANCE.md's busbw = algbw · 2(g − 1)/g). On an 8 x A100
node the two differ most at small messages: vTrain's node (VIA-Research/vTrain f8dda847 trace/a100/
AR_GPU{2,4,8}_1M_1024M_LUT) reads 45 / 56 / 93 µs for 2 MiB over 2 / 4 / 8 GPUs where the v2.12 tuner prices
23 / 36 / 53 µs; at 1 GiB both are the bus bandwidth's. A system whose table is known is priced by it:

    t(g, n) = the measured time at n where n is a measured size of g ranks,
              linear between the two measured sizes around n,
              NCCL's model below the smallest, at most t(g, n_min) (no row says what it costs there),
              t(g, n_max) · n / n_max above the largest (the largest row's algorithm bandwidth),

over the running maximum of the rows in n (a larger message is never priced faster, as tests/test_properties
requires of every collective). A group size with no rows keeps NCCL's model, and so do the serving engines' TP
all-reduce (collectives/allreduce.py, their own kernels' measured cost) and every other collective. No number here is
fitted: the rows are the system's measurement, carried with their source (meshplan_validation.source_vtrain holds
vTrain's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from meshplan.xp import Num


@dataclass(frozen=True, slots=True)
class AllReduceTable:
    """Measured tier-0 all-reduces: ``rows`` of (ranks, bytes, seconds), each one nccl-tests line."""

    rows: tuple[tuple[int, float, float], ...]
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for g, n, t in self.rows:
            if not (isinstance(g, int) and g >= 2 and n > 0 and t > 0 and np.isfinite(n) and np.isfinite(t)):
                raise ValueError(f"all-reduce row ({g}, {n}, {t}): ranks >= 2, bytes and seconds > 0")

    @property
    def groups(self) -> tuple[int, ...]:
        return tuple(sorted({g for g, _, _ in self.rows}))


@lru_cache(maxsize=64)
def group_curve(table: AllReduceTable, group: int) -> tuple[np.ndarray, np.ndarray]:
    """The group's measured sizes (ascending) and their times as the running maximum (module docstring)."""
    pairs = sorted((n, t) for g, n, t in table.rows if g == group)
    sizes = np.array([n for n, _ in pairs], dtype=float)
    return sizes, np.maximum.accumulate(np.array([t for _, t in pairs], dtype=float))


def curve_seconds(sizes: np.ndarray, times: np.ndarray, nbytes: Num, priced: Num) -> Num:
    """One group's time for ``nbytes`` from its measured curve (module docstring's t(g, n)); ``priced``, NCCL's model,
    below the smallest size, capped at the smallest row's time."""
    n = np.asarray(nbytes, dtype=float)
    inside = np.interp(n, sizes, times)  # np.interp holds the end values outside the measured sizes
    out = np.where(n > sizes[-1], times[-1] * n / sizes[-1], inside)
    out = np.where(n < sizes[0], np.minimum(priced, times[0]), out)
    return float(out) if np.ndim(out) == 0 else out


def measured_all_reduce(table: AllReduceTable, nbytes: Num, group: Num, priced: Num) -> Num:
    """``priced`` (NCCL's model) where ``group`` has no rows in ``table``, the measured curve where it has."""
    g = np.asarray(group)
    out: Num = priced
    for k in table.groups:
        hit = g == k
        if not np.any(hit):
            continue
        sizes, times = group_curve(table, k)
        out = np.where(hit, curve_seconds(sizes, times, nbytes, priced), out)
    return float(out) if np.ndim(out) == 0 else out
