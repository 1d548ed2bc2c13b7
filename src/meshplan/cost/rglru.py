"""A Griffin RG-LRU recurrent block's per-op costs, one micro-batch, one GPU: the two input branches, the temporal
conv1d, the RG-LRU's block-diagonal gates and linear recurrence, the GeLU gate, the output projection (symbols:
records.py; the layer: mixer_params.rglru_count; W = lru_width, n = lru_heads gate blocks, k = lru_conv).

Sources: De et al. 2024, "Griffin: Mixing Gated Linear Recurrences with Local Attention for Efficient Language
Models" (arXiv 2402.19427), §2.4 and Fig. 2: y = GeLU(linear_y(x)); x' = RG-LRU(conv1d(linear_x(x))), the RG-LRU's
recurrence and input gates r_t, i_t = σ(W·x_t + b) block-diagonal (§2.4), a_t = a^{c·r_t} with a = σ(Λ) and c = 8,
h_t = a_t ⊙ h_{t−1} + √(1 − a_t²) ⊙ (i_t ⊙ x_t); out = linear_out(x' ⊙ y); §3.3: the layer is split across devices
by its gate blocks, and the scan is memory-bound (a linear scan kernel, §3.4). transformers'
RecurrentGemmaRecurrentBlock and RecurrentGemmaRglru run the same, the scan in fp32.
"""

from __future__ import annotations

from meshplan.cost.blocks import elementwise, gemm, norm, residual, tp_enter, tp_exit
from meshplan.cost.records import ACT_BYTES, FP32, Dims, OpCost
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan


def rglru_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """An RG-LRU block split t ways by its gate blocks: pre-norm, the column-parallel linear_x and linear_y (2·W/t),
    GeLU on y (8 FLOPs an element, tanh form), the depthwise conv1d over x (2k + 1 FLOPs a channel, its bias), the two
    block-diagonal gates, n/t GEMMs of (T × W/n)·(W/n × W/n) each, their sigmoids and a_t, √(1 − a_t²) (15 FLOPs an
    element), the linear scan (``rglru/scan``: 4 FLOPs an element; reads a, the gated input and writes h in fp32,
    twice that backward), x' ⊙ y, the row-parallel linear_out, the residual."""
    h, t, tokens, a = model.hidden_size, d.tp, d.tokens, ACT_BYTES
    width, blocks = model.lru_width / t, model.lru_heads / t
    side = model.lru_width / model.lru_heads
    elems = tokens * width
    ops = norm("rglru/norm", model, d)
    ops += tp_enter("rglru/tp_in", model, plan, d)
    ops += gemm("rglru/in_proj", tokens, h, 2 * width, d, saved=d.tokens_sp * h * a)
    ops += elementwise("rglru/gelu", elems, elems, 8.0, saved=elems * a)
    ops += elementwise("rglru/conv1d", elems, elems, 2.0 * model.lru_conv + 1.0, saved=elems * a)
    for gate in ("rglru/input_gate", "rglru/recurrence_gate"):
        ops += gemm(gate, tokens * blocks, side, side, d, saved=0.0 if gate.endswith("recurrence_gate") else None,
                    groups=blocks)
    ops += elementwise("rglru/gates", 3 * elems, 2 * elems, 15.0, saved=2 * elems * FP32)
    ops += [OpCost("rglru/scan", "fwd", "memory", 4.0 * elems, 3 * elems * FP32, saved=elems * FP32),
            OpCost("rglru/scan", "bwd_x", "memory", 8.0 * elems, 6 * elems * FP32)]
    ops += elementwise("rglru/out_gate", 2 * elems, elems, 1.0, saved=elems * a)
    ops += gemm("rglru/out_proj", tokens, width, h, d)
    ops += tp_exit("rglru/tp_out", model, plan, d)
    ops += residual("rglru/residual", model, d)
    return ops
