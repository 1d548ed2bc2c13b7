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
The data-parallel collectives start with the pass (the gradient buckets of the last backward while its layers'
collectives run: Megatron-Core overlap_grad_reduce; the parameter gathers with the forward) and are in flight for
min(D, X) of it, X the pass as channels.py prices it (its kernels, exposed traffic, the collectives' own exposure and
the offload copies'); the layer traffic is spread over the pass, so C·min(D, X)/X of it is in flight beside them. The
two flows on the shared tiers then wait for the smaller of the two overlapping volumes, and the pass with them:
    W = min(S, min(C, X)·min(D, X)/X)          X → X + W
The layer traffic's wait is taken as exposed whether the traffic was hidden or not (an upper bound: a hidden
collective's stretch may still fit under its kernels); so it does not depend on how the overlap rules split the
traffic, and faster kernels, which expose traffic they hid, never lengthen a pass. Latency terms do not share (only
bytes do). Where no tier is shared S = 0 and nothing moves. Monotone: C, D and S never shrink when a rate drops, X
never does (channels.py), and X + min(C, X)·min(D, X)/X never shrinks with X (its slope is 1 − C·D/X² ≥ 0 where
C, D ≤ X, else 1 or more), so a faster link or GPU never slows a step (tests/test_contention.py,
tests/test_properties.py). The congestion-unaware model (each collective at the full link rate, as ASTRA-sim's
analytical backend) is S = 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from meshplan.collectives.comm import Layout, split_group
from meshplan.collectives.groups import axis_layout, expert_layout
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.mesh import group_bandwidth
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
        one = (g - 1) / g * remaining / (group_bandwidth(tier, g) * eff.link(i))
        terms.append(2 * one if kind == "all_reduce" else one)
        remaining = remaining / g
    return terms


def contended(whole: Num, traffic: Num, d: Num, shared: Num) -> Num:
    """W of a pass (X = ``whole``) whose data-parallel collectives (``d`` seconds, ``shared`` of them on the tiers
    the layer traffic also uses) overlap its layer traffic (``traffic``: C seconds): min(S, min(C, X)·min(D, X)/X)
    (module docstring). ``shared`` the float 0.0: 0."""
    if type(shared) is float and shared == 0.0:
        return 0.0
    span = maximum(whole, 1e-30)
    return minimum(shared, minimum(traffic, span) * minimum(d, span) / span)


def any_shared(c: Sequence[Num]) -> bool:
    """Whether any collective has seconds on a shared tier (for one plan, or any plan of a batch)."""
    return any(not (type(x) is float and x == 0.0) and bool(np.any(x)) for x in c)
