"""Attention's per-op costs, one micro-batch, one GPU: the Q/K/V projections (standard and MLA), the attention
core (flash or unfused, causal, sliding window), the K/V exchange of context parallelism, the attention block,
and the copies a stack's model code adds around the kernel (symbols: records.py).

Sources:
- FlashAttention: causal blocks above the diagonal are skipped (half the FLOPs); the backward pass recomputes
  the scores: 5 GEMMs vs 2 forward = 2.5 × (Dao et al. 2022, Alg. 2 and 4).
- Context parallelism: ring exchange of K and V, c-1 steps forward, K/V and dK/dV backward
  (Liu et al. 2023 "Ring Attention"; Megatron-Core context parallelism), overlapped with attention.
- Saved activations: Korthikanti et al. 2022, §4.1 (``core_attention``).
- flash-attn's varlen interface (``stack.varlen_attention``): the gathers and scatters that pack the rows around
  the kernel (``varlen_padding``); a fused QKV projection split with torch.split (``stack.qkv_concat``): the
  concatenation of the q, k, v gradients in the backward pass (``qkv_concat``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meshplan.cost.blocks import collective, elementwise, gemm, norm, projections, residual, tp_enter, tp_exit
from meshplan.cost.dsa import indexer_ops, selected_keys
from meshplan.cost.eager import eager_op, softmax_unfused
from meshplan.cost.records import ACT_BYTES, FP32, MASK_BYTES, Dims, OpCost
from meshplan.cost.shapes import kv_up_shape, qkv_shapes
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.xp import Num


def qkv_ops(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """Q, K, V projections. Standard: one column-parallel GEMM H → (A·d + 2·K·d)/t.
    MLA (DeepSeek-V3 §2.1.1): down-projections (replicated across TP) to the q and kv latents, then
    column-parallel up-projections; the decoupled RoPE key comes from the kv down-projection."""
    h, t, T = model.hidden_size, d.tp, d.tokens
    stored_input = d.tokens_sp * h * ACT_BYTES  # stored sharded under SP, re-gathered in backward
    shapes = qkv_shapes(model, t)  # the shapes serving's projections have too (cost/shapes.py)
    if not model.is_mla:
        (name, k, n), = shapes
        widths = {"q": (model.q_dim + model.gate_dim) / t, "k": model.kv_dim / t, "v": model.v_dim / t}
        return projections(name, T, k, n, widths, d, saved=stored_input)
    saved = {"attn/q_down": stored_input, "attn/q": stored_input, "attn/kv_down": 0.0}  # the input, saved once
    ops: list[OpCost] = []
    for name, k, n in shapes:
        ops += gemm(name, T, k, n, d, saved=saved.get(name))
    return ops + gemm("attn/kv_up", T, *kv_up_shape(model, t), d)


def head_dims(model: ModelSpec) -> tuple[int, int]:
    """(query/key, value) head dimensions (MLA: d_nope + d_rope and d_v)."""
    if model.is_mla:
        return model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
    return model.head_dim, model.v_head_dim or model.head_dim


def attention_elems(model: ModelSpec, d: Dims) -> tuple[Num, Num]:
    """Elements of this GPU's queries, keys and values together, and of the attention output: T·(A/t·d_qk +
    K/t·(d_qk + d_v)) and T·A/t·d_v (MLA: a key and a value per query head)."""
    heads = model.num_heads / d.tp
    kv_heads = heads if model.is_mla else model.num_kv_heads / d.tp
    d_qk, d_v = head_dims(model)
    return d.tokens * (heads * d_qk + kv_heads * (d_qk + d_v)), d.tokens * heads * d_v


def core_attention(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """softmax(Q·Kᵀ/√d)·V for A/t heads, T queries against s keys, causal.

    FLOPs: 2·T·s·(A/t)·(d_qk + d_v) for the two batched GEMMs, halved by the causal mask for a
    flash kernel that skips masked blocks; an unfused kernel computes the full square. A flash kernel in a sliding
    window of w < s keys does 2·T·a·(A/t)·(d_qk + d_v), a = ``ModelSpec.window_keys()``, on the windowed layers'
    share of the average layer (a record with ``window``); an unfused one still computes the square.
    Saved (Korthikanti §4.1): Q and K (4sbh), V (2sbh); unfused adds softmax output (2as²b), dropout mask
    (as²b) and dropout output (2as²b); FlashAttention stores the log-sum-exp instead (4 bytes per row).
    DeepSeek Sparse Attention: a flash kernel attends each query's selected keys, 2·T·k̄·(A/t)·(d_qk + d_v) FLOPs
    (k̄ = dsa.selected_keys, no mask left to skip), priced as a causal band of k keys; an unfused one computes the
    square and masks it (Megatron-Core's unfused_dsa_fn), as dense attention does.
    """
    a = ACT_BYTES
    heads, d_qk, d_v = model.num_heads / d.tp, *head_dims(model)
    T, s = d.tokens, d.seq
    full = core_flops(T, s, heads, d_qk, d_v)
    qkv_elems, out_elems = attention_elems(model, d)
    saved_qkv = qkv_elems * a
    shape: dict[str, Any]  # an op's shape and kernel, OpCost's fields
    if d.stack.flash_attention:
        shape = {"m": T * heads, "n": s, "k": d_qk, "variant": "flash_causal" if model.causal else "flash",
                 "kernel": d.stack.attention_kernel, "groups": plan.cp if d.stack.cp_comm_mode.ring else 1}
        saved = saved_qkv + T * heads * FP32  # q, k, v and the log-sum-exp
        if model.index_topk:  # DeepSeek Sparse Attention: each query's selected keys (dsa.py), a band of k keys
            return flash_records(full * selected_keys(model) / s, a * (qkv_elems + out_elems),
                                 a * (2 * qkv_elems + 3 * out_elems), saved, shape | {"window": model.index_topk})
        windowed = model.window_share
        ops = []
        if windowed < 1:  # the full-attention layers' share of the average layer
            flops = (full / 2 if model.causal else full) * (1 - windowed)
            ops += flash_records(flops, a * (qkv_elems + out_elems) * (1 - windowed),
                                 a * (2 * qkv_elems + 3 * out_elems) * (1 - windowed), saved, shape)
            saved = 0.0
        if windowed:  # the windowed layers': a query sees window_keys() keys on average
            flops = full * model.window_keys() / s * windowed
            ops += flash_records(flops, a * (qkv_elems + out_elems) * windowed,
                                 a * (2 * qkv_elems + 3 * out_elems) * windowed, saved,
                                 shape | {"window": model.sliding_window}, "attn/core/window")
        return ops
    scores = T * heads * s  # full square: the mask is applied, not skipped
    torch_path = softmax_unfused(model, d.stack, d.micro_batch, d.tp)  # 1: eager PyTorch's softmax, per plan
    # softmax out (+ mask + dropout out); the eager path keeps softmax's fp32 output and its bf16 cast for P·V
    probs = a + FP32 * torch_path
    kept = scores * (probs + a + MASK_BYTES if d.dropout else probs)
    fused_pass, torch_pass = unfused_score_traffic(d.dropout, False), unfused_score_traffic(d.dropout, True)
    fwd_traffic, bwd_traffic = (f + (t - f) * torch_path for f, t in zip(fused_pass, torch_pass, strict=True))
    # Q·Kᵀ reduces over d, P·V over s (equal FLOPs): the pair runs like one GEMM of depth 2ds/(d+s)
    shape = {"m": T * heads, "n": s, "k": 2.0 * d_qk * s / (d_qk + s), "variant": "unfused"}
    # kernels (Megatron's CoreAttention): forward Q·Kᵀ (baddbmm), the fused scale-mask-softmax, dropout, P·V (bmm);
    # backward the two GEMMs of each product, the softmax's and the dropout's backward
    drop = 1 if d.dropout else 0
    return [
        OpCost("attn/core", "fwd", "attention", full, a * (qkv_elems + out_elems) + scores * fwd_traffic,
               saved_qkv, kernels=3 + drop, **shape),
        # the scores kept for the backward pass; selective recompute drops them (Korthikanti §5)
        OpCost("attn/scores", "fwd", "memory", saved=kept),
        OpCost("attn/core", "bwd_x", "attention", 2 * full,
               a * (2 * qkv_elems + 2 * out_elems) + scores * bwd_traffic, kernels=5 + drop, **shape),
    ]


def core_flops(tokens: Num, keys: Num, heads: Num, d_qk: Num, d_v: Num) -> Num:
    """FLOPs of the attention core over the full T × s square: Q·Kᵀ (2·T·s·d_qk per head) and P·V (2·T·s·d_v),
    2·T·s·heads·(d_qk + d_v); a causal flash kernel does half (``core_attention``; calibrate times
    scaled_dot_product_attention with this count, calibrate/records.AttentionSample)."""
    return 2.0 * tokens * keys * heads * (d_qk + d_v)


def window_keys(window: Num, start: Num, count: Num) -> Num:
    """Keys a query sees on average in a sliding window of w = ``window`` keys, over the ``count`` queries at
    positions start … start + count − 1, each seeing min(i + 1, w): (S(start + count) − S(start)) / count, with
    S(x) = Σ_{j=1..x} min(j, w) = x(x + 1)/2 up to w and w(w + 1)/2 + (x − w)·w past it. From the first position
    (start 0, count s) this is ``ModelSpec.window_keys()``, w − w(w − 1)/(2s), the training forward's; serving's
    prefill chunks start past their cached prefix (serve/ops.prefill_attention)."""
    def total(x: Num) -> Num:
        return np.where(x <= window, x * (x + 1) / 2, window * (window + 1) / 2 + (x - window) * window)

    out = (total(np.asarray(start + count, dtype=float)) - total(np.asarray(start, dtype=float))) / count
    return float(out) if np.ndim(out) == 0 else out


def flash_records(flops: Num, fwd_bytes: Num, bwd_bytes: Num, saved: Num, shape: dict, name: str = "attn/core"
                  ) -> list[OpCost]:
    """A flash kernel's forward and backward records: the backward recomputes the scores and forms dS, dQ, dK and
    dV: 5 GEMMs against the forward's 2, 2.5 × its FLOPs (Dao et al. 2022, Alg. 2 and 4). The windowed layers' share
    is a sub-record, "attn/core/window", which the recompute modules of "attn/core" take along."""
    return [OpCost(name, "fwd", "attention", flops, fwd_bytes, saved, **shape),
            OpCost(name, "bwd_x", "attention", 2.5 * flops, bwd_bytes, **shape)]


def unfused_score_traffic(dropout: bool, torch_path: bool = False) -> tuple[float, float]:
    """Bytes per attention score that the unfused kernels move, forward and backward (Megatron-Core
    ``DotProductAttention``: baddbmm → fused scale-mask-softmax → attention dropout → bmm; each kernel reads its
    inputs from and writes its output to HBM in bf16). Forward: Q·Kᵀ writes S, the softmax reads S and writes
    P, P·V reads P: 4 elements. Backward: dO·Vᵀ writes dP, the softmax backward reads P and dP and writes dS,
    dQ = dS·K and dK = dSᵀ·Q read dS, dV = Pᵀ·dO reads P: 7 elements. Dropout adds, each way, a read and a
    write of the scores and the byte mask; at p = 0 PyTorch's dropout returns its input without a kernel
    (aten/src/ATen/native/Dropout.cpp), so a model without dropout moves none of that.

    ``torch_path``: the softmax as eager PyTorch ops in fp32 (cost/eager.torch_softmax), the kernels the H200 ran
    for Megatron's module code (data/measured/gpu/2026-11-26-nvidia-h200-kernel-names.json, "megatron" passes), each
    reading its input and writing its output in its own dtype. Forward: Q·Kᵀ writes S (2), the cast to fp32 (2 + 4),
    masked_fill_ in place (4 + 4), softmax_warp_forward<float> (4 + 4), the cast back (4 + 2), P·V reads P (2):
    32 bytes. Backward: dO·Vᵀ writes dP (2), Pᵀ·dO reads P (2), the cast's backward to fp32 (2 + 4), the softmax's
    backward in two kernels (grad × output: 4 + 4 + 4; softmax_warp_backward: 4 + 4 + 4), masked_fill's backward a
    clone and a masked_fill_ (4 + 4 each), the first cast's backward to bf16 (4 + 2), dQ and dK read dS (2 + 2):
    60 bytes. Measured on the H200 (docs/SMALL_WORK_GPU.md, runs A and D): Megatron's layer at micro-batch 8 ran
    its kernels for 5.0-6.0 ms against 2.4 ms priced with the fused kernel's 4 and 7 elements."""
    extra = 2 * ACT_BYTES + MASK_BYTES if dropout else 0.0
    if torch_path:
        return 32.0 + extra, 60.0 + extra
    return 4 * ACT_BYTES + extra, 7 * ACT_BYTES + extra


def kv_chunk(model: ModelSpec, d: Dims) -> Num:
    """Bytes of this GPU's K and V (its T rows, its heads)."""
    if model.is_mla:
        kv_width = model.num_heads * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim)
    else:
        kv_width = model.kv_dim + model.v_dim
    return d.tokens * kv_width / d.tp * ACT_BYTES


def kv_exchange(name: str, axis: str, group: Num, how: str, chunk: Num) -> list[OpCost]:
    """Give every rank of a sequence-sharded group the whole sequence's K and V.

    ``ring`` (ring attention, Liu et al. 2023; Megatron-Core cp_comm_type="p2p"): g-1 steps forward, K/V and
    dK/dV backward, overlapped with the attention kernel. ``allgather`` (seed 003's fused attention for the
    2D context layout; Megatron-Core cp_comm_type="all_gather"): all-gather K and V before the kernel
    forward and again backward, reduce-scatter dK and dV after it; exposed.
    """
    if how == "ring":
        return [collective(name, "fwd", "p2p", (group - 1) * chunk, axis, group, "cp"),
                collective(name, "bwd_x", "p2p", 2 * (group - 1) * chunk, axis, group, "cp")]
    full = group * chunk
    return [collective(name, "fwd", "all_gather", full, axis, group),
            collective(name, "bwd_x", "all_gather", full, axis, group),
            collective(name, "bwd_x", "reduce_scatter", full, axis, group)]


def context_exchange(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """K/V exchange across the context-parallel ranks (none when c = 1: a group of one costs nothing)."""
    return kv_exchange("attn/cp_kv", "cp", plan.cp, d.stack.cp_comm, kv_chunk(model, d))


def output_gate(model: ModelSpec, d: Dims) -> list[OpCost]:
    """The attention output gate (ModelSpec.attn_output_gate; HF Qwen3NextAttention: attn_output *
    torch.sigmoid(gate)): reads the output and the gate, writes the gated output, A·d/t per token; a sigmoid and a
    multiply, about 5 FLOPs an element (the exponential counted as one, as the norms' 5 count theirs); keeps the gate
    for the backward (the attention output is kept by the core's record)."""
    if not model.attn_output_gate:
        return head_gate(model, d)
    elems = d.tokens * model.gate_dim / d.tp
    per = 2.5 + 0.5 * model.gate_bias  # Beam's bias per head on the gate: one more add an output element
    return elementwise("attn/out_gate", 2 * elems, elems, per, saved=elems * ACT_BYTES) + head_gate(model, d)


def differential(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """Differential attention's second map (ModelSpec.diff_attention; Ye et al. 2024, "Differential Transformer",
    arXiv 2410.05258, §2.1; HF DiffLlamaAttention: two attention calls on the same q and k, each over half the value
    heads repeated, then (o₁ − λ·o₂), an RMSNorm over 2·d without weights and a scale): the core's records once more
    and the combination, reading both outputs and writing one, 8 FLOPs an element (the norm's 5, the λ multiply-add
    and the scale); none without it."""
    if not model.diff_attention:
        return []
    out = d.tokens * model.attn_out_dim / d.tp
    return core_attention(model, plan, d) + elementwise("attn/diff_combine", 2 * out, out, 8.0, saved=out * ACT_BYTES)


def head_gate(model: ModelSpec, d: Dims) -> list[OpCost]:
    """A gate per head (ModelSpec.attn_head_gate; HF BailingHybridAttention: attn_output * sigmoid(g_proj(x)), g_proj
    H → A; LagunaAttention's softplus(g_proj(x)) likewise): the column-parallel g_proj (A/t columns, its input the
    QKV projection's, saved by it) and the multiply over the output, A·d_v/t an element (a sigmoid and a multiply as
    ``output_gate``'s); keeps the gate, A/t a token. With it, MLA's RoPE-key norm (ModelSpec.rope_key_norm, dots3's
    k_rope_only_layernorm): an RMSNorm over the T × d_R key, whole on every rank as kv_a_proj_with_mqa is."""
    ops: list[OpCost] = []
    heads, t = model.num_heads / d.tp, d.tokens
    if model.attn_head_gate:
        out = t * model.attn_out_dim / d.tp
        ops += gemm("attn/head_gate", t, model.hidden_size, heads, d, saved=0.0)
        ops += elementwise("attn/head_gate_mul", out + t * heads, out, 2.5, saved=t * heads * ACT_BYTES)
    if model.rope_key_norm:
        keys = t * model.qk_rope_head_dim
        ops += elementwise("attn/rope_key_norm", keys, keys, 5.0, saved=keys * ACT_BYTES)
    return ops


def attention_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    ops = norm("attn/norm", model, d)
    ops += tp_enter("attn/tp_in", model, plan, d)
    ops += qkv_ops(model, plan, d) + unfused_rope(model, d)
    ops += indexer_ops(model, plan, d)  # DeepSeek Sparse Attention's lightning indexer (none without one)
    ops += core_attention(model, plan, d) + differential(model, plan, d)
    ops += context_exchange(model, plan, d)
    ops += output_gate(model, d)
    ops += gemm("attn/out", d.tokens, model.attn_out_dim / d.tp, model.hidden_size, d)
    ops += tp_exit("attn/tp_out", model, plan, d)
    ops += residual("attn/residual", model, d)
    return ops


# ---- flash-attn's variable-length interface and the QKV split: copies around the kernel ------------------
UNPAD_KERNELS = 8  # kernels of one flash_attn.bert_padding.unpad_input call (varlen_padding)


def varlen_padding(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """The copies around a FlashAttention call through flash-attn's varlen interface (``stack.varlen_attention``;
    flash_attn/bert_padding.py, as llm-foundry's MPT ``flash_attn_fn`` uses it), per element of the query, key and
    value and of the output (``attention_elems``, this GPU's heads):
    forward: ``unpad_input`` gathers each of q, k, v into packed rows (``IndexFirstAxis``: torch.gather, read 2 +
    write 2) and ``pad_input`` scatters the output into a zero-filled padded tensor (``IndexPutFirstAxis``: zeros
    2, index_put read 2 + write 2);
    backward: the gather's gradient scatters into zeros (2 + 2 + 2 per q, k, v element) and the output's gradient
    is gathered back (2 + 2).
    Saved: FlashAttention keeps its packed output for the backward pass, and the output projection keeps the padded
    copy pad_input made: 2 bytes per output element more than the unpacked path.
    Host: unpad_input reads the packed layout back to the host for each of q, k and v (``torch.nonzero`` needs its
    output size, ``seqlens.max().item()`` the longest sequence), so from the layer's first synchronisation to the
    FlashAttention call the GPU waits on the host for every kernel: ``UNPAD_KERNELS`` per call (the sum of the
    mask, nonzero's count and select, max, cumsum, F.pad's fill and copy, the gather), three calls per layer. The
    forward record takes at least that many host launches (``launches``, each at the stack's cost per kernel as the
    per-expert MoE path after its tokens-per-expert sync: roofline.op_time); the backward has no sync."""
    if not d.stack.varlen_attention:
        return []
    qkv, out = attention_elems(model, d)
    a = ACT_BYTES
    return [OpCost("attn/varlen", "fwd", "memory", 0.0, 2 * a * qkv + 3 * a * out,  # gather; zeros + index_put
                   a * out, launches=3 * UNPAD_KERNELS, launch_host=d.stack.host.per_kernel),
            OpCost("attn/varlen", "bwd_x", "memory", 0.0, 3 * a * qkv + 2 * a * out)]  # zeros + scatter; gather


def qkv_concat(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """The backward of torch.split on the fused QKV projection's output (``stack.qkv_concat``): autograd's
    SplitWithSizesBackward concatenates the separate q, k and v gradients into one tensor, reading and writing
    2 + 2 bytes per element of q, k and v (this GPU's heads). MLA has no fused QKV projection to split."""
    if not (d.stack.qkv_concat or d.stack.projection_mode.concat_grads) or model.is_mla:
        return []
    qkv, _ = attention_elems(model, d)
    return [OpCost("attn/qkv_concat", "bwd_x", "memory", 0.0, 2 * ACT_BYTES * qkv)]


def unfused_rope(model: ModelSpec, d: Dims) -> list[OpCost]:
    """YaRN-scaled RoPE (``model.yarn_rope``) in Megatron-Core's modules (``stack.fusion = "fused"``), applied to q
    and k as separate eager kernels (``EAGER["rope_megatron"]``): Megatron-Core's apply_rotary_pos_emb uses Transformer
    Engine's fused RoPE only at mscale 1 (models/common/embeddings/rope_utils.py @ core_v0.16.1: "mscale ... is not
    supported by TE's fused RoPE. Using unfused implementation."), and YaRN's mscale is 0.1 ln(factor) + 1 where the
    config states none (yarn_rotary_pos_embedding.py _yarn_get_mscale: 1.347 at GPT-OSS's factor 32); Megatron-Bridge
    also turns the fusion off for any position type but "rope" (NVIDIA-NeMo/Megatron-Bridge
    src/megatron/bridge/utils/fusions.py validate_rope_fusion_compatibility @ 07eea52; its GPT-OSS bridge sets
    position_embedding_type "yarn", gpt_oss_bridge.py). TE's fused kernel (read q and k, write them, each way) is
    not priced where RoPE fuses; an eager stack's own RoPE is eager_layer's."""
    if not model.yarn_rope or d.eager or not d.stack.fusion_mode.fused or model.is_mla:
        return []
    q, k = model.num_heads / d.tp * model.head_dim, model.num_kv_heads / d.tp * model.head_dim
    return eager_op("attn/rope", "rope_megatron", d.tokens * (q + k), tensors=2)
