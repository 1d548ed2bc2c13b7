"""Seed 001's weight-stationary tp_in × tp_out layout as a plan layout (cost/tp2d.py, ``--layout tp2d``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import gpt
from meshplan.cost.layers import dense_layer
from meshplan.cost.linear_2d import linear_2d
from meshplan.cost.params import kind_params
from meshplan.cost.records import ACT_BYTES, dims
from meshplan.cost.tp2d import tp2d_linear
from meshplan.estimate import estimate
from meshplan.roofline import optimistic_time
from meshplan.search import Space, search
from meshplan.specs.check import check
from meshplan.specs.hardware import Accelerator, load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack
from spaces import EVERY_PLAN

SEED_H100 = Accelerator(name="H100 SXM5 (seed 001)", peak_flops={"fp8": 1979e12, "bf16": 1979e12 / 2},
                        hbm_bytes=80e9, hbm_bandwidth=3352e9, nvlink_bandwidth=900e9)


def _d(plan: Plan):
    return dims(gpt(), plan, Stack())


def test_seed_001_worked_example_through_the_tp2d_layout():
    # The notebook's layer: d_in = 16384, d_out = 5·16384, tp_in = 8 (tp), tp_out = 40 (tp2), dp = 32,
    # b = 2048²/128 = 32768 tokens, so b_local = 1024 rows, d_in_local = d_out_local = 2048.
    plan = Plan(tp=8, tp2=40, tensor_layout="tp2d")
    ways = (("tp", 8), ("tp2", 40))
    ops = tp2d_linear("linear", 2048**2 / 128 / 32, 16384, 5 * 16384, ways, _d(plan), in_l2=True)
    gemms = [o for o in ops if o.kind == "gemm"]
    assert [o.flops for o in gemms] == [2 * 2048 * 2048 * 1024] * 3  # 2·N_local·b_local per pass
    # network: all-reduce the partial outputs (d_out_local·b_local) over tp_in, the partial input gradients
    # (d_in_local·b_local) over tp_out, the same records as cost/linear_2d.py's
    seed = [(o.phase, o.collective.nbytes, o.collective.group)
            for o in linear_2d(16384, 5 * 16384, 2048**2 / 128, 8, 40, 32) if o.kind == "collective"]
    ours = [(o.phase, o.collective.nbytes, o.collective.group) for o in ops if o.kind == "collective"]
    assert ours == seed == [("fwd", 2048 * 1024 * 2, 8), ("bwd_x", 2048 * 1024 * 2, 40)]
    seconds = optimistic_time(ops, SEED_H100, network_bandwidth=900e9, utilization=0.8, algorithm="multicast")
    assert seconds == pytest.approx(3.2554072481051035e-05, rel=1e-6)  # the notebook's printed number
    # FLOP-bound: 3·2·2048²·1024 / (0.8·989.5e12); the network would take 3·(7/8 + 39/40)·2048·1024·2 B
    # / 900e9 = 2.59e-5 s, less
    assert seconds == pytest.approx(3 * 2 * 2048 * 2048 * 1024 / (0.8 * 989.5e12), rel=1e-12)
    network = 3 * (7 / 8 + 39 / 40) * 2048 * 1024 * 2 / 900e9
    assert network == pytest.approx(2.5865e-5, rel=1e-4) and network < seconds
    # the plan's own accounting (activations read from and written to HBM, fp32 gradient accumulation) is slower:
    # HBM-bound at 3.68e-5 s, 13 % above the seed's L2-resident figure
    plain = tp2d_linear("linear", 2048**2 / 128 / 32, 16384, 5 * 16384, ways, _d(plan))
    slower = optimistic_time(plain, SEED_H100, network_bandwidth=900e9, utilization=0.8, algorithm="multicast")
    assert slower == pytest.approx(3.6834673e-05, rel=1e-6) and slower > seconds


def test_tp2d_layer_volumes_are_the_seeds_per_linear():
    """Every linear of a tp2d layer is the seed's layer: fc1 of the 1024-wide GPT (ffn 4096) on a 2 × 4 grid, 2048
    rows: W (1024/2 × 4096/4), forward all-reduce over tp of 2048 × 1024 partial outputs, backward over tp2 of
    2048 × 512 partial input gradients; fc2 swaps the axes."""
    plan = Plan(tp=2, tp2=4, tensor_layout="tp2d")
    ops = dense_layer(gpt(), plan, Stack())
    fc1 = [o for o in ops if o.name.startswith("mlp/fc1")]
    assert next(o for o in fc1 if o.phase == "fwd" and o.kind == "gemm").flops == 2 * 2048 * 512 * 1024
    coll = {(o.phase, o.collective.axis): (o.collective.nbytes, o.collective.group) for o in fc1 if o.collective}
    assert coll == {("fwd", "tp"): (2048 * 1024 * ACT_BYTES, 2), ("bwd_x", "tp2"): (2048 * 512 * ACT_BYTES, 4)}
    fc2 = {(o.phase, o.collective.axis): o.collective.nbytes for o in ops if o.name.startswith("mlp/fc2/")}
    assert fc2 == {("fwd", "tp2"): 2048 * 512 * ACT_BYTES, ("bwd_x", "tp"): 2048 * 1024 * ACT_BYTES}
    # attention: 16 heads over tp2 = 4, every one of the 2048 rows (the tp ranks repeat it)
    attn = next(o for o in ops if o.name.startswith("attn/core") and o.phase == "fwd" and o.kind != "collective")
    assert attn.m == 2048 * 16 / 4
    # weights: the block split over the 8 GPUs of the grid
    assert kind_params(gpt(), plan, "dense").dense == pytest.approx(gpt().block_params("dense") / 8)


def test_tp2d_with_tp_1_is_1d_without_sequence_parallelism():
    """tp = 1: qkv and fc1 are column-parallel over tp2 (all-reduce backward), out and fc2 row-parallel (all-reduce
    forward): Megatron's 1D layout over tp2 ranks; the same GEMMs, saved bytes and non-trivial collectives."""
    model = gpt()
    two = dense_layer(model, Plan(tp=1, tp2=4, tensor_layout="tp2d"), Stack())
    one = dense_layer(model, Plan(tp=4, sequence_parallel=False), Stack())
    for kind in ("gemm", "attention"):
        assert sum(o.flops for o in two if o.kind == kind) == pytest.approx(sum(o.flops for o in one if o.kind == kind))
    assert sum(o.saved for o in two) == pytest.approx(sum(o.saved for o in one))
    volume = sorted((o.phase, o.collective.nbytes) for o in two if o.collective and o.collective.group > 1)
    assert volume == sorted((o.phase, o.collective.nbytes) for o in one if o.collective and o.collective.group > 1)


@pytest.mark.parametrize(("model", "plan", "message"), [
    (gpt(), Plan(tp=2, tp2=3, tensor_layout="tp2d"), "tp2=3 does not divide num_heads=16"),
    (gpt(), Plan(tp=3, tp2=2, tensor_layout="tp2d"), "tp=3 does not divide hidden_size=1024"),
    (gpt(), Plan(tp=2, tp2=2, tensor_layout="tp2d", sequence_parallel=True), "sequence_parallel does not apply"),
    (load_model("mixtral-8x7b"), Plan(tp=2, tp2=2, tensor_layout="tp2d"), "dense standard-attention"),
])
def test_tp2d_plan_checks(model, plan, message):
    assert any(message in r for r in check(model, None, plan))


def test_tp2d_splits_h_not_heads_over_tp():
    """tp = 32 > 16 heads is a valid tp2d grid (tp splits h = 1024 only), not a valid 1D one."""
    assert check(gpt(), None, Plan(tp=32, tp2=2, tensor_layout="tp2d")) == []
    assert any("does not divide num_heads" in r for r in check(gpt(), None, Plan(tp=32)))


@pytest.mark.parametrize("framework", ["megatron-core", "torchtitan", "deepspeed"])
def test_frameworks_without_tp2d_refuse_it(framework):
    plan = Plan(tp=2, tp2=2, tensor_layout="tp2d")
    assert "tensor_layout=tp2d" in load_stack(framework).supports.problems(plan)
    assert Stack().supports.runs(plan)  # the generic stack (--framework any) runs it


def test_search_finds_tp2d_plans_at_their_estimate():
    """The vectorised search prices a tp2d plan as estimate() does, and a tp2d-only space ranks tp2d plans."""
    model, cluster = load_model("llama3-8b").with_seq_length(2048), load_system("h100").cluster(16)
    space = Space(**EVERY_PLAN, global_batch=32, layouts=("tp2d",), zero=(1,), recompute=("none",),
                  offload_optimizer=(False,), offload_activations=(False,), max_micro_batch=2)
    result = search(model, cluster, space, top_k=3)
    assert result.plans and all(e.plan.tensor_layout == "tp2d" and e.plan.tp > 1 < e.plan.tp2 for e in result.plans)
    for e in result.plans:
        assert estimate(model, cluster, e.plan, space.stack).step_time == pytest.approx(e.step_time, rel=1e-9)
    assert "tp2d=" in result.plans[0].plan.describe()


def test_the_tp2d_layout_never_makes_the_best_plan_slower():
    """Property: adding tp2d to the generic space keeps the best plan or finds a faster one; the space grows."""
    model, cluster = load_model("llama3-8b").with_seq_length(2048), load_system("h100").cluster(16)
    base = dict(EVERY_PLAN, global_batch=32, zero=(1,), recompute=("none",), offload_optimizer=(False,),
                offload_activations=(False,), max_micro_batch=2)
    without = search(model, cluster, Space(**base, layouts=("1d", "summa")), top_k=1)
    with_tp2d = search(model, cluster, Space(**base, layouts=("1d", "summa", "tp2d")), top_k=1)
    assert with_tp2d.plans[0].step_time <= without.plans[0].step_time
    assert with_tp2d.evaluated > without.evaluated


def test_cli_estimate_layout_tp2d(capsys):
    from bad_input_helpers import estimate as estimate_args
    from bad_input_helpers import fails
    from meshplan.cli import main
    assert main(estimate_args("llama3-8b", "h100", "--layout", "tp2d", "--tp", "2", "--tp2", "4")) == 0
    out = capsys.readouterr().out
    assert "tp2d=2x4" in out and "tp=2: nvlink, tp2=4: nvlink" in out
    line = fails(estimate_args("llama3-8b", "h100", "--layout", "tp2d", "--tp", "2", "--tp2", "4", "--sp"), capsys)
    assert "sequence_parallel does not apply to the tp2d layout (the residual stream is feature-sharded)" in line
    line = fails(estimate_args("llama3-8b", "h100", "--layout", "tp2d", "--tp", "4", "--tp2", "16", "--gpus", "64"),
                 capsys)
    assert "tp2=16 does not divide num_kv_heads=8" in line


def test_the_qkv_projection_is_as_wide_in_every_tensor_layout():
    """The fused query-key-value projection's output is written once (shapes.qkv_shapes): with an attention output
    gate, which the query projection emits (A·d more columns), H = 1024, A = 8 heads of 128, K = 2 KV heads:
    8·128 (queries) + 8·128 (gate) + 2·128 (keys) + 2·128 (values) = 2,560 columns against 1,536 without the gate.
    The 1D, SUMMA and tp2d layouts all price that GEMM 2,560 / 1,536 times as large (tp2d had left the gate out)."""
    plain = replace(gpt(), hidden_size=1024, num_heads=8, num_kv_heads=2, head_dim=128)
    gated = replace(plain, attn_output_gate=True)

    def qkv_flops(model, plan):
        return next(o.flops for o in dense_layer(model, plan, Stack()) if o.name == "attn/qkv" and o.phase == "fwd")

    for plan in (Plan(tp=4), Plan(tp=2, tp2=2, tensor_layout="summa"), Plan(tp=2, tp2=2, tensor_layout="tp2d")):
        ratio = qkv_flops(gated, plan) / qkv_flops(plain, plan)
        assert ratio == pytest.approx((8 * 128 * 2 + 2 * 128 * 2) / (8 * 128 + 2 * 128 * 2)), plan.tensor_layout
