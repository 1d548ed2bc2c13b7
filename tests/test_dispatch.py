"""DeepEP's normal kernels (dispatch.py): a token crosses the network once per node it hits, not once per copy; the
serving engines that run them (engine moe_comm "deepep") price their prompt iterations so and their decode steps as
before."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshplan.collectives.dispatch import dispatch_time, forwarded_time, node_miss
from meshplan.collectives.price import collective_time
from meshplan.serve.engine import load_engine
from meshplan.serve.metrics import Setting
from meshplan.serve.plan import Workload
from meshplan.serve.precision import Quant
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

H100 = load_system("h100")
TOKENS, K, E, HIDDEN = 8192, 8, 256, 7168  # DeepSeek-V3's routing (top-8 of 256) and width, fp8 dispatch
SENT = TOKENS * K * HIDDEN  # bytes of every copy one GPU sends


def test_a_token_misses_a_node_with_the_hypergeometric_zero_term():
    """32 GPUs in 4 nodes hold 64 of the 256 experts each: a token's 8 experts all miss one node with probability
    Π_{j<8} (192 − j)/(256 − j) = 0.0964; every expert on one node: never missed; one expert a node: (1 − 8/256)."""
    assert node_miss(E, K, 64) == pytest.approx(np.prod([(192 - j) / (256 - j) for j in range(8)]))
    assert node_miss(E, K, 64) == pytest.approx(0.0964, abs=1e-4)
    assert node_miss(E, K, E) == 0.0
    assert node_miss(E, K, 1) == pytest.approx(1 - 8 / 256)


def test_forwarding_sends_a_token_once_to_each_node_it_hits():
    """EP32 over 4 H100 nodes (NVLink 450 GB/s x 0.8, one 400 Gb/s NIC a GPU, 50 GB/s x 0.9). The plain all-to-all
    sends 24/32 of its 470 MB of copies over the network: 352 MB / 45 GB/s = 7.83 ms. Forwarded, each of the 8,192
    tokens (7,168 bytes) goes to 3 × (1 − 0.0964) = 2.71 other nodes at DeepEP's measured NIC rate over 4 nodes,
    0.863 x 50 GB/s (dispatch.NIC_SHARES): 159 MB / 43.15 GB/s = 3.69 ms, while NVLink fans out 7/8 of the copies,
    411 MB / 360 GB/s = 1.14 ms, beside it. Both pay 7 × 3 + 3 × 5 = 36 µs of latency."""
    cluster = H100.cluster(32)
    latency = 7 * 3e-6 + 3 * 5e-6
    plain = collective_time("all_to_all", SENT, 32, 1, cluster)
    assert plain == pytest.approx(SENT * 24 / 32 / 45e9 + latency)
    network = TOKENS * HIDDEN * 3 * (1 - node_miss(E, K, 64)) / (0.863 * 50e9)
    assert network > SENT * 7 / 8 / 360e9  # the network, not NVLink, sets the time
    assert forwarded_time(SENT, K, E, 32, 1, cluster) == pytest.approx(network + latency)
    assert network + latency == pytest.approx(3.725e-3, rel=1e-3)


def test_deepep_share_of_the_nic_is_priced_by_the_nodes_spanned():
    """DeepEP's internode table (docs/legacy.md @ dd758ca; dispatch.py): EP 16 over 2 nodes reads 43 / 43 GB/s of
    logical traffic, half of it its own node's: 21.5 / 50 GB/s = 0.43 of the NIC; EP 32 over 4 nodes 58 / 57 GB/s,
    3/4 on the NIC: (43.5 + 42.75) / 2 / 50 = 0.863; EP 64 over 8 nodes 51 / 50 GB/s, 3.5/4 on the NIC: 0.884.
    Between them linear in log2(nodes): 3 nodes 0.43 + (0.863 − 0.43) × log2(1.5) = 0.683; beyond 8 the last."""
    from meshplan.collectives.dispatch import nic_share

    assert nic_share(2) == pytest.approx(43 / 2 / 50)
    assert nic_share(4) == pytest.approx((58 + 57) / 2 * 3 / 4 / 50, abs=1e-3)
    assert nic_share(8) == pytest.approx((51 + 50) / 2 * 3.5 / 4 / 50, abs=1e-3)
    assert nic_share(3) == pytest.approx(0.43 + (0.863 - 0.43) * np.log2(1.5))
    assert nic_share(64) == nic_share(8) and nic_share(1) == nic_share(2)
    assert list(nic_share(np.array([2.0, 4.0, 8.0]))) == pytest.approx([0.43, 0.863, 0.884])
    # EP 16 over 2 nodes: one other node, hit by all but 1 in 300 tokens (Qwen3-30B-A3B: top-8 of 128, 64 a node),
    # at 0.43 of the NIC; a larger group never prices the share lower
    cluster = H100.cluster(16)
    network = TOKENS * HIDDEN * (1 - node_miss(128, K, 64)) / (0.43 * 50e9)
    assert forwarded_time(SENT, K, 128, 16, 1, cluster) == pytest.approx(network + 7 * 3e-6 + 5e-6)
    shares = [nic_share(n) for n in (1, 2, 3, 4, 6, 8, 16)]
    assert shares == sorted(shares)


def test_inside_one_node_forwarding_is_the_plain_all_to_all():
    """EP8 on one node: no network, every copy over NVLink either way: 7/8 of 470 MB at 360 GB/s."""
    cluster = H100.cluster(8)
    plain = collective_time("all_to_all", SENT, 8, 1, cluster)
    assert forwarded_time(SENT, K, E, 8, 1, cluster) == pytest.approx(plain)


@pytest.mark.parametrize("gpus", [16, 32, 64, 128])
def test_forwarding_is_never_slower_than_every_copy_and_never_slowed_by_bandwidth(gpus):
    """Property: forwarded ≤ plain on the presets' meshes; faster NICs or NVLink never lengthen it; experts = 0 is
    the plain all-to-all (dispatch_time), also element by element over an array of plans."""
    from dataclasses import replace

    cluster = H100.cluster(gpus)
    forwarded = forwarded_time(SENT, K, E, gpus, 1, cluster)
    plain = collective_time("all_to_all", SENT, gpus, 1, cluster)
    assert forwarded <= plain
    for scale in (1.5, 4.0):
        faster = replace(cluster, tiers=tuple(replace(t, bandwidth=t.bandwidth * scale) for t in cluster.tiers))
        assert forwarded_time(SENT, K, E, gpus, 1, faster) <= forwarded
    mixed = dispatch_time(SENT, K, np.array([E, 0.0]), gpus, 1, cluster)
    assert mixed[0] == pytest.approx(forwarded) and mixed[1] == pytest.approx(plain)


def _sglang_setting(moe_comm: str, gpus: int = 32) -> Setting:
    model = load_model("deepseek-v3")
    cols = {"tp": 1, "pp": 1, "dpa": gpus, "ep": gpus, "batch": 64.0 * gpus, "replicas": 1, "prefill_replicas": 0}
    engine = load_engine("sglang").with_(moe_comm=moe_comm)
    return Setting(model, H100.cluster(gpus), cols, Quant(weights="fp8", activations="fp8", kv_cache="bf16"), engine,
                   Workload(input_len=2048, output_len=256))


def test_deepep_forwards_the_prompt_iterations_and_leaves_the_decode_steps_alone():
    """SGLang with DeepEP (moe_comm "deepep") over 32 H100s: an iteration of 8,192 prompt tokens a GPU runs the normal
    kernels and is faster than with every copy sent over the network; a pure decode step runs the low-latency kernels,
    priced as before; on one node (EP8) the two are the same."""
    deepep, plain = _sglang_setting("deepep"), _sglang_setting("all_to_all")
    assert float(deepep.time(0.0, 8192.0, 4.0, 0.0)) < float(plain.time(0.0, 8192.0, 4.0, 0.0))
    assert float(deepep.time(64.0)) == pytest.approx(float(plain.time(64.0)))
    one = _sglang_setting("deepep", 8), _sglang_setting("all_to_all", 8)
    assert float(one[0].time(0.0, 8192.0, 4.0, 0.0)) == pytest.approx(float(one[1].time(0.0, 8192.0, 4.0, 0.0)))


def test_the_large_ep_blog_runs_deepep():
    """The SGLang large-EP blog's engine string maps to DeepEP with two-batch overlap (serving_map.ENGINES)."""
    from meshplan_validation.serving_map import case_of

    path = Path(__file__).resolve().parents[1] / "data" / "serving" / "published_serving.jsonl"
    record = next(json.loads(line) for line in path.read_text().splitlines()
                  if '"sglang_dsv3_prefill_h100_32gpu_ep32_2k"' in line)
    engine = case_of(record).engine
    assert engine.moe_comm == "deepep" and engine.two_batch_overlap



def test_training_flex_dispatcher_forwards_its_dispatch_and_combine():
    """Megatron-Core's flex dispatcher (--moe-token-dispatcher-type flex, DeepEP / HybridEP backend: Stack
    moe_dispatcher "flex") prices a training MoE layer's dispatch and combine as the forwarded kernels: DeepSeek-V3 at
    ep 32 over 4 B200 nodes sends a token over the network 3 x (1 - 0.0964) = 2.71 times, at DeepEP's 0.863 of the NIC
    against NCCL's 0.90, where the plain all-to-all sends 8 x 24/32 = 6 copies (each beside 7 x 3 + 3 x 5 us of
    latency); on one node (ep 8) the two are the same."""
    from meshplan.collectives.price import collective_seconds
    from meshplan.cost.layers import moe_layer
    from meshplan.specs.plan import Plan
    from meshplan.specs.stack import Stack

    model = load_model("deepseek-v3")
    deepep = 0.9 / 0.863  # NCCL's share of the NIC over DeepEP's over 4 nodes (dispatch.NIC_SHARES)
    across = (32, 3 * (1 - node_miss(E, K, 64)) / 6 * deepep, 7 * 3e-6 + 3 * 5e-6)
    for ep, ratio, latency in (across, (8, 1.0, 7 * 3e-6)):
        cluster = load_system("b200").cluster(ep)
        times = {}
        for name in ("alltoall", "flex"):
            ops = [o for o in moe_layer(model, Plan(dp=ep, ep=ep), Stack(moe_dispatcher=name))
                   if o.name in ("moe/dispatch", "moe/combine")]
            assert len(ops) == 4 and all(o.collective.kind == "all_to_all" for o in ops)
            times[name] = sum(float(collective_seconds(o.collective, 1, cluster)) for o in ops) - 4 * latency
        assert times["flex"] / times["alltoall"] == pytest.approx(ratio, rel=1e-3)
