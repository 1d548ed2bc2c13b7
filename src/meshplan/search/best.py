"""Best: what a share of the search keeps of the feasible plans it timed, so that the ranking does not depend on how
many plans are listed (``--top``).

Two lists. ``rows``: the k fastest plans seen so far, ties broken towards less memory, then a fixed order of the plan
fields (``plan_key``), so that the ranking is deterministic. ``close`` (only when the search prefers simple plans,
``band`` > 0): every plan that can still be among the k simplest within the error band of the fastest plan. The band
is taken around the fastest time seen so far, which only falls, so a plan slower than that time × (1 + band) can never
lead and is dropped; of the others, a plan is dropped only when k plans that come before it in the ranking (simpler,
or as simple and lighter, or as light and faster) are faster than it: those k stay in the band whenever it does
(``staircase``). What nothing can enter the lists above is ``threshold``: the k-th fastest time, or the band's edge
when that is slower, and the branch and bound (evaluate.py) times only plans whose lower bound reaches it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from meshplan.specs.plan import Plan

# The step times ranked here are float32 sums and the peaks float32: the winners are re-estimated in float64, and a
# plan is counted faster than another only when it is by more than this (relative), so that no rounding decides what
# is dropped
RANK_SLACK = 1e-5
STAIR_BLOCK = 512  # plans compared at once by ``staircase`` (a STAIR_BLOCK² boolean matrix)
AXES = ("tp", "tp2", "pp", "cp", "ep", "vpp")  # the parallel axes beyond data parallelism (``simplicity``)


def simplicity(plan: Plan) -> int:
    """How much a plan asks of its user: its parallel axes beyond data parallelism, interleaving, a 2D layout,
    offloads and recompute, one each."""
    axes = sum(getattr(plan, a) > 1 for a in AXES)
    return axes + plan.offload_optimizer + plan.offload_activations + (plan.recompute != "none") + extras(plan)


def extras(plan: Plan) -> int:
    """The options beyond the settings grid a plan takes, one each: weight offload, a parameter server, MST
    collectives (a batch shares them, so this is one count for all its rows)."""
    return int(plan.offload_weights) + (plan.dp_mode == "ps") + (plan.collectives != "nccl")


def simplicities(batch: object, rows: np.ndarray, recompute: np.ndarray, offload_opt: np.ndarray,
                 offload_act: np.ndarray) -> np.ndarray:
    """``simplicity`` of many plans: rows of a PlanBatch under per-plan settings (booleans: recompute is not
    "none", the optimizer and the activations are offloaded)."""
    axes = sum((getattr(batch, a)[rows] > 1).astype(np.int64) for a in AXES)
    return axes + offload_opt + offload_act + recompute + extras(batch)  # type: ignore[arg-type]


@dataclass
class Best:
    """The k fastest feasible plans seen so far and, with a ``band``, the plans that can still lead among those
    within it of the fastest (bounded memory)."""

    k: int
    band: float = 0.0  # relative: 0 ranks by time alone
    rows: list[tuple[float, float, tuple]] = field(default_factory=list)
    threshold: float = np.inf  # nothing slower can enter: the k-th best time so far, or the band's edge
    fastest: float = np.inf
    close: tuple[np.ndarray, np.ndarray, np.ndarray] = (np.empty(0), np.empty(0), np.empty(0, dtype=np.int64))
    close_keys: list[tuple] = field(default_factory=list)  # plan_key of each plan of ``close`` (time, peak, simple)

    def offer(self, times: np.ndarray, peaks: np.ndarray, make: Callable[[int], Plan],
              simple: np.ndarray | None = None) -> None:
        """Keep the k fastest of these plans (``make(i)`` builds the i-th), ties broken towards less memory: of
        plans as fast as the k-th, the ones with the smaller peak; with a band, also those that may lead within it
        (``simple``: each plan's ``simplicity``)."""
        if not len(times):
            return
        kth = np.partition(times, self.k - 1)[self.k - 1] if len(times) > self.k else np.inf
        tied = np.flatnonzero(times <= kth)
        top = tied[np.lexsort((peaks[tied], times[tied]))][: self.k]
        self.rows += [(float(times[i]), float(peaks[i]), plan_key(make(int(i)))) for i in top]
        self.rows.sort(key=lambda r: (r[0], r[1], r[2][0]))
        del self.rows[self.k * 4:]
        self.fastest = min(self.fastest, float(times.min()))
        if self.band:
            self._offer_close(times, peaks, make, simple)
        if len(self.rows) >= self.k:
            self.threshold = max(self.rows[self.k - 1][0], self.edge if self.band else 0.0)

    @property
    def edge(self) -> float:
        """The slowest time that can still be within the band of the fastest plan (the float32 slack added)."""
        return self.fastest * (1 + self.band) * (1 + RANK_SLACK)

    def _offer_close(self, times: np.ndarray, peaks: np.ndarray, make: Callable[[int], Plan],
                     simple: np.ndarray | None) -> None:
        if simple is None:
            raise ValueError("Best with a band needs each plan's simplicity")
        new = np.flatnonzero(times <= self.edge)
        t, p, s = (np.concatenate([old, np.asarray(x)[new]]) for old, x in zip(self.close, (times, peaks, simple),
                                                                                 strict=True))
        origin = np.concatenate([np.arange(len(self.close_keys)), -1 - new])  # >= 0: kept before; < 0: new
        keep = np.flatnonzero((t <= self.edge) & staircase(t, p, s, self.k))
        self.close_keys = [self.close_keys[o] if o >= 0 else plan_key(make(int(-1 - o))) for o in origin[keep]]
        self.close = (t[keep], p[keep], s[keep])


def staircase(times: np.ndarray, peaks: np.ndarray, simple: np.ndarray, k: int) -> np.ndarray:
    """Which plans are not dominated: a plan is dominated when at least ``k`` plans come before it in the ranking
    of plans within the band (by simplicity, peak memory, step time) and are faster than it by more than
    ``RANK_SLACK``: whatever the band's final edge, those k are in it whenever it is, so it cannot be among the k
    first. Exact, in blocks of ``STAIR_BLOCK``: the plans before a block count through the k fastest of them."""
    order = np.lexsort((times, peaks, simple))
    ts = times[order]
    cut = ts * (1 - RANK_SLACK)
    kept = np.empty(len(ts), dtype=bool)
    fastest_before = np.empty(0)  # the k fastest times of the plans before the block
    for start in range(0, len(ts), STAIR_BLOCK):
        block, below = ts[start:start + STAIR_BLOCK], cut[start:start + STAIR_BLOCK]
        before = np.minimum((fastest_before[None, :] < below[:, None]).sum(axis=1), k)
        within = np.tril(block[None, :] < below[:, None], -1).sum(axis=1)  # the block's plans before each one
        kept[start:start + STAIR_BLOCK] = before + within < k
        both = np.concatenate([fastest_before, block])
        fastest_before = np.partition(both, k - 1)[:k] if len(both) > k else both
    out = np.empty(len(ts), dtype=bool)
    out[order] = kept
    return out


def plan_key(plan: Plan) -> tuple:
    """(the ranking's order of the plan fields, the plan)."""
    order = (plan.dp, plan.tp, plan.pp, plan.cp, plan.ep, plan.etp, plan.vpp, plan.last_stage_layers, plan.micro_batch,
             plan.zero, plan.recompute, plan.sequence_parallel, plan.schedule, plan.offload_optimizer,
             plan.offload_activations, plan.placement, plan.offload_weights, plan.dp_mode, plan.collectives)
    return (order, plan)
