"""Seed 004's parameter server, minimum-spanning-tree collectives and CPU weight offload (issue 50 item 4): the
formulas by hand, the plan options, and the search's choice (a new option never makes the best plan slower)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from meshplan.collectives.comm import fastest_time, mst_time, split_group, split_time
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Accelerator, Cluster, Tier, build_cluster, load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.param_server import ps_push

PERFECT = Efficiency(nvlink=1.0, network=1.0)
ANY = load_stack("any")


def two_tiers(domain: int = 8, domains: int = 4) -> Cluster:
    acc = Accelerator(name="x", peak_flops={"bf16": 1e15}, hbm_bytes=80e9, hbm_bandwidth=2e12, nvlink_bandwidth=100e9)
    return Cluster(name="c", accelerator=acc, num_gpus=domain * domains,
                   tiers=(Tier(name="nvlink", size=domain, bandwidth=100e9, latency=1e-6),
                          Tier(name="network", size=domains, bandwidth=10e9, latency=5e-6)))


def test_mst_broadcast_wins_small_messages_and_loses_large_ones():
    c = two_tiers()
    parts = split_group(c, 8, 1)  # 8 ranks inside the NVLink domain
    # 1 KB: MST ⌈log2 8⌉·(α + n/B) = 3·(1 µs + 10 ns) = 3.03 µs; the chain (g-1)·α + n/B = 7 µs + 10 ns
    small = 1e3
    assert mst_time("broadcast", small, parts, c, PERFECT) == pytest.approx(3 * (1e-6 + small / 100e9))
    assert fastest_time("broadcast", small, 8, parts, c, PERFECT) == pytest.approx(3.03e-6)
    # (NCCL's own broadcast, split_time inside tier 0, is its LL protocol: 3.6 + 8·0.47 µs + n / (B/3), protocols.py;
    # MPICH's choice compares the α-β chain with the tree, not NCCL's protocols)
    assert split_time("broadcast", small, 8, parts, c, PERFECT) == pytest.approx(7.36e-6 + 3 * small / 100e9)
    # 100 MB: MST 3·(1 µs + 1 ms) = 3.003 ms; the chain 7 µs + 1 ms: the chain is the faster
    big = 1e8
    assert fastest_time("broadcast", big, 8, parts, c, PERFECT) == pytest.approx(7e-6 + 1e-3)


def test_mst_all_gather_by_hand_and_never_slower_than_the_ring_when_chosen():
    c = two_tiers()
    parts = split_group(c, 4, 1)  # 4 ranks on NVLink
    n = 4e3
    # gather + broadcast: 2⌈log2 4⌉·α + 3/4·n/B + 2·n/B = 4 µs + 5.5·n/(4·B)... by hand: 4e-6 + 30 ns + 80 ns
    assert mst_time("all_gather", n, parts, c, PERFECT) == pytest.approx(4e-6 + 0.75 * n / 100e9 + 2 * n / 100e9)
    ring = 3e-6 + 0.75 * n / 100e9  # the α-β ring: 3 hops · 1 µs + 3/4 · n/B
    # the ring's 3 hops beat the tree's 4 steps
    assert fastest_time("all_gather", n, 4, parts, c, PERFECT) == pytest.approx(ring)
    assert math.isinf(mst_time("all_to_all", n, parts, c, PERFECT))


def test_parameter_server_push_by_hand():
    c = two_tiers()
    plan = Plan(dp=32)  # 32 GPUs push
    n = 1e9
    # one server per GPU: α + n/B = 5 µs + 0.1 s; 8 servers: each takes 32·n/8, α + 4·n/B
    assert ps_push(c, plan, n, PERFECT) == pytest.approx(5e-6 + 0.1)
    assert ps_push(c, replace(plan, servers=8), n, PERFECT) == pytest.approx(5e-6 + 0.4)
    assert ps_push(c, replace(plan, servers=64), n, PERFECT) == pytest.approx(5e-6 + 0.1)  # at most the worker link


H100 = load_system("h100")


def _cluster(n: int, **net: float) -> Cluster:
    return build_cluster(H100.name, H100.accelerator, replace(H100.network, **net), n)


def test_parameter_server_fewer_servers_is_slower_and_more_bandwidth_never_slower():
    model = load_model("llama3-8b")
    plan = Plan(dp=8, tp=8, global_batch=64, zero=0, dp_mode="ps")
    t = {s: estimate(model, _cluster(64), replace(plan, servers=s), ANY).step_time for s in (0, 16, 4)}
    assert t[0] < t[16] < t[4]  # 64 / S times the bytes through each server link
    net = H100.network
    wider = _cluster(64, nic_bandwidth=2 * net.nic_bandwidth)
    assert estimate(model, wider, replace(plan, servers=4), ANY).step_time <= t[4]


def test_weight_offload_keeps_two_layers_and_pays_the_host_link():
    model = load_model("llama3-8b")
    plan = Plan(dp=8, global_batch=64, zero=0)
    base, off = (estimate(model, _cluster(8), replace(plan, offload_weights=w), ANY) for w in (False, True))
    # 32 layers on the stage, 2 resident: 1/16 of the weights stay on the GPU, the rest in host memory
    assert off.memory["weights"] == pytest.approx(base.memory["weights"] / 16)
    assert off.host_memory == pytest.approx(base.memory["weights"] * 15 / 16)
    assert off.step_time > base.step_time  # the fetches (16 GB per pass at 55 GB/s) and the write-back
    faster = estimate(model, _cluster(8, host_bandwidth=4 * H100.network.host_bandwidth),
                      replace(plan, offload_weights=True), ANY)
    assert base.step_time <= faster.step_time <= off.step_time


def _best(model, cluster, **options) -> float:
    space = Space(global_batch=64, stack=ANY, prefer_simple=False, headroom=0.0, max_micro_batch=2, **options)
    return search(model, cluster, space, top_k=1, workers=1).plans[0].step_time


@pytest.mark.parametrize("options", [{"dp_modes": ("allreduce", "ps")}, {"offload_weights": (False, True)},
                                     {"collectives": ("nccl", "mst")}])
def test_a_new_option_never_makes_the_best_plan_slower(options):
    model, cluster = load_model("llama3-8b"), _cluster(16)
    assert _best(model, cluster, **options) <= _best(model, cluster) * (1 + 1e-9)


def test_the_search_picks_the_parameter_server_only_when_it_wins():
    model, cluster = load_model("llama3-8b"), _cluster(16)
    space = Space(global_batch=64, stack=ANY, prefer_simple=False, headroom=0.0, max_micro_batch=2,
                  dp_modes=("allreduce", "ps"), servers=1)  # one server for 16 GPUs: 16x the bytes through it
    best = search(model, cluster, space, top_k=1, workers=1).plans[0]
    assert best.plan.dp_mode == "allreduce" or best.plan.dp * best.plan.cp == 1
    with pytest.raises(Exception, match="dp_modes"):
        Space(global_batch=64, dp_modes=("ps",))  # Megatron-Core has no parameter server
