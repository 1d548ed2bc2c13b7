"""The small extra structures of specs/model_extras.py (issue 51): each one's weights by hand and equal to the module
transformers builds, its work in the training and serving records (cost/extras.py), and the registry types it makes
exact; all off by default, so no preset's numbers move."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost.embed_head import head_ops
from meshplan.cost.layers import layer_kinds
from meshplan.cost.params import kept_params
from meshplan.cost.records import ACT_BYTES, FP32
from meshplan.errors import SpecError
from meshplan.serve.iteration import layer_ops
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

# H = 64, A = 4 heads of d = 32 (A·d = 128), K = 2, F = 96, L = 2, RMSNorm
BASE = ModelSpec(name="base", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=32,
                 ffn_hidden_size=96, vocab_size=128, mlp="swiglu", norm="rmsnorm", seq_length=16)
MOE = replace(BASE, num_experts=4, moe_topk=2, moe_ffn_hidden_size=32)
PLAN = Plan(micro_batch=2, tp=2)  # T = 2·16 = 32 tokens, t = 2
TOKENS = 32


def records(model: ModelSpec, kind: str = "dense") -> dict[tuple[str, str], object]:
    return {(o.name, o.phase): o for o in layer_kinds(model, PLAN, Stack())[kind]}


def test_extras_weights_by_hand():
    # BitNet: attn_sub_norm A·d = 128 and ffn_sub_norm F = 96 a layer, 2 layers
    assert replace(BASE, sub_norms=True).params() - BASE.params() == 2 * (128 + 96)
    # Laguna's per-head gate, Beam's gate bias and DiffLlama's λ vectors are ModelSpec's own (attn_head_gate,
    # gate_bias, diff_attention: tests/test_diff_attention.py and the registry sweep)
    # xIELU: alpha_p and alpha_n a layer
    assert replace(BASE, act_params=2).params() - BASE.params() == 2 * 2
    # A.X-K1: post_mlp_layernorm H = 64 in each of the 2 MoE layers, kept whole on every tensor-parallel rank
    assert replace(MOE, moe_post_norm=True).params() - MOE.params() == 2 * 64
    assert kept_params(replace(MOE, moe_post_norm=True), "moe") - kept_params(MOE, "moe") == 64
    # GPT-1: no final norm, H = 64 fewer
    assert BASE.params() - replace(BASE, final_norm=False).params() == 64


def test_extras_refused_where_not_modelled():
    with pytest.raises(SpecError, match="moe_post_norm=true needs experts"):
        replace(BASE, moe_post_norm=True)
    with pytest.raises(SpecError, match="not on experts"):
        replace(MOE, sub_norms=True)


def test_sub_norm_records():
    ops = records(replace(BASE, sub_norms=True))
    attn, mlp = ops[("attn/sub_norm", "fwd")], ops[("mlp/sub_norm", "fwd")]
    assert attn.flops == 5.0 * TOKENS * 128 / 2  # 5 FLOPs an element of A·d/t
    assert mlp.flops == 5.0 * TOKENS * 96 / 2 and mlp.saved == TOKENS * 48 * ACT_BYTES  # F/t, its input kept
    assert ops[("attn/sub_norm/tp", "fwd")].nbytes == TOKENS * FP32  # each token's partial sum of squares
    assert ("attn/sub_norm", "fwd") not in records(BASE)


def test_act_and_post_norm_records():
    act = records(replace(BASE, act_params=2))[("mlp/act_params", "bwd_w")]
    assert act.flops == 3.0 * TOKENS * 48 and act.nbytes == 2 * ACT_BYTES * TOKENS * 48  # g and x over T·F/t
    post = records(replace(MOE, moe_post_norm=True), "moe")[("moe/post_norm", "fwd")]
    assert post.flops == 5.0 * TOKENS / 2 * 64  # sequence-parallel rows T/t, H wide


def test_final_norm_left_out_of_the_head():
    names = {o.name for o in head_ops(replace(BASE, final_norm=False), PLAN, Stack())}
    assert "head/norm" not in names and "head/logits" in names
    assert "head/norm" in {o.name for o in head_ops(BASE, PLAN, Stack())}


def test_serving_prices_the_extras():
    from meshplan.cost.decode import Shape
    sh = Shape(tp=2, dpa=1, ep=1, decode=8, context=64, prefill=0, prompts=0, prefix=0, w_bytes=2, a_bytes=2,
               kv_bytes=2)
    ops = {o.name: o for o in layer_ops(replace(BASE, sub_norms=True), sh)["dense"]}
    rows = 8  # decoding sequences, no prefill
    assert ops["attn/sub_norm"].flops == 5.0 * rows * 64 and ops["mlp/sub_norm"].flops == 5.0 * rows * 48


EXACT = ("apertus", "apertus1p5_text", "axk1", "beam", "bitnet", "ctrl", "diffllama", "gpt_neox_japanese", "laguna",
         "jetmoe", "lfm2", "modernbert-decoder", "moshi", "openai-gpt")


@pytest.mark.parametrize("model_type", EXACT)
def test_registry_types_exact(model_type: str):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from meshplan.specs.hf.sweep import registry_sweep
    (outcome,) = registry_sweep([model_type])
    assert outcome.kind == "exact", outcome


def test_framework_configs_name_the_extras_they_cannot_build():
    from meshplan.configs.torchtitan_models import _llama_like
    from meshplan.specs.model_extras import extras_on
    bitnet = replace(BASE, sub_norms=True, final_norm=False)
    assert extras_on(bitnet) == ["BitNet sub-norms (sub_norms)", "no final norm (final_norm=false)"]
    assert extras_on(BASE) == []
    assert "BitNet sub-norms" in _llama_like(bitnet)


def test_head_over_its_own_vocabulary():
    moshi = replace(BASE, head_vocab_size=100)  # embedding V = 128 rows, head 100 (Moshi: 32,001 and 32,000)
    assert BASE.params() - moshi.params() == (128 - 100) * 64  # the head's (V − V_head)·H
    logits = {o.name: o for o in head_ops(moshi, PLAN, Stack()) if o.phase == "fwd"}["head/logits"]
    assert logits.n == 100 / 2 and logits.flops == 2.0 * TOKENS * 64 * 50  # H → V_head/t
    with pytest.raises(SpecError, match="a tied head is the embedding's matrix"):
        replace(moshi, tied_embeddings=True)


def test_last_layer_output_bias():
    from meshplan.cost.params import end_params
    neox = replace(BASE, last_out_bias=True)  # GPT-NeoX-Japanese: dense_bias in the last of its layers only
    assert neox.layer_params(1) - neox.layer_params(0) == 64 and neox.params() - BASE.params() == 64
    assert end_params(neox, 2, False, first=False) - end_params(BASE, 2, False, first=False) == 64  # last stage
    assert end_params(neox, 2, False, first=True) == end_params(BASE, 2, False, first=True)
    add = {(o.name, o.phase): o for o in head_ops(neox, PLAN, Stack())}[("last/out_bias", "fwd")]
    assert add.flops == TOKENS / 2 * 64  # 1 FLOP an element of T/t·H (sequence parallelism, on by default at t = 2)
    with pytest.raises(SpecError, match="last_out_bias=true with output-projection biases"):
        replace(neox, linear_bias=True)


def test_prediction_head_and_first_layer_without_pre_norm():
    from meshplan.cost.params import end_params
    from meshplan.serve.iteration import edge_ops
    modern = replace(BASE, head_transform=True, first_norm_skipped=True)  # ModernBERT-decoder's two
    assert modern.head_params() - BASE.head_params() == 64 * 64 + 64  # dense H·H and its RMSNorm's H
    assert modern.layer_params(0) - modern.layer_params(1) == -64  # no attn_norm in layer 0
    assert modern.params() - BASE.params() == 64 * 64 + 64 - 64
    assert end_params(modern, 2, False, first=True) - end_params(BASE, 2, False, first=True) == -64
    assert end_params(modern, 2, False, first=False) - end_params(BASE, 2, False, first=False) == 64 * 64 + 64
    ops = {(o.name, o.phase): o for o in head_ops(modern, PLAN, Stack())}
    assert ops[("head/transform", "fwd")].flops == 2.0 * TOKENS * 64 * 64  # every token, whole on each rank
    assert ops[("head/transform_norm", "fwd")].flops == 5.0 * TOKENS * 64
    from meshplan.cost.decode import Shape
    sh = Shape(tp=2, dpa=1, ep=1, decode=8, context=64, prefill=0, prompts=0, prefix=0, w_bytes=2, a_bytes=2,
               kv_bytes=2)
    serve = {o.name: o for o in edge_ops(modern, sh, 0.0, 1.0)}
    assert serve["head/transform"].flops == 2.0 * 8 * 64 * 64  # the 8 sampled rows only


def test_sequential_mlp_is_read():
    torch = pytest.importorskip("torch")
    from meshplan.specs.hf.modules import kind_of, read_layer
    ffn = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))  # CTRL's ffn
    assert kind_of(ffn) == "mlp"
    layer = torch.nn.Module()
    layer.ffn = ffn
    read = read_layer(layer, 8)
    assert read.blocks == ["mlp"] and read.sizes["mlp"]["ffn"] == 32 and read.sizes["mlp"]["bias"]
    assert not read.unclaimed
    normed = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))
    assert kind_of(normed) is None  # a weighted module between the linears: not an MLP meshplan models


def test_mixture_of_attention_heads_and_moe_output_bias():
    # JetMoE: E_a = 4 attention experts, each q H → K·d = 64 → 64 and o back; k = A / K = 4 / 2 = 2 per token
    moa = replace(MOE, attention_experts=4, moe_out_bias=True)
    idle = (4 - 2) * 2 * 64 * 64  # the two experts a token does not use: q and o, H·K·d each
    router_bias = 64 * 4 + 64  # router H·E_a and the output bias H
    assert moa.attention_params() - MOE.attention_params() == idle + router_bias == 16_704
    assert moa.attention_params(active=True) - MOE.attention_params(active=True) == router_bias
    assert moa.params() - MOE.params() == 2 * (idle + router_bias + 64)  # + the MoE output bias, 2 layers
    ops = records(moa, "moe")
    assert ops[("attn/moa_router", "fwd")].flops == 2.0 * TOKENS * 64 * 4
    assert ops[("attn/moa_weights", "fwd")].nbytes == ACT_BYTES * (4 - 2) * 2 * 64 * 64 / 2  # idle experts' share/t
    assert ops[("moe/out_bias", "fwd")].flops == TOKENS / 2 * 64  # T/t·H
    with pytest.raises(SpecError, match="at least num_heads / num_kv_heads = 2"):
        replace(MOE, attention_experts=1)
