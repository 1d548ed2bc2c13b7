"""Differential attention (DiffLlama; Ye et al. 2024): four λ vectors of head_dim a layer, two attention maps a head
(the core's FLOPs twice), their combination, and the layouts and serving it is not costed for refused."""

from __future__ import annotations

import pytest

from meshplan.cost.attention import attention_block
from meshplan.cost.flops import attention_layer_flops
from meshplan.cost.records import dims
from meshplan.errors import SpecError
from meshplan.serve.check import servable
from meshplan.specs.check import check
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

BASE = dict(name="diff", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=128,
            vocab_size=256, norm="rmsnorm", mlp="swiglu", seq_length=32)
DIFF, PLAIN = ModelSpec(**BASE, diff_attention=True), ModelSpec(**BASE)


def test_weights_and_flops():
    # λ_q1, λ_k1, λ_q2, λ_k2 of head_dim 16 each: 64 weights a layer
    assert DIFF.attention_params() - PLAIN.attention_params() == 4 * 16
    # two maps: 2 · 2·s·A·(d + d) = 2 · 2·32·4·32
    assert attention_layer_flops(DIFF) == 2 * attention_layer_flops(PLAIN) == 2 * 8_192


def test_ops_and_refusals():
    plan = Plan(micro_batch=1)
    ops = attention_block(DIFF, plan, dims(DIFF, plan, Stack()))
    plain = attention_block(PLAIN, plan, dims(PLAIN, plan, Stack()))
    core = [o.flops for o in ops if o.name == "attn/core" and o.phase == "fwd"]
    assert core == [o.flops for o in plain if o.name == "attn/core" and o.phase == "fwd"] * 2
    combine = [o for o in ops if o.name == "attn/diff_combine" and o.phase == "fwd"][0]
    assert combine.flops == 8.0 * 2 * 32 * 64  # 8 FLOPs an element of both outputs, T·A·d = 32·64 each
    with pytest.raises(SpecError, match="differential attention"):
        servable(DIFF)
    assert any("differential" in r for r in check(DIFF, None, Plan(tp=2, tp2=2, dp=1, tensor_layout="summa"),
                                                  Stack()))


def test_weights_equal_transformers():
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.diffllama.modeling_diffllama")
    from transformers import DiffLlamaConfig
    cfg = DiffLlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    with torch.device("meta"):
        module = modeling.DiffLlamaAttention(cfg, layer_idx=0)
    assert sum(p.numel() for p in module.parameters()) == DIFF.attention_params()


def test_standard_attention_head_gate():
    """Laguna's g_proj H → A gates each head's output (softplus; Bailing-hybrid's MLA, sigmoid): H·A weights, the
    projection's 2·T·H·A/t FLOPs and the multiply."""
    gated = ModelSpec(**BASE, attn_head_gate=True)
    assert gated.attention_params() - PLAIN.attention_params() == 64 * 4
    plan = Plan(micro_batch=1)
    ops = {(o.name, o.phase): o for o in attention_block(gated, plan, dims(gated, plan, Stack()))}
    assert ops[("attn/head_gate", "fwd")].flops == 2 * 32 * 64 * 4


def test_output_gate_bias_per_head():
    """Beam's gate_proj H → A·d with a bias per head: A weights more than the gate alone, and one more add an element
    of the gated output (5 → 6 FLOPs: the gate op counts 2.5 → 3 per element of its two inputs)."""
    gate = ModelSpec(**BASE, attn_output_gate=True)
    biased = ModelSpec(**BASE, attn_output_gate=True, gate_bias=True)
    assert biased.attention_params() - gate.attention_params() == 4
    plan = Plan(micro_batch=1)
    flops = [next(o.flops for o in attention_block(m, plan, dims(m, plan, Stack())) if o.name == "attn/out_gate")
             for m in (gate, biased)]
    assert flops == [2.5 * 2 * 32 * 64, 3.0 * 2 * 32 * 64]
    with pytest.raises(SpecError, match="gate_bias=true needs attn_output_gate"):
        ModelSpec(**BASE, gate_bias=True)
