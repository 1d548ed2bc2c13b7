"""NeMo AutoModel's GroupedExpertsDeepEP adds the experts' biases in eager PyTorch, one ``t + b`` (fc1) and one
``t + b·p`` (fc2) per local expert over the split rows, then a cat each (components/moe/layers.py _apply_bias
@01926a5c): Fusion.expert_bias_loop, cost/mlp_moe.looped_expert_biases."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from meshplan.cost.layers import moe_layer
from meshplan.cost.records import ACT_BYTES
from meshplan.specs.fusion import FUSIONS
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

AUTOMODEL = Stack(fusion="eager-te", host_dispatch=12e-6)


def moe(**extra: object) -> ModelSpec:
    fields = {"num_experts": 8, "moe_topk": 2} | extra
    return ModelSpec(name="m", num_layers=4, hidden_size=1024, num_heads=8, ffn_hidden_size=4096, vocab_size=32000,
                     seq_length=4096, mlp="swiglu", norm="rmsnorm", moe_ffn_hidden_size=2048, **fields)


def _bias(ops: list) -> dict[str, object]:
    return {o.phase: o for o in ops if o.name == "moe/experts/bias"}


def test_both_biases_by_hand():
    """T = 4096 tokens, top-2: 8192 routed rows on the one GPU; fc1's output F = 2·2048 (gate and up), H = 1024,
    2 bytes. Forward 4F + 6H = 22,528 elements a row (369 MB), activation gradient 2F + 5H = 13,312 (218 MB), bias
    gradient F + 3H = 7,168 (117 MB). Launches with 8 local experts: forward 3 an expert + 2 cats = 26, backward 2 an
    expert + 2 cats = 18, bias gradients 3 an expert = 24, at the host's 12 us each."""
    rows, f, h = 4096 * 2, 2 * 2048, 1024
    ops = _bias(moe_layer(moe(linear_bias=True), Plan(), AUTOMODEL))
    assert {ph: o.nbytes for ph, o in ops.items()} == {"fwd": (4 * f + 6 * h) * rows * ACT_BYTES,
                                                        "bwd_x": (2 * f + 5 * h) * rows * ACT_BYTES,
                                                        "bwd_w": (f + 3 * h) * rows * ACT_BYTES}
    assert ops["fwd"].nbytes == pytest.approx(369e6, rel=0.01)
    assert {ph: o.launches for ph, o in ops.items()} == {"fwd": 26, "bwd_x": 18, "bwd_w": 24}
    assert {o.launch_host for o in ops.values()} == {12e-6}


def test_only_biased_experts_under_the_loop_pay_it():
    assert not _bias(moe_layer(moe(), Plan(), AUTOMODEL))  # no biases (DeepSeek-V3, Qwen3 MoE, Kimi K2)
    for name, fusion in FUSIONS.items():  # only AutoModel's eager-te module code loops over its experts' biases
        ops = _bias(moe_layer(moe(linear_bias=True), Plan(), Stack(fusion=name)))
        assert bool(ops) == fusion.expert_bias_loop == (name == "eager-te")
    # Megatron-Core's per-expert MLP prices its own fc2 bias (grouped_mlp_eager), not this loop
    names = {o.name for o in moe_layer(moe(linear_bias=True), Plan(), Stack())}
    assert "moe/experts/fc2/bias" in names and "moe/experts/bias" not in names


def test_the_loop_grows_with_its_rows_and_its_experts():
    """Monotone: more routed rows (micro-batch, top-k) move more bytes; more local experts launch more kernels."""
    rng = random.Random(79)
    for _ in range(50):
        mb, k, e = rng.choice((1, 2, 4)), rng.choice((1, 2, 4)), rng.choice((4, 8, 16))
        base = _bias(moe_layer(moe(linear_bias=True, moe_topk=k, num_experts=e), Plan(micro_batch=mb), AUTOMODEL))
        more_rows = _bias(moe_layer(moe(linear_bias=True, moe_topk=k, num_experts=e), Plan(micro_batch=2 * mb),
                                    AUTOMODEL))
        more_experts = _bias(moe_layer(replace(moe(linear_bias=True, moe_topk=k), num_experts=2 * e), Plan(
            micro_batch=mb), AUTOMODEL))
        for ph, op in base.items():
            assert more_rows[ph].nbytes > op.nbytes
            assert more_experts[ph].launches > op.launches
