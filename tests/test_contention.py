"""contention.py: the data-parallel collectives share a tier's bandwidth with the layers' own traffic where both
span it and overlap, and only there."""

from __future__ import annotations

import random

import pytest

from meshplan.channels import Collectives, Offload, Passes, dp_collectives, step_channels
from meshplan.contention import contended, layer_tiers, shared_collectives, tier_bandwidth_terms
from meshplan.cost.params import stage_params
from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import build_cluster, load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan

SD = 0.189


def test_two_flows_on_one_link_show_their_arithmetic():
    # a pass of T' = 10 s whose layer traffic is C = 4 s (exposed or hidden); D = 5 s of DP collectives, S = 2 s of
    # them on the tier the layer traffic uses. Max-min fair: each flow at half rate while both are in flight, so
    # both wait min(C, S) = 2 s: T' -> 12 s, D -> 7 s
    assert contended(10.0, 4.0, 5.0, 2.0) == (12.0, 7.0)
    # S larger than the layer traffic: each waits for the smaller flow only, C = 4 s
    assert contended(10.0, 4.0, 9.0, 8.0) == (14.0, 13.0)
    # nothing shared: nothing moves
    assert contended(10.0, 4.0, 5.0, 0.0) == (10.0, 5.0)


def test_a_pass_with_a_shared_tier_is_never_faster_and_equal_without_one():
    """step_channels with the collectives' shared seconds S against without: the step's DP term never shrinks, grows
    by min(C, S) on each pass that carries DP traffic, and is unchanged for S = 0."""
    rng = random.Random(50)
    for _ in range(300):
        k_f, k_b = rng.uniform(0.1, 2), rng.uniform(0.2, 4)
        h_f, h_b = rng.uniform(0, k_f), rng.uniform(0, k_b)
        p = Passes(t_f=k_f + rng.uniform(0, 1), t_b=k_b + rng.uniform(0, 2), k_f=k_f, k_b=k_b, h_f=h_f, h_b=h_b,
                   c_f=h_f + rng.uniform(0, 1), c_b=h_b + rng.uniform(0, 2))
        c = Collectives(*(rng.uniform(0, 3) for _ in range(3)))
        s = Collectives(*(x * rng.uniform(0, 1) for x in c))
        m = rng.randint(1, 8)
        alone = step_channels(p, m, c, (0, 1, 2, 3), Offload(), SD, True)
        shared = step_channels(p, m, (c, s), (0, 1, 2, 3), Offload(), SD, True)
        none = step_channels(p, m, (c, Collectives(0.0, 0.0, 0.0)), (0, 1, 2, 3), Offload(), SD, True)
        for zero in (0, 1, 2, 3):
            assert none[zero] == alone[zero]
            assert shared[zero][0] >= alone[zero][0] - 1e-12
        # ZeRO-0: one all-reduce beside the last backward: the pass grows by min(C, S), and the collectives' longer
        # overlap may slow a little more of its compute (channels.py's σ·min(H + D, K))
        grown = shared[0][0] - alone[0][0] - min(p.c_b, s.all_reduce)
        assert -1e-12 <= grown <= SD * s.all_reduce + 1e-12


@pytest.mark.parametrize("factor", [0.5, 0.9])
def test_a_faster_link_never_slows_a_contended_pass(factor):
    """Every communication time scaled down (a faster link): the contended pass's T'' and D'' never grow."""
    rng = random.Random(7)
    for _ in range(500):
        k, c, d = rng.uniform(0.1, 5), rng.uniform(0, 3), rng.uniform(0, 6)
        s = d * rng.uniform(0, 1)
        exposed = c * rng.uniform(0, 1)
        t, dd = contended(k + exposed, c, d, s)
        t2, dd2 = contended(k + factor * exposed, factor * c, factor * d, factor * s)
        assert t2 <= t + 1e-12 and dd2 <= dd + 1e-12


def test_tier_bandwidth_terms_are_comm_s_hierarchical_terms():
    # a reduce-scatter of 1 GB over 4 GPUs of a node x 2 nodes on H100s: (4-1)/4 · 1 GB / B_0 on NVLink, then
    # (2-1)/2 · (1 GB / 4) / B_1 across nodes; an all-reduce twice each
    cluster = build_cluster(*_system("h100"), 16)
    b0, b1 = (t.bandwidth * DEFAULT.link(i) for i, t in enumerate(cluster.tiers))
    rs = tier_bandwidth_terms("reduce_scatter", 1e9, [4, 2], cluster, DEFAULT)
    assert rs == pytest.approx([0.75e9 / b0, 0.5 * 0.25e9 / b1])
    assert tier_bandwidth_terms("all_reduce", 1e9, [4, 2], cluster, DEFAULT) == pytest.approx([2 * x for x in rs])


def _system(name: str):
    s = load_system(name)
    return s.name, s.accelerator, s.network


def test_only_a_tier_both_span_is_shared():
    model = load_model("llama3-8b")
    cluster = build_cluster(*_system("h100"), 16)  # two nodes of 8
    # tp = 8 fills NVLink, dp = 2 across the nodes: the layers' traffic on tier 0, the gradients' on tier 1
    apart = Plan(dp=2, tp=8, global_batch=64, zero=1)
    assert layer_tiers(cluster, apart) == [1.0, 0.0]
    params = stage_params(model, apart, True)
    full = dp_collectives(model, cluster, apart, params, DEFAULT)
    assert shared_collectives(model, cluster, apart, params, DEFAULT, full) == (0.0, 0.0, 0.0)
    # tp = 2 beside dp = 8 (4 of them in each node): both on NVLink, the reduce-scatter's tier-0 term is shared
    beside = Plan(dp=8, tp=2, global_batch=64, zero=1)
    params = stage_params(model, beside, True)
    full = dp_collectives(model, cluster, beside, params, DEFAULT)
    shared = shared_collectives(model, cluster, beside, params, DEFAULT, full)
    terms = tier_bandwidth_terms("reduce_scatter", params.total * beside.grad_bytes, [4, 2], cluster, DEFAULT)
    assert shared[2] == pytest.approx(terms[0]) and 0 < shared[2] < full.scatter


def test_a_step_whose_tiers_are_shared_is_slower_than_its_congestion_free_price():
    """tp = 2 beside dp = 4 in one H100 node (ZeRO-1, gradients reduce-scattered beside the last backward): the DP
    term grows by the tier's shared wait, and the step with it; the same plan's data-parallel traffic across nodes
    (tp = 8, dp = 2) has no shared tier and the same step as without contention pricing."""
    model = load_model("llama3-8b")
    cluster = build_cluster(*_system("h100"), 8)
    plan = Plan(dp=4, tp=2, global_batch=32, zero=1, sequence_parallel=True)
    e = estimate(model, cluster, plan)
    params = stage_params(model, plan, True)
    full = dp_collectives(model, cluster, plan, params, DEFAULT)
    shared = shared_collectives(model, cluster, plan, params, DEFAULT, full)
    b0 = cluster.tiers[0].bandwidth * DEFAULT.link(0)
    n = params.total * plan.grad_bytes  # the whole stage's gradients, reduce-scattered over dp = 4 on NVLink
    assert shared[2] == pytest.approx(3 / 4 * n / b0)
    assert e.step_time > 0 and e.breakdown["dp"] > 0
