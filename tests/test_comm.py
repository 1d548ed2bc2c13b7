"""Collectives under the α-β model, hand-computed (Thakur et al. 2005; NCCL PERFORMANCE.md)."""

from __future__ import annotations

import pytest

from meshplan.collectives.comm import all_reduce_traffic, bus_factor, ring_hops, split_group
from meshplan.collectives.price import collective_time
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Accelerator, Cluster, Tier

PERFECT = Efficiency(nvlink=1.0, network=1.0)


def cluster(domain: int, domains: int, nv_bw=100e9, net_bw=10e9, nv_lat=1e-6, net_lat=5e-6) -> Cluster:
    acc = Accelerator(name="x", peak_flops={"bf16": 1e15}, hbm_bytes=80e9, hbm_bandwidth=2e12,
                      nvlink_bandwidth=nv_bw)
    return Cluster(name="c", accelerator=acc, num_gpus=domain * domains,
                   tiers=(Tier(name="nvlink", size=domain, bandwidth=nv_bw, latency=nv_lat),
                          Tier(name="network", size=domains, bandwidth=net_bw, latency=net_lat)))


def test_split_group_by_stride():
    c = cluster(8, 16)
    assert split_group(c, 8, 1) == [8, 1]  # tp=8 inside a node
    assert split_group(c, 16, 8) == [1, 16]  # dp across nodes, stride 8
    assert split_group(c, 16, 2) == [4, 4]  # 4 members per node, 4 nodes
    assert split_group(c, 1, 1) == [1, 1]


def test_all_reduce_inside_nvlink_is_nccls_fastest_protocol():
    # protocols.py (NCCL v2.12.12-1 tuning.cc), 8 ranks at 100 GB/s: 1 GB is Simple's 8.4 + 2·7·3.4 = 56 µs + 2·7/8 ·
    # 1e9/1e11 = 17.5 ms (LL128: 10 + 14·1.9 = 36.6 µs + 17.5 / 0.92 = 19.02 ms)
    t = collective_time("all_reduce", 1e9, 8, 1, cluster(8, 2), PERFECT)
    assert t == pytest.approx(56e-6 + 0.0175)
    # 1 KB: LL's 3.6 + 14·0.47 = 10.18 µs + 1.75 · 1e3 / (1e11 / 4) = 0.07 µs (Simple: 56 µs + 0.0175 µs)
    t = collective_time("all_reduce", 1e3, 8, 1, cluster(8, 2), PERFECT)
    assert t == pytest.approx(10.18e-6 + 1.75e3 / 25e9)


def test_small_all_reduce_beyond_tier_0_takes_the_tree():
    # 1 KB on 16 ranks one per node (α-β beyond tier 0): ring 2·15·5 µs = 150 µs; tree 2·4·5 µs + 2n/B = 40 µs +
    # 0.2 µs; and NCCL's base latency 8.4 µs once
    t = collective_time("all_reduce", 1e3, 16, 1, cluster(1, 16), PERFECT)
    assert t == pytest.approx(40e-6 + 2e3 / 10e9 + 8.4e-6)


def test_hierarchical_all_reduce_across_nodes():
    # group 16 = 8 per node × 2 nodes: ring RS+AG in the node on n, then across nodes on n/8
    n = 8e9
    inner = 2 * (7 * 1e-6 + 7 / 8 * n / 100e9)
    outer = 2 * (1 * 5e-6 + 1 / 2 * (n / 8) / 10e9)
    base = 8.4e-6  # NCCL's Simple-protocol base latency, once per call of a group that leaves the node
    assert collective_time("all_reduce", n, 16, 1, cluster(8, 2), PERFECT) == pytest.approx(base + inner + outer)
    # inside the node NCCL's Simple protocol: 8.4 + 14·3.4 = 56 µs + the same bytes (protocols.py)
    assert collective_time("all_reduce", n, 8, 1, cluster(8, 2), PERFECT) == pytest.approx(
        56e-6 + 2 * 7 / 8 * n / 100e9)


def test_all_gather_and_reduce_scatter_are_half_an_all_reduce_ring():
    # inside the node (protocols.py): Simple's 8.4 + 7·3.4 = 32.2 µs + 7/8 · 1e9 / 1e11 (LL128: 23.3 µs + 9.51 ms)
    c = cluster(8, 1)
    ag = collective_time("all_gather", 1e9, 8, 1, c, PERFECT)
    assert ag == pytest.approx(32.2e-6 + 7 / 8 * 1e9 / 100e9)
    assert collective_time("reduce_scatter", 1e9, 8, 1, c, PERFECT) == ag


def test_all_gather_across_nodes_is_one_ring_whose_every_member_is_a_latency_step():
    """16 ranks, 8 per node: NCCL's ring visits all 16, so 14 hops stay on NVLink and 1 crosses the network
    (tuning.cc: (nsteps - nInterSteps)·intraLat + nInterSteps·interLat, nInterSteps = nNodes - 1), while its
    channels leave each node through different NICs, so only n/8 of the bytes cross it per GPU."""
    n = 8e9
    latency = 8.4e-6 + 14 * 1e-6 + 1 * 5e-6  # NCCL's base latency once per call, then the ring's hops
    bytes_time = 7 / 8 * n / 100e9 + 1 / 2 * (n / 8) / 10e9
    c = cluster(8, 2)
    assert collective_time("all_gather", n, 16, 1, c, PERFECT) == pytest.approx(latency + bytes_time)
    assert collective_time("reduce_scatter", n, 16, 1, c, PERFECT) == pytest.approx(latency + bytes_time)
    # 512 ranks on 64 nodes: 448 NVLink hops and 63 network hops, against 7 + 63 for a two-level scheme
    assert ring_hops([8, 64]) == [448, 63]
    assert ring_hops([8, 2]) == [14, 1] and ring_hops([8, 1]) == [7, 0] and ring_hops([1, 16]) == [0, 15]


def test_all_to_all_is_limited_by_the_slowest_tier():
    # 16 ranks, 8 per node: 7/16 of the bytes stay on NVLink, 8/16 leave through the NIC
    n = 1.6e9
    t = collective_time("all_to_all", n, 16, 1, cluster(8, 2), PERFECT)
    assert t == pytest.approx(7 * 1e-6 + 1 * 5e-6 + max(n * 7 / 16 / 100e9, n * 8 / 16 / 10e9))


def test_group_of_one_costs_nothing():
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "p2p"):
        assert collective_time(kind, 1e9, 1, 1, cluster(8, 2)) == 0


def test_bus_bandwidth_factors():
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bus_factor("all_gather", 8) == 7 / 8
    assert bus_factor("broadcast", 8) == 1


def test_seed_001_all_reduce_volume():
    # bandwidth-optimal reduce-scatter + multicast: 3(p-1)/p · n
    assert all_reduce_traffic(1000, 4, "multicast") == 3 * 3 / 4 * 1000
    assert all_reduce_traffic(1000, 4, "ring") == 4 * 3 / 4 * 1000


def test_more_bandwidth_is_never_slower():
    for kind in ("all_reduce", "all_gather", "all_to_all", "p2p"):
        slow = collective_time(kind, 1e8, 32, 1, cluster(8, 4, net_bw=10e9))
        fast = collective_time(kind, 1e8, 32, 1, cluster(8, 4, net_bw=20e9))
        assert fast <= slow


def test_a_group_straddling_an_nvlink_domain_that_it_does_not_divide():
    """Tensor parallelism of 16 on two 72-GPU racks: the groups start at 0, 16, …, 64; ranks 64–79 sit 8 in
    each rack, so the worst group (which paces the step) is 8 on NVLink × 2 over the network: gcd(16, 72) = 8.
    A group that divides the rack stays inside it; a stride the rack cannot hold puts every member alone."""
    from meshplan.collectives.comm import tier_members

    racks = cluster(72, 2, nv_bw=900e9, net_bw=50e9)
    assert split_group(racks, 16, 1) == [8, 2]
    assert split_group(racks, 8, 1) == [8, 1]  # 72 = 9 groups of 8
    assert split_group(racks, 2, 72) == [1, 2]
    assert tier_members(4, 16, 72) == 1  # extent 64: gcd(64, 72) = 8 < one stride of 16
    whole = collective_time("all_reduce", 1e9, 16, 1, racks)
    inside = collective_time("all_reduce", 1e9, 8, 1, racks)
    assert whole > 2 * inside  # the half that crosses racks costs more than all of one rack's NVLink ring


def test_a_group_of_two_strided_factors_multiplies_their_members():
    """The dp·cp gradient group with cp = 2 at stride 1 and dp = 4 at stride 8 (pp = 4 between them) on 8-GPU
    servers: per server 2 (cp) × 1 (dp stride 8 leaves the server) = 2 members, so [2, 4]; with the axes
    adjacent (dp at stride 2) it is the contiguous group of 8: [8, 1]."""
    from meshplan.collectives.comm import block_members

    servers = cluster(8, 8)
    assert split_group(servers, 8, ((2, 1), (4, 8))) == [2, 4]
    assert split_group(servers, 8, ((2, 1), (4, 2))) == split_group(servers, 8, 1) == [8, 1]
    assert block_members(8, ((2, 1), (4, 8)), 64) == 8


def test_the_batched_split_equals_the_scalar_one():
    """``tier_members`` on arrays (the search's: the lowest-set-bit gcd for power-of-two spans, np.gcd otherwise)
    gives what it gives for each plan alone (math.gcd), fractional send strides included."""
    import numpy as np

    from meshplan.collectives.comm import tier_members

    rng = np.random.default_rng(1)
    groups = rng.choice([1, 2, 3, 4, 6, 8, 16], 2000)
    strides = rng.choice([1, 2, 3, 4, 8, 12, 16, 64], 2000) * rng.choice([1.0, 1.5], 2000)
    for span in (1, 2, 8, 64, 72, 576):
        batched = tier_members(groups, strides, span)
        assert batched.tolist() == [tier_members(int(g), float(s), span) for g, s in zip(groups, strides, strict=True)]


def test_nccl_base_latency_where_its_tuner_prices_the_call():
    """Beyond the node every call of a collective NCCL's tuner prices pays the Simple protocol's 8.4 us base latency
    (tuning.cc baseLat); all-to-all and p2p, which it does not price, keep their per-step alpha only. An
    8-byte all-reduce over 2 x 8 GPUs: 8.4 us, then the node's tree (2 log2(8) steps of 1 us, 2 n/B), then the ring of
    the 1 byte left across the 2 nodes (2 steps of 5 us, 2 (1/2) n / B)."""
    c = cluster(8, 2)
    assert collective_time("all_reduce", 8, 16, 1, c, PERFECT) == pytest.approx(
        8.4e-6 + (6e-6 + 16 / 100e9) + (10e-6 + 1 / 10e9))
    # broadcast: NCCL's ring over 16 ranks, 14 hops inside the nodes (1 us) and 1 between them (5 us); 8 bytes over
    # NVLink, 8 / 8 through the node's 8 NICs (comm._scatter_gather, whole)
    assert collective_time("broadcast", 8, 16, 1, c, PERFECT) == pytest.approx(
        8.4e-6 + 14e-6 + 5e-6 + 8 / 100e9 + 1 / 10e9)
    assert collective_time("all_to_all", 8, 16, 1, c, PERFECT) == pytest.approx(7e-6 + 5e-6 + 8 * 8 / 16 / 10e9)
    assert collective_time("p2p", 8, 2, 8, c, PERFECT) == pytest.approx(5e-6 + 8 / 10e9)
