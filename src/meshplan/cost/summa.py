"""2D tensor parallelism (SUMMA) on a tp × tp2 grid: per-op costs of one layer, one micro-batch, one GPU.

Layout (seed 003: Subramanian et al. 2024, arXiv 2410.00273, §3 and its reference ``layers.LinearSumma``;
van de Geijn & Watts 1997, "SUMMA: scalable universal matrix multiplication algorithm"):
    activations  X (b, s/tp2, h/tp)       weights W (h/tp2, f/tp)       output Y (b, s/tp2, f/tp)
A GPU in grid row r, column c owns the X block of its row and the W block of its column. Y = X·W runs in
``nb`` panels: for each panel the owners broadcast an X panel (rows × k/nb) along the grid row (tp GPUs) and a
W panel (k/nb × n/tp) along the grid column (tp2 GPUs), and every GPU multiplies them into its Y block. So:
    FLOPs per GPU, per pass       2 · rows · k · n/tp           (rows = b·s/(c·tp2))
    forward                       broadcast X over tp: rows·k;  broadcast W over tp2: k·n/tp   (bytes × a)
    input gradient dX = dY·Wᵀ     broadcast W over tp2: k·n/tp; reduce dX over tp: rows·k
    weight gradient dW = Xᵀ·dY    broadcast X over tp: rows·k;  reduce dW over tp2: k·n/tp
Each collective is sent as nb panels of 1/nb of its bytes (``OpCost.repeat``); step/passes.py exposes one
panel set and overlaps the rest with the GEMMs (seed 003: t_comm = t_panel + max(nb·t_panel - t_compute, 0)).
With tp2 = 1 the FLOPs and the weight shards are those of a 1D layout over tp GPUs.

Attention in this layout follows seed 003's 2D strategy: heads split over tp, the sequence over tp2 (and
cp); the fused attention kernel all-gathers K and V across tp2 (``attention.kv_exchange``). LayerNorm over a
feature-sharded row all-reduces its two statistics across tp.
"""

from __future__ import annotations

from meshplan.cost.attention import context_exchange, core_attention, kv_chunk, kv_exchange
from meshplan.cost.blocks import collective, elementwise, gathered_bytes, residual
from meshplan.cost.casts import cast
from meshplan.cost.records import ACT_BYTES, FP32, LOW_PRECISION_BYTES, Dims, OpCost, alignment
from meshplan.cost.shapes import fc1_width, qkv_width
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.xp import Num


def summa_linear(name: str, rows: Num, k: Num, n: Num, plan: Plan, d: Dims) -> list[OpCost]:
    """(rows × k)·(k × n) on the grid; see the module docstring for the volumes."""
    a, t, t2, nb = ACT_BYTES, plan.tp, plan.tp2, plan.summa_panels
    flops = 2.0 * rows * k * n / t
    x_row, w_col, y = rows * k * a, k * n / t * a, rows * n / t * a  # full broadcast volumes, output block
    # the panels a low-precision GEMM reads are broadcast quantized (as the 1D gathers, blocks.gathered_bytes: TE
    # keeps the weights' fp8 copies); the reductions carry 16-bit partial sums
    q = gathered_bytes(plan) / a
    saved = rows * k / t * a  # this GPU's own X block
    w_local = k / t2 * n / t
    align = alignment(k, n / t)  # the leading dimensions of the panels' GEMMs (records.OpCost.align)
    ops = [
        OpCost(name, "fwd", "gemm", flops, x_row + w_col + y, saved, m=rows, n=n / t, k=k, align=align),
        OpCost(name, "bwd_x", "gemm", flops, y + w_col + x_row, m=rows, n=k, k=n / t, align=align),
        OpCost(name, "bwd_w", "gemm", flops, x_row + y + 2 * d.grad_bytes * w_local * t2, m=k, n=n / t, k=rows,
               align=align),
    ]
    if plan.precision in LOW_PRECISION_BYTES:  # each GPU quantizes its own X block forward, its dY block backward
        ops += [cast(name, "fwd", rows * k / t, plan, d.stack), cast(name, "bwd_x", rows * n / t, plan, d.stack)]
    for phase, kind, volume, axis, group in (
        ("fwd", "broadcast", x_row * q, "tp", t), ("fwd", "broadcast", w_col * q, "tp2", t2),
        ("bwd_x", "broadcast", w_col * q, "tp2", t2), ("bwd_x", "reduce", x_row, "tp", t),
        ("bwd_w", "broadcast", x_row * q, "tp", t), ("bwd_w", "reduce", w_col, "tp2", t2),
    ):
        ops.append(collective(f"{name}/{kind}_{axis}", phase, kind, volume / nb, axis, group, "summa", repeat=nb))
    return ops


def summa_norm(name: str, model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """LayerNorm / RMSNorm over a row split across tp GPUs: local partial sums, then an all-reduce of the
    statistics (2 fp32 values per row) forward and backward (seed 003 ``LayerNorm2D``)."""
    elems = d.tokens * model.hidden_size / plan.tp
    ops = elementwise(name, elems, elems, 5.0, saved=elems * ACT_BYTES)
    stats = 2 * d.tokens * FP32
    ops += [collective(f"{name}/stats", "fwd", "all_reduce", stats, "tp", plan.tp),
            collective(f"{name}/stats", "bwd_x", "all_reduce", stats, "tp", plan.tp)]
    return ops


def summa_layer(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """One dense transformer layer in the summa layout."""
    h, rows = model.hidden_size, d.tokens
    ops = summa_norm("attn/norm", model, plan, d)
    ops += summa_linear("attn/qkv", rows, h, qkv_width(model), plan, d)
    ops += core_attention(model, plan, d)
    ops += kv_exchange("attn/tp2_kv", "tp2", plan.tp2, "allgather", kv_chunk(model, d))
    ops += context_exchange(model, plan, d)
    ops += summa_linear("attn/out", rows, model.attn_out_dim, h, plan, d)
    ops += residual("attn/residual", model, d)
    ops += summa_norm("mlp/norm", model, plan, d)
    width_in = fc1_width(model, model.ffn_hidden_size)
    ops += summa_linear("mlp/fc1", rows, h, width_in, plan, d)
    act_in, act_out = rows * width_in / plan.tp, rows * model.ffn_hidden_size / plan.tp
    ops += elementwise("mlp/act", act_in, act_out, 8.0, saved=act_in * ACT_BYTES)
    ops += summa_linear("mlp/fc2", rows, model.ffn_hidden_size, h, plan, d)
    ops += residual("mlp/residual", model, d)
    return ops
