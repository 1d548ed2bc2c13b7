"""The KV cache's geometry: bytes per token, per layer and per GPU, for standard (MHA / GQA / MQA) and multi-head
latent attention, and the tokens a sequence keeps in paged blocks.

Standard attention caches a key and a value of d per KV head per layer: 2·K·d·b bytes per token per layer, so
2·L·K·d·b per token (Pope et al. 2023, "Efficiently Scaling Transformer Inference", §2.1; GQA, Ainslie et al. 2023,
and MQA, Shazeer 2019, shrink it by A/K). Tensor parallelism splits the KV heads; past K ranks each rank keeps one
head's copy (vLLM's QKVParallelLinear replicates KV heads when tp > K: num_kv_head_replicas = tp / K).
MLA caches the compressed latent and the decoupled RoPE key, (d_c + d_R)·b per token per layer, shared by all heads
(DeepSeek-V2, DeepSeek-AI 2024, §2.1.2 and Table 1: (d_c + d_R)·l elements against 2·n_h·d_h·l), so every tensor-
parallel rank keeps the whole latent (vLLM's MLA backends; DeepSeek-V3's serving runs attention data-parallel for
this reason, §3.4.2).
A layer with a sliding window of w keys keeps at most w tokens (ModelSpec.sliding_window; vLLM's hybrid KV-cache
manager frees the blocks that leave the window). Pages of ``block_size`` tokens round each sequence up to whole
blocks (Kwon et al. 2023, §4.2): ⌈n / B⌉·B.
"""

from __future__ import annotations

import numpy as np

from meshplan.specs.model import ModelSpec
from meshplan.xp import Num, maximum, minimum


def kv_heads_per_gpu(model: ModelSpec, tp: Num) -> Num:
    """KV heads one tensor-parallel rank keeps: K / tp, at least one (replicated past K ranks)."""
    return maximum(model.num_kv_heads / tp, 1.0)


def layer_token_bytes(model: ModelSpec, tp: Num, kv_bytes: Num) -> Num:
    """Bytes of one token's cache in one attention layer on one GPU: 2·(K/tp)·d·b, or MLA's (d_c + d_R)·b."""
    if model.is_mla:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * kv_bytes + 0 * tp
    return 2 * kv_heads_per_gpu(model, tp) * model.head_dim * kv_bytes


def token_bytes(model: ModelSpec, kv_bytes: Num, tp: Num = 1) -> Num:
    """Bytes of one token's cache over all attention layers on one GPU (full context, no window):
    2·L·K·d·b for tp = 1."""
    return model.num_attention_layers * layer_token_bytes(model, tp, kv_bytes)


def kept_tokens(model: ModelSpec, context: Num) -> Num:
    """Tokens the average attention layer keeps of a ``context``-token sequence: all of them, or in the windowed
    layers' share at most the window."""
    share = window_share(model)
    if not share:
        return context
    return (1 - share) * context + share * minimum(context, model.sliding_window)


def window_share(model: ModelSpec) -> float:
    """Share of the attention layers with a sliding window (ModelSpec.window_share without the training sequence)."""
    if not model.sliding_window:
        return 0.0
    return model.window_layers / model.num_attention_layers if model.window_layers else 1.0


def paged(tokens: Num, block_size: Num) -> Num:
    """Tokens a sequence of ``tokens`` occupies in pages of ``block_size``: ⌈tokens / B⌉·B."""
    return np.ceil(np.asarray(tokens, dtype=float) / block_size) * block_size


def sequence_bytes(model: ModelSpec, context: Num, kv_bytes: Num, tp: Num, block_size: Num) -> Num:
    """Cache bytes of one sequence of ``context`` tokens on one GPU of its attention group, in whole pages (a
    windowed layer's pages: those of its window)."""
    per_layer = layer_token_bytes(model, tp, kv_bytes)
    kept = kept_tokens(model, paged(context, block_size))
    return model.num_attention_layers * per_layer * kept
