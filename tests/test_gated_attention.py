"""The attention output gate (ModelSpec.attn_output_gate; Qwen3-Next / Qwen 3.5 gated attention): its weights equal
transformers' Qwen3NextAttention's, its GEMM widens the query projection by A·d, and its sigmoid-multiply is one
element-wise record; off by default, so no other model's numbers move."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost.layers import dense_layer
from meshplan.cost.records import ACT_BYTES
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

# H = 64, A = 4 heads of d = 32 (A·d = 128 ≠ H, as Qwen3-Next's 16 × 256 ≠ 2048), K = 2
GATED = ModelSpec(name="gated", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=32,
                  ffn_hidden_size=96, vocab_size=128, mlp="swiglu", norm="rmsnorm", qk_norm=True,
                  attn_output_gate=True, seq_length=16)


def test_gate_weights_by_hand():
    # q_proj H·2·A·d = 64·256 = 16,384; k, v 2·64·64 = 8,192; o_proj 128·64 = 8,192; q/k norms 2·32 = 64
    assert GATED.attention_params() == 16_384 + 8_192 + 8_192 + 64 == 32_832
    ungated = replace(GATED, attn_output_gate=False)
    assert GATED.attention_params() - ungated.attention_params() == 64 * 128  # H·A·d


def test_gate_weights_equal_transformers():
    torch = pytest.importorskip("torch")
    qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    from transformers import Qwen3NextConfig
    cfg = Qwen3NextConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                          attention_bias=False)
    with torch.device("meta"):
        module = qwen3_next.Qwen3NextAttention(cfg, layer_idx=3)
    assert sum(p.numel() for p in module.parameters()) == GATED.attention_params()


def test_gate_ops():
    plan = Plan(micro_batch=2)
    ops = {(o.name, o.phase): o for o in dense_layer(GATED, plan, Stack())}
    tokens = 2 * 16
    qkv = ops[("attn/qkv", "fwd")]
    assert qkv.n == 2 * 128 + 2 * 64 and qkv.flops == 2.0 * tokens * 64 * 384  # queries, gate, keys, values
    gate = ops[("attn/out_gate", "fwd")]
    elems = tokens * 128  # T·A·d/t
    assert gate.flops == 5.0 * elems and gate.nbytes == 3 * ACT_BYTES * elems  # read output and gate, write
    assert ("attn/out_gate", "fwd") not in {(o.name, o.phase) for o in
                                           dense_layer(replace(GATED, attn_output_gate=False), plan, Stack())}
