"""Per-rank recompute and activation offload for the search's first plan (issue 50 item 3; Aceso and Mist search
per-stage recompute, Galvatron per-stage strategies): each pipeline rank runs the fastest setting that fits its own
memory, over the layer splits search/refine.py tries.

Under 1F1B rank r holds p − r micro-batches in flight (memory.in_flight_chunks), so a uniform recompute is the one
the first rank needs, and the later ranks pay for recompute they could keep in memory. With every rank priced apart
(step/ranks.py) the step is

    t_step = max_r s_r + (Σ_r t_r − max_r t_r) / v,   s_r = m · t_r + dp_r + offload_r + optimizer_r,

non-decreasing in every rank's t_r and s_r, and a rank's memory depends on its own setting only. So the stage
problem, the min over per-rank settings of t_step subject to each rank's memory ≤ the limit, separates: each rank
takes the setting of least s_r among those that fit (ties: the lighter), which minimises every term at once. This is
the stage DP of the sharding planner (autoshard/stage_dp.py, Alpa's Algorithm 1) with its layer counts fixed by the
split: over Megatron-Core's (first, last) splits the recurrence has one state per rank and no coupling left, so
the DP is the per-rank choice, run for each split. The settings a rank may take: none, selective, full recompute of
N = 1 … L_r layers (Megatron's block method, --recompute-num-layers N), and without recompute N = 1 … L_r layers
offloaded (Megatron-Core cpu_offloading_num_layers), each where the space allows it; "none" first, and the rest only
where "none" does not fit, each family (N recomputed, N offloaded: memory falling, time rising with N) scanned up to
its first setting that fits. The chosen plan is re-estimated (``estimate()``) and kept only where it fits and is
faster than the plan it refines, so the search's #1 is never slower than the uniform plan.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshplan.cost.params import layers_on_rank
from meshplan.estimate import Estimate, estimate
from meshplan.fields import usable_hbm
from meshplan.pipeline.registry import schedule_of
from meshplan.search.refine import end_splits
from meshplan.search.space import Space
from meshplan.specs.check import check
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.ranks import RankCost, price_rank, rank_bubble
from meshplan.step.units import Units, units_for_recomputes

RankSetting = tuple[str, int]  # (stage_recompute entry, stage_offload count)


def rank_settings(space: Space, layers: int, vpp: int = 1) -> list[list[RankSetting]]:
    """What a rank of ``layers`` layers may run, in families each ordered by falling memory and rising time: "none",
    the space's selective recompute, full recompute of N = 1 … L_r layers (the last: all, "full"), and N offloaded
    layers where the space offloads activations (search/space.py: what its stack runs). With model chunks (vpp > 1)
    full recompute is of all layers only and no partial offload: Megatron-Core's recompute_num_layers and
    cpu_offloading_num_layers count a chunk's layers (TransformerBlock.num_layers_per_pipeline_rank), not a rank's."""
    allowed = space.recompute
    out: list[list[RankSetting]] = [[(mode, 0)] for mode in ("none", "selective") if mode in allowed]
    if "full" in allowed:
        out.append([(str(n), 0) for n in range(1, layers) if vpp == 1] + [("full", 0)])
    if True in space.offload_activations and "none" in allowed:
        out.append([("none", n) for n in range(1, layers + 1) if vpp == 1 or n == layers])
    return out


def settle_ranks(model: ModelSpec, cluster: Cluster, plan: Plan, space: Space, units: Mapping[str, Units],
                 eff: Efficiency, limit: float) -> tuple[Plan, float] | None:
    """``plan`` with each rank's fastest setting within ``limit`` bytes (module docstring) and its step, or None
    where a rank fits none. Within a family (``rank_settings``) the first setting that fits is its fastest that
    does; "none", the fastest of all, ends the search where it fits."""
    chosen: list[tuple[RankSetting, RankCost]] = []
    for r in range(plan.pp):
        best: tuple[RankSetting, RankCost] | None = None
        for family in rank_settings(space, int(layers_on_rank(model, plan, r)), plan.vpp):
            fit = next(((s, c) for s in family
                        if (c := _priced(model, cluster, plan, space.stack, units, eff, r, s)).memory.total <= limit),
                       None)
            if fit is not None and (best is None or (fit[1].step, fit[1].memory.total) < (
                    best[1].step, best[1].memory.total)):
                best = fit
            if best is not None and best[0] == ("none", 0):
                break
        if best is None:
            return None
        chosen.append(best)
    settled = plan.with_(stage_recompute=tuple(s[0] for s, _ in chosen),
                         stage_offload=tuple(s[1] for s, _ in chosen) if any(s[1] for s, _ in chosen) else ())
    step = max(c.step for _, c in chosen) + rank_bubble(plan, [c.times for _, c in chosen])
    return settled, step


def _priced(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, units: Mapping[str, Units],
            eff: Efficiency, rank: int, setting: RankSetting) -> RankCost:
    """Rank ``rank`` of ``plan`` under ``setting`` (every rank given it: price_rank reads the rank's own)."""
    trial = plan.with_(stage_recompute=(setting[0],) * plan.pp, stage_offload=(setting[1],) * plan.pp)
    return price_rank(model, cluster, trial, stack, units, eff, rank)


def refine_stages(model: ModelSpec, cluster: Cluster, best: Estimate, space: Space, eff: Efficiency) -> Estimate:
    """``best`` with per-rank settings among ``space``'s (and the layer split they run best with) where that is
    faster and fits within the space's headroom, else ``best``."""
    plan, stack = best.plan, space.stack
    if not _eligible(model, cluster, best, stack):
        return best
    limit = usable_hbm(cluster.accelerator.hbm_bytes, space.headroom)
    parts = best.detail.parts if best.detail is not None else None
    splits = end_splits(model.num_layers, plan.pp, plan.vpp) if stack.supports.uneven_stages else [(0, 0)]
    base = plan.with_(recompute_layers=0, offload_activations=False, offload_layers=0)
    modes = tuple(dict.fromkeys(("none", *space.recompute)))
    found: list[tuple[float, Plan]] = []
    for f, last in splits:
        candidate = base.with_(first_stage_layers=f, last_stage_layers=last)
        if parts is None or check(model, cluster, candidate.with_(stage_recompute=("none",) * plan.pp), stack):
            continue
        units = units_for_recomputes(model, candidate, stack, parts, modes, eff)
        settled = settle_ranks(model, cluster, candidate, space, units, eff, limit)
        if settled is not None:
            found.append((settled[1], settled[0]))
    if not found:
        return best
    est = estimate(model, cluster, uniform(min(found, key=lambda x: x[0])[1]), stack, eff)
    return est if est.fits and est.peak_memory <= limit and est.step_time < best.step_time else best


def uniform(plan: Plan) -> Plan:
    """``plan`` with a per-rank recompute or offload that is the same on every rank written as the plan's own."""
    if len(set(plan.stage_recompute)) == 1:
        entry = plan.stage_recompute[0]
        mode, layers = ("full", int(entry)) if entry.isdigit() and entry != "0" else (
            "none" if entry == "0" else entry, 0)
        plan = plan.with_(recompute=mode, recompute_layers=layers, stage_recompute=())
    if len(set(plan.stage_offload)) == 1:
        n = plan.stage_offload[0]
        plan = plan.with_(offload_activations=n > 0, offload_layers=n, stage_offload=())
    return plan


def _eligible(model: ModelSpec, cluster: Cluster, best: Estimate, stack: Stack) -> bool:
    """Whether per-rank settings can beat ``best``: a pipeline the stack sets per rank, on a schedule whose ranks
    are priced apart, that recomputes or offloads (a plan without either already runs every rank's fastest)."""
    plan = best.plan
    return (plan.pp > 1 and best.fits and stack.supports.stage_settings and schedule_of(plan.schedule).priced_apart
            and not plan.offload_weights
            and (plan.recompute != "none" or plan.offload_activations))
