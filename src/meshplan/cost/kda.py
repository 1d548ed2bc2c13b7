"""A Kimi Delta Attention block's per-op costs, one micro-batch, one GPU: q/k/v and the gates' projections, the short
causal conv1d, the per-channel forget gate, the chunked delta-rule scan, the sigmoid-gated norm, o_proj (symbols:
records.py; the layer: mixer_params.kda_count; n heads of d = gdn_value_heads, gdn_value_dim; r = kda_gate_rank).

Sources: Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Hybrid Linear Attention Architecture" (arXiv
2510.26692), §3: KDA is Gated DeltaNet with a decay per channel, S_t = (I − β_t·k_t·k_tᵀ)·Diag(α_t)·S_{t-1} +
β_t·k_t·v_tᵀ, computed chunk by chunk with the same WY representation and UT transform (§3.1), its α from a low-rank
projection H → d → n·d (§3.2; the output gate likewise, a sigmoid); transformers' KimiLinearDeltaAttention (and
Bailing-hybrid's full-rank variant) and flash-linear-attention's ``chunk_kda`` that both call. The chunk products are
GDN's (``deltanet.gdn_scan_ops``, with n_k = n_v = n and d_k = d_v = d); the per-channel decay adds its cumulative
sum within a chunk and the decay-scaled q and k the kernel forms before its products (``kda/decay``, 4 FLOPs an
element of q and k, read and written in fp32).
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.blocks import elementwise, gemm, norm, residual, tp_enter, tp_exit
from meshplan.cost.deltanet import gdn_scan_ops
from meshplan.cost.records import ACT_BYTES, FP32, Dims, OpCost
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan


def kda_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """A KDA block split t ways by heads: pre-norm, the column-parallel projections of q, k, v (3·n·d), β (n) and,
    full-rank, the forget and output gates (2·n·d) or, low-rank, their H → r halves kept whole on every rank and the
    r → n·d halves split (``kda/forget_up``, ``kda/gate_up``), the depthwise conv1d + SiLU over q, k, v (2k + 4 FLOPs
    a channel), the forget gate −exp(A)·softplus(f + dt_bias) per channel (10 FLOPs), the decay (module docstring),
    the scan, the gated norm norm(o)·w·sigmoid(g) (8 FLOPs an element), the row-parallel o_proj, the residual. The
    forward keeps the projections' outputs (the conv's and gates' inputs) and the scan's output."""
    h, t, tokens, a = model.hidden_size, d.tp, d.tokens, ACT_BYTES
    heads, r = model.gdn_value_heads / t, model.kda_gate_rank
    width = heads * model.gdn_value_dim  # n·d/t: one of q, k, v, the forget gate, the output gate
    proj = 3 * width + heads + (2 * r if r else 2 * width)
    ops = norm("kda/norm", model, d)
    ops += tp_enter("kda/tp_in", model, plan, d)
    ops += gemm("kda/in_proj", tokens, h, proj, d, saved=d.tokens_sp * h * a)
    for name in ("kda/forget_up", "kda/gate_up") if r else ():  # f_b_proj, g_b_proj: r → n·d/t
        ops += gemm(name, tokens, r, width, d)
    ops += elementwise("kda/conv1d", tokens * 3 * width, tokens * 3 * width, 2.0 * model.gdn_conv + 4.0,
                       saved=tokens * proj * a)
    ops += elementwise("kda/forget_gate", tokens * width, tokens * width, 10.0, saved=tokens * width * FP32)
    ops += [OpCost("kda/decay", "fwd", "memory", 4.0 * 2 * tokens * width, 2 * 2 * tokens * width * FP32),
            OpCost("kda/decay", "bwd_x", "memory", 8.0 * 2 * tokens * width, 4 * 2 * tokens * width * FP32)]
    ops += [replace(op, name="kda/" + op.name.split("/", 1)[1]) for op in gdn_scan_ops(model, d)]
    ops += elementwise("kda/gated_norm", 2 * tokens * width, tokens * width, 8.0, saved=tokens * width * a)
    ops += gemm("kda/out_proj", tokens, width, h, d)
    ops += tp_exit("kda/tp_out", model, plan, d)
    ops += residual("kda/residual", model, d)
    return ops
