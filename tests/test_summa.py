"""2D tensor parallelism (SUMMA) and context parallelism: hand-computed volumes and reductions to 1D."""

from __future__ import annotations

import pytest

from conftest import gpt
from meshplan.cost.attention import kv_exchange
from meshplan.cost.layers import dense_layer
from meshplan.cost.records import ACT_BYTES, dims
from meshplan.cost.summa import summa_linear
from meshplan.estimate import estimate
from meshplan.specs.check import check
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


def _coll(ops, phase, kind, axis):
    return [o for o in ops if o.kind == "collective" and o.phase == phase and o.collective.kind == kind
            and o.collective.axis == axis]


def test_summa_linear_volumes():
    # rows = 64, k = 32, n = 48 on a tp=2 x tp2=4 grid with nb = 4 panels, 2-byte elements
    plan = Plan(tp=2, tp2=4, tensor_layout="summa", summa_panels=4)
    d = dims(gpt(), plan, Stack())
    ops = summa_linear("x", 64, 32, 48, plan, d)
    fwd = [o for o in ops if o.phase == "fwd" and o.kind == "gemm"][0]
    assert fwd.flops == 2 * 64 * 32 * 48 / 2  # 2·rows·k·n/tp = 98,304
    x_bcast = _coll(ops, "fwd", "broadcast", "tp")[0]
    w_bcast = _coll(ops, "fwd", "broadcast", "tp2")[0]
    # X panels along the row: rows·k·a = 64·32·2 = 4096 bytes in 4 panels of 1024
    assert (x_bcast.nbytes, x_bcast.repeat, x_bcast.collective.group) == (1024, 4, 2)
    # W panels along the column: k·(n/tp)·a = 32·24·2 = 1536 bytes in 4 panels of 384
    assert (w_bcast.nbytes, w_bcast.repeat, w_bcast.collective.group) == (384, 4, 4)
    # backward: dX = dY·Wᵀ broadcasts W (tp2) and reduces dX (tp); dW = Xᵀ·dY broadcasts X (tp), reduces dW (tp2)
    assert _coll(ops, "bwd_x", "broadcast", "tp2")[0].nbytes == 384
    assert _coll(ops, "bwd_x", "reduce", "tp")[0].nbytes == 1024
    assert _coll(ops, "bwd_w", "broadcast", "tp")[0].nbytes == 1024
    assert _coll(ops, "bwd_w", "reduce", "tp2")[0].nbytes == 384
    # the saved input is this GPU's X block: rows·(k/tp)·a = 64·16·2
    assert fwd.saved == 64 * 16 * ACT_BYTES


def test_summa_with_tp2_1_has_the_flops_and_weights_of_1d():
    model = gpt(layers=2, hidden=1024, heads=16)
    summa = Plan(tp=4, tp2=1, tensor_layout="summa")
    one_d = Plan(tp=4)
    gemm = lambda ops: sum(o.flops for o in ops if o.kind == "gemm")  # noqa: E731
    assert gemm(dense_layer(model, summa, Stack())) == gemm(dense_layer(model, one_d, Stack()))
    from meshplan.cost.params import layer_params

    # but for the two LayerNorms (4h = 4,096), which the 1D layout keeps whole on every rank and SUMMA splits with
    # the features: 4,096 · (1 − 1/4) = 3,072 fewer on a SUMMA rank
    assert layer_params(model, one_d).total - layer_params(model, summa).total == 3072


def test_summa_grid_splits_flops_over_tp_times_tp2():
    model = gpt(layers=2, hidden=1024, heads=16)
    gemm = lambda ops: sum(o.flops for o in ops if o.kind == "gemm")  # noqa: E731
    grid = dense_layer(model, Plan(tp=2, tp2=4, tensor_layout="summa"), Stack())
    assert gemm(grid) == pytest.approx(gemm(dense_layer(model, Plan(), Stack())) / 8)


def test_context_parallel_kv_exchange_volumes():
    # T = b·s/c = 4096/4 = 1024 rows; K and V of 16 heads x 64 on tp = 2: 1024 · 2·1024/2 · 2 bytes
    model = gpt(hidden=1024, heads=16, seq=4096)
    plan = Plan(cp=4, tp=2)
    chunk = 1024 * 2 * 1024 / 2 * ACT_BYTES
    ring = [o for o in dense_layer(model, plan, Stack()) if o.name == "attn/cp_kv"]
    assert ring[0].nbytes == 3 * chunk  # c - 1 = 3 ring steps forward
    assert ring[1].nbytes == 2 * 3 * chunk  # K, V and dK, dV backward
    gather = kv_exchange("kv", "cp", 4, "allgather", chunk)
    assert [g.collective.kind for g in gather] == ["all_gather", "all_gather", "reduce_scatter"]
    assert gather[0].nbytes == 4 * chunk  # the gathered K/V of all 4 ranks


def test_cp_1_has_no_kv_traffic():
    est = estimate(load_model("llama3-8b"), load_system("h100").cluster(8), Plan(tp=8, cp=1, global_batch=8,
                                                                             sequence_parallel=True))
    assert est.breakdown["cp"] == 0.0
    assert not [o for o in est.ops if o.name == "attn/cp_kv" and o.seconds > 0]


def test_summa_kv_exchange_is_tensor_parallel_time_not_context_parallel():
    """Issue 40: a 2D SUMMA plan with cp = 1 showed "cp 50.5 ms" in the report. The K/V all-gather across tp2 (the
    tensor grid's second axis, seed 003's 2D attention) is booked under tp: cp stays 0, and tp holds at least the
    exchange's time (it is exposed: no overlap)."""
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(64)
    plan = Plan(dp=8, tp=4, tp2=2, pp=1, cp=1, tensor_layout="summa", global_batch=64, zero=1)
    est = estimate(model, cluster, plan)
    # all-gather K, V forward and backward, reduce-scatter dK, dV: 3 ops x 80 layers x 8 micro-batches = 3 x 640
    kv = [o for o in est.ops if o.name == "attn/tp2_kv"]
    assert [o.count for o in kv] == [640] * 3
    exchange = sum(o.total_seconds for o in kv)
    assert exchange > 0 and est.breakdown["cp"] == 0.0
    assert est.breakdown["tp"] >= exchange * (1 - 1e-9)


def test_summa_estimate_and_memory():
    model = load_model("megatron-1t")
    cluster = load_system("b200").cluster(64)
    est = estimate(model, cluster, Plan(tp=4, tp2=4, pp=4, tensor_layout="summa", global_batch=16,
                                        recompute="full", zero=1))
    assert est.step_time > 0 and est.breakdown["tp"] > 0
    # weights per GPU (first stage): 32 layers split 16 ways, plus the vocabulary-parallel word embedding split
    # tp=4 ways and the learned position table (2048 × 25600) copied on every rank
    layers = model.num_layers // 4 * (model.attention_params() + model.mlp_params(model.ffn_hidden_size)) / 16
    word = model.vocab_size * model.hidden_size
    assert model.embedding_params() - word == 2048 * 25600
    embedding = word / 4 + 2048 * 25600
    assert est.memory["weights"] == pytest.approx(2 * (layers + embedding), rel=1e-3)


@pytest.mark.parametrize(("plan", "message"), [
    (Plan(tp2=2), "tp2=2 needs tensor_layout='summa'"),
    (Plan(tp2=3, tensor_layout="summa"), "tp2=3 does not divide hidden_size"),
    (Plan(tp=2, tp2=2, tensor_layout="summa", sequence_parallel=True), "sequence_parallel does not apply"),
    (Plan(tp=2, tp2=2, tensor_layout="summa", summa_panels=3), "summa_panels=3 does not divide"),
])
def test_summa_plan_checks(plan, message):
    assert any(message in r for r in check(gpt(), None, plan))


def test_summa_rejects_moe():
    assert any("dense standard-attention" in r for r in check(load_model("mixtral-8x7b"), None,
                                                               Plan(tp=2, tp2=2, tensor_layout="summa")))
