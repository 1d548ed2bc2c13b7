"""Evaluate one share of a search: build the candidates of some size combinations under one tensor mode, compute
the memory of every setting once per size combination, and time (``scoring.grid_times``) only the plans whose lower
bound (``bound``) can still reach the top k, offering the fast ones that fit to ``Best``; the others are counted as
evaluated and bounded, those that do not fit tallied with the plan nearest to fitting.

Size combinations are scored in blocks of ``SIZE_BLOCK``, likely winners (lowest bound) first so that the threshold
tightens early, and timed in chunks of about ``PLAN_CHUNK`` plans, so memory stays bounded.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meshplan.fields import usable_hbm
from meshplan.pipeline.registry import gpipe, schedule_of
from meshplan.search.batch import CATEGORICAL, PlanBatch
from meshplan.search.best import Best, simplicities
from meshplan.search.bound import BOUND_SLACK, lower_bound
from meshplan.search.candidates import Sized, Twin, every, expand, mode_pool, pool_works
from meshplan.search.combos import Combo
from meshplan.search.explore import Explored, sample_columns
from meshplan.search.keyed import KeyUnits, Panels
from meshplan.search.memory_pass import (
    FITS,
    IN_HEADROOM,
    OVER_HBM,
    OVER_HOST,
    GroupMemory,
    group_memory,
    left_out,
    tally_refusals,
)
from meshplan.search.scoring import grid_times
from meshplan.search.space import Space
from meshplan.search.tally import Rows, Tally, decode
from meshplan.specs.bands import ranking_band
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.units import fmt_over
from meshplan.xp import stable_order

PLAN_CHUNK = 16384  # plans timed at once
FIRST_CHUNK = 1024  # plans timed at once while the k-th best time is unknown (every key they use is priced)
SIZE_BLOCK = 16384  # size combinations whose memory is computed at once (it bounds the arrays' size)


@dataclass
class Part:
    """What one share of the search found (small: it crosses a process boundary)."""

    best: Best
    evaluated: int = 0
    feasible: int = 0
    bounded: int = 0  # evaluated plans whose step time a lower bound showed cannot reach the top k
    tally: Tally = field(default_factory=Tally)
    explored: Explored | None = None  # the sample and the Pareto front, when the search explores (explore.py)


@dataclass(frozen=True, kw_only=True)
class Start:
    """What a job starts from beyond its combinations: a fresh ``Explored`` when the search explores (explore.py);
    the memory passes of its schedule groups (memory_pass.py) by (schedule, variant), those of the same job of a
    twin search (another expert-GEMM choice, workers.run_searches) reused where they hold, this job's added."""

    explore: Explored | None = None
    memo: dict[tuple[str, int], GroupMemory] = field(default_factory=dict)
    # what the job made (candidates.Made: its size rows and pool, then the rows it searches of them,
    # memory_pass.left_out), a twin's too
    twin: Twin = field(default_factory=Twin)


def evaluate(mode: tuple[str, bool], combos: list[Combo], model: ModelSpec, cluster: Cluster, space: Space,
             top_k: int, eff: Efficiency, start: Start | None = None) -> Part:
    """Build and score the candidates of one tensor ``mode`` (layout, sequence parallelism) and size combinations;
    with ``start.explore`` (a fresh one), also keep a sample of the plans and the Pareto front (explore.py)."""
    start = Start() if start is None else start
    explore, layout = start.explore, mode[0]
    result = Part(Best(top_k, search_band(model, cluster, space)), explored=explore)
    first_mode = next(m for m in space.modes() if m[0] == layout) == mode  # tally build rejections once
    tally = result.tally if first_mode else Tally()
    pooled = mode_pool(mode, combos, cluster, space, tally, start.twin)  # built ahead or by a twin: taken
    if pooled is None:
        return result
    pool, sized = pooled
    works = pool_works(pool, space)  # of every combination: the units' store is the one shapes_ahead fills
    if not space.gpipe and gpipe().name in space.stack.supports.schedules:  # a GPipe the framework has but loses
        dropped = int(sized.count[(pool.vpp == 1) & (pool.pp > 1)].sum()) * space.grid_size
        result.tally.add("dominated: GPipe (1F1B has its step time with less memory)", "any pp > 1 plan", dropped)
    for name in space.async_schedules:  # a schedule whose rows need m >= pp (PipeDream-2BW's)
        short = (pool.vpp == 1) & (pool.pp > 1) & (pool.grad_accum < pool.pp)
        if short.any() and not schedule_of(name).runs(2, 1, 1, True):
            result.tally.add(f"{name} needs m >= pp micro-batches", "any pp > 1 plan with fewer",
                             int(sized.count[short].sum()) * space.grid_size)
    groups = _groups(pool, space)
    codes: list[np.ndarray | None] = [None] * len(groups)  # each group's refusals, where left_out found them
    if explore is None:  # a search that explores samples every combination (explore.py)
        searched, refused, evaluated = left_out(model, space, pool, sized, [(g.rows, g.of(pool)) for g in groups],
                                                start.twin, SIZE_BLOCK)
        result.tally.merge(refused)
        result.evaluated += evaluated
        if searched is None:
            return result
        pool, sized, found = searched
        groups, codes = _groups(pool, space), list(found)  # the same groups (schedule x variant), of the rows kept
    units = KeyUnits(model, cluster, pool, space.stack, space.recompute, eff, works)
    by_algorithm = {"nccl": units}  # the layers' collectives priced per algorithm (Plan.collectives: comm.fastest_time)

    def keyed(algorithm: str) -> KeyUnits:
        if algorithm not in by_algorithm:
            by_algorithm[algorithm] = KeyUnits(model, cluster, pool.select(np.arange(len(pool)), collectives=algorithm),
                                               space.stack, space.recompute, eff, works)
        return by_algorithm[algorithm]
    bound = lower_bound(model, pool, units.shapes, units.shape_of)
    if space.async_schedules or space.split_schedules:  # no bubble, or less than 1F1B's: a bound without one
        free = lower_bound(model, pool, units.shapes, units.shape_of, bubble=False)
    for group, code in zip(groups, codes, strict=True):  # each group's batch made as it is scored
        batch, shapes = group.of(pool), units.shape_of[group.rows]
        memory = _memory(model, cluster, space, batch, units, shapes, start.memo, group.key, code)
        _score_group(model, cluster, space, eff, batch, sized.select(group.rows),
                     (free if schedule_of(group.key[0]).opt_in else bound)[group.rows], shapes,
                     keyed(str(group.extra.get("collectives", "nccl"))), memory, result)
    return result


def _memory(model: ModelSpec, cluster: Cluster, space: Space, batch: PlanBatch, units: KeyUnits, shapes: np.ndarray,
            memo: dict[tuple[str, int], GroupMemory], key: tuple[str, int], codes: np.ndarray | None
            ) -> GroupMemory:
    """The memory pass of a schedule group (``batch``: its combinations, ``shapes``: theirs; ``codes``: their
    refusals, where found), the twin search's where it holds (memory_pass.GroupMemory.reusable), else computed and
    kept in ``memo`` under ``key``."""
    capacity = cluster.accelerator.hbm_bytes
    limits = (capacity, usable_hbm(capacity, space.headroom), cluster.host_memory)
    if key not in memo or not memo[key].reusable(space, units.saved(shapes), limits):
        memo[key] = group_memory(model, space, batch, lambda rows: units.saved(shapes[rows]), SIZE_BLOCK, limits,
                                 codes)
    return memo[key]


def search_band(model: ModelSpec, cluster: Cluster, space: Space) -> float:
    """The error band within which the search ranks the plans after the fastest simplest first (``Space.prefer_simple``,
    search/select.py), else 0: the
    band of the estimates it ranks (``Estimate.ranking_band``, specs/bands.py)."""
    return ranking_band(model, cluster, space.stack) if space.prefer_simple else 0.0


@dataclass(frozen=True)
class _Group:
    """A schedule group and variant: its ``key`` (schedule, variant: Space.variants' index), the ``rows`` of the pool
    it scores (those its schedule runs) and the variant's ``extra`` options."""

    key: tuple[str, int]
    rows: np.ndarray | slice
    extra: dict[str, Any]

    def of(self, pool: PlanBatch) -> PlanBatch:
        """Its rows of ``pool`` (the pool ``_groups`` read), with its schedule and options."""
        return pool.select(self.rows, schedule=self.key[0], **self.extra)


def _groups(batch: PlanBatch, space: Space) -> list[_Group]:
    """The schedule groups of ``batch`` (the plans that share a pipeline schedule), each once per variant (options
    beyond the grid, Space.variants: one by default), schedules first."""
    even = (batch.last_stage_layers == 0) & (batch.first_stage_layers == 0)
    groups = []
    for schedule in space.schedules:  # the rows each runs: its record's refusals over the batch (pipeline/rules.py)
        rows = every(np.flatnonzero(schedule_of(schedule).runs(batch.pp, batch.vpp, batch.grad_accum, even)),
                     len(batch))
        groups += [_Group((schedule, i), rows, extra) for i, extra in enumerate(space.variants())]
    return groups


def _score_group(model: ModelSpec, cluster: Cluster, space: Space, eff: Efficiency, pool: PlanBatch, sized: Sized,
                 bound: np.ndarray, shapes: np.ndarray, units: KeyUnits, memory: GroupMemory, result: Part) -> None:
    """Score the size combinations of one schedule group (``pool``: one row each, with its lower ``bound``, shape
    and ``memory``, computed once for all its placements) in blocks, likely winners first so that the threshold
    tightens early: the block's feasibility is counted (``_fit``), then the plans that can still reach the top k are
    built and timed (``_time_rows``)."""
    order = stable_order(bound)  # np.argsort(bound, kind="stable"), from the faster unstable sort
    for block in _chunks(order, SIZE_BLOCK):
        fits, peak = _fit(model, space, Rows(pool, block), memory, sized.count[block], result)
        fitting = None if result.explored is not None else memory.counts[block, FITS] > 0  # any setting fits
        _time_rows(model, cluster, space, eff, pool, sized, block, bound, shapes, units, (fits, fitting), peak,
                   result)


def _fit(model: ModelSpec, space: Space, sized: Rows, memory: GroupMemory, plans: np.ndarray, result: Part
         ) -> tuple[np.ndarray, np.ndarray]:
    """Feasibility of every setting of some size combinations (``sized``: one plan of each, ``Rows``, rows of the
    group's ``memory``), each standing for ``plans`` plans: counted as evaluated and feasible, those that do not fit
    tallied with their reason, those the framework refuses under the refusal (by their status, memory_pass.py).
    Returns (fits, peak), shaped as ``grid_memory``'s, the peak NaN where the framework refuses the plan."""
    status, peak = memory.at(sized.rows)  # views of the combinations-first rows (memory_pass._settings_first)
    counts = memory.plans_of(sized.rows, plans)
    tally_refusals(model, space, (sized, status), memory.rules, counts, result.tally)
    result.evaluated += int(plans.sum()) * (status.size // len(sized))
    result.feasible += counts[FITS]
    capacity, usable, host_capacity = memory.limits
    where = (status, sized, space.grid, model.num_layers)
    _tally_misses(result.tally, "memory exceeds HBM", (OVER_HBM, counts[OVER_HBM]), peak, where, capacity)
    if space.headroom:
        _tally_misses(result.tally, f"memory within the {space.headroom:.0%} headroom",
                      (IN_HEADROOM, counts[IN_HEADROOM]), peak, where, usable)
    if counts[OVER_HOST]:
        _tally_misses(result.tally, "offload exceeds host memory", (OVER_HOST, counts[OVER_HOST]),
                      memory.host_at(sized.rows), where, host_capacity)
    return status == FITS, peak


def _time_rows(model: ModelSpec, cluster: Cluster, space: Space, eff: Efficiency, pool: PlanBatch, sized: Sized,
               block: np.ndarray, bound: np.ndarray, shapes: np.ndarray, units: KeyUnits,
               fit: tuple[np.ndarray, np.ndarray | None], peak: np.ndarray, result: Part) -> None:
    """The step time of the plans of the size combinations ``block`` (rows of ``pool``) whose lower bound can still
    reach the top k, in chunks (branch and bound: exact, a plan slower than the k-th best so far cannot enter):
    their placements are built and their keys priced only then; the others counted as bounded. ``fits`` and
    ``peak``: the block's, settings × combinations (``fit``: ``fits`` and whether any setting of each combination
    fits, unless the search explores); a combination none of whose settings fits offers no plan, and is not timed
    unless the search explores (where none fits, nothing is)."""
    fits, fitting = fit
    settings, any_fit = fits[..., 0].size, fits.any() if fitting is None else bool(fitting.any())
    fits, peak = fits.reshape(settings, -1), peak.reshape(settings, -1)
    count, explored = sized.count[block], result.explored
    sampled = None if explored is None else explored.sampled(pool, block, bool(pool.sequence_parallel))
    for piece in _pieces(count, result.best):
        low = bound[block[piece]] * (1 - BOUND_SLACK)
        near = low <= result.best.threshold
        if explored is not None:  # also the sampled combinations and those that may join the Pareto front
            assert sampled is not None  # drawn whenever the search explores
            near |= sampled[piece] | explored.wanted(low, fits[:, piece], peak[:, piece])
        near = piece[near]
        result.bounded += int(count[piece].sum() - count[near].sum()) * settings
        built = None  # the plans of ``near``, where built before it is narrowed to the combinations that fit
        if fitting is not None and not fitting[near].all():  # offers no plan to the top k (only plans that fit
            if not np.isfinite(result.best.threshold) and fitting[near].any():  # are offered): not timed; while
                built = _plans(pool, sized, block[near], shapes)  # the first pieces run, all their keys priced
                units.slots(*built)  # at once (the later pieces' plans mostly share them)
                kept = np.repeat(fitting[near], count[near])  # then those timed selected, not built again
                built = (built[0].select(kept), built[1][kept])
            near = near[fitting[near]]
        if len(near) and (any_fit or (sampled is not None and sampled[near].any())):
            plans, plan_shapes = built if built is not None else _plans(pool, sized, block[near], shapes)
            local = np.repeat(near, count[near])  # each plan's combination, in the block
            _time_chunk(model, cluster, space, eff, plans, plan_shapes, units, fits, peak, local, result, sampled)


def _plans(pool: PlanBatch, sized: Sized, rows: np.ndarray, shapes: np.ndarray) -> tuple[PlanBatch, np.ndarray]:
    """The plans of the size combinations ``rows`` of ``pool`` (every placement: ``expand``) and their shapes."""
    return (PlanBatch(**expand(sized, rows), placements=pool.placements, **{k: getattr(pool, k) for k in CATEGORICAL}),
            np.repeat(shapes[rows], sized.count[rows]))


def _pieces(plans: np.ndarray, best: Best) -> Iterator[np.ndarray]:
    """Consecutive ranges of size combinations holding about ``PLAN_CHUNK`` plans each (``plans``: each one's), smaller
    ones (``FIRST_CHUNK``) until the k-th best time is known; at least one combination each."""
    ends, start = np.cumsum(plans), 0
    while start < len(plans):
        size = PLAN_CHUNK if np.isfinite(best.threshold) else min(PLAN_CHUNK, FIRST_CHUNK)
        done = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, done + size, side="right")))
        yield np.arange(start, stop)
        start = stop


def _time_chunk(model: ModelSpec, cluster: Cluster, space: Space, eff: Efficiency, batch: PlanBatch,
                shapes: np.ndarray, units: KeyUnits, fits: np.ndarray, peak: np.ndarray, sizes: np.ndarray,
                result: Part, sampled: np.ndarray | None = None) -> None:
    """Time the plans of ``batch`` (``shapes``: their shapes; ``sizes``: their columns in ``fits`` and ``peak``,
    settings × size combinations) under every setting and offer the fast enough ones that fit to the top k; when the
    search explores, offer those that fit to the Pareto front and record the ``sampled`` combinations' plans."""
    full, panels = units.price(batch, shapes)
    combos = sizes[np.flatnonzero(np.diff(sizes, prepend=-1))]  # ``sizes`` increase: each combination once
    wanted = None if result.explored is not None else np.asarray(fits[:, combos].any(axis=1)).reshape(
        [len(g) for g in space.grid])
    time = grid_times(model, cluster, batch, full, space, eff, wanted)  # NaN where not wanted: no plan fits there
    ok = np.flatnonzero(time.reshape(-1) <= result.best.threshold)  # fast enough, then: does it fit?
    setting, row = np.divmod(ok, len(batch))
    fit = fits[setting, sizes[row]]
    ok, setting, row = ok[fit], setting[fit], row[fit]
    nb, each = [panels[rc] for rc in space.recompute], _Once(batch, np.arange(len(batch)))
    simple = None
    if result.best.band:  # each plan's simplicity, for the simplest within the band (best.py)
        r, _, o, a = np.unravel_index(setting, time.shape[:-1])
        grid = [np.array(g) for g in space.grid]
        simple = simplicities(batch, row, grid[0][r] != "none", grid[2][o], grid[3][a])
    result.best.offer(time.reshape(-1)[ok], peak[setting, sizes[row]],
                      lambda i: decode(each, space.grid, time.shape, int(ok[i]), nb, model.num_layers, space.stack),
                      simple)
    if result.explored is not None:
        assert sampled is not None  # given whenever the search explores
        _explore_chunk(cluster, space, batch, time, fits[:, sizes], peak[:, sizes], sampled[sizes], nb,
                       result.explored, model.num_layers)


@dataclass(frozen=True)
class _Once(Rows):
    """A chunk's plans read a plan at a time (``decode``), each row's built once: ``Best.offer`` decodes a row under
    each of its settings it keeps (the 8-count strong-scaling plan: 1,174 decodes of 616 rows, ``PlanBatch.plan``
    half of their time)."""

    built: dict[int, Plan] = field(default_factory=dict)

    def plan(self, i: int) -> Plan:
        plan = self.built.get(i)
        if plan is None:
            plan = self.built[i] = super().plan(i)
        return plan


def _explore_chunk(cluster: Cluster, space: Space, batch: PlanBatch, time: np.ndarray, fits: np.ndarray,
                   peak: np.ndarray, sampled: np.ndarray, panels: list[Panels], explored: Explored,
                   layers: int) -> None:
    """Offer the plans of a timed chunk that fit to the Pareto front, and record every setting of its sampled plans
    with the reason each does not fit (``fits``, ``peak``: settings × plans)."""
    flat: np.ndarray = time.reshape(fits.shape)
    explored.offer(flat.reshape(-1), fits.reshape(-1), peak.reshape(-1),
                   lambda i: decode(batch, space.grid, time.shape, i, panels, layers, space.stack))
    rows = np.flatnonzero(sampled)
    if not len(rows):
        return
    capacity = cluster.accelerator.hbm_bytes
    mem = peak[:, rows]
    status = np.where(fits[:, rows], 0, np.where(mem > capacity, 1, np.where(mem > usable_hbm(capacity, space.headroom),
                                                                              2, 3)))
    settings = np.unravel_index(np.arange(flat.shape[0]), time.shape[:-1])
    explored.record(sample_columns(flat[:, rows], status, mem, settings, batch, rows))


def _tally_misses(tally: Tally, reason: str, miss: tuple[int, int], used: np.ndarray,
                  where: tuple[np.ndarray, Rows, tuple[tuple, ...], int], capacity: float) -> None:
    """Count the plans of a status (``miss``: the status and how many plans have it) for ``reason``; the example is
    the plan nearest to fitting: the least bytes ``used`` among them (``where``: the statuses, settings × size
    combinations, the combinations, the grid and the model's layers)."""
    (code, count), (status, sized, grid, layers) = miss, where
    if not count:
        return
    flat = _least_of(status == code, used)
    least = float(used.flat[flat])
    if least >= tally.scores.get(reason, math.inf):
        tally.add(reason, "", count, least)
        return
    plan = decode(sized, grid, status.shape, flat, layers=layers)
    tally.add(reason, f"{plan.describe()}: {fmt_over(least, capacity)}", count, least)


def _least_of(mask: np.ndarray, used: np.ndarray) -> int:
    """np.argmin(np.where(mask, used, np.inf)) without the masked copy: the flat index (C order) of the first least
    of ``used`` where ``mask`` (the first NaN if any: argmin's), read on those elements alone; where all of them are
    infinite, the first element (masked or not) argmin would have found, as before. Both are settings ×
    combinations, read in the order of ``GroupMemory.at``'s views (combinations first: no transposing copy), the
    ties among the least then ordered as the C order would."""
    cells, count = np.moveaxis(used, -1, 0).reshape(-1), used.shape[-1]
    where = np.flatnonzero(np.moveaxis(mask, -1, 0).reshape(-1))
    values = cells[where]
    least = values[np.argmin(values)]
    if not (least < np.inf or np.isnan(least)):
        return int(np.argmin(np.where(mask, used, np.inf)))
    combination, setting = np.divmod(where[np.isnan(values) if np.isnan(least) else values == least],
                                     cells.size // max(count, 1))
    return int((setting * count + combination).min())


def _chunks(rows: np.ndarray, size: int) -> Iterator[np.ndarray]:
    for i in range(0, len(rows), size):
        yield rows[i:i + size]
