"""Where a collective's group sits on the ranks: the strides and strided factors that comm.split_group splits over
the mesh's tiers (plan.py's placement; Megatron-Core's expert rank order for the MoE groups)."""

from __future__ import annotations

from meshplan.collectives.comm import Layout, block_members
from meshplan.specs.hardware import Cluster
from meshplan.specs.plan import Plan
from meshplan.xp import Num, floor_div, maximum, minimum


def send_stride(pp_stride: Num, pp: Num) -> Num:
    """The rank distance a pipeline send (a pair of neighbouring stages) is priced at: s·p/2 for p stages s
    apart. Such a pair shares a tier's block exactly when the whole pipeline does (span // (s·p/2) ≥ 2 ⟺
    s·p ≤ span), so every send is priced on the slowest link of the stages' chain: the stage that sends over
    it sets the pipeline's pace, m · t_stage of the busiest rank."""
    return pp_stride * pp / 2


def pipeline_bounds(plan: Plan) -> tuple[Num, Num]:
    """(ranks placed inside the pipeline axis, the rank distance across all its stages): s_pp and s_pp·p."""
    below = plan.stride("pp")
    return below, below * plan.pp


def expert_layout(plan: Plan, members: Num, stride: Num) -> Layout:
    """A group of the expert domain (the tp·cp·dp ranks of one pipeline stage, ordered etp innermost, then ep,
    then expert-data-parallel: Megatron-Core's expert RankGenerator) as strided factors over the global ranks.
    The domain's first s_pp ranks are global ranks; each further step skips the pipeline's stages (s_pp·p), so a
    group that reaches past s_pp splits into an inner factor at ``stride`` and an outer one at
    max(stride, s_pp)·p. With pp placed outermost (the default) s_pp is the whole domain: one factor."""
    return expert_factors(members, stride, *pipeline_bounds(plan))


def expert_factors(members: Num, stride: Num, below: Num, above: Num) -> Layout:
    """``expert_layout`` from the pipeline's bounds (s_pp, s_pp·p)."""
    inner = minimum(members, maximum(1, floor_div(below, stride)))
    return ((inner, stride), (members / inner, maximum(stride, below) * (above / below)))


def axis_layout(plan: Plan, axis: str) -> Layout:
    """How a collective's group sits on the ranks (plan.py placement; comm.split_group): a stride, or strided
    factors for groups that are not evenly strided (the dp·cp gradient group, expert groups; pipeline sends:
    ``send_stride``)."""
    if axis in ("tp", "tp2", "cp"):
        return plan.stride(axis)
    if axis == "pp":
        return send_stride(plan.stride("pp"), plan.pp)
    if axis == "dp":  # gradients are reduced over dp·cp together, wherever the two axes are placed
        return ((plan.cp, plan.stride("cp")), (plan.dp, plan.stride("dp")))
    if axis == "ep":
        return expert_layout(plan, plan.ep, plan.etp)
    if axis == "etp_ep":  # the all-gather dispatcher's group: etp innermost, then ep (cost/moe_permute.py)
        return expert_layout(plan, plan.etp * plan.ep, 1)
    if axis == "edp":
        return expert_layout(plan, plan.tp * plan.cp * plan.dp / (plan.ep * plan.etp), plan.ep * plan.etp)
    return 1


def zero_layouts(plan: Plan) -> tuple[Layout, Layout, Layout, Layout]:
    """Where the ZeRO groups smaller than the data-parallel ranks sit (cost/zero_group.py): (a dense weight's ZeRO
    group, its instances, an expert weight's ZeRO group, its instances). With I = ``distributed_optimizer_instances``
    the group is the inner dp·cp/I ranks of the dp·cp group, cp whole and the inner dp/I (Megatron-Core 0.16.1
    parallel_state.py: contiguous slices of the dp-cp group's ranks, cp innermost; InternEvo's zero1 groups, the
    inner data-parallel ranks at stride tp), and the I instances stride past it; the expert groups alike, in the
    expert rank order. I = 1: the group is ``axis_layout``'s dp (edp), the instances a single rank."""
    i = plan.distributed_optimizer_instances
    below, dp_stride = plan.dp / i, plan.stride("dp")
    experts, ep_etp = plan.tp * plan.cp * plan.dp / (plan.ep * plan.etp), plan.ep * plan.etp
    return (((plan.cp, plan.stride("cp")), (below, dp_stride)), dp_stride * below,
            expert_layout(plan, experts / i, ep_etp), expert_layout(plan, i, ep_etp * experts / i))


def axis_tiers(plan: Plan, cluster: Cluster) -> dict[str, str]:
    """For each parallel axis of more than one GPU (the dense axes in placement order, then ep): the innermost mesh
    tier whose blocks hold each of its groups whole (``block_members`` of the group over that tier's span: all of
    them), by the tier's name: where its collectives (tp, cp, ep), its sends (the pipeline's stages) or its gradient
    reduction (dp) run. The outermost tier holds every group."""
    groups: dict[str, tuple[int, Layout]] = {a: (getattr(plan, a), plan.stride(a)) for a in plan.placement}
    groups["ep"] = (plan.ep, expert_layout(plan, plan.ep, plan.etp))
    out, spans, span = {}, [], 1
    for tier in cluster.tiers:
        span *= tier.size
        spans.append(span)
    for axis, (size, layout) in groups.items():
        if size > 1:
            inner = next((i for i, s in enumerate(spans[:-1]) if block_members(size, layout, s) >= size),
                         len(spans) - 1)
            out[axis] = cluster.tiers[inner].name
    return out
