"""Each pipeline rank's step, time per micro-batch and memory as functions of the layers it holds, for the stage DP
(search/stage_dp.py): priced by ``step.ranks.price_rank`` (the estimate's own per-rank pricing) at two layer counts
under each of the settings a rank may run, and taken as straight lines through them.

A rank of l layers under one setting runs l times a layer's passes beside its fixed work (the embedding on the first,
the head on the last, its sends, its optimizer step), and holds l layers' weights and saved activations beside its
fixed bytes; its data-parallel collectives carry its parameters. So its step s, its time per micro-batch t and its
memory are each c + k·l, exactly but for a few kinks (NCCL's protocol thresholds, ZeRO-3's two-layer prefetch): the
lines only *propose* splits; every proposal is re-priced by ``estimate()`` before it is kept (stage_dp.py). A rank
with N of its layers fully recomputed (Megatron's block method) or offloaded mixes the lines: N layers at the
recomputed (offloaded) slope, l − N at the plain one.

Each rank is priced on its own cluster (``clusters``: one per rank), so the ranks of a pipeline laid over pools of
different GPUs (meshplan/derived/mixed.py) each take their pool's speed and memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshplan.cost.wrapper_work import work_of
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.ranks import RankCost, RankShared, price_rank, shared_rank, stage_modes
from meshplan.step.units import Units, timed_parts, units_for_recomputes

# the settings whose lines are priced: (stage_recompute entry, offload every layer); "full" beside "none" gives the
# lines of N layers recomputed, the offloaded one those of N layers offloaded
BASES = (("none", False), ("selective", False), ("full", False), ("none", True))


@dataclass(frozen=True, slots=True)
class Line:
    """c + k·l."""

    c: float
    k: float

    def at(self, layers: Any) -> Any:
        """At ``layers`` (a count, or an array of them)."""
        return self.c + self.k * layers


@dataclass(frozen=True, slots=True)
class RankLines:
    """One rank under one setting: its step beside the bubble, its time per micro-batch and its memory, per layer
    count."""

    step: Line
    time: Line
    memory: Line


def _line(a: Any, b: Any, la: int, lb: int) -> Line:
    k = float(b - a) / (lb - la)
    return Line(float(a) - k * la, k)


def sample_counts(layers: int, pp: int, vpp: int) -> tuple[int, int]:
    """The two layer counts the lines pass through: about half and one and a half the even split, multiples of vpp
    (far apart, so that a kink near either moves the slope little)."""
    even = max(vpp, layers // pp)
    low = max(vpp, (even // 2) // vpp * vpp)
    high = max(low + vpp, -(-(3 * even) // (2 * vpp)) * vpp)
    return low, high


def units_on(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency) -> dict[str, Units]:
    """The per-micro-batch units of ``plan`` on ``cluster`` under every recompute mode a rank may run."""
    own = work_of(plan, stack)
    parts = timed_parts(model, cluster, plan, stack, eff, works=(own,) if own else ())
    return units_for_recomputes(model, plan, stack, parts, ("none", "selective", "full"), eff)


def _trial(plan: Plan, layers: int, setting: tuple[str, bool]) -> Plan:
    """``plan`` with ``layers`` layers on every rank under ``setting`` (every rank given it: price_rank reads its
    own)."""
    entry, offloaded = setting
    return plan.with_(stage_layers=(layers,) * plan.pp, first_stage_layers=0, last_stage_layers=0,
                      stage_recompute=(entry,) * plan.pp, stage_offload=(layers * offloaded,) * plan.pp)


def _priced(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, units: dict[str, Units], eff: Efficiency,
            rank: int, layers: int, settings: Sequence[tuple[str, bool]],
            middle: dict[tuple[int, float], RankShared] | None = None, trials: Sequence[Plan] = ()) -> list[RankCost]:
    """Rank ``rank`` holding ``layers`` layers under each of ``settings``: its parameters' share (its traffic, its
    optimizer step, its buffers: ``step.ranks.rank_shared``) priced once for them all, since no setting moves it,
    and once for the middle ranks of one cluster (``middle``, by cluster and count: step/ranks.shared_rank).
    ``trials``: the plans of ``_trial`` for them, where made already (``rank_lines``: the ranks of one count price the
    same plans, so that its middle ranks share their passes, step/ranks._PASSES)."""
    trials = trials or [_trial(plan, layers, s) for s in settings]
    shared = shared_rank(model, cluster, trials[0], stack, eff, rank, {} if middle is None else middle)
    return [price_rank(model, cluster, trial, stack, units, eff, rank, shared) for trial in trials]


def priced_ranks(clusters: Sequence[Cluster]) -> list[int]:
    """The ranks priced: the two ends and the first and last of each run of ranks on one cluster; a middle rank
    between two priced ones on its cluster differs from them only by the micro-batches it holds in flight, which
    fall by one a rank under 1F1B (memory.in_flight_chunks), so its lines are interpolated between theirs."""
    out = {0, len(clusters) - 1}
    for r in range(1, len(clusters)):
        if clusters[r] is not clusters[r - 1]:
            out |= {r - 1, r}
    out |= {min(1, len(clusters) - 1), max(0, len(clusters) - 2)}  # the middle ranks' first and last
    return sorted(out)


def _between(a: RankLines, b: RankLines, w: float) -> RankLines:
    def mixed(x: Line, y: Line) -> Line:
        return Line(x.c + w * (y.c - x.c), x.k + w * (y.k - x.k))

    return RankLines(mixed(a.step, b.step), mixed(a.time, b.time), mixed(a.memory, b.memory))


def rank_lines(model: ModelSpec, clusters: Sequence[Cluster], plan: Plan, stack: Stack, eff: Efficiency,
               settings: Sequence[tuple[str, bool]] = BASES) -> list[dict[tuple[str, bool], RankLines]]:
    """Per rank of ``plan``, the lines of each of ``settings`` (module docstring), on its own cluster: priced at the
    ranks of ``priced_ranks``, interpolated between them for the middle ranks of a run."""
    la, lb = sample_counts(model.num_layers, plan.pp, plan.vpp)
    base = plan.with_(recompute_layers=0, offload_activations=False, offload_layers=0)
    units: dict[int, dict[str, Units]] = {}
    known: dict[int, dict[tuple[str, bool], RankLines]] = {}
    middle: dict[tuple[int, float], RankShared] = {}
    trials = {n: [_trial(base, n, s) for s in settings] for n in (la, lb)}
    for r in priced_ranks(clusters):
        cluster = clusters[r]
        if id(cluster) not in units:
            units[id(cluster)] = units_on(model, cluster, base, stack, eff)
        known[r] = {}
        at_a, at_b = (_priced(model, cluster, base, stack, units[id(cluster)], eff, r, n, settings, middle, trials[n])
                      for n in (la, lb))
        for setting, a, b in zip(settings, at_a, at_b, strict=True):
            known[r][setting] = RankLines(_line(a.step, b.step, la, lb), _line(a.times.total, b.times.total, la, lb),
                                          _line(a.memory.total, b.memory.total, la, lb))
    out = []
    for r in range(len(clusters)):
        if r in known:
            out.append(known[r])
            continue
        lo, hi = max(k for k in known if k < r), min(k for k in known if k > r)
        out.append({s: _between(known[lo][s], known[hi][s], (r - lo) / (hi - lo)) for s in settings})
    return out


def ends_step(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency) -> float:
    """The larger of ``plan``'s end ranks' steps beside the bubble, priced as ``estimate`` prices a plan's ranks apart
    (the same parts, units and ``price_rank``): a floor of its step, the busiest rank's plus the bubble (>= 0)."""
    units = _end_units(model, cluster, plan, stack, eff)
    return max(price_rank(model, cluster, plan, stack, units, eff, r).step for r in (0, plan.pp - 1))


def ends_reach(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency, ceiling: float) -> bool:
    """Whether ``ends_step`` is ``ceiling`` or more: the last rank priced first, the first only where the last is
    below it (the stage DP's proposals of a strong-scaling sweep of llama3-70b over 8 GPU counts: 36 of the 51 priced
    reach it at the last rank, 19 of them at the first)."""
    units = _end_units(model, cluster, plan, stack, eff)
    return any(price_rank(model, cluster, plan, stack, units, eff, r).step >= ceiling for r in (plan.pp - 1, 0))


def _end_units(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency) -> dict[str, Units]:
    """The units ``estimate`` prices ``plan``'s ranks with: its own and each rank's recompute mode."""
    own = work_of(plan, stack)
    parts = timed_parts(model, cluster, plan, stack, eff, works=(own,) if own else ())
    return units_for_recomputes(model, plan, stack, parts, (*stage_modes(plan), plan.recompute), eff)


def layer_spans(values: np.ndarray, layers: int) -> list[tuple[np.ndarray, int, int]] | None:
    """Per rank of ``values`` (tables × ranks × counts, ∞ where a table does not let a rank hold a count): the counts
    any table lets it hold and the span [lo, hi] of the layer totals of the ranks up to it on a split of ``layers``
    (at least their least counts' sum, at most their most counts', and leaving the later ranks between their least
    and most); None where a rank may hold none or no split exists. The stage DP's convolutions (search/stage_dp.py)
    compute their costs on these spans alone: a total outside its span cannot reach ``layers``, and a total inside
    that can reads, through each count its rank may hold, only totals of the rank before that can, so the cost and
    least count at ``layers`` are those of the DP over every total (tests/test_stage_dp.py)."""
    counts = [np.flatnonzero(np.isfinite(values[:, r]).any(axis=0)) for r in range(values.shape[1])]
    if any(not c.size for c in counts):
        return None
    least = np.cumsum([int(c[0]) for c in counts])
    most = np.cumsum([int(c[-1]) for c in counts])
    out = []
    for r, c in enumerate(counts):
        lo = max(int(least[r]), layers - int(most[-1] - most[r]))
        hi = min(int(most[r]), layers - int(least[-1] - least[r]))
        if lo > hi:
            return None
        out.append((c, lo, hi))
    return out
