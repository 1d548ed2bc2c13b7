"""Eager PyTorch's extra kernels (cost/eager.py): decomposed norms, RoPE, GQA copies, SwiGLU, bias gradients,
PyTorch's cross-entropy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import gpt
from meshplan.cost.embed_head import head_ops
from meshplan.cost.layers import dense_layer
from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


def _eager(model, stack):
    return {(o.name, o.phase): o.nbytes for o in dense_layer(model, Plan(), stack) if o.name.endswith("/eager")}


EAGER = Stack(fusion="eager")


def _llama(**extra):
    # Llama layout: RMSNorm, SwiGLU, RoPE, GQA (4 kv heads of 16), no biases, no dropout
    return ModelSpec(name="llama-test", num_layers=2, hidden_size=1024, num_heads=16, num_kv_heads=4,
                     ffn_hidden_size=2816, vocab_size=32000, seq_length=2048, mlp="swiglu", norm="rmsnorm", **extra)


def test_fused_plans_launch_no_eager_kernels():
    assert _eager(_llama(), Stack()) == {}
    assert not [o for o in head_ops(_llama(), Plan(), Stack()) if o.name.endswith("/eager")]


def test_eager_rmsnorm_streams_36_bytes_forward_and_92_backward_per_element():
    # T·H = 2048 · 1024 elements; the fused norm already counts r2 w2 forward and r4 w2 backward
    ops = _eager(_llama(), EAGER)
    elems = 2048 * 1024
    assert ops[("attn/norm/eager", "fwd")] == (36 - 4) * elems
    assert ops[("attn/norm/eager", "bwd_x")] == (92 - 6) * elems
    assert ops[("mlp/norm/eager", "fwd")] == ops[("attn/norm/eager", "fwd")]


def test_eager_rope_swiglu_and_repeat_kv_bytes():
    ops = _eager(_llama(), EAGER)
    T, d = 2048, 64
    # RoPE on q (16 heads) and k (4 heads): to fp32 (r2 w4), complex mul (r4 w4), type_as (r4 w2) = 20 bytes
    assert ops[("attn/rope/eager", "fwd")] == 20 * T * (16 + 4) * d
    # K and V copied to 16 heads each: 2 bytes written per element of the copies
    assert ops[("attn/repeat_kv/eager", "fwd")] == 2 * (2 * T * 16 * d)
    # SwiGLU as silu + mul (r2 w2 + r4 w2 = 10 bytes per FFN element) less the fused kernel's 6
    assert ops[("mlp/act/eager", "fwd")] == (10 - 6) * T * 2816


def test_eager_layernorm_gelu_model_adds_only_its_bias_gradients():
    # F.layer_norm and GELU are one kernel each way in eager mode too; each biased linear's gradient is reduced
    # by its own kernel, reading the output gradient once (2 bytes per element)
    model = gpt(layers=2, hidden=1024, heads=16, seq=2048)
    ops = _eager(model, EAGER)
    T, h = 2048, 1024
    assert set(ops) == {("attn/qkv_bias/eager", "bwd_w"), ("attn/out_bias/eager", "bwd_w"),
                        ("mlp/bias/eager", "bwd_w")}
    assert ops[("attn/qkv_bias/eager", "bwd_w")] == 2 * T * 3 * h
    assert ops[("mlp/bias/eager", "bwd_w")] == 2 * T * (4 * h + h)


def test_pytorch_cross_entropy_pays_the_upcast_and_three_pass_softmax():
    model = _llama()
    fused = {o.phase: o.nbytes for o in head_ops(model, Plan(), Stack()) if o.name == "head/loss"}
    extra = {o.phase: o.nbytes for o in head_ops(model, Plan(), Stack(cross_entropy="pytorch"))
             if o.name == "head/loss/eager"}
    logits = 2048 * 32000
    # fused: 10 bytes per logit forward, 6 backward; PyTorch: 6 + 16 forward, 4 + 16 + 6 backward
    assert fused["fwd"] + extra["fwd"] == 22 * logits
    assert fused["bwd_x"] + extra["bwd_x"] == 26 * logits


def test_eager_is_slower_and_compile_matters_only_where_kernels_differ():
    cluster = load_system("h100").cluster(8)
    plan = Plan(dp=8, global_batch=8)
    llama = _llama()
    assert estimate(llama, cluster, plan, EAGER).step_time > estimate(llama, cluster, plan, Stack()).step_time
    plain = replace(gpt(layers=2), qkv_bias=False, linear_bias=False)  # LayerNorm, GELU, no biases: nothing to fuse
    # but eager PyTorch launches more kernels (cost/eager.py EAGER_KERNELS, counted by PyTorch): per layer each
    # LayerNorm's backward its GammaBetaBackward kernel (1) and the accumulations of its weight's and bias's gradients
    # into the former micro-batches' (2), each of attn/out, fc1 and fc2 its weight's (1), SDPA's flash backward 3
    # kernels where the fused count has 1 (2), the stack of the q, k, v gradients and its layout copy (2):
    # 2 x 3 + 3 + 2 + 2 = 13 kernels, each at the H100's 1.5 us t0
    extra = 2 * 13 * load_system("h100").cluster(8).accelerator.kernel_overhead
    assert estimate(plain, cluster, plan, EAGER).step_time == pytest.approx(
        estimate(plain, cluster, plan, Stack()).step_time + extra)
