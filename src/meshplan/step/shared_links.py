"""The data-parallel collectives' seconds on the tiers a pass's layer traffic also uses: S of the link-contention
model (collectives/contention.py), for a rank holding given parameters; the link physics (which tiers the layer
traffic spans, each tier's bandwidth term) is the collectives package's, the parameters and gradient bytes the
step's."""

from __future__ import annotations

from collections.abc import Sequence

from meshplan.collectives.comm import Layout, split_group
from meshplan.collectives.contention import layer_tiers, tier_bandwidth_terms
from meshplan.collectives.groups import axis_layout
from meshplan.cost.params import StageParams, trainable
from meshplan.memory import WEIGHT_BYTES
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.xp import Num, minimum


def shared_collectives(model: ModelSpec, cluster: Cluster, plan: Plan, params: StageParams, eff: Efficiency,
                       full: Sequence[Num]) -> tuple[Num, Num, Num]:
    """S of the module docstring for each data-parallel collective (all-reduce, all-gather, reduce-scatter) of a
    rank holding ``params``, priced ``full`` by channels.dp_collectives: its bandwidth terms on the tiers a
    layer-level group also spans, at most the collective's own time. A parameter server's exchange runs on the
    network tier (param_server.ps_push).

    TODO: at ``distributed_optimizer_instances`` I > 1 the collectives run within a ZeRO group and across its
    instances (step/param_sync.dp_groups), but their contention is still priced over the whole dp·cp group here."""
    spans = layer_tiers(cluster, plan)
    if all(type(s) is float and s == 0.0 for s in spans):
        return 0.0, 0.0, 0.0
    if plan.dp_mode == "ps":
        share = spans[-1]
        return share * full[0], share * full[1], share * full[2]
    params = trainable(params, plan)
    groups: list[tuple[Num, Num, Layout]] = [(params.dense, plan.dp * plan.cp, axis_layout(plan, "dp"))]
    if model.is_moe:
        groups.append((params.expert, plan.tp * plan.cp * plan.dp / (plan.ep * plan.etp), axis_layout(plan, "edp")))

    split = [(count, split_group(cluster, group, layout)) for count, group, layout in groups]  # once for the kinds

    def one(kind: str, per_param: int) -> Num:
        total: Num = 0.0
        for count, parts in split:
            for span, term in zip(spans, tier_bandwidth_terms(kind, count * per_param, parts, cluster, eff),
                                  strict=True):
                total = total + span * term
        return total

    shared = (one("all_reduce", plan.grad_bytes), one("all_gather", WEIGHT_BYTES),
              one("reduce_scatter", plan.grad_bytes))
    return minimum(shared[0], full[0]), minimum(shared[1], full[1]), minimum(shared[2], full[2])
