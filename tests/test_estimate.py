"""estimate(): relations that must hold whatever the efficiency constants are."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import gpt
from meshplan.cost.flops import model_flops_per_token
from meshplan.estimate import estimate
from meshplan.pipeline.simulator import simulate
from meshplan.pipeline.tables import build
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack
from meshplan.step.assemble import step_costs


def h100(n: int):
    return load_system("h100").cluster(n)


def test_breakdown_sums_to_step_time():
    est = estimate(load_model("llama3-8b"), h100(64), Plan(dp=8, tp=4, pp=2, global_batch=64,
                                                          sequence_parallel=True))
    assert sum(est.breakdown.values()) == pytest.approx(est.step_time)
    assert sum(est.memory.values()) == pytest.approx(est.peak_memory)


def test_mfu_definition():
    model = load_model("llama3-8b")
    est = estimate(model, h100(8), Plan(dp=8, global_batch=64, zero=1, recompute="none"))
    # MFU = 6N+attn FLOPs per token · tokens / (time · peak · GPUs)
    tokens = 64 * model.seq_length
    assert est.mfu == pytest.approx(model_flops_per_token(model) * tokens / est.step_time / (989e12 * 8))
    assert est.hfu == pytest.approx(est.mfu)  # no recompute


def test_mfu_is_taken_against_the_peak_of_the_precision_that_runs():
    """Issue 34: megatron-1t on 512 B300s in fp4 read MFU 1.47 against the bf16 peak. It is now taken against the
    fp4 peak (13.5 PFLOP/s dense, 6x bf16's 2.25); the bf16-basis figure stays, named, 6x as large."""
    est = estimate(load_model("megatron-1t"), load_system("b300").cluster(512),
                   Plan(dp=4, tp=8, pp=16, global_batch=512, zero=1, recompute="full", sequence_parallel=True,
                        precision="fp4"))
    assert est.mfu_basis == "fp4" and est.peak_flops_per_gpu == 13500e12
    assert 0 < est.mfu <= est.hfu <= 1
    # issue 48: a 16-bit basis of an fp4 plan (6x its peak) is no utilisation (it passed 1): none is given
    assert est.mfu_bf16 is None and est.hfu_bf16 is None
    d = est.to_dict(ops=False)
    assert (d["mfu_basis"], d["mfu"], d["mfu_bf16"]) == ("fp4", est.mfu, None)
    # fp8 (4.5 PFLOP/s dense on B300, 2x bf16's 2.25): the 16-bit basis NVIDIA's FP8 tables quote, twice the MFU
    fp8 = estimate(load_model("megatron-1t"), load_system("b300").cluster(512),
                   Plan(dp=4, tp=8, pp=16, global_batch=512, zero=1, recompute="full", sequence_parallel=True,
                        precision="fp8"))
    assert fp8.mfu_bf16 == pytest.approx(fp8.mfu * 4500 / 2250)
    # a bf16 plan: one basis
    bf16 = estimate(load_model("llama3-8b"), h100(8), Plan(dp=8, global_batch=64, zero=1))
    assert bf16.mfu == bf16.mfu_bf16 and bf16.mfu_basis == "bf16"


def test_full_recompute_adds_one_forward():
    model, c = gpt(layers=8), h100(8)
    none = estimate(model, c, Plan(tp=8, sequence_parallel=True))
    full = estimate(model, c, Plan(tp=8, sequence_parallel=True, recompute="full"))
    fwd_layers = none.breakdown["compute"]  # forward kernels are 1/3 of GEMM time, so check against stage_fwd
    costs = step_costs(model, c, Plan(tp=8, sequence_parallel=True))
    layers_fwd = costs.stage_fwd - 0  # includes embedding and head forward, which are not recomputed
    assert 0 < full.breakdown["recompute"] <= layers_fwd + none.breakdown["tp"]
    assert full.step_time > none.step_time and fwd_layers > 0
    # hardware FLOPs add the recomputed forward (without the LM head)
    extra = full.hardware_flops - full.model_flops
    layer_fwd_flops = (model_flops_per_token(model) / 3 - 2 * model.vocab_size * model.hidden_size)
    assert extra == pytest.approx(layer_fwd_flops * model.seq_length * full.plan.global_batch)


def test_pipeline_bubble_matches_the_simulator():
    """The bubble formula (bubble.flow_bubble) against the schedule simulator fed each rank's own times."""
    model, c = gpt(layers=8), h100(8)
    for plan in (Plan(pp=4, dp=2, global_batch=16), Plan(pp=4, dp=2, vpp=2, global_batch=16,
                                                         schedule="interleaved")):
        costs = step_costs(model, c, plan)
        m, p, v = plan.grad_accum, plan.pp, plan.vpp
        (f0, b0), (fm, bm), (fl, bl) = costs.ranks  # first, middle, last rank per micro-batch
        tf, tb = [f0 / v, fm / v, fm / v, fl / v], [b0 / v, bm / v, bm / v, bl / v]
        sim = simulate(build(plan.schedule, p, m, v), tf, tb)
        pipeline = sum(costs.breakdown[k] for k in ("compute", "recompute", "tp", "cp", "ep", "pp", "bubble"))
        assert pipeline == pytest.approx(sim.step_time, rel=1e-9)
        # the LM head makes the last rank the busiest; the bubble is paid at the others' times:
        # (t_first + (p − 2)·t_middle) / v, not (p − 1)/v · t_last
        t0, tm, tl = f0 + b0, fm + bm, fl + bl
        assert tl > t0 > tm
        assert costs.breakdown["bubble"] == pytest.approx((t0 + (p - 2) * tm) / v, rel=1e-9)
        assert costs.breakdown["bubble"] < (p - 1) / v * tl
        # equal ranks give the textbook bubble (p − 1)/(v·m) of the ideal time
        even = simulate(build(plan.schedule, p, m, v), tm / v, tm / v)
        assert even.bubble_fraction == pytest.approx((p - 1) / (v * m))


def test_overlapped_pipeline_sends_cost_the_overlap_slowdown_with_interleaving_only():
    """Megatron-Core's overlap_p2p_comm (Stack.overlap_pp) hides each chunk's send behind another chunk's compute,
    slowing it by 18.9 % of the send (efficiency.overlap_slowdown); without virtual stages Megatron turns it off,
    so a 1F1B plan pays its sends in full either way."""
    model, c = gpt(layers=8), h100(64)
    kw = dict(pp=4, dp=2, tp=8, sequence_parallel=True, global_batch=16)  # pp outermost: sends cross nodes
    interleaved = dict(kw, vpp=2, schedule="interleaved")
    exposed, hidden = (estimate(model, c, Plan(**interleaved), Stack(overlap_pp=o)).breakdown for o in (False, True))
    assert exposed["pp"] > 0
    assert hidden["pp"] == pytest.approx(0.189 * exposed["pp"])
    assert hidden["compute"] == pytest.approx(exposed["compute"])
    plain = [estimate(model, c, Plan(**kw), Stack(overlap_pp=o)).breakdown["pp"] for o in (False, True)]
    assert plain[0] == plain[1] > 0
    # the vectorised path (step_costs on totals) agrees with the per-component breakdown
    costs = step_costs(model, c, Plan(**interleaved), Stack(overlap_pp=True))
    assert float(costs.step_time) == pytest.approx(sum(hidden.values()))


def test_more_flops_or_bandwidth_is_never_slower():
    model = load_model("llama3-8b")
    system = load_system("h100")
    plan = Plan(dp=4, tp=4, pp=2, global_batch=64, sequence_parallel=True)
    base = estimate(model, system.cluster(32), plan).step_time
    acc = system.accelerator
    faster = [
        replace(acc, peak_flops={k: 2 * v for k, v in acc.peak_flops.items()}),
        replace(acc, hbm_bandwidth=2 * acc.hbm_bandwidth),
        replace(acc, nvlink_bandwidth=2 * acc.nvlink_bandwidth),
    ]
    for a in faster:
        assert estimate(model, replace(system, accelerator=a).cluster(32), plan).step_time <= base
    net = replace(system.network, nic_bandwidth=2 * system.network.nic_bandwidth)
    assert estimate(model, replace(system, network=net).cluster(32), plan).step_time <= base


def test_zero3_peak_memory_falls_as_dp_grows():
    model = load_model("llama3-8b")
    peaks = [estimate(model, h100(n), Plan(dp=n, zero=3, global_batch=n)).peak_memory for n in (8, 16, 32, 64)]
    assert peaks == sorted(peaks, reverse=True)


def test_does_not_fit_is_a_result():
    est = estimate(load_model("llama3-70b"), h100(8), Plan(dp=8, zero=0, global_batch=8))
    assert not est.fits and est.reasons[0].startswith("memory ")


def test_moe_model_estimates():
    est = estimate(load_model("mixtral-8x7b"), h100(64), Plan(dp=8, tp=2, pp=4, ep=8, etp=1, global_batch=64,
                                                             sequence_parallel=True))
    assert est.breakdown["ep"] > 0 and est.step_time > 0


def test_vectorised_costs_equal_scalar_costs():
    """step_costs accepts arrays in the numeric plan fields and returns the same numbers elementwise."""
    import numpy as np

    from meshplan.search.batch import PlanBatch

    model, c = load_model("llama3-8b"), h100(64)
    plans = [Plan(dp=64 // (t * p), tp=t, pp=p, global_batch=128, micro_batch=1, sequence_parallel=t > 1)
             for t, p in ((1, 1), (2, 2), (4, 2), (8, 1), (8, 8))]
    for sp in (False, True):
        group = [p for p in plans if p.sequence_parallel == sp]
        batch = PlanBatch.of(group)
        vec = step_costs(model, c, batch)
        for i, plan in enumerate(group):
            one = step_costs(model, c, plan)
            assert np.asarray(vec.step_time)[i] == pytest.approx(one.step_time, rel=1e-12)
            assert np.asarray(vec.peak_memory)[i] == pytest.approx(one.peak_memory, rel=1e-12)


def test_pipeline_sends_are_priced_on_the_slowest_link_of_the_stages_chain():
    """tp = 4, pp = 4 on two 8-GPU servers: stages 0–1 share server 0 and stages 2–3 server 1, so the 1 → 2 send
    crosses InfiniBand; the stage that sends over it paces the pipeline, so every send is priced there. With
    tp = 2 the four stages fit one server and every send stays on NVLink."""
    from meshplan.collectives.price import collective_time

    model, c = gpt(layers=8), h100(16)
    msg = 2048 * 1024 * 2 / 4  # one micro-batch's activations (2048 tokens · 1024 · 2 bytes), 1/tp per rank
    nvlink, network = c.tiers[0], c.tiers[1]
    over_ib = network.latency + msg / (network.bandwidth * 0.9)  # one hop, α + n/B, at NCCL's network efficiency
    est = estimate(model, c, Plan(tp=4, pp=4, sequence_parallel=True, global_batch=8))
    sends = [o for o in est.ops if o.name.startswith("pp/send")]
    assert len(sends) == 2 and all(o.seconds == pytest.approx(over_ib) for o in sends)
    # stage 1 → 2 alone would be a pair 4 ranks apart, which used to be priced on NVLink
    assert collective_time("p2p", msg, 2, 4, c) < over_ib / 2
    inside = estimate(model, h100(8), Plan(tp=2, pp=4, sequence_parallel=True, global_batch=8))
    half = 2048 * 1024 * 2 / 2
    on_nvlink = nvlink.latency + half / (nvlink.bandwidth * 0.8)
    assert all(o.seconds == pytest.approx(on_nvlink) for o in inside.ops if o.name.startswith("pp/send"))


def test_expert_groups_step_over_a_pipeline_placed_inside_them():
    """Mixtral on two 8-GPU servers, pp = 2, dp = 8, ep = 8. With pp outermost the 8 expert-parallel ranks of a
    stage are one server (0..7): the all-to-all stays on NVLink. With pp innermost a stage's ranks are 0, 2, …,
    14, so its expert group spans both servers: 4 per server × 2 (groups.expert_layout), and the all-to-all
    crosses InfiniBand. Pricing both at stride etp = 1 (before) made the second as cheap as the first."""
    from meshplan.collectives.comm import split_group
    from meshplan.collectives.groups import axis_layout

    model, cluster = load_model("mixtral-8x7b").with_seq_length(4096), load_system("h100").cluster(16)
    outer = Plan(dp=8, pp=2, ep=8, global_batch=64, recompute="full", placement=("tp", "cp", "dp", "pp"))
    inner = replace(outer, placement=("pp", "tp", "cp", "dp"))
    assert split_group(cluster, 8, axis_layout(outer, "ep")) == [8, 1]
    assert axis_layout(inner, "ep") == ((1, 1), (8.0, 2))  # s_pp = 1: every step of the domain skips a stage
    assert split_group(cluster, 8, axis_layout(inner, "ep")) == [4, 2]
    assert estimate(model, cluster, inner).breakdown["ep"] > 3 * estimate(model, cluster, outer).breakdown["ep"]


def test_the_gradient_group_of_dp_and_cp_apart_in_the_placement():
    """cp = 2, pp = 2, dp = 4 on two servers. Placed (cp, dp, pp) the dp·cp group is ranks 0..7 (one server);
    placed (cp, pp, dp) it is cp at stride 1 × dp at stride 4: ranks 0, 1, 4, 5, 8, 9, 12, 13, four per server.
    The gradient reduction then crosses servers; treating the group as contiguous at the inner stride priced
    both on NVLink."""
    from meshplan.collectives.comm import split_group
    from meshplan.collectives.groups import axis_layout

    model, cluster = load_model("llama3-8b").with_seq_length(8192), load_system("h100").cluster(16)
    adjacent = Plan(dp=4, cp=2, pp=2, global_batch=64, zero=0, placement=("tp", "cp", "dp", "pp"))
    apart = replace(adjacent, placement=("tp", "cp", "pp", "dp"))
    assert split_group(cluster, 8, axis_layout(adjacent, "dp")) == [8, 1]
    assert split_group(cluster, 8, axis_layout(apart, "dp")) == [4, 2]
    assert estimate(model, cluster, apart).breakdown["dp"] > estimate(model, cluster, adjacent).breakdown["dp"]


def test_the_combined_1f1b_schedule_hides_the_all_to_alls_behind_the_nodes_beside_them():
    """Megatron-Core's combined 1F1B (model_chunk_schedule_plan.py): comm_stream combine_bwd | dispatch_fwd ->
    dispatch_bwd | combine_fwd beside comp_stream attn_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | attn_bwd. Times:
    forward attention 10, experts 4, dispatch 6, combine 12; backward attention 15, experts' input gradients 5 and
    weight gradients 5, dispatch 6, combine 12. The layer takes max(10, 12) + max(max(6, 5) + 6, max(5 + 5, 6) + 4)
    + max(12, 15) = 12 + 14 + 15 = 41 against 39 of kernels: 2 exposed, the other 36 − 2 = 34 of all-to-all hidden,
    slowing the compute by 0.189 × 34: 2 + 6.426 = 8.426, half of it the forward's (18 of the 36)."""
    from meshplan.cost.blocks import collective
    from meshplan.cost.records import OpCost
    from meshplan.step.passes import pass_times

    def a2a(name, phase):
        return collective(name, phase, "all_to_all", 1.0, "ep", 8)

    ops = [OpCost("attn/qkv", "fwd", "gemm"), OpCost("moe/experts/fc1", "fwd", "gemm"),
           a2a("moe/dispatch", "fwd"), a2a("moe/combine", "fwd"),
           OpCost("attn/qkv", "bwd_x", "gemm"), OpCost("moe/experts/fc1", "bwd_x", "gemm"),
           OpCost("moe/experts/fc1", "bwd_w", "gemm"), a2a("moe/dispatch", "bwd_x"), a2a("moe/combine", "bwd_x")]
    times = [10.0, 4.0, 6.0, 12.0, 15.0, 5.0, 5.0, 6.0, 12.0]
    paired = pass_times(ops, times, Plan(ep=8, dp=8), Stack(overlap_ep=True), "none")
    assert (paired.fwd, paired.bwd) == (14.0, 25.0)
    assert paired.ep == pytest.approx(2 + 0.189 * 34)
    exposed = pass_times(ops, times, Plan(ep=8, dp=8), Stack(), "none")
    assert exposed.ep == 36.0  # no overlap: every all-to-all on the critical path
    assert paired.unpaired == pytest.approx(36 - (2 + 0.189 * 34))  # a pass without a partner exposes all 36
    assert exposed.unpaired == 0.0


def test_the_combined_1f1b_schedule_runs_its_warm_up_and_cool_down_alone():
    """Megatron-Core core_v0.14.0 schedules.py get_pp_rank_microbatches: rank r of an interleaved pipeline runs
    (pp − r − 1)·2 + (v − 1)·pp + 1 forward chunks of warm-up alone under overlap_moe_expert_parallel_comm, and as many
    backward chunks of cool-down; combined_1f1b.py without a pipeline: the first forward and the last backward.
    Along the last rank, with the pp − 1 chunks of fill and drain: min(m, ((v − 1)·pp + 1)/v) + (pp − 1)/v passes of
    its layers: pp = 8, v = 4, m = 128 (the H100 DeepSeek-V3 record): min(128, 25/4) + 7/4 = 8 = pp; pp = 1: 1;
    pp = 2, v = 2, m = 2: min(2, 3/2) + 1/2 = 2 = m, every pass's all-to-alls exposed as without the overlap."""
    from meshplan.step.stages import unpaired_passes

    assert unpaired_passes(8, 4, 128) == 8.0
    assert unpaired_passes(1, 1, 16) == 1.0
    assert unpaired_passes(2, 2, 2) == 2.0
    model, cluster = load_model("qwen3-30b-a3b"), load_system("h100").cluster(32)
    stack = load_stack("megatron-core").with_(overlap_ep=True)
    ep = {}
    for gb in (32, 1024):  # m = 2 and m = 64
        plan = Plan(dp=16, pp=2, vpp=2, ep=16, global_batch=gb, micro_batch=1, zero=1)
        ep[gb] = [estimate(model, cluster, plan, s).breakdown["ep"] for s in (stack, stack.with_(overlap_ep=False))]
    assert ep[32][0] == pytest.approx(ep[32][1])  # m = 2: every pass alone, as without the overlap
    assert ep[1024][0] < 0.5 * ep[1024][1]  # m = 64: two of the 64 passes alone, the rest paired
