"""LFM2's short-convolution blocks ("C"; lfm2 with conv layers, lfm3): the block's weights equal transformers'
Lfm2ShortConv's, its projections and conv cost what their shapes say (and split over tp by channels), plans that
split it over context-parallel ranks are refused, and LFM2 / LFM3 config.json files read as their patterns, exact
against the model transformers builds (conv biases refused, naming them)."""

from __future__ import annotations

import json

import pytest

from meshplan.cost.flops import matmul_params
from meshplan.cost.layers import hybrid_block
from meshplan.errors import SpecError
from meshplan.specs.check import check
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

# H = 64, kernel L = 3; attention of 4 heads of 16; T = 32 tokens a micro-batch
SC = ModelSpec(name="sc", num_layers=4, hidden_size=64, num_heads=4, ffn_hidden_size=128, vocab_size=256,
               norm="rmsnorm", mlp="swiglu", seq_length=32, layer_pattern="C-*-", short_conv=3)


def test_weights_by_hand():
    # in_proj H → 3H: 64·192 = 12,288; out_proj 64·64 = 4,096; depthwise conv H·L = 64·3 = 192; the pre-norm 64
    assert SC.block_params("shortconv") == 12_288 + 4_096 + 192 + 64 == 16_640


def test_weights_equal_transformers():
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.lfm2.modeling_lfm2")
    from transformers import Lfm2Config
    cfg = Lfm2Config(hidden_size=64, conv_L_cache=3, num_hidden_layers=1, layer_types=["conv"])
    with torch.device("meta"):
        block = modeling.Lfm2ShortConv(cfg, layer_idx=0)
    assert sum(p.numel() for p in block.parameters()) == SC.block_params("shortconv") - 64  # less the pre-norm


def test_flops_split_by_channels():
    ops = {(o.name, o.phase): o for o in hybrid_block(SC, Plan(micro_batch=1), Stack(), "shortconv")}
    # in_proj 2·T·H·3H = 2·32·64·192; out_proj 2·32·64·64; conv (2L − 1)·T·H = 5·32·64; each gate T·H products
    assert ops[("shortconv/in_proj", "fwd")].flops == 2 * 32 * 64 * 192 == 786_432
    assert ops[("shortconv/out_proj", "fwd")].flops == 2 * 32 * 64 * 64 == 262_144
    assert ops[("shortconv/conv1d", "fwd")].flops == 5 * 32 * 64 == 10_240
    assert ops[("shortconv/gate_bx", "fwd")].flops == ops[("shortconv/gate_c", "fwd")].flops == 32 * 64
    # forward FLOPs a token of the projections and the conv: (786,432 + 262,144 + 10,240) / 32 = 33,088, the
    # 2 · 16,576 weights' 33,152 that MFU counts less one add a channel (2L − 1 taps' FLOPs, not 2L): 33,152 − 64
    per_token = sum(ops[(n, "fwd")].flops for n in ("shortconv/in_proj", "shortconv/out_proj", "shortconv/conv1d"))
    assert per_token / 32 == 2 * (SC.block_params("shortconv") - 64) - 64 == 33_088
    assert SC.block_params("shortconv") - 64 <= matmul_params(SC)
    halves = {(o.name, o.phase): o for o in hybrid_block(SC, Plan(micro_batch=1, tp=2, dp=1), Stack(), "shortconv")}
    for name in ("shortconv/in_proj", "shortconv/out_proj", "shortconv/conv1d", "shortconv/gate_c"):
        assert halves[(name, "fwd")].flops == ops[(name, "fwd")].flops / 2, name


def test_refusals():
    assert any("short-convolution" in r for r in check(SC, None, Plan(cp=2, dp=1), Stack()))
    assert not any("short-convolution" in r for r in check(SC, None, Plan(tp=2, dp=1), Stack()))
    with pytest.raises(SpecError, match="short_conv=0"):
        ModelSpec(name="x", num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=96, vocab_size=128,
                  layer_pattern="C-")
    with pytest.raises(SpecError, match="short_conv=3 needs"):
        ModelSpec(name="x", num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=96, vocab_size=128,
                  short_conv=3)


def _read(model_type: str, **kw: object) -> ModelSpec:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from meshplan.specs.hf.config import from_hf_config
    cfg = transformers.AutoConfig.for_model(model_type, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                            num_key_value_heads=2, vocab_size=1000, pad_token_id=0, bos_token_id=1,
                                            eos_token_id=2, **kw)
    return from_hf_config(json.loads(cfg.to_json_string(use_diff=False)), model_type)


def test_configs_read_as_their_patterns():
    # LFM2 with attention at layers 2 and 5 of 6 (its full_attn_idxs), kernel 3, one pre-norm a block; the reader
    # checks the count against the meta-device build (specs/hf/config.py), so it is exact
    lfm2 = _read("lfm2", num_hidden_layers=6, full_attn_idxs=[2, 5])
    assert (lfm2.layer_pattern, lfm2.short_conv, lfm2.block_norms) == ("C-C-*-C-C-*-", 3, 1)
    # LFM3: layer i full attention at i % 4 = 2, sliding at i % 4 = 0 (i > 0), else conv; kernel 7; sandwich norms
    # (a post-norm a block); Qwen3 q/k norms and a gate a head (g_proj H → A); windowed: layer 4 of its 3 attention
    # layers (2, 4, 6)
    lfm3 = _read("lfm3", num_hidden_layers=8, head_dim=64)
    assert (lfm3.layer_pattern, lfm3.short_conv, lfm3.block_norms) == ("C-C-*-C-*-C-*-C-", 7, 2)
    assert lfm3.qk_norm and lfm3.attn_head_gate and (lfm3.sliding_window, lfm3.window_layers) == (256, 1)
    with pytest.raises(SpecError, match="conv.in_proj.bias"):
        _read("lfm2", num_hidden_layers=6, full_attn_idxs=[2, 5], conv_bias=True)
