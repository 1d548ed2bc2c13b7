"""Search: every parallel plan for a model on N GPUs, evaluated in bulk, ranked; the rest rejected with reasons.

Candidates → (vectorised) evaluation → feasible / rejected-with-reason → top-k. Exhaustive and exact: the
cost of every candidate is the cost ``estimate()`` gives it (the same functions, on arrays), and nothing is
pruned unless it cannot win: GPipe has the step time of 1F1B with at least its memory, so it can tie but
never beat it; such plans are counted as dominated rather than evaluated unless ``Space.gpipe`` asks for
them (ties are broken towards less memory).

How it is fast (DESIGN.md example 4): per-micro-batch costs of a layer, the embedding, the head and a pipeline
send (``step.units.Units``) depend only on tp, cp, micro-batch, ep, etp, the strides of tp / cp / pp on the mesh
and the categorical settings; they are computed once per distinct key. estimate()'s own step composition
(``step.assemble.compose``, on arrays, via ``scoring``) then turns them into step time and memory for every candidate
at once with NumPy, in chunks, so memory stays bounded. Memory, and a lower bound on the step time (``bound``),
depend on the size combination (every numeric field but the placement) and on a unit's kernel times and saved
activations, which depend on the op shapes alone: they are computed once per size combination. Only the combinations
whose bound can still reach the top k have their placements built, their unit keys' collectives priced
(``keyed.KeyUnits``) and their step time computed (branch and bound, ``evaluate``).

The modules, in data-flow order: ``space`` (what may be chosen), ``combos`` (valid size combinations, the rest
tallied), ``placements`` and ``candidates`` (the candidates as NumPy columns), ``limits`` (the space's size, checked
before any plan is built), ``scoring`` and ``bound`` (step time and memory over the settings grid, a lower bound),
``best`` (what a share keeps: the k fastest and, preferring simple plans, every plan that can lead within the error
band of the fastest), ``evaluate`` (one share of the work), ``workers`` (the shares, in one or more processes),
``select`` (the kept plans re-estimated in float64 and ranked: the same first plan whatever the number listed) and
this one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from meshplan.estimate import Estimate
from meshplan.search.best import Best, simplicity
from meshplan.search.candidates import taken
from meshplan.search.combos import Combo, valid_combos
from meshplan.search.evaluate import Part
from meshplan.search.explore import Explore, Explored, PlanSpace, plan_space
from meshplan.search.limits import check_space
from meshplan.search.placements import PLACEMENTS
from meshplan.search.refine import refine_ends
from meshplan.search.select import LAZY_RANKING, fastest_kept, kept_rows, leader, leads_ranking, pricer, ranked
from meshplan.search.space import Space
from meshplan.search.stage_dp import dp_kinds, eligible
from meshplan.search.stage_pool import PIPELINES, POOL, refine_ranked
from meshplan.search.stage_settings import refine_stages
from meshplan.search.tally import Tally
from meshplan.search.workers import Job, Losing, jobs, run_searches, worker_count
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan

__all__ = ["SearchResult", "fastest_searches", "search", "searches", "simplicity"]


@dataclass(frozen=True)
class SearchResult:
    """A search's answer: the feasible plans best first, and what was evaluated, rejected and why."""

    model: ModelSpec
    cluster: Cluster
    space: Space
    plans: tuple[Estimate, ...]  # feasible, best first
    evaluated: int
    feasible: int
    rejected: dict[str, int]  # reason → count
    examples: dict[str, str]  # reason → one concrete instance
    seconds: float
    bounded: int = 0  # of the evaluated plans: step time not computed, a lower bound keeps them out of the top k
    explored: PlanSpace | None = None  # a sample of the space and its Pareto front, when asked for (explore.py)
    fastest: Estimate | None = None  # the fastest feasible plan (with prefer_simple, not always the first listed)
    exact: bool | None = None  # a lazy ranking's answer to its exactness test (select.LAZY_RANKING), else None

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def equivalent(self) -> tuple[bool, ...]:
        """Per plan: whether its step time is within the error band of the fastest plan's (specs/bands.py), so
        that the model cannot tell the two apart."""
        if not self.plans:
            return ()
        fastest = self.fastest.step_time if self.fastest else min(e.step_time for e in self.plans)
        return tuple(e.step_time <= fastest * (1 + e.ranking_band) for e in self.plans)

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model.name, "system": self.cluster.name, "gpus": self.cluster.num_gpus,
            "global_batch": self.space.global_batch, "evaluated": self.evaluated, "feasible": self.feasible,
            "bounded": self.bounded,
            "rejected": {"count": self.rejected_total, "reasons": dict(self.rejected), "examples": dict(self.examples)},
            "seconds": self.seconds, "plans_per_second": self.evaluated / self.seconds if self.seconds else None,
            "fastest": self.fastest.to_dict(ops=False) if self.fastest else None,
            "plans": [e.to_dict(ops=False) | {"equivalent": same} for e, same in zip(self.plans, self.equivalent,
                                                                                      strict=True)],
        }


def search(model: ModelSpec, cluster: Cluster, space: Space, top_k: int = 10, eff: Efficiency = DEFAULT,
           progress: Callable[[int, int], None] | None = None, workers: int = 0,
           explore: Explore | None = None) -> SearchResult:
    """Evaluate every candidate of ``space``; return the ``top_k`` feasible plans (as full Estimates), the
    number evaluated, and the rejected ones tallied by reason. ``progress(done, total)`` counts finished
    jobs. ``workers``: processes to use (0: up to 2 when the space is large; 1: this process only). ``explore``:
    also keep a sample of the plans and the Pareto front of time and memory (``SearchResult.explored``)."""
    return searches(model, cluster, [space], top_k, eff, progress, workers, explore)[0]


@dataclass(frozen=True)
class _Prepared:
    """One search before its jobs run: its valid size combinations, the build rejections, its shares and the
    processes it would fork."""

    space: Space
    combos: list[Combo]
    tally: Tally
    shares: list[Job]
    workers: int
    start_from: Explored | None
    start: float


def searches(model: ModelSpec, cluster: Cluster, spaces: list[Space], top_k: int = 10, eff: Efficiency = DEFAULT,
             progress: Callable[[int, int], None] | None = None, workers: int = 0,
             explore: Explore | None = None) -> list[SearchResult]:
    """``search`` over each of ``spaces`` (search/variants.py: a stack switch each), their jobs in one pool of
    processes: each result is the one ``search`` gives it alone (its shares are its own: ``workers.jobs``; where
    the searches' combinations are the same, so are their shares, one task each: workers.run_searches)."""
    return _searches(model, cluster, spaces, (top_k, eff, workers, explore), progress, None)


def fastest_searches(model: ModelSpec, cluster: Cluster, spaces: list[Space], top_k: int = 10,
                     eff: Efficiency = DEFAULT, progress: Callable[[int, int], None] | None = None,
                     explore: Explore | None = None) -> list[SearchResult]:
    """``searches``, for a caller that keeps the whole result of the search whose fastest plan is fastest (the first
    of equals) and only the counts and the fastest plan's step time of the others (search/variants.py): a result
    finished in a worker that another search's beats or equals before it may come without its plans, its fastest
    estimate without its detail (workers.run_searches: what it spares is their pickling)."""
    return _searches(model, cluster, spaces, (top_k, eff, 0, explore), progress, (_rank, _light))


def _rank(result: SearchResult) -> float:
    return result.fastest.step_time if result.fastest is not None else math.inf


def _light(result: SearchResult) -> SearchResult:
    fastest = None if result.fastest is None else replace(result.fastest, detail=None)
    return replace(result, plans=(), fastest=fastest, explored=None)


def _searches(model: ModelSpec, cluster: Cluster, spaces: list[Space],
              options: tuple[int, Efficiency, int, Explore | None], progress: Callable[[int, int], None] | None,
              losing: Losing | None) -> list[SearchResult]:
    top_k, eff, workers, explore = options
    prepared = [_prepare(model, cluster, space, workers, explore) for space in spaces]
    alone = 1 if all(p.combos == prepared[0].combos for p in prepared) else len(spaces)  # searches of own tasks
    prepared = [replace(p, shares=_shares(p, alone)) for p in prepared]
    return run_searches([(p.shares, p.combos, (model, cluster, p.space, _kept(p.space, top_k), eff, p.start_from))
                         for p in prepared], max(p.workers for p in prepared),
                        lambda s, parts, ahead: _finish(model, cluster, prepared[s], parts, (top_k, eff, explore),
                                                        None if ahead is None else (s, ahead)), progress, losing)


def _kept(space: Space, top_k: int) -> int:
    """The fastest plans each share keeps: the ``top_k`` listed, and where the stage DP runs at least its ``POOL``
    (the DP's pool is drawn from the search's POOL fastest, whatever the number listed: ``_refined``). cli/plan.py
    ``_listed`` lists one plan a count on this (what a share keeps does not depend on ``top_k`` <= POOL)."""
    return max(top_k, POOL) if space.stage_layers else top_k


def _shares(prepared: _Prepared, searches: int) -> list[Job]:
    """A search's shares: each tensor mode's combinations one share, split further only where the ``searches``
    evaluated apart times the modes are fewer than the workers. A share finds its own top k, so a split bounds fewer
    plans out: DeepSeek-V3 on 2,048 H100 (two modes, two expert-GEMM searches in one task a mode) took 1.24x the
    CPU seconds (whole process, median of 3) in four shares a mode as in one, 2026-11-28."""
    space, workers = prepared.space, prepared.workers
    tasks = searches * sum(1 for _ in space.modes())
    return jobs(prepared.combos, space, 1 if workers == 1 else -(-workers // tasks))  # as the workers take them


def _prepare(model: ModelSpec, cluster: Cluster, space: Space, workers: int, explore: Explore | None) -> _Prepared:
    start = time.perf_counter()
    combos, tally = taken(("combos", model, cluster, space)) or valid_combos(model, cluster, space)  # shapes_ahead
    check_space(model, cluster, space, combos)
    workers = worker_count(combos, workers)
    shares: list[Job] = []  # searches._shares: once the searches' tasks are known
    start_from = None
    if explore is not None:  # the share of size combinations to sample: about explore.sample plans of the space
        unplaced = sum(c.unplaced for c in combos)
        start_from = Explored(min(1.0, explore.sample / unplaced) if unplaced else 0.0, explore.seed, explore.fits_only)
    return _Prepared(space, combos, tally, shares, workers, start_from, start)


def _finish(model: ModelSpec, cluster: Cluster, prepared: _Prepared, results: list[Part],
            options: tuple[int, Efficiency, Explore | None],
            behind: tuple[int, Callable[[], tuple[float, int]]] | None = None) -> SearchResult:
    """The search's result from its jobs' parts: the kept plans ranked, the first refined. ``behind``: (this search's
    index, what gives another search's rank and index) where that search is finished first (workers.run_searches):
    where this one's fastest plan ranks after that one's (as ``_rank`` ranks it; a tie: the first search), the result
    comes light (``fastest_searches``: the plans after the fastest neither ranked nor estimated)."""
    space, tally, (top_k, eff, explore) = prepared.space, prepared.tally, options
    for part in results:
        tally.merge(part.tally)
    kept, priced = [part.best for part in results], pricer(model, cluster, space, eff)  # each plan estimated once

    def refine(plans: tuple[Estimate, ...], fastest: Estimate) -> tuple[tuple[Estimate, ...], Estimate]:
        return _refined(model, cluster, space, eff, (kept, priced), plans, fastest)

    def result(plans: tuple[Estimate, ...], fastest: Estimate | None, exact: bool | None, light: bool = False
               ) -> SearchResult:  # light: without what a losing search's result need not keep (``_light``)
        out = SearchResult(model=model, cluster=cluster, space=space, plans=plans, fastest=fastest,
                            evaluated=sum(r.evaluated for r in results), feasible=sum(r.feasible for r in results),
                            bounded=sum(r.bounded for r in results),
                            rejected=dict(tally.counts), examples=dict(tally.examples),
                            explored=None if explore is None or light else plan_space(
                                [r.explored for r in results if r.explored is not None], explore, space.grid,
                                PLACEMENTS),
                            seconds=time.perf_counter() - prepared.start, exact=exact)
        return _light(out) if light else out

    lazy = LAZY_RANKING.get() if not space.prefer_simple else None  # search/by_goodput.py's, where it asks for one
    found = lazy(kept_rows(kept), top_k, priced, refine) if lazy is not None else None
    if found is not None:
        return result(*found)
    if not leads_ranking(space, top_k):
        plans, fastest = ranked(model, cluster, space, eff, kept, top_k, priced)
        return result(*(refine(plans, fastest) if plans and fastest is not None else (plans, fastest)), None)
    # the fastest plan leads the ranking whatever the rest: refined first, the rest ranked only where it is kept
    led = leader(kept, priced)
    if led is None:
        return result((), None, None)
    head, fastest, dropped = _refined_first(model, cluster, space, eff, (kept, priced), led[2], led[2])
    if behind is not None and math.isfinite(behind[1]()[0]) and (fastest.step_time, behind[0]) > behind[1]():
        return result((), fastest, None, light=True)
    listed = ranked(model, cluster, space, eff, kept, top_k, priced, led)[0]  # the first: led's, refined in head
    return result((*head, *(p for p in listed[1:] if p.plan not in dropped)), fastest, None)


def _refined(model: ModelSpec, cluster: Cluster, space: Space, eff: Efficiency,
             found: tuple[list[Best], Callable[[Plan], Estimate]], plans: tuple[Estimate, ...],
             fastest: Estimate) -> tuple[tuple[Estimate, ...], Estimate]:
    """The ranking ``plans`` (``fastest`` the fastest of them) with its first refined (``found``: what the shares
    kept and the search's pricing)."""
    head, fastest, dropped = _refined_first(model, cluster, space, eff, found, plans[0], fastest)
    return (*head, *(p for p in plans[1:] if p.plan not in dropped)), fastest


def _refined_first(model: ModelSpec, cluster: Cluster, space: Space, eff: Efficiency,
                   found: tuple[list[Best], Callable[[Plan], Estimate]], first: Estimate, fastest: Estimate
                   ) -> tuple[tuple[Estimate, ...], Estimate, tuple[Plan, ...]]:
    """A ranking's ``first`` plan refined (``_refined``; ``fastest`` the ranking's fastest): the plans that lead the
    ranking then, its fastest, and the plans taken out of the rest of the ranking (each refinement's plan, and the
    plan the stage DP's refines where that leads). Nothing here reads the ranking's other plans."""
    kept, priced = found
    dropped: tuple[Plan, ...] = ()
    if space.uneven_stages:  # the first plan's end stages resized (refine.py)
        first = refine_ends(model, cluster, first, space.stack, eff)
        dropped, fastest = (first.plan,), min(fastest, first, key=lambda e: e.step_time)
    staged = refine_stages(model, cluster, first, space, eff)  # each rank's own recompute and offload
    head: tuple[Estimate, ...] = (staged,)
    dropped, fastest = (*dropped, staged.plan), min(fastest, staged, key=lambda e: e.step_time)
    if space.stage_layers:  # layers and settings per rank (stage_dp.py)
        kinds = dp_kinds(space.recompute, True in space.offload_activations)
        stack, lead = staged.stack, (staged, fastest)  # the DP's pool, whatever the number listed: the first plan,
        # the fastest and the plans of the POOL fastest kept that can be among its PIPELINES fastest pipelines
        pool = (*lead, *fastest_kept(priced, kept, POOL, lambda p: eligible(p, stack), PIPELINES, lead))
        head, fastest, out = refine_ranked(model, cluster, head, fastest, kinds, space.headroom, eff, pool)
        dropped = (*dropped, *out)
    return head, fastest, dropped
