"""A MiniMax lightning-attention block's per-op costs, one micro-batch, one GPU: the q/k/v and output-gate
projections, SiLU, the blockwise linear attention, the output norm and gate, out_proj (symbols: records.py; the
layer: mixer_params.lightning_count; A heads of d = num_heads, head_dim; B = lightning_block).

Sources: MiniMax 2025, "MiniMax-01: Scaling Foundation Models with Lightning Attention" (arXiv 2501.08313), §2.2 and
Qin et al. 2024, "Lightning Attention-2" (arXiv 2401.04658), Alg. 1: the sequence is cut into blocks of B tokens; in
a block the intra part (Q·Kᵀ ∘ M)·V, M the causal decay mask, is computed as attention, the inter part Q·KV
from the running d × d state KV, which then decays and takes Kᵀ·V of the block; no softmax, linear in the sequence.
transformers' MiniMaxLightningAttention runs the same loop (act_fn on qkv_proj, then per block
attn_weights_intra, attn_output_inter, next_attn_weights_inter; norm(output) · sigmoid(output_gate(x)), out_proj).
"""

from __future__ import annotations

from meshplan.cost.blocks import elementwise, gemm, norm, residual, tp_enter, tp_exit
from meshplan.cost.mamba import activation_product
from meshplan.cost.records import ACT_BYTES, FP32, Dims, OpCost
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan


def lightning_scan_ops(model: ModelSpec, d: Dims) -> list[OpCost]:
    """The blockwise linear attention of A/t heads over blocks of B tokens, per block and head (each product's
    backward records as ``mamba.activation_product``'s, priced like the chunked scans at their streaming rate):
    - intra Q·Kᵀ, (B×d)·(d×B), and (Q·Kᵀ ∘ M)·V, (B×B)·(B×d), the masked half computed: reads q, k, v;
    - inter (Q ∘ decay)·KV, (B×d)·(d×d): reads q and the state, writes o;
    - the state update (K ∘ decay)ᵀ·V, (d×B)·(B×d): reads k, v and the fp32 d×d state, writes it.
    Forward per token and head: 4·B·d + 4·d² FLOPs. The backward runs the block loop again for the states."""
    t, a = d.tp, ACT_BYTES
    heads, b, dim = model.num_heads / t, model.lightning_block, model.head_dim
    blocks = d.tokens / b
    one = d.tokens * heads * dim * a  # one of q, k, v, o
    state = blocks * heads * dim * dim * FP32
    batch = blocks * heads
    ops = activation_product("lightning/qk", b, dim, b, batch, 2 * one + blocks * heads * b * b * FP32)
    ops += activation_product("lightning/intra", b, b, dim, batch, blocks * heads * b * b * FP32 + 2 * one)
    ops += activation_product("lightning/inter", b, dim, dim, batch, one + state + one)
    ops += activation_product("lightning/state", dim, b, dim, batch, 2 * one + 2 * state)
    rerun = [op for op in ops if op.phase == "fwd" and op.name == "lightning/state"]
    ops.append(OpCost("lightning/rerun", "bwd_x", "gemm", rerun[0].flops, rerun[0].nbytes, variant="ssd"))
    return ops


def lightning_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """A lightning-attention block split t ways by heads: pre-norm, the column-parallel qkv_proj and output_gate
    (4·A·d/t), SiLU on q, k, v (4 FLOPs an element), the scan (``lightning_scan_ops``), the RMSNorm over the output
    and its sigmoid gate (8 FLOPs an element, as the gated norms'; the norm's sum of squares over A·d spans the
    tensor-parallel ranks, a T-element reduction neglected), the row-parallel out_proj, the residual. The forward
    keeps the projections' output and the scan's."""
    h, t, tokens, a = model.hidden_size, d.tp, d.tokens, ACT_BYTES
    width = model.num_heads * model.head_dim / t
    ops = norm("lightning/norm", model, d)
    ops += tp_enter("lightning/tp_in", model, plan, d)
    ops += gemm("lightning/in_proj", tokens, h, 4 * width, d, saved=d.tokens_sp * h * a)
    ops += elementwise("lightning/silu", 3 * tokens * width, 3 * tokens * width, 4.0, saved=4 * tokens * width * a)
    ops += lightning_scan_ops(model, d)
    ops += elementwise("lightning/gated_norm", 2 * tokens * width, tokens * width, 8.0, saved=tokens * width * a)
    ops += gemm("lightning/out_proj", tokens, width, h, d)
    ops += tp_exit("lightning/tp_out", model, plan, d)
    ops += residual("lightning/residual", model, d)
    return ops
