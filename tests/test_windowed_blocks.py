"""Layers of two attention shapes (Gemma 4 unified: windowed layers of head width 256 beside full ones of 512): a
hybrid's "W" blocks attend in a sliding window with their own head width, KV heads and sinks, its "*" blocks attend
the whole sequence; with block_norms = 2 each block has a post-norm too. Parameters, FLOPs and ops follow each
block's own shape."""

from __future__ import annotations

import pytest

from meshplan.cost.flops import attention_flops_per_token
from meshplan.cost.layers import hybrid_block
from meshplan.errors import SpecError
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

# H = 64, A = 4 heads; "*": d = 32, K = 2; "W": d = 16, K = 4, sinks, a window of 16 keys; s = 64
BASE = dict(name="w", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=32, ffn_hidden_size=128,
            vocab_size=256, norm="rmsnorm", mlp="swiglu", seq_length=64, layer_pattern="W-*-", sliding_window=16)
WIN = ModelSpec(**BASE, window_head_dim=16, window_kv_heads=4, window_sinks=True)
POST = ModelSpec(**BASE, window_head_dim=16, window_kv_heads=4, window_sinks=True, block_norms=2)


def test_params_by_block():
    # "*": q 64·128 + k, v 2·64·64 + o 128·64 = 8,192 + 8,192 + 8,192 = 24,576, + the pre-norm 64
    assert WIN.block_params("attention") == 24_576 + 64
    # "W": q 64·64 + k, v 2·64·64 + o 64·64 = 4,096 + 8,192 + 4,096 = 16,384, + 4 sinks + the pre-norm 64
    assert WIN.block_params("window") == 16_384 + 4 + 64
    # block_norms = 2: each block's post-norm, 64 more
    assert POST.block_params("window") - WIN.block_params("window") == 64 == POST.block_params("mlp") - \
        WIN.block_params("mlp")


def test_attention_flops_by_block():
    # "*": 2·s·A·(d + d) = 2·64·4·64 = 32,768; "W": 2·w·A·(d + d) = 2·16·4·32 = 4,096
    assert attention_flops_per_token(WIN) == 32_768 + 4_096


def test_ops_by_block():
    plan = Plan(micro_batch=1)
    full = {(o.name, o.phase): o for o in hybrid_block(WIN, plan, Stack(), "attention")}
    win = {(o.name, o.phase): o for o in hybrid_block(WIN, plan, Stack(), "window")}
    # the full block's causal core: 2·T·s·A·(d + d) / 2 = 2·64·64·4·64 / 2
    assert full[("attn/core", "fwd")].flops == 2 * 64 * 64 * 4 * 64 / 2
    # the windowed block's: 2·T·a·A·(d + d), a = w − w(w − 1)/2s = 16 − 240/128 keys on average
    assert win[("attn/core/window", "fwd")].flops == pytest.approx(2 * 64 * (16 - 240 / 128) * 4 * 32)
    assert ("window/post_norm", "fwd") not in win
    assert ("window/post_norm", "fwd") in {(o.name, o.phase) for o in hybrid_block(POST, plan, Stack(), "window")}


def test_rules():
    with pytest.raises(SpecError, match="window_layers = 0"):
        ModelSpec(**(BASE | {"sliding_window": 0}))
    with pytest.raises(SpecError, match="window_head_dim=16 needs W"):
        ModelSpec(**(BASE | {"layer_pattern": "*-*-"}), window_head_dim=16)


def test_values_of_their_own_width():
    """MiMo-V2-Flash: keys and queries of 192, values of 128. Here d = 32, d_v = 16: v_proj 64·(2·16), o_proj
    (4·16)·64, the core's P·V over d_v."""
    mimo = ModelSpec(**BASE, v_head_dim=16)
    # "*": q 64·128 + k 64·64 + v 64·32 + o 64·64 = 8,192 + 4,096 + 2,048 + 4,096 = 18,432, + the pre-norm 64
    assert mimo.block_params("attention") == 18_432 + 64
    # 2·s·A·(d + d_v) = 2·64·4·(32 + 16) for "*"; the "W" block (no window overrides) in its window of 16 keys
    assert attention_flops_per_token(mimo) == 2 * 64 * 4 * 48 + 2 * 16 * 4 * 48
    with pytest.raises(SpecError, match="v_head_dim=16 needs MLA"):
        ModelSpec(**(BASE | {"layer_pattern": "", "sliding_window": 0}), v_head_dim=16)


def test_ring_context_parallelism_refused_with_windowed_blocks():
    # the "*" blocks are full (window_share 0), but the "W" blocks still window: Transformer Engine's ring refuses
    from meshplan.specs.check import check
    assert WIN.window_share == 0.0
    assert any("sliding-window" in r for r in check(WIN, None, Plan(cp=2, dp=1), Stack()))
