"""Switchless tiers (specs/mesh.py, ``Tier.peers``; hardware.Network's ``nvlink_peers``): a group of g GPUs that each
link directly to ``peers`` others drives only the links to its members, B · min(g − 1, peers) / peers per GPU
(``group_bandwidth``), in every collective that crosses the tier (comm.py, protocols.py, allreduce.py). An MI300X
board links each GPU to the other 7 by one 64 GB/s Infinity Fabric link; a DGX-1 links each V100 to 4 of the other 7
by 6 NVLink2 links of 25 GB/s."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.collectives.allreduce import tp_all_reduce
from meshplan.collectives.comm import split_group
from meshplan.collectives.price import collective_time
from meshplan.collectives.protocols import library, nccl_time
from meshplan.errors import SpecError
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster, build_cluster, load_system, network_from_dict
from meshplan.specs.mesh import Tier, group_bandwidth
from meshplan_validation.map_system import map_cluster

PERFECT = Efficiency(nvlink=1.0, network=1.0)
GB = 1e9


def test_a_group_drives_the_links_to_its_members() -> None:
    board = Tier(name="xgmi", size=8, bandwidth=448 * GB, latency=3e-6, peers=7)  # 7 links x 64 GB/s
    assert [group_bandwidth(board, g) / GB for g in (2, 4, 8)] == pytest.approx([64, 192, 448])  # 1, 3, 7 links
    cube = Tier(name="nvlink", size=8, bandwidth=150 * GB, latency=3e-6, peers=4)  # DGX-1: 6 links to 4 neighbours
    assert [group_bandwidth(cube, g) / GB for g in (2, 4, 8)] == pytest.approx([37.5, 112.5, 150])  # 150 x 1/4, 3/4, 1
    switch = replace(board, peers=0)
    assert [group_bandwidth(switch, g) / GB for g in (2, 4, 8)] == pytest.approx([448, 448, 448])


def _cluster(name: str, gpus: int = 8) -> Cluster:
    return load_system(name).cluster(gpus)


def test_presets_state_their_links() -> None:
    assert [_cluster(n).tiers[0].peers for n in ("mi300x", "mi325x", "mi355x", "dgx1-v100")] == [7, 7, 7, 4]
    assert [_cluster(n).tiers[0].peers for n in ("h100", "v100", "gb200")] == [0, 0, 0]  # NVSwitch


def test_a_pair_on_an_mi300x_board_reduces_at_one_link() -> None:
    """1 GB all-reduces, where the bandwidth term is all (RCCL's Simple protocol, the whole bus, protocols.py): tp 2
    moves 2(2−1)/2 · n over one 64 GB/s link, tp 8 moves 2(8−1)/8 · n over 448 GB/s, so the pair takes
    (1 / 64) / (1.75 / 448) = 4x as long; behind a switch the pair would take 1 / 1.75 of tp 8's."""
    cluster, n = _cluster("mi300x"), 1e9
    t2, t8 = (collective_time("all_reduce", n, g, 1, cluster, PERFECT) for g in (2, 8))
    rccl = library(cluster.accelerator.architecture)
    assert rccl == "rccl-gfx942"
    assert (t2, t8) == pytest.approx((nccl_time("all_reduce", n, 2, 64 * GB, tuner=rccl),
                                      nccl_time("all_reduce", n, 8, 448 * GB, tuner=rccl)))
    assert t2 / t8 == pytest.approx(4.0, rel=0.02)  # less the latency terms: 14 hops at 8 ranks, 2 at 2
    switched = replace(cluster, tiers=(replace(cluster.tiers[0], peers=0), *cluster.tiers[1:]))
    s2, s8 = (collective_time("all_reduce", n, g, 1, switched, PERFECT) for g in (2, 8))
    assert s8 == pytest.approx(t8) and s2 / s8 == pytest.approx(1 / 1.75, rel=0.02)


def test_training_and_serving_all_reduces_pay_it() -> None:
    """The tensor-parallel all-reduce (allreduce.tp_all_reduce: training's and serving's) and the α-β model beyond
    NCCL's kinds (an all-to-all of a pair) both see the pair's one link."""
    cluster = _cluster("mi300x")
    switched = replace(cluster, tiers=(replace(cluster.tiers[0], peers=0), *cluster.tiers[1:]))
    n = 64e6  # a 2 MB x 32 all-reduce: bandwidth-bound
    parts = split_group(cluster, 2, 1)
    assert tp_all_reduce(n, 2, parts, cluster, DEFAULT) > 3 * tp_all_reduce(n, 2, parts, switched, DEFAULT)
    a2a = collective_time("all_to_all", n, 2, 1, cluster, PERFECT)
    assert a2a == pytest.approx(3e-6 + 0.5 * n / (64 * GB), rel=1e-6)  # α + (g−1)/g · n / one link


def test_more_bandwidth_or_members_never_slows_a_group() -> None:
    cluster = _cluster("dgx1-v100")
    for kind in ("all_reduce", "all_gather", "all_to_all", "p2p"):
        times = [collective_time(kind, 8e6 * g, g, 1, cluster) / g for g in (2, 4, 8)]  # bytes per member equal
        faster = replace(cluster, tiers=(replace(cluster.tiers[0], bandwidth=2 * cluster.tiers[0].bandwidth),
                                         *cluster.tiers[1:]))
        assert all(collective_time(kind, 8e6 * g, g, 1, faster) <= collective_time(kind, 8e6 * g, g, 1, cluster)
                   for g in (2, 4, 8)), kind
        assert times == sorted(times, reverse=True) or kind == "p2p", (kind, times)


def test_a_v100_sxm2_record_runs_on_the_cube_mesh() -> None:
    cluster, _ = map_cluster({"gpu": "V100-SXM2-16GB", "num_gpus": 8})
    assert (cluster.name, cluster.tiers[0].peers, cluster.accelerator.tdp_watts) == ("dgx1-v100", 4, 300)
    assert map_cluster({"gpu": "V100 (DGX-2)", "num_gpus": 16})[0].name == "v100"


def test_bad_peers_are_one_line() -> None:
    with pytest.raises(SpecError, match="nvlink_peers"):
        network_from_dict({"nvlink_domain": 8, "nvlink_peers": -1, "nvlink_latency": "3 us", "nics_per_gpu": 1,
                           "nic_bandwidth": "400 Gb/s", "nic_latency": "5 us"}, "network")
    with pytest.raises(SpecError, match="nvlink_peers belongs to the two-tier form"):
        network_from_dict({"nvlink_peers": 7, "tiers": [{"name": "xgmi", "size": 8, "latency": "3 us"},
                                                        {"name": "ib", "bandwidth": "50 GB/s", "latency": "5 us"}]},
                          "network")


def test_a_tier_list_states_its_peers() -> None:
    """The N-tier form gives tier 0 (or any tier) its ``peers``: 16 MI300X as two boards of 8 over InfiniBand."""
    net = network_from_dict({"tiers": [{"name": "xgmi", "size": 8, "latency": "3 us", "peers": 7},
                                       {"name": "ib", "bandwidth": "50 GB/s", "latency": "5 us"}]}, "network")
    cluster = build_cluster("two boards", load_system("mi300x").accelerator, net, 16)
    assert [(t.size, t.peers) for t in cluster.tiers] == [(8, 7), (2, 0)]
    assert group_bandwidth(cluster.tiers[0], 2) / GB == pytest.approx(64)
