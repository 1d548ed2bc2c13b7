"""Kimi Delta Attention ("K"; kimi_linear, bailing_hybrid) and MiniMax's lightning attention ("L"; minimax): each
mixer's weights equal transformers' module's, their scans cost what their chunked algorithms do, and context
parallelism is refused."""

from __future__ import annotations

import pytest

from meshplan.cost.flops import ssd_flops_per_token
from meshplan.cost.kda import kda_block
from meshplan.cost.lightning import lightning_block
from meshplan.cost.records import dims
from meshplan.specs.check import check
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

BASE = dict(num_layers=2, hidden_size=64, num_heads=4, head_dim=16, ffn_hidden_size=128, vocab_size=256,
            norm="rmsnorm", mlp="swiglu", seq_length=64)
# H = 64; KDA: n = 4 heads of d = 16, gates of rank r = 16, kernel 4
KDA = ModelSpec(name="kda", **BASE, layer_pattern="K*", gdn_key_heads=4, gdn_key_dim=16, gdn_value_heads=4,
                gdn_value_dim=16, kda_gate_rank=16)
FULL = ModelSpec(name="kda-full", **BASE, layer_pattern="K*", gdn_key_heads=4, gdn_key_dim=16, gdn_value_heads=4,
                 gdn_value_dim=16)
# lightning: A = 4 heads of d = 16 over blocks of B = 16
LIGHT = ModelSpec(name="light", **BASE, layer_pattern="L*", lightning_block=16)


def test_kda_weights_by_hand():
    # q, k, v 3·64·64 = 12,288; conv1d 3·64·4 = 768; gates 2·16·(64 + 64) = 4,096; dt_bias 64; A_log 4;
    # b_proj 64·4 = 256; o_norm 16; o_proj 64·64 = 4,096; the pre-norm 64
    assert KDA.block_params("kda") == 12_288 + 768 + 4_096 + 64 + 4 + 256 + 16 + 4_096 + 64 == 21_652
    # full-rank gates f_proj and g_proj: 2·64·64 = 8,192 instead of 4,096
    assert FULL.block_params("kda") - KDA.block_params("kda") == 8_192 - 4_096


def test_lightning_weights_by_hand():
    # qkv_proj 64·192 = 12,288; output_gate 64·64 = 4,096; out_proj 4,096; the norm over A·d 64; the pre-norm 64
    assert LIGHT.block_params("lightning") == 12_288 + 4_096 + 4_096 + 64 + 64 == 20_608


def test_weights_equal_transformers():
    torch = pytest.importorskip("torch")
    kimi = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    minimax = pytest.importorskip("transformers.models.minimax.modeling_minimax")
    from transformers import KimiLinearConfig, MiniMaxConfig
    kcfg = KimiLinearConfig(hidden_size=64, linear_num_heads=4, linear_head_dim=16, linear_conv_kernel_dim=4)
    mcfg = MiniMaxConfig(hidden_size=64, num_attention_heads=4, head_dim=16, num_hidden_layers=2, block_size=16)
    with torch.device("meta"):
        kda = kimi.KimiLinearDeltaAttention(kcfg, layer_idx=0)
        light = minimax.MiniMaxLightningAttention(mcfg, layer_idx=1)
    norm = 64  # the block's pre-norm, outside the mixer
    assert sum(p.numel() for p in kda.parameters()) == KDA.block_params("kda") - norm
    assert sum(p.numel() for p in light.parameters()) == LIGHT.block_params("lightning") - norm


def test_scan_flops():
    plan = Plan(micro_batch=1)
    light = {(o.name, o.phase): o for o in lightning_block(LIGHT, plan, dims(LIGHT, plan, Stack()))}
    # 64 tokens = 4 blocks of 16, 4 heads: Q·Kᵀ 2·16·16·16 per block and head → 16 products
    assert light[("lightning/qk", "fwd")].flops == 2 * 16 * 16 * 16 * 16
    # per token: 4·A·d·(B + d) = 4·4·16·32 = 8,192 for the L block (the * block has no scan)
    assert ssd_flops_per_token(LIGHT) == 8_192
    # KDA counts the Gated DeltaNet chunk products: n·(6·d² + C·(6·d + 4·d) + 2C²/3), C = 64
    assert ssd_flops_per_token(KDA) == 4 * (6 * 256 + 64 * 160 + 2 * 64 * 64 / 3)
    kda = {(o.name, o.phase) for o in kda_block(KDA, plan, dims(KDA, plan, Stack()))}
    assert {("kda/kkt", "fwd"), ("kda/forget_up", "bwd_w"), ("kda/decay", "fwd")} <= kda
    assert ("kda/forget_up", "fwd") not in {(o.name, o.phase) for o in kda_block(FULL, plan,
                                                                                   dims(FULL, plan, Stack()))}


def test_context_parallelism_refused():
    for model, what in ((KDA, "KDA"), (LIGHT, "lightning")):
        assert any(what in r for r in check(model, None, Plan(cp=2, dp=1), Stack()))
