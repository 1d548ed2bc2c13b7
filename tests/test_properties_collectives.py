"""The collective layer's physics over seeded random draws (as test_properties.py): every kind of collective
(comm.COLLECTIVES), 1 B to 1 TB, groups inside tier 0 and across two or three tiers, clusters with NCCL's protocol
constants and calibrated ones (protocols.py):
- more latency on any tier, or less bandwidth, never shortens a collective;
- inside tier 0 NCCL's protocol minimum never exceeds the Simple protocol alone;
- at large messages (100 GB to 1 TB) the protocol model is the bandwidth term f·n / busbw within 1 %;
- the search's vectorised path (arrays of groups and strides) gives each plan's scalar time.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from meshplan.collectives.comm import COLLECTIVES, ONE_HOST, bus_factor, split_group, split_time
from meshplan.collectives.price import collective_time
from meshplan.collectives.protocols import NCCL_KINDS, nccl_time, protocol_times
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import Accelerator, Cluster, Tier

DRAWS = 600
RTOL = 1e-12


def draw_cluster(rng: random.Random) -> Cluster:
    """Two or three tiers: an NVLink domain of 2-72 GPUs, then nodes; a third of them calibrated."""
    sizes = [rng.choice((2, 4, 8, 16, 72)), rng.choice((1, 2, 4, 8))]
    if rng.random() < 0.3:
        sizes.append(rng.choice((2, 4)))
    bandwidths = [rng.uniform(50e9, 1.8e12), rng.uniform(5e9, 100e9), rng.uniform(1e9, 50e9)]
    tiers = tuple(Tier(name=f"t{i}", size=s, bandwidth=bandwidths[i], latency=rng.uniform(0.2e-6, 20e-6))
                  for i, s in enumerate(sizes))
    acc = Accelerator(name="x", peak_flops={"bf16": 1e15}, hbm_bytes=80e9, hbm_bandwidth=2e12,
                      nvlink_bandwidth=bandwidths[0])
    return Cluster(name="c", accelerator=acc, num_gpus=math.prod(sizes), tiers=tiers,
                   nccl_protocols=rng.random() > 0.3)


def draw(rng: random.Random) -> tuple[str, float, int, int, Cluster]:
    """(kind, bytes, group, stride, cluster): a group of a power of two or the domain, at a stride that fits."""
    cluster = draw_cluster(rng)
    group = rng.choice([g for g in (2, 3, 4, 8, 16, 72, 128) if g <= cluster.num_gpus] or [1])
    strides = [s for s in (1, 2, 4, 8, 16) if group * s <= cluster.num_gpus]
    return rng.choice(COLLECTIVES), 10 ** rng.uniform(0, 12), group, rng.choice(strides), cluster


@pytest.fixture(scope="module")
def draws() -> list[tuple[str, float, int, int, Cluster]]:
    rng = random.Random(46)
    return [draw(rng) for _ in range(DRAWS)]


def test_the_draws_cover_both_regimes(draws):
    inside = sum(split_group(c, g, s)[0] == g for _, _, g, s, c in draws)
    calibrated = sum(not c.nccl_protocols for *_, c in draws)
    assert 100 < inside < DRAWS - 100 and calibrated > 100  # groups inside tier 0 and across it, both kinds of tier 0
    assert {k for k, *_ in draws} == set(COLLECTIVES)


@pytest.mark.parametrize("factor", [1.5, 10.0])
def test_more_latency_or_less_bandwidth_never_shortens_a_collective(draws, factor):
    for kind, n, group, stride, c in draws:
        base = float(collective_time(kind, n, group, stride, c, DEFAULT))
        for i in range(len(c.tiers)):
            slower = list(c.tiers)
            slower[i] = replace(c.tiers[i], latency=c.tiers[i].latency * factor)
            later = float(collective_time(kind, n, group, stride, replace(c, tiers=tuple(slower)), DEFAULT))
            slower[i] = replace(c.tiers[i], bandwidth=c.tiers[i].bandwidth / factor)
            narrower = float(collective_time(kind, n, group, stride, replace(c, tiers=tuple(slower)), DEFAULT))
            assert later >= base * (1 - RTOL) and narrower >= base * (1 - RTOL), (kind, n, group, stride, i)


def test_the_protocol_minimum_never_exceeds_simple_alone(draws):
    for kind, n, group, stride, c in draws:
        if kind not in NCCL_KINDS or split_group(c, group, stride)[0] != group:
            continue
        busbw = c.tiers[0].bandwidth * DEFAULT.link(0)
        simple = protocol_times(kind, n, group, busbw)[-1]  # (LL, LL128, Simple)
        assert nccl_time(kind, n, group, busbw) <= simple
        priced = float(collective_time(kind, n, group, stride, c, DEFAULT))
        if c.nccl_protocols and group <= ONE_HOST:  # what comm.py prices inside one host's tier 0 is that minimum
            assert priced == pytest.approx(nccl_time(kind, n, group, busbw), rel=RTOL)
        elif c.nccl_protocols:  # beyond one host's GPUs (NVL72) at most that: the α-β ring or tree where faster
            assert priced <= nccl_time(kind, n, group, busbw) * (1 + RTOL)


def test_at_large_messages_the_protocols_are_the_bandwidth_term(draws):
    """100 GB to 1 TB over up to 72 ranks at up to 1.44 TB/s: Simple's fixed cost, at most 8.4 + 142 × 3.4 = 491 µs,
    is under 1 % of the bandwidth term, at least 0.5 × 1e11 / 1.44e12 = 35 ms, and LL / LL128 pay 4× / 1.09× it."""
    rng = random.Random(4646)
    for kind, _, group, _, c in draws:
        if kind not in NCCL_KINDS:
            continue
        n, busbw = 10 ** rng.uniform(11, 12), c.tiers[0].bandwidth * DEFAULT.link(0)
        bandwidth_term = bus_factor(kind, group) * n / busbw
        assert nccl_time(kind, n, group, busbw) == pytest.approx(bandwidth_term, rel=0.01), (kind, group)


def test_a_group_moved_into_a_larger_nvlink_domain_is_never_slower(draws):
    """A collective over g ranks across nodes (NVLink domains of 8 joined by the network) against the same g ranks
    inside one NVLink domain of g (the h100 preset with nvlink_domain = g): the larger domain never prices it slower
    (the protocol ring's 2(g - 1) hops beyond one host would: 64 ranks, 8 MB, 145 -> 238 us before comm._tier0)."""
    from dataclasses import replace as swap

    from meshplan.specs.hardware import load_system
    system = load_system("h100")
    for group in (16, 32, 64):
        wide = swap(system, network=swap(system.network, nvlink_domain=group))
        for kind in NCCL_KINDS:
            for n in (8.0, 6.4e4, 8e6, 2.56e8):
                across = float(collective_time(kind, n, group, 1, system.cluster(group), DEFAULT))
                inside = float(collective_time(kind, n, group, 1, wide.cluster(group), DEFAULT))
                assert inside <= across * (1 + RTOL), (kind, group, n, inside, across)


def test_the_vectorised_path_gives_each_plans_scalar_time(draws):
    """split_time on arrays of groups (the search's PlanBatch columns) equals the scalar call per element."""
    for kind, n, _, _, c in draws[:100]:
        fitting = [g for g in (1, 2, 4, 8, 16, 72) if g <= c.num_gpus]
        groups = np.array(fitting * 2)
        strides = np.array([1] * len(fitting) + [2 if 2 * g <= c.num_gpus else 1 for g in fitting])
        vector = split_time(kind, n, groups, split_group(c, groups, strides), c, DEFAULT)
        scalar = [float(collective_time(kind, n, int(g), int(s), c, DEFAULT))
                  for g, s in zip(groups, strides, strict=True)]
        np.testing.assert_allclose(np.broadcast_to(vector, groups.shape), scalar, rtol=1e-12)
