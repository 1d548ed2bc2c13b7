"""One layer's per-op costs (cost/layers.py over blocks, attention, mlp_moe): relations and closed forms
(Narayanan 2021 eq. 3, PaLM App. B, Korthikanti 2022 Table 2)."""

from __future__ import annotations

import pytest

from conftest import gpt
from meshplan.cost.embed_head import head_ops
from meshplan.cost.flops import attention_flops_per_token, matmul_params, model_flops_per_token
from meshplan.cost.layers import dense_layer
from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.units import saved_bytes


def _flops(ops, phase=None, kind=None):
    return sum(o.flops for o in ops if (phase is None or o.phase == phase) and (kind is None or o.kind == kind))


def test_gemm_backward_is_twice_forward():
    ops = dense_layer(gpt(), Plan(), Stack())
    fwd = _flops(ops, "fwd", "gemm")
    bwd = _flops(ops, "bwd_x", "gemm") + _flops(ops, "bwd_w", "gemm")
    assert bwd == pytest.approx(2 * fwd)


def test_gemm_flops_of_one_layer_match_hand_count():
    # h=1024, s=2048, b=1: qkv 2·T·h·3h, out 2·T·h·h, fc1 2·T·h·4h, fc2 2·T·4h·h → 2·T·12h² = 24·T·h²
    ops = dense_layer(gpt(), Plan(), Stack())
    assert _flops(ops, "fwd", "gemm") == 24 * 2048 * 1024**2


def test_per_op_training_flops_match_6n_plus_attention():
    """Σ per-op FLOPs (unfused attention, no recompute) = 6·N·tokens + 3·attention (PaLM App. B).

    N counts the matmul weights; norms and biases are not matmul parameters, so allow 0.1 %."""
    model = gpt(layers=4, hidden=2048, heads=16)
    plan, unfused = Plan(), Stack(flash_attention=False)
    layer = dense_layer(model, plan, unfused)
    per_layer = _flops(layer, kind="gemm") + _flops(layer, kind="attention")
    head = _flops(head_ops(model, plan, unfused), kind="gemm")
    tokens = model.seq_length
    assert (model.num_layers * per_layer + head) / tokens == pytest.approx(model_flops_per_token(model), rel=1e-3)


def test_attention_term_is_palm_12_l_h_s():
    model = gpt(layers=3, hidden=1024, heads=16, seq=4096)
    # 3 · 2·s·A·2d·L = 12·L·h·s with A·d = h
    assert 3 * attention_flops_per_token(model) == 12 * 3 * 1024 * 4096


UNFUSED = Stack(flash_attention=False)


def _saved(model: ModelSpec, plan: Plan, stack: Stack = UNFUSED) -> float:
    """Bytes one layer keeps for its backward pass (selective recompute drops the recomputable ones); unfused
    attention unless ``stack`` says otherwise."""
    return saved_bytes(dense_layer(model, plan, stack), plan.recompute)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_activations_per_layer_korthikanti_table2(tp):
    s, b, h, a = 2048, 1, 1024, 16
    model = gpt(hidden=h, heads=a, seq=s)
    sbh = s * b * h
    scores = 5 * a * s * s * b
    # no parallelism row generalised to tp: 10·sbh + 24·sbh/t + 5·a·s²·b/t
    plan = Plan(tp=tp, sequence_parallel=False, recompute="none")
    assert _saved(model, plan) == pytest.approx(10 * sbh + 24 * sbh / tp + scores / tp)
    # sequence parallel: 34·sbh/t + 5·a·s²·b/t (needs tp > 1)
    if tp > 1:
        sp = Plan(tp=tp, sequence_parallel=True, recompute="none")
        assert _saved(model, sp) == pytest.approx(34 * sbh / tp + scores / tp)
        sel = Plan(tp=tp, sequence_parallel=True, recompute="selective")
        assert _saved(model, sel) == pytest.approx(34 * sbh / tp)


def test_activations_without_parallelism_are_34_plus_5as_over_h():
    s, b, h, a = 1024, 2, 512, 8
    model = gpt(hidden=h, heads=a, seq=s)
    plan = Plan(micro_batch=b, recompute="none")
    assert _saved(model, plan) == pytest.approx(s * b * h * (34 + 5 * a * s / h))


def test_flash_attention_saves_like_selective_recompute_plus_lse():
    model = gpt()
    flash = _saved(model, Plan(tp=4, sequence_parallel=True, recompute="none"), Stack())
    selective = _saved(model, Plan(tp=4, sequence_parallel=True, recompute="selective"))
    lse = 2048 * (16 / 4) * 4  # T · A/t heads · fp32
    assert flash == pytest.approx(selective + lse)


def test_tp_1_has_no_tp_traffic_time():
    est = estimate(gpt(), load_system("h100").cluster(8), Plan(dp=8, global_batch=64))
    assert est.breakdown["tp"] == 0.0


def test_sequence_parallel_replaces_all_reduce_with_gather_and_scatter():
    ops = dense_layer(gpt(), Plan(tp=4, sequence_parallel=True), Stack())
    kinds = {o.collective.kind for o in ops if o.kind == "collective" and o.collective.axis == "tp"}
    assert kinds == {"all_gather", "reduce_scatter"}
    ops = dense_layer(gpt(), Plan(tp=4, sequence_parallel=False), Stack())
    kinds = {o.collective.kind for o in ops if o.kind == "collective" and o.collective.axis == "tp"}
    assert kinds == {"all_reduce"}


def test_matmul_params_excludes_lookup_but_keeps_tied_head():
    model = gpt(layers=2, hidden=256, heads=4, vocab=1000)
    assert matmul_params(model) == model.params() - model.embedding_params() + 1000 * 256
