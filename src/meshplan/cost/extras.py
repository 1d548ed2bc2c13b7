"""The work of the small extra structures of specs/model_extras.py, one micro-batch (training) or one iteration
(serving), one GPU: records beside a layer's blocks (symbols: records.py; the structures' sources: model_extras.py).

- Sub-norms (BitNet): an RMSNorm over the attention output, A·d/t a token on the rank, and over the MLP's
  act(gate)·up, F/t, each the pre-norm's element-wise record (blocks.norm: 5 FLOPs an element, its input kept). The
  heads and the MLP columns are split over the t tensor-parallel ranks, so each token's sum of squares is summed
  across them: an all-reduce of T fp32 values forward and, for the backward's Σ g·x, another.
- Per-head gate (Laguna g_proj): a GEMM H → A/t, then softplus and the product of each head's d outputs with its
  value, A·d/t elements (read output and gate, write; 5 FLOPs as cost/attention.output_gate's sigmoid gate).
- Gate bias (Beam): adding a head's bias to its A·d/t gate elements before the sigmoid, 1 FLOP an element (read,
  write); its gradient, the gate gradient summed over the tokens, is neglected beside the gate's own record.
- Activation scalars (xIELU alpha_p, alpha_n): the activation itself is the 8-FLOP record every activation has
  (mlp_moe.mlp_gemms); the scalars' gradients reduce g·x² (and the negative branch's) over the T·F/t elements
  in the backward pass, reading the saved input and the output gradient: 2 reads and 3 FLOPs an element.
- MoE post-norm (A.X-K1): an H-wide norm over the MoE block's output (blocks.norm), before the residual add.
- Differential attention (DiffLlama): transformers' second attention call, the core's records again as sub-records
  (``attn/core/diff``: selective recompute of the core takes them along), its saved tensors without Q and K (the
  first call's, shared); the concatenation of the two calls' outputs (2·A·d/t read and written), out₁ − λ·out₂
  (2·A·d/t read, A·d/t written, 2 FLOPs an output), the weightless RMSNorm over each head pair (5 FLOPs an element,
  its input kept) and the (1 − λ_init) scale (1 FLOP). Paired heads i and i + A/2 are taken to sit on one
  tensor-parallel rank (a permutation of the projections' rows at load; transformers has no tensor-parallel plan
  for it). Serving runs the prefill and decode attention records twice over the same cache.
- A mixture of attention heads (JetMoE): the A = k·K query heads' projections and attention are the standard block's
  records (same FLOPs: T·k rows through H → K·d/t each way); beside them the router GEMM T×H×E_a (whole on each
  rank, as its weight is kept), the other E_a − k experts' q and o weights, 2·(E_a − k)·H·K·d/t, that the grouped
  GEMMs read forward and backward and whose gradients they write, the tokens' gather to their experts and the
  queries' scatter back (T·k rows of H and of K·d/t, read and written), the outputs' gate-weighted scatter-add (1 FLOP
  an element) and the output bias (1 FLOP an element of T·H). transformers repeats K and V k times for its attention
  call; a GQA kernel shares them, as priced. A MoE output bias (JetMoeMoE.bias) is one more add over T/t·H.
- The last layer's attention-output bias (GPT-NeoX-Japanese): its add over the last stage's T·H outputs (1 FLOP
  an element, read and write; the bias's gradient a sum over the tokens, read once), beside the head's ops.
- The prediction head (ModernBERT-decoder): after the final norm a GEMM T×H×H, whole on every tensor-parallel rank
  (no framework splits it), its activation (8 FLOPs an element, as an MLP's) and a norm (blocks.norm's record over
  T·H); serving runs them on the rows that sample only, as it does the LM head.
- The first layer's missing pre-norm (ModernBERT-decoder): its weights leave the first stage (cost/params.end_params);
  its work, one norm over T·H on the first stage, is left priced as the average layer's (no negative record).
- No final norm (GPT-1): embed_head.head_ops and serve/iteration.edge_ops leave the head's norm out.
"""

from __future__ import annotations

from meshplan.cost.blocks import collective, elementwise, gemm, norm
from meshplan.cost.decode import Shape, forward, stream
from meshplan.cost.decode import collective as serve_collective
from meshplan.cost.decode import gemm as serve_gemm
from meshplan.cost.ple import ple_layer_ops, serve_ple_layer_ops
from meshplan.cost.records import ACT_BYTES, FP32, Dims, OpCost
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import moa_topk
from meshplan.specs.plan import Plan
from meshplan.xp import Num


def sub_norm(name: str, elems: Num, tokens: Num, plan: Plan) -> list[OpCost]:
    """An RMSNorm over a width split t ways (module docstring): the element-wise record and the two all-reduces of
    the tokens' partial sums."""
    return elementwise(name, elems, elems, 5.0, saved=elems * ACT_BYTES) + [
        collective(f"{name}/tp", "fwd", "all_reduce", tokens * FP32, "tp", plan.tp),
        collective(f"{name}/tp", "bwd_x", "all_reduce", tokens * FP32, "tp", plan.tp)]


def attention_extra_ops(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """An attention block's extras: sub-norm, a mixture of attention heads (the per-head output gate, its bias and
    differential attention are cost/attention.py's: ModelSpec.attn_head_gate, gate_bias, diff_attention)."""
    out = d.tokens * model.attn_out_dim / d.tp
    ops = sub_norm("attn/sub_norm", out, d.tokens, plan) if model.sub_norms else []
    return ops + (moa_ops(model, d) if model.attention_experts else [])


def moa_ops(model: ModelSpec, d: Dims) -> list[OpCost]:
    """A mixture of attention heads' router, idle expert weights, routing and output bias (module docstring)."""
    e, k, h, kd = model.attention_experts, moa_topk(model), model.hidden_size, model.kv_dim / d.tp
    idle = (e - k) * 2 * h * kd
    rows = d.tokens * k
    return gemm("attn/moa_router", d.tokens, h, e, d) + [
        OpCost("attn/moa_weights", "fwd", "memory", 0.0, ACT_BYTES * idle),
        OpCost("attn/moa_weights", "bwd_x", "memory", 0.0, ACT_BYTES * idle),
        OpCost("attn/moa_weights", "bwd_w", "memory", 0.0, 2 * d.grad_bytes * idle)] + (
        elementwise("attn/moa_dispatch", rows * (h + kd), rows * (h + kd), 0.0)
        + elementwise("attn/moa_combine", rows * (kd + h), rows * h, 1.0)
        + elementwise("attn/moa_bias", d.tokens * h, d.tokens * h, 1.0))


def ffn_extra_ops(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """A dense MLP's extras: the sub-norm over F/t and the activation scalars' gradient reduction."""
    elems = d.tokens * model.ffn_hidden_size / d.tp
    ops = sub_norm("mlp/sub_norm", elems, d.tokens, plan) if model.sub_norms else []
    if model.act_params:
        ops.append(OpCost("mlp/act_params", "bwd_w", "memory", 3.0 * elems, 2 * ACT_BYTES * elems))
    return ops


def extra_ops(model: ModelSpec, plan: Plan, d: Dims, kind: str) -> list[OpCost]:
    """The extras of one layer of ``kind`` (ModelSpec.block_counts: dense, moe, or a hybrid's blocks)."""
    attention = kind in ("dense", "attention") or (kind == "moe" and not model.is_hybrid)
    ops = attention_extra_ops(model, plan, d) if attention else []
    ops += ple_layer_ops(model, d) if attention or kind == "window" else []  # per-layer embeddings: cost/ple.py
    if kind in ("dense", "mlp"):
        ops += ffn_extra_ops(model, plan, d)
    if kind == "moe" and model.moe_post_norm:
        ops += norm("moe/post_norm", model, d)
    if kind == "moe" and model.moe_out_bias:
        ops += elementwise("moe/out_bias", d.tokens_sp * model.hidden_size, d.tokens_sp * model.hidden_size, 1.0)
    return ops


def head_extra_ops(model: ModelSpec, d: Dims) -> list[OpCost]:
    """The last stage's extras (module docstring): the last layer's own bias add, the prediction head."""
    h = model.hidden_size
    elems = d.tokens_sp * h
    ops = elementwise("last/out_bias", elems, elems, 1.0) + [
        OpCost("last/out_bias", "bwd_w", "memory", elems, ACT_BYTES * elems)] if model.last_out_bias else []
    if model.head_transform:
        rows = d.tokens * h  # every token's H outputs, on every tensor-parallel rank
        ops += gemm("head/transform", d.tokens, h, h, d)
        ops += elementwise("head/transform_act", rows, rows, 8.0, saved=rows * ACT_BYTES)
        ops += elementwise("head/transform_norm", rows, rows, 5.0, saved=rows * ACT_BYTES)
    return ops


def serve_head_extra_ops(model: ModelSpec, sh: Shape, sampled: Num, last: Num) -> list[OpCost]:
    """``head_extra_ops``' forward in an inference iteration: the bias over its rows, the prediction head over the
    ``sampled`` rows (``last``: 1 on the last stage)."""
    h = model.hidden_size
    ops = [forward(elementwise("last/out_bias", sh.rows * h * last, sh.rows * h * last, 1.0))] if (
        model.last_out_bias) else []
    if model.head_transform:
        rows = sampled * last
        ops += [serve_gemm("head/transform", rows, h, h, ACT_BYTES, ACT_BYTES),
                forward(elementwise("head/transform_act", rows * h, rows * h, 8.0)),
                forward(elementwise("head/transform_norm", rows * h, rows * h, 5.0))]
    return ops


def serve_extra_ops(model: ModelSpec, sh: Shape, kind: str) -> list[OpCost]:
    """The forward records of ``extra_ops`` in an inference iteration of ``sh.rows`` rows (training's records in
    phase ``serve``; the sub-norms' all-reduces of the rows' partial sums)."""
    rows, t = sh.rows, sh.tp
    out, ffn = rows * model.attn_out_dim / t, rows * model.ffn_hidden_size / t
    ops: list[OpCost] = []
    if model.sub_norms:
        widths = [("attn/sub_norm", out)] + ([("mlp/sub_norm", ffn)] if kind == "dense" else [])
        for name, elems in widths:
            ops += [forward(elementwise(name, elems, elems, 5.0)),
                    serve_collective(f"{name}/tp", "all_reduce", rows * FP32, "tp", t)]
    if model.attention_experts and kind != "mlp":
        e, k, h, kd = model.attention_experts, moa_topk(model), model.hidden_size, model.kv_dim / t
        ops += [serve_gemm("attn/moa_router", rows, h, e, sh.w_bytes, sh.a_bytes),
                stream("attn/moa_weights", sh.w_bytes * (e - k) * 2 * h * kd),
                forward(elementwise("attn/moa_dispatch", rows * k * (h + kd), rows * k * (h + kd), 0.0)),
                forward(elementwise("attn/moa_combine", rows * k * (kd + h), rows * k * h, 1.0)),
                forward(elementwise("attn/moa_bias", rows * h, rows * h, 1.0))]
    if kind == "moe" and model.moe_out_bias:
        ops.append(forward(elementwise("moe/out_bias", rows * model.hidden_size, rows * model.hidden_size, 1.0)))
    if kind == "moe" and model.moe_post_norm:
        ops.append(forward(elementwise("moe/post_norm", rows * model.hidden_size, rows * model.hidden_size, 5.0)))
    if kind in ("dense", "attention", "window") or (kind == "moe" and not model.is_hybrid):
        ops += serve_ple_layer_ops(model, sh)
    return ops
