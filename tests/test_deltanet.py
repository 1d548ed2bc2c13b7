"""Gated DeltaNet blocks ("G" in layer_pattern; Qwen3-Next / Qwen 3.5's linear attention): the mixer's weights equal
transformers' Qwen3NextGatedDeltaNet's, the chunked scan's forward FLOPs are the per-token formula of
cost/flops.gdn_block_flops, and a Qwen3-Next config.json reads as its 3-to-1 pattern of G and attention blocks."""

from __future__ import annotations

import pytest

from meshplan.cost.deltanet import deltanet_block, gdn_scan_ops
from meshplan.cost.flops import gdn_block_flops
from meshplan.cost.records import dims
from meshplan.errors import SpecError
from meshplan.specs.mixer_params import deltanet_count
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

# H = 64; n_k = 2 key heads of d_k = 16, n_v = 4 value heads of d_v = 16; conv k = 4; chunk C = 8; "G*" blocks + MLPs
GDN = ModelSpec(name="gdn", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                ffn_hidden_size=96, vocab_size=128, mlp="swiglu", norm="rmsnorm", layer_pattern="G-*-",
                gdn_key_heads=2, gdn_key_dim=16, gdn_value_heads=4, gdn_value_dim=16, gdn_chunk=8, seq_length=32)


def test_mixer_weights_by_hand():
    # key width 32, value width 64: in_proj 64·(2·32 + 2·64 + 2·4) = 12,800; conv (2·32 + 64)·4 = 512;
    # dt_bias + A_log 8; gated norm 16; out_proj 64·64 = 4,096
    assert deltanet_count(GDN) == 12_800 + 512 + 8 + 16 + 4_096 == 17_432
    assert GDN.block_params("deltanet") == 17_432 + 64  # its pre-norm


def test_mixer_weights_equal_transformers():
    torch = pytest.importorskip("torch")
    qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    from transformers import Qwen3NextConfig
    cfg = Qwen3NextConfig(hidden_size=64, linear_num_key_heads=2, linear_key_head_dim=16, linear_num_value_heads=4,
                          linear_value_head_dim=16, linear_conv_kernel_dim=4, num_hidden_layers=4)
    with torch.device("meta"):
        module = qwen3_next.Qwen3NextGatedDeltaNet(cfg, layer_idx=0)
    assert sum(p.numel() for p in module.parameters()) == deltanet_count(GDN)


def test_scan_flops_per_token():
    d = dims(GDN, Plan(micro_batch=2), Stack())
    fwd = sum(op.flops for op in gdn_scan_ops(GDN, d) if op.phase == "fwd")
    # per value head and token: 6·16·16 + 8·(6·16 + 4·16) + 2·64/3 = 1,536 + 1,280 + 42.67; × 4 heads
    assert gdn_block_flops(GDN) == pytest.approx(4 * (1_536 + 1_280 + 128 / 3))
    assert fwd == pytest.approx(2 * 32 * gdn_block_flops(GDN))  # 2 sequences of 32 tokens


def test_block_splits_by_heads():
    one = deltanet_block(GDN, Plan(), dims(GDN, Plan(), Stack()))
    two = deltanet_block(GDN, Plan(tp=2, dp=1), dims(GDN, Plan(tp=2, dp=1), Stack()))
    proj = {o.name: o for o in one if o.phase == "fwd"}["gdn/in_proj"]
    assert proj.n == 2 * 32 + 2 * 64 + 2 * 4  # q, k, v, z, β, a
    assert {o.name: o for o in two if o.phase == "fwd"}["gdn/in_proj"].n == proj.n / 2


def test_bad_heads_named():
    with pytest.raises(SpecError, match="gdn_value_heads"):
        ModelSpec(name="x", num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=96, vocab_size=128,
                  layer_pattern="G-", gdn_key_heads=2, gdn_key_dim=16, gdn_value_dim=16)


def test_qwen3_next_config_reads_as_its_pattern():
    transformers = pytest.importorskip("transformers")
    import json

    from meshplan.specs.hf.config import from_hf_config
    cfg = transformers.AutoConfig.for_model("qwen3_next", num_hidden_layers=8)
    spec = from_hf_config(json.loads(cfg.to_json_string(use_diff=False)), "qwen3-next")
    # 3 linear-attention layers to 1 full-attention layer, each followed by a MoE block
    assert spec.layer_pattern == "GEGEGE*E" * 2 and spec.attn_output_gate
    assert (spec.gdn_key_heads, spec.gdn_key_dim, spec.gdn_value_heads, spec.gdn_value_dim) == (16, 128, 32, 128)
