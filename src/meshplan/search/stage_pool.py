"""The stage DP over a search's ranking (issue 83): which pipelines it refines, drawn from the search's ``POOL`` fastest
plans, its first and its fastest, never from the plans listed (search/run.py ``_refined``), so that #1 is the same
whatever ``--top``; the refinement leads where it beats the fastest plan (``refine_ranked``); the DP itself:
stage_dp.py.
"""

from __future__ import annotations

from collections.abc import Callable

from meshplan.estimate import Estimate
from meshplan.search.stage_dp import Allowed, eligible, stage_dp
from meshplan.search.stage_lines import ends_reach
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

PIPELINES = 3  # the pipelined plans the DP refines: the fastest of its pool
POOL = 10  # the search's fastest plans (whatever the number listed) whose pipelines make the DP's pool (search/run.py)


def refine_ranked(model: ModelSpec, cluster: Cluster, plans: tuple[Estimate, ...], fastest: Estimate,
                  kinds: tuple[str, ...], headroom: float, eff: Efficiency, pool: tuple[Estimate, ...]
                  ) -> tuple[tuple[Estimate, ...], Estimate, tuple[Plan, ...]]:
    """``plans`` with the stage DP's best refinement of the ``PIPELINES`` fastest pipelines of ``pool`` (the search's
    first, fastest and ``POOL`` fastest plans, not those listed: #1 whatever ``--top``, search/run.py) leading where
    it beats the fastest plan, else unchanged: the fastest, not the first listed, since the listing puts the simpler
    plans of the ranking band first, which says nothing of what the DP can gain. Third: the plans taken out of
    ``plans`` (the refined one and the plan it refines, where it leads), for plans listed after these (run.py)."""
    stack = plans[0].stack
    candidates = {e.plan: e for e in pool if eligible(e.plan, stack)}
    piped = sorted(candidates.values(), key=lambda e: e.step_time)[:PIPELINES]
    refined = [stage_dp(model, [cluster] * e.plan.pp, e, e.plan, stack, eff, Allowed(kinds, headroom),
                        _below(model, cluster, stack, eff, e.step_time)) for e in piped]
    best = min(refined, key=lambda e: e.step_time, default=None)
    if best is None or best.step_time >= fastest.step_time:
        return plans, fastest, ()
    dropped = (piped[refined.index(best)].plan, best.plan)
    return (best, *(e for e in plans if e.plan not in dropped)), best, dropped


def _below(model: ModelSpec, cluster: Cluster, stack: Stack, eff: Efficiency, ceiling: float
           ) -> Callable[[Plan], Estimate | None]:
    """``estimate()`` of a proposal, or None where its end ranks alone take ``ceiling`` (the step of the plan it
    refines) or more (stage_lines.ends_reach, priced as the estimate prices them): it cannot be faster. 2/3 of the
    proposals priced are slower (1.03x to 1.3x), most of them at an end rank already."""
    from meshplan.estimate import estimate
    from meshplan.step.ranks import priced_apart

    def price(q: Plan) -> Estimate | None:
        if priced_apart(model, q) and ends_reach(model, cluster, q, stack, eff, ceiling):
            return None
        return estimate(model, cluster, q, stack, eff)

    return price
