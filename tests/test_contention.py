"""contention.py: the data-parallel collectives share a tier's bandwidth with the layers' own traffic where both
span it and overlap, and only there."""

from __future__ import annotations

import random

import pytest

from meshplan.collectives.contention import contended, layer_tiers, tier_bandwidth_terms
from meshplan.cost.params import stage_params
from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import build_cluster, load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.step.channels import Collectives, Offload, Passes, dp_collectives, step_channels
from meshplan.step.shared_links import shared_collectives

SD = 0.189


def test_two_flows_on_one_link_show_their_arithmetic():
    # a pass of X = 10 s whose layer traffic is C = 4 s (exposed or hidden, spread over the pass); D = 5 s of DP
    # collectives from its start, S = 2 s of them on the tier the layer traffic uses. Beside the collectives' 5 s run
    # C·D/T' = 2 s of layer traffic; max-min fair, each flow at half rate while both are in flight: both wait
    # min(S, 2) = 2 s
    assert contended(10.0, 4.0, 5.0, 2.0) == pytest.approx(2.0)
    # S = 3 s: the 2 s of layer traffic beside them is the smaller
    assert contended(10.0, 4.0, 5.0, 3.0) == pytest.approx(2.0)
    # D beyond the pass: all of C overlaps it, min(S, C) = 4 s
    assert contended(10.0, 4.0, 12.0, 8.0) == pytest.approx(4.0)
    # nothing shared: nothing moves
    assert contended(10.0, 4.0, 5.0, 0.0) == 0.0


def test_a_pass_with_a_shared_tier_is_never_faster_and_equal_without_one():
    """step_channels with the collectives' shared seconds S against without: the step's DP term never shrinks, grows
    by W on each pass that carries DP traffic, and is unchanged for S = 0."""
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
        # ZeRO-0: one all-reduce beside the last backward: the pass grows by W, the collectives' wait
        whole = p.t_b + alone[0][0]  # X: the last backward with its all-reduce (no copies)
        wait = min(s.all_reduce, min(p.c_b, whole) * min(c.all_reduce, whole) / whole)
        assert shared[0][0] == pytest.approx(alone[0][0] + wait)


@pytest.mark.parametrize("factor", [0.5, 0.9])
def test_a_faster_link_or_gpu_never_slows_a_contended_pass(factor):
    """Every communication time scaled down (a faster link): W never grows; the compute scaled down (a faster GPU,
    X shrinking, never below C): X + W never grows."""
    rng = random.Random(7)
    for _ in range(500):
        c, d = rng.uniform(0, 3), rng.uniform(0, 6)
        s = d * rng.uniform(0, 1)
        exposed = c * rng.uniform(0, 1)
        k = c - exposed + rng.uniform(0.1, 5)  # the hidden traffic fits under the kernels: C <= T'
        w = contended(k + exposed, c, d, s)
        assert contended(k + factor * exposed, factor * c, factor * d, factor * s) <= w + 1e-12
        slow = k + exposed
        fast = max(c, factor * slow)  # faster kernels: T' shrinks, never below the traffic C it carries
        assert fast + contended(fast, c, d, s) <= slow + w + 1e-12


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
