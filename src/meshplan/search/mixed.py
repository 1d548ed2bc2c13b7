"""The search on a mixed cluster (issue 84 item 1; meshplan/derived/mixed.py prices a plan on pools).

In two levels, as Metis prunes its space (Um et al., ATC '24, §5: device groups first, then each group's plan):

1. Shapes: the plans the vectorised search ranks first on each pool's GPUs, at the whole cluster's size (its
   ``SHAPES_PER_POOL`` best, ranked by time): tp, cp, pp, micro-batch, ZeRO, recompute … that run well on that kind
   of GPU.
2. Placements: each shape laid on the pools in both layouts where the pools' sizes allow (mixed.MIXED_LAYOUTS): its
   pipeline's stages over the pools in every order, with the layers per rank (and the settings) of the stage DP run
   on every rank's own pool (search/stage_dp.py); its replicas over the pools, with equal micro-batch shares, and,
   where the framework runs them (Supports.uneven_batch), shares that balance the pools: each pool's step is
   a + b·m in its replicas' micro-batches m (two estimates), and the integer shares summing to the global batch that
   make the slowest pool least are tried, the best two priced.

Every plan is priced by mixed.mixed_estimate and kept where each pool's ranks fit within the headroom; the fastest
lead. Beside them, each pool alone: the best plan on its own GPUs at the same global batch (does the mixed cluster
beat its fastest pool?).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace

from meshplan.derived.mixed import MixedEstimate, MixedPlan, mixed_estimate, problems, rank_clusters
from meshplan.errors import SpecError
from meshplan.estimate import Estimate, estimate
from meshplan.fields import usable_hbm
from meshplan.search.run import search
from meshplan.search.space import Space
from meshplan.search.stage_dp import Allowed, dp_kinds, stage_dp
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.pools import Pools

SHAPES_PER_POOL = 6  # the best plans of each pool's search laid on the pools
SHARES = 2  # balanced batch shares priced per shape


@dataclass(frozen=True)
class MixedResult:
    model: ModelSpec
    pools: Pools
    space: Space
    plans: tuple[MixedEstimate, ...]  # fitting, fastest first
    alone: tuple[Estimate | None, ...]  # per pool: its best plan on its own GPUs
    shapes: int
    evaluated: int
    rejected: dict[str, int]
    seconds: float

    def to_dict(self) -> dict[str, object]:
        return {"model": self.model.name, "pools": self.pools.name, "gpus": self.pools.num_gpus,
                "global_batch": self.space.global_batch, "shapes": self.shapes, "evaluated": self.evaluated,
                "rejected": dict(self.rejected), "seconds": self.seconds,
                "alone": [None if e is None else e.to_dict(ops=False) for e in self.alone],
                "plans": [e.to_dict() for e in self.plans]}


def plan_shapes(model: ModelSpec, pools: Pools, space: Space, eff: Efficiency) -> list[Plan]:
    """Stage 1 (module docstring): each pool's best plans at the cluster's size, their per-rank fields cleared."""
    found: dict[Plan, None] = {}
    flat = replace(space, stage_layers=False, prefer_simple=False, simplest_leads=False)
    for pool in pools.pools:
        try:
            cluster = pool.system.cluster(pools.num_gpus)
        except SpecError:  # the cluster's size is not a multiple of this pool's NVLink domain
            continue
        for est in search(model, cluster, flat, top_k=SHAPES_PER_POOL, eff=eff, workers=1).plans:
            found.setdefault(est.plan.with_(stage_layers=(), first_stage_layers=0, last_stage_layers=0,
                                            stage_recompute=(), stage_offload=()), None)
    return list(found)


def _counts(pools: Pools, per: int) -> tuple[int, ...] | None:
    """Each pool's whole number of ``per``-GPU units, None where one does not divide."""
    if any(p.gpus % per for p in pools.pools):
        return None
    return tuple(p.gpus // per for p in pools.pools)


def pipelines(pools: Pools, plan: Plan) -> Iterator[MixedPlan]:
    """``plan``'s stages over the pools in every order (even layers; the DP balances them)."""
    counts = _counts(pools, plan.dp * plan.tp * plan.tp2 * plan.cp)
    if counts is None or plan.pp < len(pools.pools):
        return
    for order in itertools.permutations(range(len(pools.pools))):
        yield MixedPlan(plan=plan, kind="pipeline", order=order, counts=tuple(counts[k] for k in order))


def balanced_shares(counts: tuple[int, ...], lines: list[tuple[float, float]], micro: int) -> list[tuple[int, ...]]:
    """Integer micro-batch shares m_k ≥ 1 with Σ c_k·m_k = ``micro`` whose slowest pool, max_k (a_k + b_k·m_k),
    is least (``lines``: (a_k, b_k)), the best ``SHARES``: around the continuous optimum T where every pool ends
    together, m_k = (T − a_k)/b_k."""
    weight = sum(c / b for c, (_, b) in zip(counts, lines, strict=True))
    level = (micro + sum(c * a / b for c, (a, b) in zip(counts, lines, strict=True))) / weight
    ideal = [(level - a) / b for a, b in lines]
    ranges = [range(max(1, int(m) - 2), int(m) + 3) for m in ideal[:-1]]
    found = []
    for head in itertools.product(*ranges):
        rest = micro - sum(c * m for c, m in zip(counts, head, strict=False))
        if rest >= counts[-1] and rest % counts[-1] == 0:
            shares = (*head, rest // counts[-1])
            found.append((max(a + b * m for (a, b), m in zip(lines, shares, strict=True)), shares))
    return [s for _, s in sorted(found)[:SHARES]]


def replicas(model: ModelSpec, pools: Pools, plan: Plan, space: Space, eff: Efficiency) -> Iterator[MixedPlan]:
    """``plan``'s replicas over the pools: equal shares where they divide the micro-batches, and balanced ones where
    the framework runs uneven shares."""
    counts = _counts(pools, plan.tp * plan.tp2 * plan.pp * plan.cp)
    micro = plan.global_batch // plan.micro_batch
    if counts is None or plan.global_batch % plan.micro_batch:
        return
    order = tuple(range(len(pools.pools)))
    if micro % sum(counts) == 0:
        equal = (micro // sum(counts),) * len(counts)
        yield MixedPlan(plan=plan, kind="data", order=order, counts=counts, shares=equal)
    if not space.stack.supports.uneven_batch:
        return
    lines = []
    for pool in pools.pools:  # a + b·m from two shares m of each pool's replicas
        cluster, base = pool.cluster(plan.num_gpus), max(1, micro // sum(counts))
        a, b = (estimate(model, cluster, plan.with_(global_batch=plan.dp * plan.micro_batch * m), space.stack,
                         eff).step_time for m in (base, 2 * base))
        lines.append((2 * a - b, (b - a) / base))
    for shares in balanced_shares(counts, lines, micro):
        if len(set(shares)) > 1:
            yield MixedPlan(plan=plan, kind="data", order=order, counts=counts, shares=shares)


def _fits(est: MixedEstimate, headroom: float) -> str:
    """Why ``est`` does not fit within the headroom on some pool, "" where it does."""
    for k, used in zip(est.mixed.order, est.pool_memory, strict=True):
        hbm = est.pools.pools[k].system.accelerator.hbm_bytes
        if used > usable_hbm(hbm, headroom):
            return f"memory on {est.pools.pools[k].name} over its HBM" + (" less the headroom" if used <= hbm else "")
    return ""


def _priced(model: ModelSpec, pools: Pools, mixed: MixedPlan, space: Space, eff: Efficiency) -> MixedEstimate:
    """``mixed`` priced, a pipeline with the stage DP's layers and settings where they are faster."""
    est = mixed_estimate(model, pools, mixed, space.stack, eff)
    if mixed.kind != "pipeline":
        return est
    allowed = Allowed(dp_kinds(space.recompute, True in space.offload_activations), space.headroom)
    return stage_dp(model, rank_clusters(pools, mixed), est, mixed.plan, space.stack, eff, allowed,
                    lambda q: mixed_estimate(model, pools, replace(mixed, plan=q), space.stack, eff))


def mixed_search(model: ModelSpec, pools: Pools, space: Space, top_k: int = 10, eff: Efficiency = DEFAULT
                 ) -> MixedResult:
    """The search of the module docstring."""
    start = time.perf_counter()
    tried = plan_shapes(model, pools, space, eff)
    kept: dict[tuple, MixedEstimate] = {}
    rejected: Counter[str] = Counter()
    evaluated = 0
    for plan in tried:
        for mixed in (*pipelines(pools, plan), *replicas(model, pools, plan, space, eff)):
            wrong = problems(model, pools, mixed, space.stack)
            evaluated += 1
            if wrong:
                rejected[wrong[0].split(":")[0]] += 1
                continue
            est = _priced(model, pools, mixed, space, eff)
            why = _fits(est, space.headroom)
            if why:
                rejected[why] += 1
                continue
            key = (est.mixed.kind, est.mixed.order, est.mixed.shares, est.mixed.plan)
            kept.setdefault(key, est)
    plans = sorted(kept.values(), key=lambda e: (e.step_time, e.peak_memory))[:top_k]
    alone = tuple(_alone(model, pool.cluster(), space, eff) for pool in pools.pools)
    return MixedResult(model, pools, space, tuple(plans), alone, len(tried), evaluated, dict(rejected),
                       time.perf_counter() - start)


def _alone(model: ModelSpec, cluster, space: Space, eff: Efficiency) -> Estimate | None:
    """The best plan of ``cluster`` alone (one pool's GPUs), None where none fits."""
    try:
        result = search(model, cluster, space, top_k=1, eff=eff, workers=1)
    except SpecError:
        return None
    return result.fastest
