"""Weight-stationary 2D tensor parallelism on a tp × tp2 grid (seed 001's tp_in × tp_out linear layer, composed
into a transformer layer): per-op costs of one layer, one micro-batch, one GPU.

Each linear layer Y = X·W keeps W (k × n) still, split k over one grid axis and n over the other, as seed 001's
notebook does (cost/linear_2d.py: N_local = (d_in/tp_in)·(d_out/tp_out), all-reduce the partial outputs over tp_in
forward and the partial input gradients over tp_out backward). Consecutive layers swap the axes' roles so that a
layer's output is sharded the way the next one's input must be (the 2D weight-stationary layout of Pope et al.
2022, "Efficiently Scaling Transformer Inference", §3.2.2, with all-reduces in place of its reduce-scatter /
all-gather pairs):
    residual stream X (T, h/tp), replicated over tp2         hidden (T, f/tp2), replicated over tp
    qkv, fc1:     W (h/tp, n/tp2)   forward all-reduce over tp of (T, n/tp2); backward all-reduce over tp2 of (T, h/tp)
    out, fc2:     W (k/tp2, h/tp)   forward all-reduce over tp2 of (T, h/tp); backward all-reduce over tp of (T, k/tp2)
    attention:    heads over tp2, every one of T rows; the tp ranks of a grid column repeat it (the layout's price)
    norms:        over a feature-split row: the statistics all-reduced over tp (as summa.summa_norm)
With tp = 1 this is Megatron's 1D layout over tp2 ranks without sequence parallelism (Shoeybi et al. 2019: column-
then row-parallel GEMMs, one all-reduce each way per block); with tp2 = 1 every GEMM all-reduces its output.
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.attention import context_exchange, core_attention
from meshplan.cost.blocks import collective, elementwise, gemm, residual
from meshplan.cost.records import ACT_BYTES, Dims, OpCost
from meshplan.cost.shapes import fc1_width, qkv_width
from meshplan.cost.summa import summa_norm
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.xp import Num


def tp2d_linear(name: str, rows: Num, k: Num, n: Num, ways: tuple[tuple[str, Num], tuple[str, Num]],
                d: Dims, in_l2: bool = False) -> list[OpCost]:
    """(rows × k)·(k × n) with W split k over ``ways[0]`` (axis, size) and n over ``ways[1]``: the three GEMMs of
    a (rows × k/k_ways)·(k/k_ways × n/n_ways) block, the forward all-reduce of the partial outputs (rows × n/n_ways)
    over the k axis and the backward all-reduce of the partial input gradients (rows × k/k_ways) over the n axis
    (seed 001: ``all_reduce_communication(d_out_local·b_local, tp_in)`` and ``(d_in_local·b_local, tp_out)``).
    HBM bytes as ``blocks.gemm`` counts them (operands and result; the gradient accumulated in grad_bytes);
    ``in_l2``: as seed 001 counts them instead (activations stay in L2: the weights forward and for the input
    gradient, the reloaded input and the 16-bit gradient's read + write for the weight gradient)."""
    (k_axis, k_ways), (n_axis, n_ways) = ways
    k_local, n_local = k / k_ways, n / n_ways
    gemms = gemm(name, rows, k_local, n_local, d)
    if in_l2:  # the order of blocks.gemm: forward, input gradient, weight gradient
        weights = k_local * n_local * ACT_BYTES
        seed = (weights, weights, rows * k_local * ACT_BYTES + 2 * weights)
        gemms = [replace(g, nbytes=b) for g, b in zip(gemms, seed, strict=True)]
    return gemms + [
        collective(f"{name}/reduce_out", "fwd", "all_reduce", rows * n_local * ACT_BYTES, k_axis, k_ways, "tp"),
        collective(f"{name}/reduce_in", "bwd_x", "all_reduce", rows * k_local * ACT_BYTES, n_axis, n_ways, "tp"),
    ]


def tp2d_layer(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """One dense transformer layer in the tp2d layout (module docstring)."""
    h, rows = model.hidden_size, d.tokens
    into, out_of = (("tp", plan.tp), ("tp2", plan.tp2)), (("tp2", plan.tp2), ("tp", plan.tp))
    heads = replace(d, tp=plan.tp2)  # attention sees its heads split over tp2 only
    ops = summa_norm("attn/norm", model, plan, d)
    ops += tp2d_linear("attn/qkv", rows, h, qkv_width(model), into, d)
    ops += core_attention(model, plan, heads)
    ops += context_exchange(model, plan, heads)
    ops += tp2d_linear("attn/out", rows, model.attn_out_dim, h, out_of, d)
    ops += residual("attn/residual", model, d)
    ops += summa_norm("mlp/norm", model, plan, d)
    width_in = fc1_width(model, model.ffn_hidden_size)
    ops += tp2d_linear("mlp/fc1", rows, h, width_in, into, d)
    act_in, act_out = rows * width_in / plan.tp2, rows * model.ffn_hidden_size / plan.tp2
    ops += elementwise("mlp/act", act_in, act_out, 8.0, saved=act_in * ACT_BYTES)
    ops += tp2d_linear("mlp/fc2", rows, model.ffn_hidden_size, h, out_of, d)
    ops += residual("mlp/residual", model, d)
    return ops
