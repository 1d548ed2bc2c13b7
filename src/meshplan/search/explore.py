"""Explore: what a search keeps of the plan space beside its top k, for the report's plan-space view.

Off by default (``search(..., explore=None)``): the search then runs exactly as before. With an ``Explore``, each share
of the search (``evaluate.Part``) also keeps

- a sample: the plans of about ``sample / (plans in the space)`` of the size combinations, drawn by a hash of their
  sizes (so the same whatever the number of workers), each timed under every setting of the grid whether its lower
  bound could reach the top k or not, with its memory and, when it does not fit, the reason (``STATUS``); the search
  draws about ``sample`` plans and keeps ``sample`` of them, uniformly (``PlanSpace``);
- the exact Pareto front of step time and memory per GPU among the plans that fit: a size combination is timed when
  its lower bound on the step time could still reach the top k *or* when some setting of it that fits has a memory
  and a lower bound that no plan of the front dominates (the branch and bound of ``evaluate`` extended to a second
  objective, so the front is exact: a plan left untimed is dominated by one already on it).

The times are the search's float32 sums (``scoring.grid_times``); the report re-estimates the front's plans in float64.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from meshplan.pipeline.registry import SEARCH_ORDER
from meshplan.ranges import check_value
from meshplan.search.batch import PlanBatch
from meshplan.specs.plan import LAYOUTS, Plan

STATUS = ("fits", "memory exceeds HBM", "memory within the headroom", "offload exceeds host memory")
SCHEDULES = SEARCH_ORDER  # the schedule column's codes (pipeline/registry.py)
SIZES = ("dp", "tp", "tp2", "pp", "cp", "ep", "etp", "vpp", "last_stage_layers", "micro_batch")
_HASHED = ("dp", "tp", "tp2", "pp", "cp", "ep", "etp", "vpp", "last_stage_layers", "micro_batch", "global_batch")


@dataclass(frozen=True)
class Explore:
    """Keep about ``sample`` plans of the space (0: none) and the Pareto front of time and memory; ``seed`` picks
    which size combinations and plans."""

    sample: int = 20_000
    seed: int = 0
    # keep only the plans that fit (``meshplan plan --all``: with a sample larger than the space, every feasible plan)
    fits_only: bool = False

    def __post_init__(self) -> None:
        check_value("seed", self.seed, "explore: ")


# every feasible plan of a space (``meshplan plan --all``): a sample larger than any space, the plans that fit
ALL_FEASIBLE = Explore(sample=2**62, fits_only=True)


@dataclass
class Explored:
    """One share's sample and front (small: it crosses a process boundary). ``rate``: the share of size combinations
    sampled."""

    rate: float
    seed: int = 0
    fits_only: bool = False  # Explore.fits_only
    chunks: list[dict[str, np.ndarray]] = field(default_factory=list)
    front_t: np.ndarray = field(default_factory=lambda: np.empty(0))  # ascending
    front_m: np.ndarray = field(default_factory=lambda: np.empty(0))  # strictly descending
    front_plans: list[Plan] = field(default_factory=list)

    def sampled(self, pool: PlanBatch, rows: np.ndarray, sp: bool) -> np.ndarray:
        """Whether each size combination at ``rows`` of ``pool`` is in the sample: a hash of its sizes, tensor layout
        and sequence parallelism (splitmix64) below ``rate``."""
        if self.rate <= 0:
            return np.zeros(len(rows), dtype=bool)
        start = (self.seed * 0x9E3779B97F4A7C15 + 2 * sp + LAYOUTS.index(pool.tensor_layout)) % 2**64
        h = np.full(len(rows), start, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for name in _HASHED:
                h = _mix(h ^ getattr(pool, name)[rows].astype(np.uint64))
        return (h >> np.uint64(11)).astype(np.float64) / 2.0**53 < self.rate

    def dominated(self, t: np.ndarray, m: np.ndarray) -> np.ndarray:
        """Whether a plan of the front is at least as fast and at least as light as each (t, m)."""
        if not len(self.front_t):
            return np.zeros(np.shape(t), dtype=bool)
        at = np.searchsorted(self.front_t, t, side="right") - 1
        return (at >= 0) & (self.front_m[np.maximum(at, 0)] <= m)

    def wanted(self, bound: np.ndarray, fits: np.ndarray, peak: np.ndarray) -> np.ndarray:
        """Per size combination (``bound``: its lower bound on the step time; ``fits``, ``peak``: settings ×
        combinations): whether a setting that fits is dominated by no plan of the front, so it may join it."""
        t = np.broadcast_to(bound, peak.shape)
        return (fits & ~self.dominated(t.reshape(-1), peak.reshape(-1)).reshape(peak.shape)).any(axis=0)

    def offer(self, time: np.ndarray, fits: np.ndarray, peak: np.ndarray, make: Callable[[int], Plan]) -> None:
        """Add the plans that fit (``time``, ``fits``, ``peak``: flat, one per plan and setting; ``make(i)`` builds
        the i-th) to the front where nothing on it dominates them."""
        cand = np.flatnonzero(fits)
        cand = cand[~self.dominated(time[cand], peak[cand])]
        if not len(cand):
            return
        t = np.concatenate([self.front_t, time[cand]])
        m = np.concatenate([self.front_m, peak[cand]])
        keep = front_of(t, m)
        old = len(self.front_t)
        self.front_plans = [self.front_plans[i] if i < old else make(int(cand[i - old])) for i in keep]
        self.front_t, self.front_m = t[keep], m[keep]

    def record(self, columns: dict[str, np.ndarray]) -> None:
        """Keep a chunk of the sample (only the plans that fit, with ``fits_only``); a plan the stack's framework
        refuses (its memory NaN: search/evaluate._fit) is no plan of the space and stays out."""
        keep = (columns["status"] == 0) if self.fits_only else ~np.isnan(columns["memory"])
        self.chunks.append({k: v[keep] for k, v in columns.items()})


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (Steele, Lea and Flood 2014), on uint64 arrays."""
    h = (h + np.uint64(0x9E3779B97F4A7C15)) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def front_of(t: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Indices of the points no other point dominates (at most as slow and as heavy, one of them strictly), ordered
    by time; of equal points the first."""
    order = np.lexsort((m, t))
    ms = m[order]
    best = np.minimum.accumulate(ms)
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = ms[1:] < best[:-1]
    return order[keep]


def sample_columns(time: np.ndarray, status: np.ndarray, peak: np.ndarray, settings: tuple[np.ndarray, ...],
                   batch: PlanBatch, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The sample's columns of plans ``rows`` of ``batch`` under every setting (``time``, ``status``, ``peak``:
    settings × rows; ``settings``: each setting's recompute, ZeRO, optimizer and activation offload indices)."""
    n = time.shape[0]
    out: dict[str, np.ndarray]
    out = {"time": time.reshape(-1).astype(np.float32), "memory": peak.reshape(-1).astype(np.float32),
           "status": status.reshape(-1).astype(np.int8)}
    for name, idx in zip(("recompute", "zero", "offload_optimizer", "offload_activations"), settings, strict=True):
        out[name] = np.repeat(idx.astype(np.int8), len(rows))
    for name in SIZES:
        out[name] = np.tile(getattr(batch, name)[rows].astype(np.int32), n)
    out["placement"] = np.tile(batch.placement_id[rows].astype(np.int16), n)
    size = len(out["time"])
    out["schedule"] = np.full(size, SCHEDULES.index(batch.schedule), dtype=np.int8)
    out["layout"] = np.full(size, LAYOUTS.index(batch.tensor_layout), dtype=np.int8)
    out["sequence_parallel"] = np.full(size, batch.sequence_parallel, dtype=bool)
    return out


@dataclass(frozen=True)
class PlanSpace:
    """What a search kept of its plan space: the sample's columns (``sample_columns``; ``status`` indexes ``STATUS``,
    ``recompute`` / ``zero`` / the offloads index ``grid``, ``placement`` indexes ``placements``), how many plans it
    was drawn from, and the Pareto front of time and memory ((step time, peak memory, plan), fastest first)."""

    columns: dict[str, np.ndarray]
    drawn: int  # plans the sampled size combinations held (before the sample was cut to size)
    front: tuple[tuple[float, float, Plan], ...]
    grid: tuple[tuple, ...]
    placements: tuple[tuple[str, ...], ...]

    def __len__(self) -> int:
        return len(self.columns.get("time", ()))


def plan_space(parts: list[Explored], explore: Explore, grid: tuple[tuple, ...],
               placements: tuple[tuple[str, ...], ...]) -> PlanSpace:
    """The shares' samples and fronts merged: the sample cut to ``explore.sample`` plans (uniformly, in a canonical
    order so that the result does not depend on the workers' order), the fronts merged into the exact one."""
    chunks = [c for p in parts for c in p.chunks]
    columns = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]} if chunks else {}
    drawn = len(columns.get("time", ()))
    if drawn:
        order = np.lexsort([columns[k] for k in reversed(list(columns))])
        if drawn > explore.sample:
            rng = np.random.default_rng(explore.seed)
            order = order[np.sort(rng.choice(drawn, explore.sample, replace=False))]
        columns = {k: v[order] for k, v in columns.items()}
    points = sorted(((float(t), float(m), p) for part in parts
                     for t, m, p in zip(part.front_t, part.front_m, part.front_plans, strict=True)),
                    key=lambda x: (x[0], x[1], x[2].describe()))
    keep: np.ndarray | list[int]
    keep = front_of(np.array([x[0] for x in points]), np.array([x[1] for x in points])) if points else []
    return PlanSpace(columns=columns, drawn=drawn, front=tuple(points[i] for i in sorted(keep)), grid=grid,
                     placements=placements)
