"""Parameters of one recurrent (linear-time) mixer of a hybrid ModelSpec (``layer_pattern``), each equal to the
module transformers builds (model.py's ``block_params`` adds the block's pre-norm), DeepSeek Sparse Attention's
indexer, and the specs of a hybrid's full ("*") and windowed ("W") attention blocks. Symbols: model.py's glossary;
each formula names the module it counts.

A Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs", §7; mamba_ssm ``modules/mamba2.py``): in_proj H → (z, x,
B, C, dt) of widths (D_i, D_i, G·N, G·N, n_h) with D_i = n_h·P, a depthwise causal conv1d (kernel k, with bias) over
x, B, C, per-head dt_bias, A_log and D, a gated RMSNorm over D_i and out_proj D_i → H.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any


def mamba2_count(m: Any) -> int:
    """One Mamba-2 mixer (model.py's docstring): in_proj H·(2·D_i + 2·G·N + n_h), conv1d (D_i + 2·G·N)·(k + 1),
    dt_bias, A_log and D (n_h each), the gated norm's weight D_i (none without ``mamba_norm``: Falcon-H1's
    mamba_rms_norm false), out_proj D_i·H; no linear biases (Nemotron-H: mamba_proj_bias false, use_conv_bias true)."""
    h, inner, heads = m.hidden_size, m.mamba_inner, m.mamba_heads
    in_proj = h * (inner + m.mamba_conv_dim + heads)
    return in_proj + m.mamba_conv_dim * (m.mamba_conv + 1) + 3 * heads + inner * m.mamba_norm + inner * h


def deltanet_count(m: Any) -> int:
    """One Gated DeltaNet mixer (HF Qwen3NextGatedDeltaNet; Qwen 3.5's in_proj_qkv, _z, _b, _a hold the same):
    in_proj H·(2·n_k·d_k + 2·n_v·d_v) for q, k, v, z and H·2·n_v for β and a, the depthwise conv1d over q, k, v
    (2·n_k·d_k + n_v·d_v)·k without bias, dt_bias and A_log (n_v each), the per-head gated RMSNorm's d_v, out_proj
    n_v·d_v·H; no linear biases."""
    key, value = m.gdn_dims
    in_proj = m.hidden_size * (2 * key + 2 * value + 2 * m.gdn_value_heads)
    conv = (2 * key + value) * m.gdn_conv
    return in_proj + conv + 2 * m.gdn_value_heads + m.gdn_value_dim + value * m.hidden_size


def mamba1_count(m: Any) -> int:
    """One Mamba-1 mixer (HF MambaMixer, use_bias false): in_proj H·2·D_i, conv1d D_i·(k + 1), x_proj D_i·(r + 2N),
    dt_proj r·D_i + D_i, A_log D_i·N, D D_i, out_proj D_i·H; Jamba's RMSNorms over Δ, B and C (``ssm_norms``):
    r + 2N (HF JambaMambaMixer dt_layernorm, b_layernorm, c_layernorm)."""
    d, n, r = m.ssm_inner, m.mamba_state, m.ssm_dt_rank
    norms = r + 2 * n if m.ssm_norms else 0
    return 3 * m.hidden_size * d + d * (m.mamba_conv + 1) + d * (r + 2 * n) + r * d + 2 * d + d * n + norms


def kda_count(m: Any) -> int:
    """One Kimi Delta Attention mixer (HF KimiLinearDeltaAttention; Bailing-hybrid's BailingHybridDeltaAttention): q,
    k, v 3·H·n·d, the depthwise conv1d over them 3·n·d·k without bias, the forget gate (f_a H·r + f_b r·n·d, or f_proj
    H·n·d with r = 0) with dt_bias n·d and A_log n, b_proj (β) H·n, the output gate (g_a + g_b, or g_proj) as the
    forget gate's, the per-head gated RMSNorm d, o_proj n·d·H; no linear biases (n, d: gdn_value_heads, _dim)."""
    n, d, r, h = m.gdn_value_heads, m.gdn_value_dim, m.kda_gate_rank, m.hidden_size
    gate = r * (h + n * d) if r else h * n * d
    return 3 * h * n * d + 3 * n * d * m.gdn_conv + 2 * gate + n * d + n + h * n + d + n * d * h


def lightning_count(m: Any) -> int:
    """One MiniMax lightning-attention mixer (HF MiniMaxLightningAttention): qkv_proj H·3·A·d, output_gate H·A·d,
    out_proj A·d·H, the RMSNorm over A·d; no biases (its decays are buffers)."""
    width = m.num_heads * m.head_dim
    return 5 * m.hidden_size * width + width


def indexer_count(m: Any) -> int:
    """DeepSeek Sparse Attention's lightning indexer (HF DeepseekV32Indexer): wq_b r_q·n_i·d_i, wk H·d_i, weights_proj
    H·n_i and k_norm, a LayerNorm of d_i with its bias; 0 without DSA."""
    n, d = m.index_heads, m.index_head_dim
    return m.q_lora_rank * n * d + m.hidden_size * (d + n) + 2 * d if m.index_topk else 0


_PLAIN = dict(window_head_dim=0, window_kv_heads=0, window_sinks=False)


@lru_cache(maxsize=64)
def window_attention_spec(m: Any) -> Any:
    """The spec a hybrid's "W" blocks attend as: every attention block windowed (the "W" letters read as "*",
    window_layers 0), with the window's head width, KV heads and sinks, no DSA indexer (dots3's windowed layers have
    none)."""
    return replace(m, layer_pattern=m.layer_pattern.replace("W", "*"), window_layers=0,
                   head_dim=m.window_head_dim or m.head_dim, num_kv_heads=m.window_kv_heads or m.num_kv_heads,
                   attention_sinks=m.window_sinks, index_topk=0, index_heads=0, index_head_dim=0, **_PLAIN)


@lru_cache(maxsize=64)
def full_attention_spec(m: Any) -> Any:
    """The spec a hybrid's "*" blocks attend as when "W" blocks window beside them: no sliding window."""
    if "W" not in m.layer_pattern:
        return m
    return replace(m, layer_pattern=m.layer_pattern.replace("W", "*"), sliding_window=0, window_layers=0, **_PLAIN)


def attention_spec(m: Any, kind: str) -> Any:
    """The spec a block of ``kind`` attends as: a "W" block's window spec, a "*" block's full one, else ``m``."""
    if kind == "window":
        return window_attention_spec(m)
    return full_attention_spec(m) if kind == "attention" else m


def rglru_count(m: Any) -> int:
    """One RG-LRU recurrent block (Griffin; HF RecurrentGemmaRecurrentBlock): linear_x and linear_y H → W and
    linear_out W → H with biases, the depthwise conv_1d W·(k + 1), and the RG-LRU: recurrent_param W, the input and
    recurrence gates block-diagonal, W²/n + W each (n = lru_heads blocks, with biases)."""
    h, w, n = m.hidden_size, m.lru_width, m.lru_heads
    return 3 * h * w + 2 * w + h + w * (m.lru_conv + 1) + w + 2 * (w * w // n + w) if n else 0


def shortconv_count(m: Any) -> int:
    """One LFM2 short-convolution mixer (HF Lfm2ShortConv, conv_bias false): in_proj H → 3H (B, C and x), the
    depthwise conv over H channels of kernel L (``short_conv``: conv_L_cache) without bias H·L, out_proj H → H."""
    h = m.hidden_size
    return 3 * h * h + h * m.short_conv + h * h
