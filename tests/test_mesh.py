"""N-tier meshes (specs/mesh.py, hardware.Network's [[network.tiers]]) and the collectives on them (comm.py): how a
job's GPUs are laid onto the tiers, the 3-tier preset, the one-line errors of a bad tier list, and each collective's
time on three tiers computed by hand, tier by tier (α + n·β per tier, ring or tree: seed 000)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bad_input_helpers import H100
from meshplan.cli import main
from meshplan.collectives.comm import SIMPLE_BASE, ring_hops, split_group
from meshplan.collectives.price import collective_time
from meshplan.errors import SpecError
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Accelerator, Cluster, Network, Tier, load_system
from meshplan.specs.mesh import TierSpec, largest_divisor, tier_sizes

PERFECT = Efficiency(nvlink=1.0, network=1.0)
ACC = Accelerator(name="x", peak_flops={"bf16": 1e15}, hbm_bytes=80e9, hbm_bandwidth=2e12, nvlink_bandwidth=100e9)


def three_tiers(sizes=(2, 2, 2), bandwidths=(100e9, 10e9, 1e9), latencies=(1e-6, 2e-6, 4e-6)) -> Cluster:
    tiers = tuple(Tier(name=name, size=s, bandwidth=b, latency=a)
                  for name, s, b, a in zip(("nvlink", "leaf", "spine"), sizes, bandwidths, latencies, strict=True))
    return Cluster(name="c", accelerator=ACC, num_gpus=sizes[0] * sizes[1] * sizes[2], tiers=tiers)


# ---- laying a job onto the tiers ------------------------------------------------------------------------------
SPECS = (TierSpec(name="nvlink", size=8, latency=3e-6), TierSpec(name="leaf", size=32, bandwidth=50e9, latency=5e-6),
         TierSpec(name="spine", bandwidth=50e9, latency=5e-6, oversubscription=4))


@pytest.mark.parametrize(("gpus", "shape"), [
    (4, (4, 1, 1)),        # part of one NVLink domain
    (256, (8, 32, 1)),     # 32 nodes: one whole leaf
    (1024, (8, 32, 4)),    # 128 nodes = 4 leaves of 32
    (320, (8, 20, 2)),     # 40 nodes: the fewest leaves that split 40 evenly are 2 of 20 (not 32 + 8)
    (296, (8, 1, 37)),     # 37 nodes (prime): no even split but 37 leaves of one node
    (8 * 2**15, (8, 32, 1024)),
])
def test_a_job_spreads_evenly_over_the_fewest_blocks(gpus, shape):
    assert tuple(tier_sizes(SPECS, gpus)) == shape
    assert shape[0] * shape[1] * shape[2] == gpus


def test_largest_divisor():
    assert [largest_divisor(n, 32) for n in (40, 37, 128, 1, 96)] == [20, 1, 32, 1, 32]  # 40 = 2 × 20; 96 = 3 × 32
    assert largest_divisor(2048, 384) == 256  # 2,048 nodes on 384-node pods: 8 pods of 256


def test_bandwidth_over_oversubscription_and_tier_zero_from_the_accelerator():
    net = Network(tiers=SPECS)
    cluster = replace(load_system("h100"), network=net).cluster(1024)
    assert cluster.mesh_shape == (8, 32, 4) and cluster.nvlink_domain == 8 == net.nvlink_domain
    # tier 0 without a bandwidth: H100's NVLink, 450 GB/s; the spine: 50 GB/s over a 4:1 taper = 12.5 GB/s
    assert [t.bandwidth for t in cluster.tiers] == [450e9, 50e9, 12.5e9]
    assert [t.name for t in cluster.tiers] == ["nvlink", "leaf", "spine"]


def test_meta_llama3_cluster_preset():
    """Llama 3's 24K-GPU RoCE cluster (Dubey et al. 2024, §3.3.1): 8 GPUs per server, 3,072-GPU pods at full
    bisection (384 servers), 8 pods at 1:7."""
    system = load_system("h100-meta-24k")
    assert system.cluster(24576).mesh_shape == (8, 384, 8)  # 8 × 384 × 8 = 24,576
    # Llama 3 405B's 16,384 GPUs: 2,048 servers, spread as 8 pods of 256 (2,048 = 8 × 256)
    big = system.cluster(16384)
    assert big.mesh_shape == (8, 256, 8)
    assert [t.bandwidth for t in big.tiers] == pytest.approx([450e9, 50e9, 50e9 / 7])  # 400 Gb/s = 50 GB/s; / 7
    assert [t.latency for t in big.tiers] == pytest.approx([3e-6, 5e-6, 5e-6])
    assert system.cluster(3072).mesh_shape == (8, 384, 1)  # one pod
    with pytest.raises(SpecError, match=r"gpus=49152 spreads over 16 blocks of 3,072 GPUs .* more than tier "
                                        "aggregation's size 8"):
        system.cluster(49152)  # 16 pods: twice the building


def test_the_nvlink_domain_override_resizes_tier_zero():
    system = load_system("h100-meta-24k")
    cluster = system.cluster(144 * 8, nvlink_domain=72)  # what if NVLink were 72 wide? 1,152 = 72 × 16 × 1
    assert cluster.mesh_shape == (72, 16, 1) and cluster.nvlink_domain == 72
    assert system.cluster(1152).mesh_shape == (8, 144, 1)  # the preset is unchanged


@pytest.mark.parametrize(("tiers", "message"), [
    ('[[network.tiers]]\nname = "nvlink"\nsize = 8\nlatency = "3 us"\n',
     "tiers has 1 tier(s): give 2 to 8, innermost (NVLink) first"),
    ('[[network.tiers]]\nname = "nvlink"\nsize = "rest"\nlatency = "3 us"\n'
     '[[network.tiers]]\nname = "net"\nbandwidth = "50 GB/s"\nlatency = "5 us"\n',
     "tier nvlink: size='rest' is for the outermost tier only (give its size)"),
    ('[[network.tiers]]\nname = "nvlink"\nsize = 8\nlatency = "3 us"\n'
     '[[network.tiers]]\nname = "net"\nlatency = "5 us"\n',
     "tier net: bandwidth missing (only tier 0 takes the accelerator's nvlink_bandwidth when it gives none)"),
    ('[[network.tiers]]\nname = "a"\nsize = 8\nlatency = "3 us"\n'
     '[[network.tiers]]\nname = "a"\nbandwidth = "50 GB/s"\nlatency = "5 us"\n',
     "tiers[1]: name='a' is given twice (each tier needs its own name)"),
    ('[[network.tiers]]\nname = "nvlink"\nsize = 8\nlatency = "3 us"\n'
     '[[network.tiers]]\nname = "net"\nbandwidth = "50 GB/s"\nlatency = "5 us"\noversubscription = 0.5\n',
     "tiers[1]: tier net: oversubscription=0.5 is outside 1 … 1,000"),
    ('[[network.tiers]]\nname = "nvlink"\nsize = 8\nlatency = "3 us"\n'
     '[[network.tiers]]\nname = "net"\nbandwidth = "50 GB/s"\nlatency = "5 us"\nspeed = 3\n',
     "tiers[1]: unknown field 'speed' (known: bandwidth, latency, name, oversubscription, peers, size, source)"),
    ('[[network.tiers]]\nname = "nvlink"\nsize = 8\nlatency = "3 us"\n'
     '[[network.tiers]]\nname = "net"\nbandwidth = "50 GB"\nlatency = "5 us"\n', "bandwidth"),
    ('nic_latency = "5 us"\n[[network.tiers]]\nname = "nvlink"\nsize = 8\nlatency = "3 us"\n'
     '[[network.tiers]]\nname = "net"\nbandwidth = "50 GB/s"\nlatency = "5 us"\n',
     "nic_latency belongs to the two-tier form: with [[network.tiers]], give each tier its bandwidth and latency"),
    ('nvlink_domain = 8\n[[network.tiers]]\nname = "nvlink"\nsize = 8\nlatency = "3 us"\n'
     '[[network.tiers]]\nname = "net"\nbandwidth = "50 GB/s"\nlatency = "5 us"\n',
     "nvlink_domain and tiers are both given: tier 0's size is the NVLink domain"),
    ('tiers = 3\n', "tiers=3 must be a list of tables"),
    ('nvlink_domain = 8\nnvlink_latency = "3 us"\nnics_per_gpu = 1\nnic_bandwidth = "400 Gb/s"\n',
     "missing field 'nic_latency' (or describe the mesh as [[network.tiers]])"),
    ('nvlink_domain = [8]\nnvlink_latency = "3 us"\nnics_per_gpu = 1\nnic_bandwidth = "400 Gb/s"\nnic_latency = 0\n',
     "nvlink_domain=[8] must be an integer"),  # a two-tier field may be left out (N tiers), not be of another kind
])
def test_a_bad_tier_list_is_one_line(tmp_path, capsys, tiers, message):
    h100 = H100.read_text()
    head = h100[:h100.index("\n[network]\n") + 1]
    path = tmp_path / "bad.toml"
    path.write_text(head + "[network]\n" + tiers)
    with pytest.raises(SpecError) as info:
        load_system(str(path))
    assert message in str(info.value) and "\n" not in str(info.value)
    assert main(["estimate", "--model", "llama3-8b", "--system", str(path), "--gpus", "16"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_job_beyond_the_outermost_tier_or_off_the_domain_is_one_line():
    system = replace(load_system("h100"), network=Network(tiers=SPECS[:2] + (replace(SPECS[2], size=2),)))
    assert system.cluster(512).mesh_shape == (8, 32, 2)  # capacity: 8 × 32 × 2 = 512
    with pytest.raises(SpecError, match="gpus=1024 spreads over 4 blocks of 256 GPUs"):
        system.cluster(1024)
    with pytest.raises(SpecError, match=r"gpus=12 is not a multiple of the nvlink domain size 8 \(tier 0\)"):
        system.cluster(12)


# ---- collectives on three tiers, by hand ----------------------------------------------------------------------
# Tiers (2 GPUs, 100 GB/s, α 1 µs), (2, 10 GB/s, 2 µs), (2, 1 GB/s, 4 µs); n = 8 MB over all 8 GPUs
N = 8e6


def test_a_group_over_three_tiers_splits_two_two_two():
    c = three_tiers()
    assert split_group(c, 8, 1) == [2, 2, 2]
    assert split_group(c, 4, 2) == [1, 2, 2]  # stride 2: one member per NVLink pair, two per leaf, two leaves
    assert split_group(c, 2, 4) == [1, 1, 2]  # a pipeline send between leaves
    assert ring_hops([2, 2, 2]) == [4, 2, 1]  # 7 hops: 8 − 4 inside pairs, 4 − 2 across pairs, 2 − 1 across leaves


def test_hierarchical_all_reduce_costs_each_tiers_part():
    # per tier the faster of ring 2((g−1)α + (g−1)/g · n_i/B) and tree 2⌈log2 g⌉α + 2n_i/B, n_i = n / Π_{j<i} g_j:
    # tier 0, n 8 MB:  ring 2(1 µs + 0.5 · 8e6/1e11) = 82 µs     (tree 2 µs + 160 µs = 162 µs)
    # tier 1, n 4 MB:  ring 2(2 µs + 0.5 · 4e6/1e10) = 404 µs    (tree 4 µs + 800 µs)
    # tier 2, n 2 MB:  ring 2(4 µs + 0.5 · 2e6/1e9) = 2,008 µs   (tree 8 µs + 4,000 µs)
    # and NCCL's base latency once a call, the group leaving tier 0: SIMPLE_BASE = 8.4 µs (comm.base_latency)
    assert collective_time("all_reduce", N, 8, 1, three_tiers(), PERFECT) == pytest.approx(
        82e-6 + 404e-6 + 2008e-6 + SIMPLE_BASE)
    # the group of 4 at stride 2 skips tier 0: 2(2 µs + 0.5 · 8e6/1e10) + 2(4 µs + 0.5 · 4e6/1e9) = 804 + 4,008 µs
    assert collective_time("all_reduce", N, 4, 2, three_tiers(), PERFECT) == pytest.approx(
        804e-6 + 4008e-6 + SIMPLE_BASE)


def test_a_small_all_reduce_takes_the_tree_on_the_wide_tier():
    # 1 kB on tiers (8, 64, 2): tier 1 of 64 ranks at 5 µs: ring 2 · 63 · 5 µs = 630 µs, tree 2 · 6 · 5 µs = 60 µs
    c = three_tiers((8, 64, 2), (100e9, 50e9, 10e9), (1e-6, 5e-6, 10e-6))
    inner = 2 * 3 * 1e-6 + 2 * 1e3 / 100e9  # tier 0: 8 ranks, tree 6 µs (ring 14 µs)
    middle = 2 * 6 * 5e-6 + 2 * 1e3 / 8 / 50e9  # tier 1 works on n / 8
    outer = 2 * (10e-6 + 0.5 * 1e3 / 8 / 64 / 10e9)  # tier 2: 2 ranks, ring 2(α + n/2B) beats tree 2α + 2n/B
    assert collective_time("all_reduce", 1e3, 1024, 1, c, PERFECT) == pytest.approx(inner + middle + outer
                                                                                      + SIMPLE_BASE)


def test_all_gather_is_one_ring_whose_hops_cross_each_tier():
    # Σ_i h_i·α_i + (g_i−1)/g_i · n_i/B_i with hops (4, 2, 1): 4 µs + 40 µs, 4 µs + 200 µs, 4 µs + 1,000 µs
    for kind in ("all_gather", "reduce_scatter"):
        assert collective_time(kind, N, 8, 1, three_tiers(), PERFECT) == pytest.approx(1252e-6 + SIMPLE_BASE)


def test_all_to_all_is_paced_by_its_slowest_tier():
    # the share of a rank's bytes for peers beyond tier i−1 leaves through tier i: 1/8 · 8 MB over 100 GB/s = 10 µs,
    # 2/8 · 8 MB over 10 GB/s = 200 µs, 4/8 · 8 MB over 1 GB/s = 4 ms; concurrent (max) + latencies 1 + 2 + 4 µs
    assert collective_time("all_to_all", N, 8, 1, three_tiers(), PERFECT) == pytest.approx(4e-3 + 7e-6)


def test_a_broadcast_runs_as_nccls_ring_across_tiers():
    # broadcast over 8 = 2 x 2 x 2: NCCL's ring visits every rank, 7 hops of which 4 inside a pair (1 µs), 2 between
    # pairs (2 µs), 1 across the spine (4 µs): 12 µs; the bytes leave each block through all its GPUs' links, as an
    # all-gather's (bus factor 1): 8e6 / 100e9 + 4e6 / 10e9 + 2e6 / 1e9 = 2.48 ms; and NCCL's base latency (a broadcast
    # is a kind its tuner prices); p2p has none (send / recv: not tuned) and stays a chain
    assert collective_time("broadcast", N, 8, 1, three_tiers(), PERFECT) == pytest.approx(
        12e-6 + (8e6 / 100e9 + 4e6 / 10e9 + 2e6 / 1e9) + SIMPLE_BASE)
    assert collective_time("p2p", N, 2, 4, three_tiers(), PERFECT) == pytest.approx(4e-6 + 8e-3)  # across leaves


def test_link_efficiency_by_position_not_name():
    """Tier 0 is the scale-up domain (efficiency.nvlink), every tier beyond it a network (efficiency.network),
    whatever their names: a 2-member group on tier 2 alone sees 0.9 × 1 GB/s."""
    c = three_tiers()
    assert collective_time("p2p", N, 2, 4, c, DEFAULT) == pytest.approx(4e-6 + N / (DEFAULT.network * 1e9))
    assert collective_time("p2p", N, 2, 1, c, DEFAULT) == pytest.approx(1e-6 + N / (DEFAULT.nvlink * 100e9))


def test_sweeps_scale_every_tier_beyond_nvlink():
    """nic_bandwidth scales the pod and the aggregation tiers (50 → 100 GB/s; the aggregation's 1:7 stays:
    100 / 7 = 14.3 GB/s), nvlink_bandwidth the accelerator's NVLink (450 → 900 GB/s), nvlink_domain tier 0."""
    from meshplan.search.sweep import PARAMS, scaled_system

    system = load_system("h100-meta-24k")
    assert PARAMS["nic_bandwidth"][1](system) == pytest.approx(50e9)
    faster = scaled_system(system, "nic_bandwidth", 2.0).cluster(16384)
    assert [t.bandwidth for t in faster.tiers] == pytest.approx([450e9, 100e9, 100e9 / 7])
    assert [t.bandwidth for t in scaled_system(system, "nvlink_bandwidth", 2.0).cluster(16384).tiers] == \
        pytest.approx([900e9, 50e9, 50e9 / 7])
    assert scaled_system(system, "nvlink_domain", 2.0).cluster(16384).mesh_shape == (16, 128, 8)  # 1,024 of 16


def test_the_reports_scaling_counts_stay_within_the_mesh():
    """meshplan report's default scaling curve, N/4 … 2N, keeps the counts the mesh holds: on Meta's 24,576-GPU
    cluster 2 × 16,384 is beyond its 8 pods; asked for explicitly, it is one line naming the tier."""
    from meshplan.cli.report import _scaling_counts

    system = load_system("h100-meta-24k")
    assert _scaling_counts(None, 16384, system) == [4096, 8192, 16384]
    assert _scaling_counts(None, 4096, system) == [1024, 2048, 4096, 8192]
    with pytest.raises(SpecError, match="scaling='32768': gpus=32768 .* more than tier aggregation's size 8"):
        _scaling_counts("32768", 16384, system)


def test_estimate_and_plan_run_on_the_three_tier_preset(capsys):
    """The command line on h100-meta-24k (the HTML report's columns: test_report_text.py; sweeps: above)."""
    import json

    assert main(["estimate", "--model", "llama3-8b", "--system", "h100-meta-24k", "--gpus", "4096", "--tp", "2",
                 "--pp", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] > 0
    assert main(["plan", "--model", "llama3-8b", "--system", "h100-meta-24k", "--gpus", "4096", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and plans[0]["step_time_s"] > 0
    with pytest.raises(TypeError, match="index"):
        DEFAULT.link("nvlink")
