"""A published record's hardware → Cluster (map_system.py): the GPU count (stated, from nodes, or from the parallel
sizes), the system preset its GPU names (the 40 GB A100 for a 2020 source, an MI250X's GCDs), the NVLink domain a
server or a partial GB200 rack bounds, and the network the record states in place of the preset's."""

from __future__ import annotations

import pytest

from meshplan.specs.hardware import load_system
from meshplan_validation.case import map_run
from meshplan_validation.map_system import map_cluster
from published_helpers import indep, record


def test_gb200_jobs_that_do_not_fill_racks_use_the_largest_dividing_domain():
    case = map_run(record(precision="mxfp8", hardware={"gpu": "GB200", "num_gpus": 256, "gpus_per_node": 4},
                          parallel={"tp": 4, "pp": 16, "vp": 4, "global_batch_size": 1536}))
    assert case.cluster.mesh_shape == (64, 4)  # 256 is not a multiple of 72: 4 domains of 64
    assert any("NVLink domain 64" in a for a in case.assumptions)


def test_a_gpu_count_no_server_multiple_divides_still_maps():
    """6 H100s in servers of 4: no NVLink domain of a multiple of 4 divides 6; the domain is gcd(6, 4) = 2."""
    cluster, notes = map_cluster({"gpu": "H100", "num_gpus": 6, "gpus_per_node": 4})
    assert cluster.num_gpus == 6 and cluster.tiers[0].size == 2
    assert any("NVLink domain 2" in n for n in notes)


def test_servers_smaller_than_the_presets_nvlink_domain_bound_it():
    """An H200 record of 4-GPU servers: NVLink domains of 4, not the DGX's 8; a GB200 record's 4-GPU compute trays
    stay in the preset's 72-GPU NVLink domain."""
    h200 = map_run(indep("x", hardware={"gpu": "H200", "num_gpus": 64, "gpus_per_node": 4}))
    assert h200.cluster.tiers[0].size == 4 and any("NVLink domain 4" in a for a in h200.assumptions)
    gb200 = map_run(indep("x", hardware={"gpu": "GB200", "num_gpus": 64, "gpus_per_node": 4}))
    assert gb200.cluster.tiers[0].size == 64  # 64 GPUs of a 72-GPU domain


@pytest.mark.parametrize(("gpu", "preset"), [
    ("NVIDIA H800 80GB", "h800"), ("A800-SXM4-80GB", "a800"), ("H20", "h20"), ("H200", "h200"),
    ("GH200", "gh200"), ("AMD Instinct MI300X", "mi300x"), ("MI325X", "mi325x"), ("MI355X", "mi355x"),
    ("L40S", "l40s"), ("NVIDIA H100 PCIe", "h100-pcie"), ("8xH20", "h20"), ("NVIDIA GH200 480GB", "gh200"),
    ("RTX-PRO-6000-Blackwell-Server", "rtx-pro-6000"), ("RTX 6000 Pro Blackwell Server Edition", "rtx-pro-6000"),
])
def test_other_gpus_map_to_their_presets(gpu, preset):
    case = map_run(record(hardware={"gpu": gpu, "num_gpus": 64, "gpus_per_node": 8}, precision="bf16"))
    assert f"hardware: {preset} preset" in case.assumptions


def test_the_gpu_count_comes_from_nodes_or_from_the_parallel_sizes():
    by_nodes = map_run(record(hardware={"gpu": "H100", "num_gpus": None, "num_nodes": 8, "gpus_per_node": 8}))
    assert by_nodes.cluster.num_gpus == 64 and any("8 nodes x 8" in a for a in by_nodes.assumptions)
    by_sizes = map_run(record(hardware={"gpu": "H100", "num_gpus": None}, parallel={"dp": 2}))
    assert by_sizes.cluster.num_gpus == 2 * 4 * 8  # dp 2 × tp 4 × pp 8


def test_a100_of_unstated_memory_is_dated_by_its_source():
    """The A100 80GB was announced in November 2020: a 2020 source's A100 is the 40 GB part (1,555 GB/s HBM2);
    a later one keeps the 80 GB assumption, and a stated size is taken as stated."""
    a100 = {"gpu": "A100 (DGX-A100)", "num_gpus": 64, "gpus_per_node": 8}
    old = map_run(record(source="Megatron-LM README (Sep 2020) weak-scaling tables", precision="bf16",
                         hardware=a100))
    assert old.cluster.accelerator.name == "A100 SXM4 40GB"
    assert any(a.startswith("A100 40 GB: the source dates from 2020") for a in old.assumptions)
    later = map_run(record(source="Narayanan et al. 2021", precision="bf16", hardware=a100))
    assert later.cluster.accelerator.name == "A100 SXM4 80GB"
    stated = map_run(record(source="a 2020 table", precision="bf16", hardware=a100 | {"gpu": "A100 80GB"}))
    assert stated.cluster.accelerator.name == "A100 SXM4 80GB"


def test_an_mi250x_record_of_four_per_server_says_how_its_gpus_are_counted():
    """The preset is one GCD; 4 MI250X per server are packages (8 GCDs): the count is kept and the doubt stated."""
    cluster, notes = map_cluster({"gpu": "AMD MI250X", "num_gpus": 64, "gpus_per_node": 4})
    assert cluster.num_gpus == 64
    assert any("if it counts packages of 2 GCDs" in n for n in notes)


@pytest.mark.parametrize(("interconnect", "per_node", "nics", "gbps"), [
    ("inter-machine 4 x 100Gb RoCE; intra-node NVLink", 8, 0.5, 100),  # InternEvo: 4 NICs per 8-GPU server
    ("4 x 200Gbps RDMA inter-node; NVLink intra-node", 8, 0.5, 200),  # Megatron-LLaMA
    ("NVLink within node; Omni-Path inter-node (4 links per node per BLOOM README)", 8, 0.5, 100),
    ("NVLink 4 inter-gpu connects, 4 OmniPath links per node", None, 0.5, 100),  # per_node unstated: the server's 8
    ("InfiniBand HDR via 4 ConnectX-6 HCAs per node with GPUDirect RDMA", 8, 0.5, 200),
    ("8x200Gb/s HDR InfiniBand per node", 8, 1.0, 200),  # the DGX A100's own network
    ("RDMA backend network 400 Gb/s per GPU", 8, 1.0, 400),
])
def test_the_network_a_record_states_replaces_the_presets(interconnect, per_node, nics, gbps):
    """4 NICs of 100 Gb/s per 8-GPU server: 0.5 NIC of 12.5 GB/s per GPU."""
    hw = {"gpu": "A100 80GB", "num_gpus": 64, "gpus_per_node": per_node, "interconnect": interconnect}
    cluster, notes = map_cluster(hw)
    network = load_system("a100").cluster(64, nics_per_gpu=nics, nic_bandwidth=gbps * 1e9 / 8)
    assert cluster.tiers[-1] == network.tiers[-1]
    assert any(n.startswith("network as stated") for n in notes)


def test_an_unstated_network_keeps_the_presets():
    cluster, notes = map_cluster({"gpu": "A100 80GB", "num_gpus": 64, "interconnect": "not stated"})
    assert cluster.tiers[-1] == load_system("a100").cluster(64).tiers[-1]
    assert not any(n.startswith("network") for n in notes)
