"""An LFM2 short-convolution block's per-op costs, one micro-batch, one GPU: the input projection into B, C and x,
the gate B ⊙ x, the depthwise causal conv1d, the gate C ⊙ conv, the output projection (symbols: records.py; the
layer: mixer_params.shortconv_count; L = short_conv, the kernel).

Source: transformers' models/lfm2/modeling_lfm2.py, Lfm2ShortConv.forward (LFM3's Lfm3ShortConv is the same class):
``B, C, x = in_proj(h).chunk(3)``; ``y = B * x``; ``y = causal_conv1d(y, conv.weight)`` (nn.Conv1d with
groups = H: one L-tap filter a channel, no bias by default); ``y = C * y``; ``out_proj(y)``. Every op but the two
projections is per channel, so Megatron-style tensor parallelism splits the block as it splits an MLP: in_proj
column-parallel (each rank B, C and x of H/t channels), the conv and both gates on those channels, out_proj
row-parallel. The causal conv reads the L − 1 tokens before each one, which context parallelism would fetch from
the previous rank: not modelled (check.py refuses cp > 1).
"""

from __future__ import annotations

from meshplan.cost.blocks import elementwise, gemm, norm, residual, tp_enter, tp_exit
from meshplan.cost.records import ACT_BYTES, Dims, OpCost
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan


def shortconv_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """A short-convolution block split t ways by channels: pre-norm, the column-parallel in_proj H → 3H/t (saves its
    input), B ⊙ x (one multiply an output element: 0.5 a FLOP on its 2·T·H/t inputs; saves B and x), the depthwise
    causal conv1d (L multiplies and L − 1 adds an output element: 2L − 1 FLOPs; saves its input), C ⊙ conv (saves
    both), the row-parallel out_proj H/t → H (saves its input), the residual. The conv's weights (H·L) are in the
    model's matmul parameters, so MFU counts 6·H·L a token for it (flops.matmul_params), its 2L − 1 forward FLOPs a
    channel within those 2·L."""
    h, tokens, a = model.hidden_size, d.tokens, ACT_BYTES
    elems = tokens * h / d.tp
    ops = norm("shortconv/norm", model, d)
    ops += tp_enter("shortconv/tp_in", model, plan, d)
    ops += gemm("shortconv/in_proj", tokens, h, 3 * h / d.tp, d, saved=d.tokens_sp * h * a)
    ops += elementwise("shortconv/gate_bx", 2 * elems, elems, 0.5, saved=2 * elems * a)
    ops += elementwise("shortconv/conv1d", elems, elems, 2.0 * model.short_conv - 1.0, saved=elems * a)
    ops += elementwise("shortconv/gate_c", 2 * elems, elems, 0.5, saved=2 * elems * a)
    ops += gemm("shortconv/out_proj", tokens, h / d.tp, h, d)
    ops += tp_exit("shortconv/tp_out", model, plan, d)
    ops += residual("shortconv/residual", model, d)
    return ops
