"""DeepSeek Sparse Attention (DeepSeek-V3.2; HF deepseek_v32, glm_moe_dsa): the lightning indexer's weights equal
transformers' DeepseekV32Indexer's, its scores cost O(s²) and the main attention O(s·k), and the plans it is not
costed for are refused."""

from __future__ import annotations

import pytest

from meshplan.cost.attention import attention_block
from meshplan.cost.dsa import indexer_flops_per_token, selected_keys
from meshplan.cost.flops import attention_layer_flops, model_flops_per_token
from meshplan.cost.records import dims
from meshplan.errors import SpecError
from meshplan.serve.check import servable
from meshplan.specs.check import check
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

# H = 64, A = 4 MLA heads (d_nope 16, d_rope 8, d_v 16), r_q 32, r_kv 16; indexer n_i = 2 heads of d_i = 16, k = 8
MLA = dict(name="dsa", num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=128, vocab_size=256,
           norm="rmsnorm", mlp="swiglu", q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
           v_head_dim=16, seq_length=32)
DSA = ModelSpec(**MLA, index_heads=2, index_head_dim=16, index_topk=8)
DENSE = ModelSpec(**MLA)


def test_indexer_weights_by_hand():
    # wq_b 32·(2·16) = 1,024; wk 64·16 = 1,024; weights_proj 64·2 = 128; k_norm 16 + 16 = 32
    assert DSA.indexer_params() == 1_024 + 1_024 + 128 + 32 == 2_208
    assert DSA.attention_params() - DENSE.attention_params() == 2_208
    assert DENSE.indexer_params() == 0


def test_indexer_weights_equal_transformers():
    torch = pytest.importorskip("torch")
    v32 = pytest.importorskip("transformers.models.deepseek_v32.modeling_deepseek_v32")
    from transformers import DeepseekV32Config
    cfg = DeepseekV32Config(hidden_size=64, q_lora_rank=32, index_n_heads=2, index_head_dim=16, index_topk=8,
                            qk_rope_head_dim=8)
    with torch.device("meta"):
        module = v32.DeepseekV32Indexer(cfg, layer_idx=0)
    assert sum(p.numel() for p in module.parameters()) == DSA.indexer_params()


def test_selected_keys_and_model_flops():
    # min(i + 1, 8) over i = 0 … 31: 1 + 2 + … + 8 = 36, then 24 · 8 = 192: 228 / 32 = 7.125 = 8 − 8·7/64
    assert selected_keys(DSA) == 228 / 32 == 8 - 8 * 7 / 64
    # main attention 2·min(k, s)·A·(d_qk + d_v) = 2·8·4·(24 + 16) = 2,560 (dense: all s = 32 keys)
    assert attention_layer_flops(DSA) == 2_560
    assert attention_layer_flops(DENSE) == 2 * 32 * 4 * 40 == 10_240
    # the indexer's training FLOPs a token: (2·16 + 3)·2·32/2 = 1,120 forward + 6·16·2·7.125 = 1,368 backward,
    # less 2 per indexer weight (2·2,208), in each of the 2 layers, on top of the dense model's count
    per_layer = 1_120 + 1_368 - 2 * 2_208
    assert indexer_flops_per_token(DSA) == per_layer
    assert model_flops_per_token(DSA) - model_flops_per_token(DENSE) == pytest.approx(
        6 * 2 * 2_208 + 3 * 2 * (2_560 - 10_240) + 2 * per_layer)


def test_indexer_and_sparse_core_ops():
    plan = Plan(micro_batch=1)
    ops = {(o.name, o.phase): o for o in attention_block(DSA, plan, dims(DSA, plan, Stack()))}
    # scores: T·n_i·(2·d_i + 3)·s/2 = 32·2·35·16 = 35,840 forward; backward 3·2·d_i·n_i·T·k̄ = 6·16·2·32·7.125
    assert ops[("dsa/scores", "fwd")].flops == 35_840
    assert ops[("dsa/scores", "bwd_x")].flops == pytest.approx(6 * 16 * 2 * 32 * 7.125)
    # the T·k int32 indices kept for the backward: 32·8·4 bytes
    assert ops[("dsa/topk", "fwd")].saved == 1_024
    # the indexer's inputs are detached: weight gradients, no input gradients
    assert ("dsa/wq_b", "bwd_w") in ops and ("dsa/wq_b", "bwd_x") not in ops
    # the main attention over the selected keys: 2·T·k̄·A·(d_qk + d_v) = 2·32·7.125·4·40, against the dense causal
    # kernel's half square 2·32·32·4·40 / 2
    assert ops[("attn/core", "fwd")].flops == pytest.approx(2 * 32 * 7.125 * 4 * 40)
    dense = {(o.name, o.phase): o for o in attention_block(DENSE, plan, dims(DENSE, plan, Stack()))}
    assert dense[("attn/core", "fwd")].flops == 2 * 32 * 32 * 4 * 40 / 2


def test_refusals():
    assert any("DeepSeek Sparse Attention" in r for r in check(DSA, None, Plan(cp=2, dp=1), Stack()))
    assert not any("DeepSeek Sparse Attention" in r for r in check(DENSE, None, Plan(cp=2, dp=1), Stack()))
    with pytest.raises(SpecError, match="not modelled for serving"):
        servable(DSA)
    with pytest.raises(SpecError, match="index_topk=8 .* needs index_heads"):
        ModelSpec(**MLA, index_topk=8)


def test_mla_head_gate_and_rope_key_norm():
    # Bailing-hybrid's g_proj H → A: 64·4 = 256 weights; dots3's RoPE-key RMSNorm: d_R = 8
    gated = ModelSpec(**MLA, attn_head_gate=True, rope_key_norm=True)
    assert gated.attention_params() - DENSE.attention_params() == 256 + 8
    plan = Plan(micro_batch=1)
    ops = {(o.name, o.phase): o for o in attention_block(gated, plan, dims(gated, plan, Stack()))}
    # g_proj 2·T·H·A = 2·32·64·4 forward; the multiply over T·A·d_v = 32·64 outputs and T·A gates, 2.5 FLOPs each
    assert ops[("attn/head_gate", "fwd")].flops == 2 * 32 * 64 * 4
    assert ops[("attn/head_gate_mul", "fwd")].flops == 2.5 * (32 * 64 + 32 * 4)
    assert ops[("attn/rope_key_norm", "fwd")].flops == 5.0 * 32 * 8


def test_deepseek_v32_preset():
    """DeepSeek-V3's 671,026,419,200 + 61 indexers of 1536·64·128 + 7168·(128 + 64) + 2·128 = 13,959,424; the same as
    transformers builds from the checkpoint's config.json keys (DeepSeek-V3.2-Exp)."""
    from meshplan.specs.model_load import load_model
    spec = load_model("deepseek-v3.2")
    assert spec.indexer_params() == 1536 * 64 * 128 + 7168 * 192 + 256 == 13_959_424
    assert spec.params() == 671_026_419_200 + 61 * 13_959_424 == 671_877_944_064
    from meshplan.specs.hf.meta import available, build_meta
    if not available():
        pytest.skip("transformers not installed")
    meta = build_meta({"model_type": "deepseek_v32", "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048,
                       "num_hidden_layers": 61, "vocab_size": 129280, "tie_word_embeddings": False})
    assert not isinstance(meta, str) and meta.total == spec.params()
