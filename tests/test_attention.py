"""Attention's per-op costs (cost/attention.py): flash and unfused kernels (Dao et al. 2022), flash-attn's varlen
packing, the QKV split's backward concatenation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import gpt
from meshplan.cost.layers import dense_layer, moe_layer
from meshplan.cost.records import ACT_BYTES
from meshplan.roofline import op_time
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


def test_flash_attention_skips_the_masked_half_and_recomputes_in_backward():
    model = gpt()
    unfused = [o for o in dense_layer(model, Plan(), Stack(flash_attention=False)) if o.kind == "attention"]
    fused = [o for o in dense_layer(model, Plan(), Stack()) if o.kind == "attention"]
    assert fused[0].flops == unfused[0].flops / 2  # causal blocks skipped
    assert fused[1].flops == 2.5 * fused[0].flops  # 5 GEMMs backward vs 2 forward


@pytest.mark.parametrize("dropout, fwd_bytes, bwd_bytes", [(False, 8, 14), (True, 13, 19)])
def test_unfused_attention_moves_the_scores_kernel_by_kernel(dropout, fwd_bytes, bwd_bytes):
    """bf16 scores, s = 2048, 16 heads, b = 1. Forward: Q·Kᵀ writes S (2), softmax reads S and writes P (4),
    P·V reads P (2) = 8 bytes per score; backward: dP written (2), softmax-backward reads P, dP and writes dS
    (6), dQ and dK read dS (4), dV reads P (2) = 14. Dropout: + read, write and a 1-byte mask = +5 each way."""
    model = replace(gpt(), dropout=dropout)
    fwd, bwd = [o for o in dense_layer(model, Plan(), Stack(flash_attention=False)) if o.kind == "attention"]
    s, heads, h = 2048, 16, 1024
    scores = heads * s * s
    qkv, out = 3 * s * h, s * h  # elements
    assert fwd.nbytes == ACT_BYTES * (qkv + out) + fwd_bytes * scores
    assert bwd.nbytes == ACT_BYTES * (2 * qkv + 2 * out) + bwd_bytes * scores


@pytest.mark.parametrize("fusion, seq, torch_path", [("eager", 2048, True), ("jit", 2048, False),
                                                    ("jit", 4096, True), ("fused", 4096, False)])
def test_eager_softmax_moves_fp32_scores(fusion, seq, torch_path):
    """Megatron's softmax as eager ops in fp32 (under fusion "eager", or "jit" past the kernel's 2,048 keys), per
    score: forward S written (2), cast to fp32 (2 + 4), masked_fill_ (4 + 4), softmax (4 + 4), cast back (4 + 2),
    P read (2) = 32 bytes; backward dP written (2), P read (2), the cast's backward (2 + 4), softmax backward's two
    kernels (12 + 12), masked_fill's clone and fill (8 + 8), the first cast's backward (4 + 2), dS read twice (4)
    = 60; kept for the backward: fp32 softmax output and its bf16 cast, 6 bytes (the fused kernel: 8, 14 and 2).
    No dropout (it adds 5 bytes each way and 3 kept either way)."""
    model = replace(gpt(), seq_length=seq, max_position_embeddings=seq, dropout=False)
    ops = dense_layer(model, Plan(), Stack(flash_attention=False, fusion=fusion))
    fwd, bwd = [o for o in ops if o.kind == "attention"]
    (kept,) = [o.saved for o in ops if o.name == "attn/scores"]
    scores = 16 * seq * seq
    qkv, out = 3 * seq * 1024, seq * 1024
    per_fwd, per_bwd, per_kept = (32, 60, 6) if torch_path else (8, 14, 2)
    assert fwd.nbytes == ACT_BYTES * (qkv + out) + per_fwd * scores
    assert bwd.nbytes == ACT_BYTES * (2 * qkv + 2 * out) + per_bwd * scores
    assert kept == per_kept * scores


def test_varlen_attention_packs_and_unpacks_every_layer():
    """flash-attn's unpad_input / pad_input around the kernel, per q, k, v element (q + 2·kv = 3h for MHA) and
    output element (h): forward gathers (2 + 2) and zero-fills + index_puts the output (2 + 2 + 2); backward
    zero-fills + scatters the q, k, v gradients (2 + 2 + 2) and gathers the output's (2 + 2). The test GPT (h = 1024,
    T = 2048): forward 4·3·T·h + 6·T·h = 18·T·h bytes, backward 18·T·h + 4·T·h = 22·T·h; halved at tp = 2.
    The forward also takes at least 24 host launches (roofline: launches × the stack's cost per kernel)."""
    model, th = gpt(), 2048 * 1024

    def varlen(plan, on=True):
        return [o for o in dense_layer(model, plan, Stack(varlen_attention=on)) if o.name == "attn/varlen"]

    fwd, bwd = varlen(Plan())
    assert (fwd.phase, fwd.kind, fwd.nbytes) == ("fwd", "memory", 18 * th)
    assert (bwd.phase, bwd.nbytes) == ("bwd_x", 22 * th)
    # three unpad_input calls of 8 kernels each wait on the host after the synchronisations; the backward none
    assert (fwd.launches, bwd.launches) == (24, 0.0)
    # FlashAttention's packed output is kept beside the padded copy the output projection saves: 2 bytes per element
    assert (fwd.saved, bwd.saved) == (2 * th, 0.0)
    assert [o.nbytes for o in varlen(Plan(tp=2))] == [9 * th, 11 * th]
    assert varlen(Plan(), on=False) == []


def test_qkv_split_backward_concatenates_the_gradients():
    """torch.split's backward on the fused QKV output: a cat reading and writing 2 + 2 bytes per q, k, v element
    (3·T·h for the MHA test GPT), backward only."""
    model, th = gpt(), 2048 * 1024
    (cat,) = [o for o in dense_layer(model, Plan(), Stack(qkv_concat=True)) if o.name == "attn/qkv_concat"]
    assert (cat.phase, cat.kind, cat.nbytes) == ("bwd_x", "memory", 4 * 3 * th)
    assert not [o for o in dense_layer(model, Plan(), Stack()) if o.name == "attn/qkv_concat"]
    # MLA projects queries and keys/values through separate low-rank paths: nothing to concatenate
    assert not [o for o in moe_layer(load_model("deepseek-v3"), Plan(ep=8), Stack(qkv_concat=True))
                if o.name == "attn/qkv_concat"]


def test_varlen_forward_waits_on_the_host_for_its_launches():
    """A small micro-batch's unpad copies take less than 24 host launches at the stack's cost per kernel (llm-foundry's
    25 µs, HostCost.per_kernel): the op takes that host time, 0.6 ms."""
    acc = load_system("h100").accelerator
    stack = Stack(varlen_attention=True, host_dispatch=25e-6)
    (fwd,) = [o for o in dense_layer(gpt(seq=128), Plan(), stack)
              if o.name == "attn/varlen" and o.phase == "fwd"]
    assert fwd.launch_host == stack.host.per_kernel == 25e-6
    assert op_time(fwd, acc, "bf16", DEFAULT) == pytest.approx(24 * 25e-6)


def test_separate_projections_are_their_own_gemms_and_sum_their_input_gradients():
    """Hugging Face's q_proj, k_proj, v_proj and gate_proj, up_proj (``projections="separate"``): the same FLOPs as
    the fused GEMMs, one GEMM each, and autograd's adds of their input gradients, 2 in attention and 1 in the MLP,
    each reading two and writing one T·h tensor (3·2 bytes an element); split projections concatenate instead."""
    model = load_model("llama3-8b")
    plan, t, h = Plan(tp=2, micro_batch=1), 8192, 4096
    fused, separate = dense_layer(model, plan, Stack()), dense_layer(model, plan, Stack(projections="separate"))
    gemms = [o for o in separate if o.kind == "gemm" and o.name.startswith(("attn/qkv/", "mlp/fc1/"))]
    assert {o.name for o in gemms} == {"attn/qkv/q", "attn/qkv/k", "attn/qkv/v", "mlp/fc1/gate", "mlp/fc1/up"}
    assert sum(o.flops for o in gemms) == sum(o.flops for o in fused if o.name in ("attn/qkv", "mlp/fc1"))
    sums = {o.name: o.nbytes for o in separate if o.name.endswith("/grad_sum")}
    assert sums == {"attn/qkv/grad_sum": 2 * 3 * 2 * t * h, "mlp/fc1/grad_sum": 1 * 3 * 2 * t * h}
    split = {o.name: o.nbytes for o in dense_layer(model, plan, Stack(projections="split")) if o.kind == "memory"
             and o.name in ("attn/qkv_concat", "mlp/fc1/concat")}
    assert split["mlp/fc1/concat"] == 2 * 2 * t * 2 * 14336 / 2  # read and write T x 2F/t bf16
    assert split["attn/qkv_concat"] == 2 * 2 * t * (4096 + 2 * 1024) / 2  # q, k, v: T x (A + 2K)·d/t

