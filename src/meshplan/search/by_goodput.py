"""The search ranked by expected time to train under failures (issue 84 item 3; ``plan --mtbf``): a plan's step time
times its wall factor, 1 / goodput (goodput.plan_goodput: its checkpoint's write through each rank's host link, its
replicas' recovery where the job recovers by replicas), so that a plan with a cheaper checkpoint or smaller replicas
can lead a slightly faster one that loses more to failures.

Exact over the space, not over a top k: the search ranks by step time (branch and bound, ``search.run``) and keeps its
``depth`` fastest; no plan past them can lead where the last one kept, at the smallest factor any plan of the space
can have (``least_factor``), is already slower in expectation than the best found. Where it is not, the search runs
again keeping four times as many, up to ``DEPTHS``' last (then the ranking says it is among those kept).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from meshplan.derived.goodput import Reliability, goodput, plan_goodput, restart_goodput
from meshplan.estimate import Estimate
from meshplan.search.best import RANK_SLACK
from meshplan.search.run import SearchResult
from meshplan.search.select import LAZY_RANKING, by_time
from meshplan.search.space import Space
from meshplan.search.stage_pool import POOL
from meshplan.search.variants import search_switches
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

DEPTHS = (50, 200, 800)


def expected_time(est: Estimate, rel: Reliability) -> float:
    """Wall time per step on average: the step over the plan's goodput."""
    return est.step_time * plan_goodput(est, rel).factor


def least_factor(model: ModelSpec, plan: Plan, gpus: int, rel: Reliability, stack: Stack | None = None) -> float:
    """The smallest wall factor any plan of the space can have: a checkpoint at the storage's full rate (no rank's
    link binding), or under replica recovery one-GPU replicas that lose only their restart (no heal, no step)."""
    restart = goodput(model, plan, gpus, rel, stack=stack).factor
    if rel.recovery != "replica":
        return restart
    mtbf = rel.mtbf_gpu_hours * 3600 / gpus
    return min(restart, 1.0 / (1.0 - rel.restart_s / mtbf / gpus))


def search_by_goodput(model: ModelSpec, cluster: Cluster, space: Space, rel: Reliability, top_k: int = 10,
                      eff: Efficiency = DEFAULT) -> tuple[SearchResult, bool]:
    """(the search's plans ranked by expected time, whether that ranking is exact over the space: module docstring)."""
    by_step = replace(space, prefer_simple=False, simplest_leads=False)
    result, exact = None, False
    for depth in DEPTHS:
        lazy = _Lazy(rel, depth, top_k, by_step.stage_layers)
        token = LAZY_RANKING.set(None if rel.recovery == "replica" else lazy.ranking)
        try:
            result = search_switches(model, cluster, by_step, top_k=max(depth, top_k), eff=eff)
        finally:
            LAZY_RANKING.reset(token)
        if not result.plans:
            return result, True
        exact = result.exact if result.exact is not None else _exact(result.plans, rel, depth, cluster.num_gpus)
        if exact:
            break
    assert result is not None
    ranked = sorted(result.plans, key=lambda e: (expected_time(e, rel), e.step_time))
    return replace(result, plans=tuple(ranked[:top_k]), fastest=ranked[0], exact=None), exact


def _exact(plans: tuple[Estimate, ...], rel: Reliability, depth: int, gpus: int) -> bool:
    """Whether no plan past the ``depth`` fastest kept (``plans``, by step time) can lead (module docstring)."""
    best = min(expected_time(e, rel) for e in plans)
    floor = least_factor(plans[0].model, plans[0].plan, gpus, rel, plans[0].stack)
    return len(plans) < depth or plans[-1].step_time * floor >= best


_SLACK = 2 * RANK_SLACK  # a float32 row's time within this share of its float64 step (select.py's walks)


@dataclass(frozen=True)
class _Lazy:
    """The ranking by expected time drawn from the kept rows lazily under restart recovery, where a plan's wall factor
    reads no step time (goodput.restart_goodput): the ranking by time (select._by_time_first's first ``keep``, refined
    by run._refined) is known as far as a prefix of rows whose float64 steps all lie below every later row's float32
    bound (within ``_SLACK``, as select.py's walks read it); the prefix grows until no later row's bound times its
    factor can reach the ``top_k``-th in expectation, and the exactness test passes on the ``depth``-th step's lower
    bound. None (the ranking in full, eager) wherever a refinement's plan stands among the later rows, the prefix cannot
    be told apart at the ``keep``-th, or the bound does not pass the test: the same answer as the ranking in full
    (tests/test_goodput_ranking.py). llama3-70b on 1,024 H100, --mtbf llama3: 10 plans estimated, not 50.
    ``pooled``: the stage DP runs (``Space.stage_layers``), whose pool run._refined draws from the POOL first rows."""

    rel: Reliability
    depth: int
    top_k: int
    pooled: bool = False

    def ranking(self, rows: list[tuple], keep: int, priced: Callable[[Plan], Estimate],
                refine: Callable[[tuple[Estimate, ...], Estimate], tuple[tuple[Estimate, ...], Estimate]]
                ) -> tuple[tuple[Estimate, ...], Estimate, bool] | None:
        head = rows[: max(2 * keep + 2, sum(r[0] <= rows[0][0] * (1 + _SLACK) for r in rows))] if rows else []
        size, known, first = min(keep, len(head)), [], 0
        refined: tuple[tuple[Estimate, ...], Estimate] | None = None
        factor: dict[Plan, float] = {}
        for m in range(1, size + 1):
            known.append(priced(head[m - 1][2][1]))
            if m < len(head) and head[m][0] * (1 - _SLACK) <= max(e.step_time for e in known):
                if m < size:
                    continue  # a later row may be faster than one of the prefix in float64
                return None
            stack = known[0].stack
            if refined is None:
                if m < size and self.pooled and stack.supports.stage_layers and m < POOL:
                    continue  # the DP's pool (of the POOL first rows: run._refined) may reach past the prefix
                plans = tuple(sorted(known, key=by_time))
                refined, first = refine(plans, plans[0]), m
                if ({e.plan for e in refined[0]} - {e.plan for e in known}) & {key[1] for *_, key in head[m:]}:
                    return None  # a refinement's plan stands among the later rows: the ranking in full drops it
                e0 = known[0]
                factor = {key[1]: restart_goodput(e0.model, e0.cluster, key[1], stack.supports.sharded_checkpoint,
                                                  self.rel, stack).factor for *_, key in head[m:]}
            listed = (*refined[0], *sorted(known[first:], key=by_time))
            done = self._done(listed, head[m:], factor, size - m)
            if done is not None:
                return None if done[1] is None else (done[0], refined[1], done[1])
        return None

    def _done(self, listed: tuple[Estimate, ...], rest: list[tuple], factor: dict[Plan, float], unknown: int
              ) -> tuple[tuple[Estimate, ...], bool | None] | None:
        """(the ``top_k`` of the ranking by expected time, the exactness test's answer, None where the bounds do not
        decide it) once no row of ``rest`` can be among them (``unknown`` of them are in the ranking by time), else
        None."""
        top = sorted(listed, key=lambda e: (expected_time(e, self.rel), e.step_time))[: self.top_k]
        if unknown and (len(top) < self.top_k or expected_time(top[-1], self.rel) >= min(
                r[0] * (1 - _SLACK) * factor[r[2][1]] for r in rest)):
            return None
        best = expected_time(top[0], self.rel)
        floor = least_factor(listed[0].model, listed[0].plan, listed[0].cluster.num_gpus, self.rel, listed[0].stack)
        if len(listed) + unknown < self.depth:
            return tuple(top), True
        if not unknown:
            return tuple(top), listed[-1].step_time * floor >= best
        low = sorted(r[0] * (1 - _SLACK) for r in rest)[unknown - 1]  # at most the last one's step
        return tuple(top), True if low * floor >= best else None  # else it is estimated (the ranking in full)
