"""FLOP accounting per token: model FLOPs (the MFU basis), what a plan's training needs (LoRA), and what
recomputation adds (the HFU basis).

MFU counts model FLOPs: 6·N per token for the matmul parameters N (embedding lookup excluded, LM head
included) plus 6·s·A·(d_qk + d_v) per layer for attention, without causal savings (PaLM, Chowdhery et al.
2022, App. B); a hybrid's Mamba-2 SSD scans and the multi-token-prediction depths count likewise. HFU adds the
FLOPs of recomputed forward passes.
Symbols: N matmul parameters, s sequence length, A heads, d_qk / d_v head dims, V vocabulary, H hidden size.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import cast

from meshplan.cost.attention import head_dims
from meshplan.cost.dsa import indexer_flops_per_token
from meshplan.cost.layers import layer_kinds
from meshplan.cost.params import layers_on_first
from meshplan.cost.recompute import rerun_by, rerun_part
from meshplan.cost.records import OpCost, token_rows
from meshplan.specs.mixer_params import attention_spec
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import head_vocab, ple_projection_params
from meshplan.specs.plan import Plan
from meshplan.specs.stack import DEFAULT as DEFAULT_STACK
from meshplan.specs.stack import Stack
from meshplan.xp import Num


@lru_cache(maxsize=256)
def matmul_params(model: ModelSpec) -> int:
    """Parameters that take part in a matmul per token (active experts only; the LM head even if tied)."""
    lookup = model.embedding_params() - ple_projection_params(model)  # the per-layer inputs' projection: a matmul
    head = model.vocab_size * model.hidden_size if model.tied_embeddings else 0
    return model.params(active=True) - lookup + head


def attention_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of Q·Kᵀ and A·V per token over all attention layers, no causal savings: 2·s·A·(d_qk + d_v)·L
    (a hybrid: its attention blocks), plus a hybrid's SSD scans (``ssd_flops_per_token``)."""
    return attention_blocks_flops(model) + ssd_flops_per_token(model)


def attention_blocks_flops(model: ModelSpec) -> float:
    """``attention_layer_flops`` over the attention layers; beside windowed "W" blocks, each "*" block's full
    attention and each "W" block's windowed one (mixer_params.attention_spec)."""
    if "W" not in model.layer_pattern:
        return attention_layer_flops(model) * model.num_attention_layers
    return sum(model.layer_pattern.count(c) * attention_layer_flops(attention_spec(model, kind))
               for c, kind in (("*", "attention"), ("W", "window")))


def attention_layer_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one attention layer's Q·Kᵀ and A·V, no causal savings: 2·s·A·(d_qk + d_v), the
    keys s a query may see; a sliding window lets it see w = min(sliding_window, s) of them, so the windowed share
    f of the layers counts 2·w·A·(d_qk + d_v) (the average layer: 2·((1 − f)·s + f·w)·A·(d_qk + d_v)). DeepSeek
    Sparse Attention: a query sees its min(k, s) selected keys (its indexer: ``model_flops_per_token``)."""
    d_qk, d_v = head_dims(model)
    f = model.window_share
    keys = (1 - f) * model.seq_length + f * min(model.sliding_window, model.seq_length)
    if model.index_topk:
        keys = min(model.index_topk, model.seq_length)
    return 2.0 * keys * model.num_heads * (d_qk + d_v) * (2 if model.diff_attention else 1)  # DiffLlama: two maps


def ssd_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of the Mamba-2 SSD scans of the model's Mamba blocks (``ssd_block_flops``) and of the
    Gated DeltaNet and Kimi Delta Attention blocks' chunked scans (``gdn_block_flops``), the Mamba-1 blocks'
    selective scans and the lightning-attention blocks' 4·A·d·(B + d) (lightning.lightning_scan_ops')."""
    mamba1 = (9.0 * model.mamba_state + 2.0) * model.ssm_inner  # mamba1.selective_scan's, per token
    lightning = 4.0 * model.num_heads * model.head_dim * (model.lightning_block + model.head_dim)  # lightning.py's
    pattern = model.layer_pattern
    mamba2 = pattern.count("M") + pattern.count("P")  # "P": Falcon-H1's Mamba-2 beside its attention
    return (mamba2 * ssd_block_flops(model) + (pattern.count("G") + pattern.count("K"))
            * gdn_block_flops(model) + pattern.count("S") * mamba1 + pattern.count("L") * lightning)


def gdn_block_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one Gated DeltaNet block's chunked scan (``deltanet.gdn_scan_ops``' products, per
    token): n_v·(6·d_k·d_v + C·(6·d_k + 4·d_v) + 2·C²/3)."""
    c, dk, dv = model.gdn_chunk, model.gdn_key_dim, model.gdn_value_dim
    return model.gdn_value_heads * (6.0 * dk * dv + c * (6.0 * dk + 4.0 * dv) + 2.0 * c * c / 3)


def ssd_block_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one Mamba block's SSD scan (``mamba.ssd_ops``' products over a chunk, per token):
    n_h·(2·N·P + 2·(Q + N)·P) + G·2·Q·N."""
    q, n, p = model.mamba_chunk, model.mamba_state, model.mamba_head_dim
    return model.mamba_heads * (2.0 * n * p + 2.0 * (q + n) * p) + model.mamba_groups * 2.0 * q * n


def model_flops_per_token(model: ModelSpec) -> float:
    """Training (forward + backward) model FLOPs per token: 6·N + 3 · attention forward (PaLM App. B), plus the
    multi-token-prediction depths' (``mtp_flops_per_token``) and DeepSeek Sparse Attention's indexers' scores, one
    in each attention layer (dsa.indexer_flops_per_token: forward and backward as they run)."""
    indexers = model.num_attention_layers * indexer_flops_per_token(model)
    return 6.0 * matmul_params(model) + 3.0 * attention_flops_per_token(model) + mtp_flops_per_token(model) + indexers


def mtp_flops_per_token(model: ModelSpec) -> float:
    """Per MTP depth, counted as the model's layers are: 6 · (the MTP layer's active parameters, eh_proj 2·H·H and
    its norms among them, + the LM head V·H) + 3 · the forward of its attention blocks' scores, 2·s·A·(d_qk + d_v)
    each, and of its Mamba blocks' scans (Megatron-Core's num_floating_point_operations counts the MTP layers
    likewise)."""
    if not model.mtp_layers:
        return 0.0
    params = model.mtp_layer_params(active=True) + head_vocab(model) * model.hidden_size
    return model.mtp_layers * (6.0 * params + 3.0 * _mtp_scores_flops(model))


def _mtp_scores_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one MTP layer's attention scores and Mamba scans."""
    return (_mtp_attention_blocks(model) * attention_layer_flops(model)
            + model.mtp_kinds.count("mamba") * ssd_block_flops(model))


def _mtp_attention_blocks(model: ModelSpec) -> int:
    """Attention blocks in one MTP layer: a transformer layer's one, or a hybrid pattern's "*" blocks."""
    return sum(k == "attention" or (k in ("dense", "moe") and not model.is_hybrid) for k in model.mtp_kinds)


def plan_flops_per_token(model: ModelSpec, plan: Plan) -> float:
    """Model FLOPs per token the plan's training needs: ``model_flops_per_token``, or under LoRA without the weight
    gradients of the frozen base weights, 4·N + 3 · attention (the adapters' own FLOPs neglected; NeMo's LoRA
    "model TFLOP/s" counts the same)."""
    if plan.finetune == "lora":
        return model_flops_per_token(model) - 2.0 * matmul_params(model)
    return model_flops_per_token(model)


def recompute_flops_per_token(model: ModelSpec, plan: Plan, stack: Stack = DEFAULT_STACK,
                              ops: Mapping[str, list[OpCost]] | None = None) -> float:
    """Extra forward FLOPs per token that recomputation executes (counted like model FLOPs): under full recompute
    the layers' forward (a share of them with ``recompute_layers``) and every MTP depth's but its head; under
    selective recompute the modules' (``module_flops_per_token``, the attention core by its closed form; ``ops``:
    the plan's op records where the caller holds them, step/units.Parts.ops, else built)."""
    head = 2.0 * head_vocab(model) * model.hidden_size
    mtp = mtp_flops_per_token(model) / 3
    if plan.recompute == "full":
        layers = cast(int, layers_on_first(model, plan))  # one Plan (estimate.py), not a batch
        share = 1.0 if plan.recompute_layers == 0 else min(plan.recompute_layers, layers) / layers
        return share * (model_flops_per_token(model) / 3 - mtp - head) + mtp - model.mtp_layers * head
    if plan.recompute == "selective":
        modules = plan.recompute_modules
        attention = 0.0
        if "core_attn" in modules:
            mtp = model.mtp_layers * _mtp_attention_blocks(model) * attention_layer_flops(model)
            attention = attention_blocks_flops(model) + mtp
        others = tuple(m for m in modules if m != "core_attn")
        return attention + (module_flops_per_token(model, plan, stack, others, ops) if others else 0.0)
    return 0.0


def module_flops_per_token(model: ModelSpec, plan: Plan, stack: Stack, modules: tuple[str, ...],
                           ops: Mapping[str, list[OpCost]] | None = None) -> float:
    """Forward FLOPs per token of the ops the selective recompute of ``modules`` runs again, over all layers: a
    layer's op on one GPU does the work of T/t of the tokens (T = b·s/c on the GPU; column- and row-parallel
    GEMMs split the work t ways, a rank's experts take the k·T/t rows it routes), so per token it is
    flops · t / T, counted once per layer of its kind (the multi-token-prediction depths' layers too)."""
    tokens = token_rows(model, plan)[0]
    counts = model.block_counts
    total: Num = 0.0
    kinds = layer_kinds(model, plan, stack) if ops is None else {kind: ops[kind] for kind in counts}
    for kind, layer in kinds.items():
        again = rerun_by(layer, modules)
        layers = counts[kind] + model.mtp_layers * model.mtp_kinds.count(kind)
        total += layers * sum(rerun_part(redo, op.flops) for op, redo in zip(layer, again, strict=True))
    return float(total * plan.tp / tokens)
