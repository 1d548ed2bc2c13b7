"""Griffin's RG-LRU blocks ("R"; recurrent_gemma): the block's weights equal transformers' recurrent block's,
its block-diagonal gates cost 2·T·W·(W/n) each, and plans that split it across its gate blocks unevenly or over
context-parallel ranks are refused."""

from __future__ import annotations

import pytest

from meshplan.cost.layers import hybrid_block
from meshplan.specs.check import check
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

# H = 64, W = 64 in n = 4 gate blocks of 16, conv k = 4; attention of 4 heads of 16
RG = ModelSpec(name="rg", num_layers=4, hidden_size=64, num_heads=4, ffn_hidden_size=128, vocab_size=256,
               norm="rmsnorm", mlp="swiglu", seq_length=32, layer_pattern="R-*-", lru_width=64, lru_heads=4)


def test_weights_by_hand():
    # linear_x, linear_y 2·(64·64 + 64) = 8,320; linear_out 64·64 + 64 = 4,160; conv_1d 64·5 = 320;
    # recurrent_param 64; the two gates 2·(4·16·16 + 64) = 2,176; the pre-norm 64
    assert RG.block_params("rglru") == 8_320 + 4_160 + 320 + 64 + 2_176 + 64 == 15_104


def test_weights_equal_transformers():
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.recurrent_gemma.modeling_recurrent_gemma")
    from transformers import RecurrentGemmaConfig
    cfg = RecurrentGemmaConfig(hidden_size=64, lru_width=64, num_attention_heads=4, conv1d_width=4)
    with torch.device("meta"):
        block = modeling.RecurrentGemmaRecurrentBlock(cfg, layer_idx=0)
    assert sum(p.numel() for p in block.parameters()) == RG.block_params("rglru") - 64  # less the pre-norm


def test_gate_flops_and_refusals():
    ops = {(o.name, o.phase): o for o in hybrid_block(RG, Plan(micro_batch=1), Stack(), "rglru")}
    # each gate: 2·T·W·(W/n) = 2·32·64·16
    assert ops[("rglru/input_gate", "fwd")].flops == 2 * 32 * 64 * 16 == ops[("rglru/recurrence_gate", "fwd")].flops
    assert ops[("rglru/scan", "fwd")].flops == 4.0 * 32 * 64
    assert any("RG-LRU" in r for r in check(RG, None, Plan(tp=8, dp=1), Stack()))
    assert any("RG-LRU" in r for r in check(RG, None, Plan(cp=2, dp=1), Stack()))
    assert not any("RG-LRU" in r for r in check(RG, None, Plan(tp=2, dp=1), Stack()))
