"""Link contention: the data-parallel collectives and the layers' own traffic on a tier they share.

A pass's layer-level traffic (tensor-, context- and expert-parallel collectives, the pipeline's sends) and the
data-parallel collectives that overlap it (channels.py, ``stack.overlap_dp``: the gradient reduce-scatter or
all-reduce beside the backward, the parameter all-gather beside the forward) each keep their link busy; where their
groups span the same tier (data parallelism inside the NVLink domain beside tensor parallelism; gradients and pipeline
sends both across nodes), they are two flows on one link. A fluid model of that link (the congestion-aware treatment
of network simulators: Won et al. 2023, "ASTRA-sim2.0", §4.2, flows sharing a link at its bandwidth; Wang et al. 2024,
"SimAI", NS-3 backend; Bertsekas & Gallager 1992, "Data Networks", §6.5.2, max-min fair rates): while both are in
flight the link carries bytes_a + bytes_b at its bandwidth, each flow at half of it, so two flows of a and b seconds
(alone) that start together end at a + min(a, b) and b + min(a, b). Per pass, symbols as channels.py's:
    C   the pass's layer traffic at its collectives' and sends' own seconds (step.passes.PassTimes.traffic_f /
        traffic_b), exposed or hidden under its kernels alike, however the overlap rules split it
    S   the seconds of the pass's data-parallel collectives on the tiers the layer traffic also spans (their
        bandwidth terms there, ``shared_collectives``): 0 where the groups sit on different tiers
Contended, both flows wait for the smaller one on the shared tier:
    T' → T' + min(C, S)        D → D + min(C, S)
so the pass, max(T', D) and the rest of channels.py's X, grows by min(C, S). The layer traffic's wait is taken as
exposed whether the traffic was hidden or not (an upper bound: a hidden collective's stretch may still fit under its
kernels); so the wait does not depend on how the overlap rules split the traffic, and faster kernels, which expose
traffic they hid, never lengthen a pass. The flows are taken to start together, as the gradient buckets of the last
backward start while its layers' collectives run (Megatron-Core overlap_grad_reduce); latency terms do not share
(only bytes do). Where no tier is shared S = 0 and nothing moves; C and S are sums of collectives' times, which never
shrink when a rate drops, so a faster link or GPU never slows a step (tests/test_contention.py,
tests/test_properties.py). The congestion-unaware model (each collective at the full link rate, as ASTRA-sim's
analytical backend) is S = 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from meshplan.comm import Layout, split_group
from meshplan.cost.params import StageParams, trainable
from meshplan.groups import axis_layout, expert_layout
from meshplan.memory import WEIGHT_BYTES
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.xp import Num, maximum, minimum


def layer_groups(plan: Plan) -> list[tuple[Num, Layout]]:
    """The groups of a pass's layer-level traffic, (size, layout): tp, tp2 (2D layouts), cp, the expert groups
    (ep, and etp·ep: the all-gather dispatcher's) and the pipeline's sends (two neighbours, when p > 1)."""
    return [(plan.tp, axis_layout(plan, "tp")), (plan.tp2, plan.stride("tp2")), (plan.cp, axis_layout(plan, "cp")),
            (plan.ep, expert_layout(plan, plan.ep, plan.etp)), (plan.etp * plan.ep, axis_layout(plan, "etp_ep")),
            (1 + (plan.pp > 1), axis_layout(plan, "pp"))]


def layer_tiers(cluster: Cluster, plan: Plan) -> list[Num]:
    """Per tier, 1 where some layer-level group spans it (more than one member there, ``comm.split_group``), else 0."""
    spans: list[Num] = [0.0] * len(cluster.tiers)
    for size, layout in layer_groups(plan):
        for i, part in enumerate(split_group(cluster, size, layout)):
            spans[i] = maximum(spans[i], 1.0 * (part > 1))
    return spans


def tier_bandwidth_terms(kind: str, nbytes: Num, parts: Sequence[Num], cluster: Cluster, eff: Efficiency
                         ) -> list[Num]:
    """The bandwidth term on each tier of a hierarchical ``kind`` (comm.py): (g_i − 1)/g_i · n_i / B_i for a
    reduce-scatter or an all-gather, twice that for an all-reduce (its reduce-scatter and all-gather), with
    n_i = n / Π_{j<i} g_j."""
    terms: list[Num] = []
    remaining = nbytes
    for i, (g, tier) in enumerate(zip(parts, cluster.tiers, strict=True)):
        one = (g - 1) / g * remaining / (tier.bandwidth * eff.link(i))
        terms.append(2 * one if kind == "all_reduce" else one)
        remaining = remaining / g
    return terms


def shared_collectives(model: ModelSpec, cluster: Cluster, plan: Plan, params: StageParams, eff: Efficiency,
                       full: Sequence[Num]) -> tuple[Num, Num, Num]:
    """S of the module docstring for each data-parallel collective (all-reduce, all-gather, reduce-scatter) of a
    rank holding ``params``, priced ``full`` by channels.dp_collectives: its bandwidth terms on the tiers a
    layer-level group also spans, at most the collective's own time. A parameter server's exchange runs on the
    network tier (channels.ps_push)."""
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

    def one(kind: str, per_param: int) -> Num:
        total: Num = 0.0
        for count, group, layout in groups:
            parts = split_group(cluster, group, layout)
            for span, term in zip(spans, tier_bandwidth_terms(kind, count * per_param, parts, cluster, eff),
                                  strict=True):
                total = total + span * term
        return total

    shared = (one("all_reduce", plan.grad_bytes), one("all_gather", WEIGHT_BYTES),
              one("reduce_scatter", plan.grad_bytes))
    return minimum(shared[0], full[0]), minimum(shared[1], full[1]), minimum(shared[2], full[2])


def contended(bare: Num, traffic: Num, d: Num, shared: Num) -> tuple[Num, Num]:
    """(T'', D'') of a pass (T' = ``bare``) whose data-parallel collectives (``d`` seconds, ``shared`` of them on the
    tiers the layer traffic also uses) overlap its layer traffic (``traffic``: C seconds): both wait
    min(C, S) (module docstring). ``shared`` the float 0.0: unchanged."""
    if type(shared) is float and shared == 0.0:
        return bare, d
    wait = minimum(maximum(traffic, 0.0), shared)
    return bare + wait, d + wait


def any_shared(c: Sequence[Num]) -> bool:
    """Whether any collective has seconds on a shared tier (for one plan, or any plan of a batch)."""
    return any(not (type(x) is float and x == 0.0) and bool(np.any(x)) for x in c)
