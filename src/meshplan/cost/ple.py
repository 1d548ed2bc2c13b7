"""The work of per-layer embeddings (Gemma 4 and Gemma 3n, specs/model_extras.py ``per_layer_input``; transformers 5.24
models/gemma4/modeling_gemma4.py Gemma4TextModel.get_per_layer_inputs / project_per_layer_inputs and
Gemma4TextDecoderLayer.forward), one micro-batch (training) or one iteration (serving), one GPU. Symbols: records.py;
d the per-layer width (hidden_size_per_layer_input), L the layers.

On the first stage, beside the token embedding: a lookup of each token's L·d values in the V_p × L·d table (its
backward a scatter-add into the table's gradient), the projection of the token embedding H → L·d (a GEMM), its scale,
the RMSNorm over each layer's d values, and the sum and scale of the two (L·d elements a token each, element-wise).
In every layer after its MLP: the gate GEMM H → d, its activation (8 FLOPs an element, as an MLP's), the product with
the layer's d inputs, the projection GEMM d → H, the RMSNorm over H and the residual add. The gate and the projection
are kept whole on every tensor-parallel rank (no framework splits them): over the rank's residual rows (T/t with
sequence parallelism, else T). The per-layer inputs travel with the pipeline's sends to later stages: plans with a
pipeline are refused (specs/check.py), which prices them on one stage only.
"""

from __future__ import annotations

from meshplan.cost.blocks import elementwise, gemm
from meshplan.cost.decode import Shape, forward
from meshplan.cost.decode import gemm as serve_gemm
from meshplan.cost.records import ACT_BYTES, Dims, OpCost
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import ple_layers
from meshplan.xp import Num


def ple_embed_ops(model: ModelSpec, d: Dims) -> list[OpCost]:
    """The first stage's records (module docstring)."""
    width = ple_layers(model) * model.per_layer_input
    if not width:
        return []
    rows = d.tokens_sp
    elems = rows * width
    return [OpCost("embed/ple_lookup", "fwd", "memory", 0.0, 2 * elems * ACT_BYTES),
            OpCost("embed/ple_lookup", "bwd_w", "memory", elems, elems * ACT_BYTES + elems * 2 * d.grad_bytes)] + (
        gemm("embed/ple_projection", rows, model.hidden_size, width, d)
        + elementwise("embed/ple_norm", elems, elems, 6.0, saved=elems * ACT_BYTES)
        + elementwise("embed/ple_combine", 2 * elems, elems, 2.0))


def ple_layer_ops(model: ModelSpec, d: Dims) -> list[OpCost]:
    """A layer's records (module docstring)."""
    p, h = model.per_layer_input, model.hidden_size
    if not p:
        return []
    rows = d.tokens_sp
    return (gemm("ple/gate", rows, h, p, d)
            + elementwise("ple/act", rows * p, rows * p, 8.0, saved=rows * p * ACT_BYTES)
            + elementwise("ple/product", 2 * rows * p, rows * p, 1.0, saved=rows * p * ACT_BYTES)
            + gemm("ple/projection", rows, p, h, d)
            + elementwise("ple/norm", rows * h, rows * h, 5.0, saved=rows * h * ACT_BYTES)
            + elementwise("ple/residual", 2 * rows * h, rows * h, 1.0))


def serve_ple_embed_ops(model: ModelSpec, sh: Shape, first: Num) -> list[OpCost]:
    """The first stage's forward records in an inference iteration of ``sh.rows`` rows (``first``: 1 on it)."""
    width = ple_layers(model) * model.per_layer_input
    if not width:
        return []
    rows = sh.rows * first
    return [forward([OpCost("embed/ple_lookup", "fwd", "memory", 0.0, 2 * rows * width * ACT_BYTES)]),
            serve_gemm("embed/ple_projection", rows, model.hidden_size, width, sh.w_bytes, sh.a_bytes),
            forward(elementwise("embed/ple_norm", rows * width, rows * width, 6.0)),
            forward(elementwise("embed/ple_combine", 2 * rows * width, rows * width, 2.0))]


def serve_ple_layer_ops(model: ModelSpec, sh: Shape) -> list[OpCost]:
    """A layer's forward records in an inference iteration."""
    p, h, rows = model.per_layer_input, model.hidden_size, sh.rows
    if not p:
        return []
    return [serve_gemm("ple/gate", rows, h, p, sh.w_bytes, sh.a_bytes),
            forward(elementwise("ple/act", rows * p, rows * p, 8.0)),
            forward(elementwise("ple/product", 2 * rows * p, rows * p, 1.0)),
            serve_gemm("ple/projection", rows, p, h, sh.w_bytes, sh.a_bytes),
            forward(elementwise("ple/norm", rows * h, rows * h, 5.0)),
            forward(elementwise("ple/residual", 2 * rows * h, rows * h, 1.0))]
