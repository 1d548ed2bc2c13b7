"""Parameters of one recurrent (linear-time) mixer of a hybrid ModelSpec (``layer_pattern``), each equal to the
module transformers builds (model.py's ``block_params`` adds the block's pre-norm). Symbols: model.py's glossary;
each formula names the module it counts.
"""

from __future__ import annotations

from typing import Any


def mamba2_count(m: Any) -> int:
    """One Mamba-2 mixer (model.py's docstring): in_proj H·(2·D_i + 2·G·N + n_h), conv1d (D_i + 2·G·N)·(k + 1),
    dt_bias, A_log and D (n_h each), the gated norm's weight D_i, out_proj D_i·H; no linear biases (Nemotron-H:
    mamba_proj_bias false, use_conv_bias true)."""
    h, inner, heads = m.hidden_size, m.mamba_inner, m.mamba_heads
    in_proj = h * (inner + m.mamba_conv_dim + heads)
    return in_proj + m.mamba_conv_dim * (m.mamba_conv + 1) + 3 * heads + inner + inner * h


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
    dt_proj r·D_i + D_i, A_log D_i·N, D D_i, out_proj D_i·H."""
    d, n, r = m.ssm_inner, m.mamba_state, m.ssm_dt_rank
    return 3 * m.hidden_size * d + d * (m.mamba_conv + 1) + d * (r + 2 * n) + r * d + 2 * d + d * n


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
