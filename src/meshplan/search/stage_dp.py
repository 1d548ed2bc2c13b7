"""The stage DP: how many layers each pipeline rank holds and what it recomputes or offloads (issue 84 item 2; Alpa's
stage DP, Zheng et al. 2022 §5.2; Aceso and Mist search per-stage recompute, Metis and HexiScale uneven stages over
GPUs of different speed).

With every rank priced apart (step/ranks.py) the step of a pipeline is

    t_step = max_r s_r + (Σ_r t_r − max_r t_r) / v,     s_r = m · t_r + dp_r + offload_r + optimizer_r,

where rank r's step s_r, time per micro-batch t_r and memory depend on its own layer count l_r and setting σ_r alone
(search/stage_lines.py prices them as lines in l_r). The problem — the min over (l_r, σ_r) of t_step subject to
Σ l_r = L and each rank's memory within its limit — is solved as Alpa solves its stage DP: for a threshold T on the
largest step, a DP over the ranks and the layers used so far finds the split of least Σ t_r whose every s_r ≤ T
(a min-plus convolution per rank); T runs over the smallest feasible step values (the least found by a min-max DP
over the ranks, the bottleneck form of the same convolution), and the split of least t_step wins. Each rank's
setting is its fastest that fits, where the framework sets one per rank (``Supports.stage_settings``: none,
selective, full, N layers recomputed, N offloaded); where it runs one setting for every rank (Megatron-Core's
TransformerConfig), the DP runs once per setting (none, selective, full, or N layers recomputed on each
rank, Megatron's block method: min(N, l_r) on rank r).

The lines only propose: the best few splits are priced by ``estimate()`` (or the mixed cluster's pricing) and the
fastest that fits within the headroom is kept only where it beats the plan it refines, so the search's #1 is never
slower than the uniform plan (tests/test_stage_dp.py). Which of a search's plans it refines: stage_pool.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from meshplan.cost.params import layers_on_rank
from meshplan.fields import usable_hbm
from meshplan.pipeline.registry import schedule_of
from meshplan.search.stage_lines import BASES, RankLines, layer_spans, rank_lines
from meshplan.specs.check import check
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

_INF = float("inf")
THRESHOLDS = 8  # step thresholds T tried from the least feasible one up
PROPOSALS = 3  # splits re-priced exactly
StageSetting = tuple[str, int]  # ("none" | "selective" | "full" | "recompute" | "offload", N layers)
StageTable = tuple[np.ndarray, np.ndarray, list[list[StageSetting]]]  # per rank and layer count: step, time, setting


def eligible(plan: Plan, stack: Stack) -> bool:
    """A pipeline whose ranks can be priced apart and the framework sets a layer count per rank."""
    schedule = schedule_of(plan.schedule)  # its end ranks apart and flushed: not DualPipe, ZB-V, Chimera, the async
    return (plan.pp > 1 and stack.supports.stage_layers and schedule.ends_apart and schedule.flushes
            and not plan.offload_weights)


def _candidates(lines: dict, layers: np.ndarray, limit: float, kinds: tuple[str, ...], vpp: int
                ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, list[StageSetting]]]:
    """Every setting a rank may take at each layer count: (step, time, memory, setting per count)."""
    none = lines[("none", False)]
    plain: tuple[str, ...] = ("none", "selective", "full")
    out = [(ln.step.at(layers), ln.time.at(layers), ln.memory.at(layers), [(kind, 0)] * len(layers))
           for kind in plain if kind in kinds for ln in (lines[(kind, False)],)]
    for kind, base in (("recompute", ("full", False)), ("offload", ("none", True))):
        if kind not in kinds or vpp > 1:
            continue
        done = lines[base]
        saved = none.memory.k - done.memory.k  # bytes a layer frees by it
        if saved <= 0:
            continue
        n = np.clip(np.ceil((done.memory.c + none.memory.k * layers - limit) / saved), 1, None)
        n = np.minimum(n, layers - (kind == "recompute"))
        out.append((*mix(none, done, layers, n), [(kind, int(x)) for x in n]))
    return out


def bases(kinds: tuple[str, ...], per_rank: bool, vpp: int) -> tuple[tuple[str, bool], ...]:
    """The settings whose lines the DP reads (stage_lines.BASES, in its order): the plain one, which every mix
    reads, selective and full recompute where a rank may run them (full also for N layers recomputed), and every layer
    offloaded where a rank may offload N of them (only where each rank has its own setting, and without chunks)."""
    wanted = {("none", False), *((("selective", False),) if "selective" in kinds else ()),
              *((("full", False),) if {"full", "recompute"} & set(kinds) else ()),
              *((("none", True),) if per_rank and "offload" in kinds and vpp == 1 else ())}
    return tuple(b for b in BASES if b in wanted)


def mix(plain: RankLines, done: RankLines, layers: np.ndarray, n: np.ndarray
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step, time and memory of a rank of ``layers`` layers, ``n`` of them recomputed (offloaded: ``done``'s
    slopes), the rest plain: the plain intercepts for the times, ``done``'s for the memory (full recompute's working
    set, the offload's copy buffer)."""
    rest = layers - n
    return (plain.step.c + plain.step.k * rest + done.step.k * n, plain.time.c + plain.time.k * rest + done.time.k * n,
            done.memory.c + plain.memory.k * rest + done.memory.k * n)


def per_rank_table(lines: Sequence[dict], layers: int, limits: Sequence[float], kinds: tuple[str, ...],
                   vpp: int) -> StageTable:
    """Each rank's fastest fitting setting at each layer count 0 … L (steps ∞ where none fits or the count is not a
    positive multiple of vpp)."""
    counts = np.arange(layers + 1, dtype=float)
    allowed = (counts >= vpp) & (counts % vpp == 0)
    steps, times, settings = np.full((len(lines), layers + 1), _INF), np.full((len(lines), layers + 1), _INF), []
    for r, mine in enumerate(lines):
        chosen: list[StageSetting] = [("none", 0)] * (layers + 1)
        for s, t, mem, labels in _candidates(mine, counts, limits[r], kinds, vpp):
            better = allowed & (mem <= limits[r]) & (np.isfinite(mem)) & (s < steps[r])
            for i in np.flatnonzero(better):
                chosen[i] = labels[i]
            steps[r] = np.where(better, s, steps[r])
            times[r] = np.where(better, t, times[r])
        settings.append(chosen)
    return steps, times, settings


def uniform_tables(lines: Sequence[dict], layers: int, limits: Sequence[float], settings: Sequence[StageSetting],
                   vpp: int) -> list[StageTable]:
    """For each of ``settings``, every rank under it (N layers recomputed: min(N, l) on a rank of l) at each layer
    count; the N-layers-recomputed settings' mixes priced in one array a rank (one row an N)."""
    counts = np.arange(layers + 1, dtype=float)
    allowed = (counts >= vpp) & (counts % vpp == 0)
    steps, times = np.full((2, len(settings), len(lines), layers + 1), _INF)
    redone = [i for i, (kind, _) in enumerate(settings) if kind == "recompute"]
    n = np.minimum(np.array([settings[i][1] for i in redone], dtype=int)[:, None], counts)
    for r, mine in enumerate(lines):
        for i, (kind, _) in enumerate(settings):
            if kind != "recompute":
                ln: RankLines = mine[(kind, False)]
                ok = allowed & (ln.memory.at(counts) <= limits[r])
                steps[i, r], times[i, r] = (np.where(ok, ln.step.at(counts), _INF),
                                            np.where(ok, ln.time.at(counts), _INF))
        if redone:
            s, t, mem = mix(mine[("none", False)], mine[("full", False)], counts, n)
            ok = allowed & (mem <= limits[r])
            steps[redone, r], times[redone, r] = np.where(ok, s, _INF), np.where(ok, t, _INF)
    return [(steps[i], times[i], [[setting] * (layers + 1)] * len(lines)) for i, setting in enumerate(settings)]


def _least_largest(steps: np.ndarray, layers: int) -> np.ndarray:
    """For each table of ``steps`` (tables × ranks × counts), the least largest s_r over the splits of ``layers`` (a
    min-max convolution per rank over the counts it may hold: the bottleneck form of ``_least_times``' DP), ∞ where
    no split exists: the least T for which some split has every s_r ≤ T, in one pass over the ranks rather than a
    reachability DP per T tried. A count only another table allows is ∞ in this one's, which no max-min picks."""
    spans = layer_spans(steps, layers)
    if spans is None:
        return np.full(steps.shape[0], _INF)
    cost = np.full((steps.shape[0], 2 * layers + 2), _INF)  # the second half: negative counts (k − n < 0), ∞
    cost[:, 0] = -_INF
    for r, (counts, lo, hi) in enumerate(spans):
        k = np.arange(lo, hi + 1)[:, None]
        done = np.maximum(cost[:, k - counts[None, :]], steps[:, r, counts][:, None, :]).min(axis=2)
        cost[:, : layers + 1] = _INF
        cost[:, lo: hi + 1] = done
    return cost[:, layers]


def _least_times(times: np.ndarray, layers: int) -> list[list[int] | None]:
    """For each table of ``times`` (thresholds × ranks × counts), the split of least Σ t_r (a min-plus convolution
    per rank over the counts it may hold, with back pointers), None where none exists: the DPs of every threshold
    in one pass over the ranks. A rank's counts are those any table lets it hold; a count another table allows adds
    ∞ to this one's sums, which never ties a finite least (its back pointer is the first least count, as over its
    own counts alone), and a position of ∞ cost is never walked back through. Each rank's costs on its span alone
    (stage_lines.layer_spans)."""
    n = times.shape[0]
    spans = layer_spans(times, layers)
    if spans is None:
        return [None] * n
    cost = np.full((n, 2 * layers + 2), _INF)  # the second half: the costs of negative counts (k − c < 0), ∞
    cost[:, 0] = 0.0
    back = []
    for r, (counts, lo, hi) in enumerate(spans):
        k = np.arange(lo, hi + 1)[:, None]
        prev = cost[:, k - counts[None, :]] + times[:, r, counts][:, None, :]
        best = prev.argmin(axis=2)
        back.append((lo, counts[best]))
        cost[:, : layers + 1] = _INF
        cost[:, lo: hi + 1] = np.take_along_axis(prev, best[:, :, None], axis=2)[:, :, 0]
    out: list[list[int] | None] = []
    for t in range(n):
        if not np.isfinite(cost[t, layers]):
            out.append(None)
            continue
        split, left = [], layers
        for lo, arg in reversed(back):
            split.append(int(arg[t, left - lo]))
            left -= split[-1]
        out.append(split[::-1])
    return out


def least_threshold(table: StageTable, layers: int) -> tuple[np.ndarray, int]:
    """The ranks' step values, sorted, and the index of the least T for which a split has every s_r ≤ T
    (``_least_largest``; the length of the values where none has): a lower bound of the split's t_step."""
    steps = table[0]
    return threshold_values(steps, float(_least_largest(steps[None], layers)[0]))


def threshold_values(steps: np.ndarray, least: float) -> tuple[np.ndarray, int]:
    """``least_threshold``'s answer from a table's ``steps`` and its least largest step (``_least_largest``): the
    distinct finite steps, sorted, and the index of ``least`` among them (their length where it is ∞)."""
    values = np.sort(steps[np.isfinite(steps)])  # np.unique's sort and mask, without the numpy.ma it imports
    values = values[np.concatenate(([True], values[1:] != values[:-1]))] if values.size else values
    if not values.size or not np.isfinite(least):
        return values, len(values)
    return values, int(np.searchsorted(values, least))  # the least is one of the values, exactly


def partition(table: StageTable, layers: int, vpp: int, least: tuple[np.ndarray, int] | None = None
              ) -> list[tuple[float, tuple[int, ...]]]:
    """The splits of least t_step (module docstring) under the lines, (t_step, counts), best first; ``least``:
    ``least_threshold``'s answer where known."""
    steps, times, _ = table
    values, lo = least or least_threshold(table, layers)
    found: dict[tuple[int, ...], float] = {}
    tried = values[lo: lo + THRESHOLDS]
    splits = _least_times(np.where(steps[None] <= tried[:, None, None], times[None], _INF), layers) if len(
        tried) else []
    for split in splits:
        if split is None:
            continue
        ranks = range(len(split))
        s = max(steps[r, split[r]] for r in ranks)
        t = [times[r, split[r]] for r in ranks]
        found[tuple(split)] = float(s + (sum(t) - max(t)) / vpp)
    return sorted(((v, k) for k, v in found.items()))


def with_split(plan: Plan, split: tuple[int, ...], settings: list[StageSetting], per_rank: bool) -> Plan:
    """``plan`` with ``split`` layers per rank and each rank's setting (per rank, or the one every rank shares)."""
    plan = plan.with_(stage_layers=split, first_stage_layers=0, last_stage_layers=0, stage_recompute=(),
                      stage_offload=(), recompute_layers=0, offload_activations=False, offload_layers=0)
    if not per_rank:
        kind, n = settings[0]
        if kind == "recompute":
            return plan.with_(recompute="full", recompute_layers=n)
        return plan.with_(recompute=kind)
    recompute = tuple({"recompute": str(n), "offload": "none"}.get(kind, kind) for kind, n in settings)
    offload = tuple(n if kind == "offload" else 0 for kind, n in settings)
    return plan.with_(stage_recompute=recompute, stage_offload=offload if any(offload) else ())


def uniform_settings(kinds: tuple[str, ...], most: int, vpp: int) -> list[StageSetting]:
    """The settings a framework with one setting for every rank may run: none, selective, full, and N layers
    recomputed on each rank for N below the most any rank may hold (vpp = 1)."""
    out: list[StageSetting] = [(k, 0) for k in ("none", "selective", "full") if k in kinds]
    if "full" in kinds and vpp == 1:
        out += [("recompute", n) for n in range(1, most)]
    return out


def proposals(model: ModelSpec, clusters: Sequence[Cluster], plan: Plan, stack: Stack, eff: Efficiency,
              kinds: tuple[str, ...], headroom: float) -> list[tuple[float, Plan]]:
    """The best splits and settings under the lines, (t_step, plan), best first."""
    lines = rank_lines(model, clusters, plan, stack, eff, bases(kinds, stack.supports.stage_settings, plan.vpp))
    limits = [usable_hbm(c.accelerator.hbm_bytes, headroom) for c in clusters]
    layers, vpp = model.num_layers, plan.vpp
    out: list[tuple[float, Plan]] = []
    if stack.supports.stage_settings:
        table = per_rank_table(lines, layers, limits, kinds, vpp)
        for value, split in partition(table, layers, vpp)[:PROPOSALS]:
            out.append((value, with_split(plan, split, [table[2][r][n] for r, n in enumerate(split)], True)))
    else:  # one setting for every rank: each setting's least threshold bounds its t_step from below
        bounded = []
        most = min(layers - (plan.pp - 1) * vpp, 3 * -(-layers // plan.pp))  # a rank holds at most 3x the even
        settings = uniform_settings(kinds, most, vpp)
        tables = uniform_tables(lines, layers, limits, settings, vpp)
        # each setting's least largest step, which is one of its table's steps, exactly (a min-max selects them):
        # ``least_threshold``'s value, its sorted steps made only for the settings partitioned (3-4 of ~60 a pipeline)
        leasts = _least_largest(np.stack([t[0] for t in tables]), layers) if tables else ()
        for setting, table, least in zip(settings, tables, leasts, strict=True):
            if np.isfinite(least):
                bounded.append((float(least), setting, table, float(least)))
        for bound, setting, table, least in sorted(bounded, key=lambda x: x[0]):
            if len(out) >= PROPOSALS and bound >= sorted(v for v, _ in out)[PROPOSALS - 1]:
                break
            out += [(value, with_split(plan, split, [setting], False))
                    for value, split in partition(table, layers, vpp, threshold_values(table[0], least))[:PROPOSALS]]
    return sorted(out, key=lambda x: x[0])


class Priced(Protocol):
    """What the DP reads of a priced plan: an Estimate, or a mixed cluster's (meshplan/derived/mixed.py)."""

    @property
    def step_time(self) -> float: ...

    @property
    def fits(self) -> bool: ...

    @property
    def peak_memory(self) -> float: ...

    @property
    def stage_memory(self) -> tuple[float, ...]: ...


P = TypeVar("P", bound=Priced)


@dataclass(frozen=True)
class Allowed:
    """What the DP may choose: the settings a rank may run (``dp_kinds``) and the share of HBM left free."""

    kinds: tuple[str, ...]
    headroom: float


def stage_dp(model: ModelSpec, clusters: Sequence[Cluster], best: P, plan: Plan, stack: Stack, eff: Efficiency,
             allowed: Allowed, price: Callable[[Plan], P | None]) -> P:
    """``best`` (``plan`` priced) with the layers and settings per rank of the stage DP where that is faster and
    fits within ``headroom`` on each rank's own cluster (priced by ``price``: ``estimate()`` on one cluster, or a
    mixed cluster's pricing; None: no faster than ``best``), else ``best``."""
    if not eligible(plan, stack):
        return best
    headroom = allowed.headroom
    limit = min(usable_hbm(c.accelerator.hbm_bytes, headroom) for c in clusters)
    chosen, tried = best, 0
    for _, candidate in proposals(model, clusters, plan, stack, eff, allowed.kinds, headroom):
        if tried >= PROPOSALS or candidate == plan:
            break
        if any(check(model, c, candidate, stack) for c in {id(c): c for c in clusters}.values()) or \
                stack.supports.problems(candidate, model, stack):
            continue
        tried += 1
        if written_out(model, candidate, plan):  # ``plan`` itself: no faster than ``best``
            continue
        est = price(candidate)
        if est is None:  # its end ranks alone as slow as ``best``
            continue
        if est.fits and _within(est, clusters, headroom, limit) and est.step_time < chosen.step_time:
            chosen = est
    return chosen


def written_out(model: ModelSpec, candidate: Plan, plan: Plan) -> bool:
    """Whether ``candidate`` is ``plan`` with its own layers per rank written out (``with_split`` of the split it
    has, under the setting it runs: the DP's first proposal, 16 of the 72 a strong-scaling sweep of llama3-70b over 8
    GPU counts prices), which prices as ``plan`` does (tests/test_stage_dp.py: rank by rank as by its end ranks)."""
    if plan.stage_layers or candidate.pp != plan.pp or any(
            layers_on_rank(model, candidate, r) != layers_on_rank(model, plan, r) for r in range(plan.pp)):
        return False
    return candidate.with_(stage_layers=()) == plan


def _within(est: Priced, clusters: Sequence[Cluster], headroom: float, limit: float) -> bool:
    """Every rank within its own cluster's headroom (the estimate's per-rank memory where it has one)."""
    if est.stage_memory and len(est.stage_memory) == len(clusters):
        return all(m <= usable_hbm(c.accelerator.hbm_bytes, headroom) for m, c in zip(est.stage_memory, clusters,
                                                                                      strict=True))
    return est.peak_memory <= limit


def dp_kinds(recompute: tuple[str, ...], offload: bool) -> tuple[str, ...]:
    """What a rank may run under a space's recompute modes and activation offload: those modes, N layers
    recomputed where full recompute is one, N layers offloaded where offload is."""
    return (*recompute, *(("recompute",) if "full" in recompute else ()), *(("offload",) if offload else ()))
