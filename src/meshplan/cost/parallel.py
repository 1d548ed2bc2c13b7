"""A parallel hybrid block's per-op costs, one micro-batch, one GPU: attention and a Mamba-2 mixer side by side on
the same normed input, their outputs summed into the residual ("P" in layer_pattern; symbols: records.py).

Source: Falcon-LLM Team 2025, "Falcon-H1: A Family of Hybrid-Head Language Models" (arXiv 2507.22448), §2: each
block runs attention and an SSM in parallel, their outputs concatenated before the output projection; transformers'
FalconH1DecoderLayer computes input_layernorm once, ``self.mamba(h) * ssm_out_multiplier + self.self_attn(h *
attention_in_multiplier) * attention_out_multiplier``, one residual add, then the MLP block (the μP multipliers
scale activations: no weights, FLOPs neglected).
"""

from __future__ import annotations

from meshplan.cost.attention import attention_block
from meshplan.cost.mamba import mamba_block
from meshplan.cost.records import Dims, OpCost
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan

# the Mamba mixer's records the attention's share: the pre-norm, the tensor-parallel entry and exit (the two
# row-parallel outputs are summed before one reduction), the residual add
SHARED = ("mamba/norm", "mamba/tp_in", "mamba/tp_in/regather", "mamba/tp_out", "mamba/residual")


def parallel_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """The attention block (attention.attention_block) and the Mamba-2 mixer (mamba.mamba_block) without the norm,
    tensor-parallel collectives and residual the two share."""
    return attention_block(model, plan, d) + [op for op in mamba_block(model, plan, d) if op.name not in SHARED]
