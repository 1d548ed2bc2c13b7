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

from dataclasses import replace

from meshplan.estimate import Estimate
from meshplan.goodput import Reliability, goodput, plan_goodput
from meshplan.search.run import SearchResult
from meshplan.search.space import Space
from meshplan.search.variants import search_switches
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan

DEPTHS = (50, 200, 800)


def expected_time(est: Estimate, rel: Reliability) -> float:
    """Wall time per step on average: the step over the plan's goodput."""
    return est.step_time * plan_goodput(est, rel).factor


def least_factor(model: ModelSpec, plan: Plan, gpus: int, rel: Reliability) -> float:
    """The smallest wall factor any plan of the space can have: a checkpoint at the storage's full rate (no rank's
    link binding), or under replica recovery one-GPU replicas that lose only their restart (no heal, no step)."""
    restart = goodput(model, plan, gpus, rel).factor
    if rel.recovery != "replica":
        return restart
    mtbf = rel.mtbf_gpu_hours * 3600 / gpus
    return min(restart, 1.0 / (1.0 - rel.restart_s / mtbf / gpus))


def search_by_goodput(model: ModelSpec, cluster: Cluster, space: Space, rel: Reliability, top_k: int = 10,
                      eff: Efficiency = DEFAULT) -> tuple[SearchResult, bool]:
    """(the search's plans ranked by expected time, whether that ranking is exact over the space: module docstring)."""
    by_time = replace(space, prefer_simple=False, simplest_leads=False)
    result, exact = None, False
    for depth in DEPTHS:
        result = search_switches(model, cluster, by_time, top_k=max(depth, top_k), eff=eff)
        if not result.plans:
            return result, True
        best = min(expected_time(e, rel) for e in result.plans)
        floor = least_factor(model, result.plans[0].plan, cluster.num_gpus, rel)
        exact = len(result.plans) < depth or result.plans[-1].step_time * floor >= best
        if exact:
            break
    assert result is not None
    ranked = sorted(result.plans, key=lambda e: (expected_time(e, rel), e.step_time))
    return replace(result, plans=tuple(ranked[:top_k]), fastest=ranked[0]), exact

