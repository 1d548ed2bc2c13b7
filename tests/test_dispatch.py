"""DeepEP's normal kernels and HybridEP (dispatch.py): a token crosses the network once per node it hits, not once
per copy, at each backend's own measured rate; the serving engines that run DeepEP (engine moe_comm "deepep") price
their prompt iterations so and their decode steps as before."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshplan.collectives.comm import Collective
from meshplan.collectives.dispatch import dispatch_time, forwarded_time, node_hit, node_miss, rank_copies
from meshplan.collectives.price import collective_time
from meshplan.serve.engine import load_engine
from meshplan.serve.metrics import Setting
from meshplan.serve.plan import Workload
from meshplan.serve.precision import Quant
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.xp import Num

H100 = load_system("h100")
TOKENS, K, E, HIDDEN = 8192, 8, 256, 7168  # DeepSeek-V3's routing (top-8 of 256) and width, fp8 dispatch
SENT = TOKENS * K * HIDDEN  # bytes of every copy one GPU sends


def a2a(group: int, experts: Num = E, backend: str = "deepep") -> Collective:
    """The dispatch (or combine) of ``SENT`` bytes over ``group`` ranks of the ep axis, k = 8 copies a token, which
    ``backend``'s kernels forward where ``experts`` > 0 (what cost/mlp_moe.py builds for a flex stack)."""
    return Collective("all_to_all", SENT, "ep", group, copies=K, experts=experts, backend=backend)


def test_a_token_misses_a_node_with_the_hypergeometric_zero_term():
    """32 GPUs in 4 nodes hold 64 of the 256 experts each: a token's 8 experts all miss one node with probability
    Π_{j<8} (192 − j)/(256 − j) = 0.0964; every expert on one node: never missed; one expert a node: (1 − 8/256)."""
    assert node_miss(E, K, 64) == pytest.approx(np.prod([(192 - j) / (256 - j) for j in range(8)]))
    assert node_miss(E, K, 64) == pytest.approx(0.0964, abs=1e-4)
    assert node_miss(E, K, E) == 0.0
    assert node_miss(E, K, 1) == pytest.approx(1 - 8 / 256)


def test_contiguous_routing_hits_the_nodes_its_k_experts_in_a_row_span():
    """k = 8 experts in a row from a multiple of 8 (AutoModel's FakeBalancedGate): on nodes of 32 experts each they
    sit on one of the 8 nodes, 32/256 = 1/8 a node, against 1 − 0.33 = 0.66 for a uniform router; on nodes of 4 they
    span 2 of the 64, 8/256 a node; on one node of all 256, always hit."""
    assert node_hit(E, K, 32, "contiguous") == pytest.approx(1 / 8)
    assert node_hit(E, K, 32) == pytest.approx(1 - np.prod([(224 - j) / (256 - j) for j in range(8)]))
    assert node_hit(E, K, 32) == pytest.approx(0.662, abs=1e-3)
    assert node_hit(E, K, 4, "contiguous") * (E / 4) == pytest.approx(2.0)  # nodes a token hits
    assert node_hit(E, K, E, "contiguous") == 1.0


def test_nvlink_carries_one_copy_a_rank_under_contiguous_routing():
    """DeepEP sends a token once to each rank holding its experts: 8 experts in a row on ranks of 16 (Qwen3-30B's 128
    over EP 8) sit on one rank, on ranks of 4 (DeepSeek-V3's 256 over EP 64) on 2."""
    assert rank_copies(128, 8, 16, "contiguous") == 1.0
    assert rank_copies(E, K, 4, "contiguous") == 2.0


def test_nvlink_carries_one_copy_to_each_distinct_rank_under_uniform_routing():
    """Uniform routing: a rank of r experts is missed by all k with probability C(E − r, k)/C(E, k), so a token hits
    R·(1 − C(E − r, k)/C(E, k)) of the R = E/r ranks. DeepSeek-V3 over EP 8 (32 experts a rank): 8 × (1 − 0.338) =
    5.29 ranks, not 8 copies; over EP 32 (8 a rank): 32 × (1 − 0.773) = 7.27; over EP 256 (one a rank): every copy
    on its own rank, 8; Qwen3-30B-A3B (top-8 of 128) over EP 8: 8 × (1 − 0.333) = 5.34."""
    from math import comb

    assert rank_copies(E, K, 32) == pytest.approx(8 * (1 - comb(224, 8) / comb(256, 8)))
    assert rank_copies(E, K, 32) == pytest.approx(5.29, abs=5e-3)
    assert rank_copies(E, K, 8) == pytest.approx(32 * (1 - comb(248, 8) / comb(256, 8)))
    assert rank_copies(E, K, 8) == pytest.approx(7.27, abs=5e-3)
    assert rank_copies(E, K, 1) == pytest.approx(8.0)
    assert rank_copies(128, K, 16) == pytest.approx(8 * (1 - comb(112, 8) / comb(128, 8)))
    assert rank_copies(128, K, 16) == pytest.approx(5.34, abs=5e-3)
    assert rank_copies(E, K, E) == 1.0  # every expert on one rank: one copy


@pytest.mark.parametrize("routing", ["uniform", "contiguous"])
def test_fewer_copies_or_more_experts_a_rank_never_send_more_copies(routing):
    """Property: of E = 256, the distinct ranks a token hits never grow as its k falls (1 to 8) or as a rank holds
    more experts (1 to 256): at most k, at least 1."""
    for per_rank in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        copies = [rank_copies(E, k, per_rank, routing) for k in range(1, 9)]
        assert copies == sorted(copies) and all(1 - 1e-12 <= c <= k + 1e-12 for k, c in enumerate(copies, 1))
    for k in (1, 2, 4, 8):
        copies = [rank_copies(E, k, r, routing) for r in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
        assert copies == sorted(copies, reverse=True)


def test_forwarding_sends_a_token_once_to_each_node_it_hits():
    """EP32 over 4 H100 nodes (NVLink 450 GB/s x 0.8, one 400 Gb/s NIC a GPU, 50 GB/s x 0.9). The plain all-to-all
    sends 24/32 of its 470 MB of copies over the network: 352 MB / 45 GB/s = 7.83 ms. Forwarded, each of the 8,192
    tokens (7,168 bytes) goes to 3 × (1 − 0.0964) = 2.71 other nodes at DeepEP's measured NIC rate over 4 nodes,
    0.863 x 50 GB/s (its NIC-bound point: specs/stack_variants.py "flex_backend"): 159 MB / 43.15 GB/s = 3.69 ms,
    while NVLink fans out one copy to each of the 7.27 ranks a token hits, 7/8 of them other GPUs of their node,
    470 MB x 7.27/8 x 7/8 / 360 GB/s = 1.04 ms, beside it. Both pay 7 × 3 + 3 × 5 = 36 µs of latency."""
    cluster = H100.cluster(32)
    latency = 7 * 3e-6 + 3 * 5e-6
    plain = collective_time("all_to_all", SENT, 32, 1, cluster)
    assert plain == pytest.approx(SENT * 24 / 32 / 45e9 + latency)
    network = TOKENS * HIDDEN * 3 * (1 - node_miss(E, K, 64)) / (0.863 * 50e9)
    assert network > SENT * rank_copies(E, K, 8) / 8 * 7 / 8 / 360e9  # the network, not NVLink, sets the time
    assert forwarded_time(a2a(32, E), 1, cluster) == pytest.approx(network + latency)
    assert network + latency == pytest.approx(3.725e-3, rel=1e-3)


def test_deepep_share_of_the_nic_is_priced_by_the_nodes_spanned():
    """DeepEP's internode table (docs/legacy.md @ dd758ca; dispatch.py) on a 400 Gb/s NIC (50 GB/s): EP 16 over 2
    nodes reads 43 / 43 GB/s of logical traffic, half of it its own node's: 21.5 / 50 GB/s = 0.43 of the NIC (a
    kernel limit: NIC-bound it would read ~87 logical); EP 32 over 4 nodes 58 / 57 GB/s, 3/4 on the NIC:
    (43.5 + 42.75) / 2 / 50 = 0.863; EP 64 over 8 nodes 51 / 50 GB/s, 3.5/4 on the NIC: 0.884. Between them linear in
    log2(nodes): 3 nodes 0.43 + (0.863 − 0.43) × log2(1.5) = 0.683; beyond 8 the last."""
    from meshplan.collectives.dispatch import nic_share

    nic = 50e9
    assert nic_share(2, nic) == pytest.approx(43 / 2 / 50)
    assert nic_share(4, nic) == pytest.approx((58 + 57) / 2 * 3 / 4 / 50, abs=1e-3)
    assert nic_share(8, nic) == pytest.approx((51 + 50) / 2 * 3.5 / 4 / 50, abs=1e-3)
    assert nic_share(3, nic) == pytest.approx(0.43 + (0.863 - 0.43) * np.log2(1.5))
    assert nic_share(64, nic) == nic_share(8, nic) and nic_share(1, nic) == nic_share(2, nic)
    assert list(nic_share(np.array([2.0, 4.0, 8.0]), nic)) == pytest.approx([0.43, 0.863, 0.884])
    # EP 16 over 2 nodes: one other node, hit by all but 1 in 300 tokens (Qwen3-30B-A3B: top-8 of 128, 64 a node),
    # at 0.43 of the NIC; a larger group never prices the share lower
    cluster = H100.cluster(16)
    network = TOKENS * HIDDEN * (1 - node_miss(128, K, 64)) / (0.43 * 50e9)
    assert forwarded_time(a2a(16, 128), 1, cluster) == pytest.approx(network + 7 * 3e-6 + 5e-6)


def test_the_two_node_kernel_limit_is_absolute_and_the_nic_bound_points_scale_with_the_nic():
    """The 2-node point is the kernel's 43 GB/s logical (21.5 GB/s on the NIC), not a share: on an 800 Gb/s NIC
    (100 GB/s: ConnectX-8) it is 21.5 / 100 = 0.215 of it, the same bytes/s, while the NIC-bound 4- and 8-node points
    keep their shares (0.863 x 100 = 86.3 GB/s). On a 200 Gb/s NIC (25 GB/s) the kernel's 21.5 GB/s would be 0.86
    of it: capped at the NIC-bound share over 4 nodes, 0.863, it stays 0.86."""
    from meshplan.collectives.dispatch import nic_share

    assert nic_share(2, 100e9) == pytest.approx(21.5 / 100)
    assert nic_share(2, 100e9) * 100e9 == pytest.approx(nic_share(2, 50e9) * 50e9)  # the same absolute rate
    assert nic_share(4, 100e9) == pytest.approx(0.863) and nic_share(8, 100e9) == pytest.approx(0.884)
    assert nic_share(2, 25e9) == pytest.approx(21.5 / 25)
    assert nic_share(2, 20e9) == pytest.approx(0.863)  # 21.5 / 20 > 1: the NIC binds, at its measured share


def test_hybridep_is_priced_at_its_own_h100_table():
    """HybridEP's H100 table (DeepEP branch hybrid-ep @ 94a9f8f docs/README_Hybrid-EP.md), Torch API at
    Megatron-Core's 16 SMs, BF16 dispatch / combine averaged, logical GB/s with the sender's node counted:
    16 ranks (54.47 + 53.35) / 2 = 53.91, 1/2 on the NIC: 26.96 / 50 = 0.539; 32 ranks (47.36 + 52.53) / 2 = 49.945,
    3/4 on it: 0.749; 64 ranks (41.24 + 46.57) / 2 = 43.905, 7/8: 0.768. All three are kernel limits: its kernels
    alone reach (57.69 + 57.46) / 2 x 3/4 / 50 = 0.864 and (49.97 + 49.77) / 2 x 7/8 / 50 = 0.873 of the NIC over 4
    and 8 nodes, the caps on a slow NIC. Qwen3-30B-A3B's EP 16 over 2 H100 nodes: 0.539 of the NIC, not DeepEP's
    0.43."""
    from meshplan.collectives.dispatch import nic_share

    nic = 50e9
    assert nic_share(2, nic, "hybridep") == pytest.approx((54.47 + 53.35) / 2 / 2 / 50)
    assert nic_share(4, nic, "hybridep") == pytest.approx((47.36 + 52.53) / 2 * 3 / 4 / 50)
    assert nic_share(8, nic, "hybridep") == pytest.approx((41.24 + 46.57) / 2 * 7 / 8 / 50)
    assert nic_share(8, 10e9, "hybridep") == pytest.approx((49.97 + 49.77) / 2 * 7 / 8 / 50, abs=1e-4)
    cluster = H100.cluster(16)
    share = (54.47 + 53.35) / 4 / 50
    network = TOKENS * HIDDEN * (1 - node_miss(128, K, 64)) / (share * 50e9)
    assert forwarded_time(a2a(16, 128, "hybridep"), 1, cluster) == pytest.approx(
        network + 7 * 3e-6 + 5e-6)


@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
@pytest.mark.parametrize("nic", [25e9, 50e9, 100e9])
def test_a_backends_share_never_falls_as_nodes_are_added(backend, nic):
    """Property: over 1 to 16 nodes on a 200, 400 or 800 Gb/s NIC, each backend's share of the NIC never falls."""
    from meshplan.collectives.dispatch import nic_share

    shares = [nic_share(n, nic, backend) for n in (1, 2, 3, 4, 6, 8, 16)]
    assert shares == sorted(shares)


@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
def test_more_ranks_a_node_or_fewer_copies_never_slow_the_forwarded_exchange(backend):
    """Property: DeepSeek-V3's routing over 64 H100s. Packing the same 64 ranks into larger scale-up domains (4, 8,
    16, 32, 64 GPUs a node: fewer nodes to cross, the tokens deduplicated per rank over NVLink) never slows the
    dispatch; nor does a smaller k at the same tokens (1 to 8 copies a token, the bytes of each the same)."""
    from dataclasses import replace

    base = H100.cluster(64)
    times = []
    for per_node in (4, 8, 16, 32, 64):
        tiers = (replace(base.tiers[0], size=per_node), replace(base.tiers[1], size=64 // per_node))
        times.append(forwarded_time(a2a(64, E, backend), 1, replace(base, tiers=tiers)))
    assert times == sorted(times, reverse=True)
    by_k = [forwarded_time(Collective("all_to_all", TOKENS * k * HIDDEN, "ep", 64, copies=k, experts=E,
                                      backend=backend), 1, base) for k in range(1, 9)]
    assert by_k == sorted(by_k)


@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
@pytest.mark.parametrize("gpus", [16, 32, 64, 128])
def test_forwarding_is_never_slower_than_every_copy_and_never_slowed_by_bandwidth(gpus, backend):
    """Property: forwarded ≤ plain on the presets' meshes; faster NICs or NVLink never lengthen it, a kernel-bound
    point included (its bytes/s fixed, the NIC's cap raised); experts = 0 is the plain all-to-all (dispatch_time),
    also element by element over an array of plans."""
    from dataclasses import replace

    cluster = H100.cluster(gpus)
    forwarded = forwarded_time(a2a(gpus, E, backend), 1, cluster)
    plain = collective_time("all_to_all", SENT, gpus, 1, cluster)
    assert forwarded <= plain
    last = forwarded
    for scale in (0.25, 0.5, 1.5, 2.0, 4.0):
        scaled = replace(cluster, tiers=tuple(replace(t, bandwidth=t.bandwidth * scale) for t in cluster.tiers))
        time = forwarded_time(a2a(gpus, E, backend), 1, scaled)
        assert time <= last * (1 + 1e-12) if scale > 1 else time >= forwarded  # a kernel-bound time: constant
        last = time if scale > 1 else last
    mixed = dispatch_time(a2a(gpus, np.array([E, 0.0]), backend), 1, cluster)
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
    priced as before; on one node (EP8) the prompt iteration is faster too (one copy a rank over NVLink), the decode
    step the same."""
    deepep, plain = _sglang_setting("deepep"), _sglang_setting("all_to_all")
    assert float(deepep.time(0.0, 8192.0, 4.0, 0.0)) < float(plain.time(0.0, 8192.0, 4.0, 0.0))
    assert float(deepep.time(64.0)) == pytest.approx(float(plain.time(64.0)))
    one = _sglang_setting("deepep", 8), _sglang_setting("all_to_all", 8)
    assert float(one[0].time(0.0, 8192.0, 4.0, 0.0)) < float(one[1].time(0.0, 8192.0, 4.0, 0.0))
    assert float(one[0].time(64.0)) == pytest.approx(float(one[1].time(64.0)))


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
    latency); on one node (ep 8) DeepEP sends one row to each of the 5.29 ranks a token hits, not 8 copies, but at
    its kernels' 391 GB/s of rows (20 SMs), where NCCL's all-to-all is priced at 720 GB/s on the link, 7/8 of its
    rows: 5.29/8 x 8/7 x 720/391 = 1.39 x the all-to-all's time."""
    from meshplan.collectives.price import collective_seconds
    from meshplan.cost.layers import moe_layer
    from meshplan.specs.plan import Plan
    from meshplan.specs.stack import Stack

    model = load_model("deepseek-v3")
    deepep = 0.9 / 0.863  # NCCL's share of the NIC over DeepEP's over 4 nodes (its "flex_backend" entry)
    across = (32, 3 * (1 - node_miss(E, K, 64)) / 6 * deepep, 7 * 3e-6 + 3 * 5e-6)
    for ep, ratio, latency in (across, (8, rank_copies(E, K, 32) / 8 * 8 / 7 * 720e9 / 391e9, 7 * 3e-6)):
        cluster = load_system("b200").cluster(ep)
        times = {}
        for name in ("alltoall", "flex"):
            ops = [o for o in moe_layer(model, Plan(dp=ep, ep=ep), Stack(moe_dispatcher=name))
                   if o.name in ("moe/dispatch", "moe/combine")]
            assert len(ops) == 4 and all(o.collective.kind == "all_to_all" for o in ops)
            times[name] = sum(float(collective_seconds(o.collective, 1, cluster)) for o in ops) - 4 * latency
        assert times["flex"] / times["alltoall"] == pytest.approx(ratio, rel=1e-3)


def test_hybridep_at_32_sms_is_priced_at_the_readmes_32_sm_rows():
    """Megatron-Bridge's harness runs HybridEP at 32 SMs ("hybridep-32sm"; Megatron-Core's default 16: "hybridep").
    GB200 BF16 dispatch / combine at 32 SMs (README_Hybrid-EP.md @ 94a9f8f): 8 ranks (545.71 + 568.94) / 2 = 557.325
    GB/s, 16 (523.48 + 521.55) / 2 = 522.515, 24 (507.32 + 483.76) / 2 = 495.54, 32 (484.22 + 464.54) / 2 = 474.38,
    36 (479.02 + 447.89) / 2 = 463.455: 2-12 % over the 16-SM rows. Across nodes the README's H100 table stops at 16
    SMs, where the NIC binds already (8 SMs read as fast): the same cross-node points as 16 SMs."""
    from meshplan.collectives.dispatch import nvlink_rate
    from meshplan.specs.stack_variants import choice_of, flex_backend_of

    for ranks, (dispatch, combine) in ((8, (545.71, 568.94)), (16, (523.48, 521.55)), (24, (507.32, 483.76)),
                                       (32, (484.22, 464.54)), (36, (479.02, 447.89))):
        assert nvlink_rate(ranks, "hybridep-32sm", "blackwell") == pytest.approx((dispatch + combine) / 2 * 1e9)
        assert nvlink_rate(ranks, "hybridep-32sm", "blackwell") > nvlink_rate(ranks, "hybridep", "blackwell")
    assert nvlink_rate(64, "hybridep-32sm", "blackwell") == pytest.approx(463.455e9)
    at16, at32 = choice_of("flex_backend", "hybridep"), choice_of("flex_backend", "hybridep-32sm")
    assert (at32.kernel, at32.nic, at32.pads_for_quantization) == (at16.kernel, at16.nic, True)
    assert (at16.argument, at16.num_sms, at32.argument, at32.num_sms) == ("hybridep", 16, "hybridep", 32)
    # a config's --moe-flex-dispatcher-backend at its --moe-hybridep-num-sms: the variant measured nearest
    assert [flex_backend_of("hybridep", n) for n in (None, "16", 24, "32", 128)] == \
        ["hybridep", "hybridep", "hybridep", "hybridep-32sm", "hybridep-32sm"]
    assert flex_backend_of("deepep", "32") == "deepep"


def test_hybridep_at_32_sms_is_written_and_read_as_megatron_core_takes_it():
    """A "hybridep-32sm" stack writes --moe-flex-dispatcher-backend hybridep --moe-hybridep-num-sms 32 (Megatron-Core
    refuses any other backend name: transformer_config.py @ core_v0.17.0) and reads back as itself; "hybridep"
    writes no SM count (Megatron-Core's default, 16); the variant's name is no argument value."""
    from meshplan.configs import emit, read
    from meshplan.errors import SpecError
    from meshplan.specs.plan import Plan
    from meshplan.specs.stack import load_stack

    model = load_model("qwen3-30b-a3b")
    plan = Plan(dp=16, tp=1, pp=1, ep=8, etp=1, micro_batch=1, global_batch=64, zero=1)
    for preset, fmt in (("megatron-core", "megatron"), ("megatron-bridge", "nemo")):
        base = load_stack(preset).with_(moe_dispatcher="flex")
        text32, text16 = (emit(fmt, model, plan, base.with_(flex_backend=b)) for b in ("hybridep-32sm", "hybridep"))
        backend, sms = (("--moe-flex-dispatcher-backend ", "--moe-hybridep-num-sms ") if fmt == "megatron" else
                        ("model.moe_flex_dispatcher_backend=", "model.moe_hybridep_num_sms="))
        assert f"{backend}hybridep" in text32 and f"{sms}32" in text32 and f"{backend}hybridep-" not in text32
        assert f"{backend}hybridep" in text16 and sms not in text16
        assert read(fmt, model, plan.num_gpus, text=text32)[1].flex_backend == "hybridep-32sm"
        assert read(fmt, model, plan.num_gpus, text=text16)[1].flex_backend == "hybridep"
        with pytest.raises(SpecError):
            read(fmt, model, plan.num_gpus, text=text16.replace(f"{backend}hybridep", f"{backend}hybridep-32sm"))
