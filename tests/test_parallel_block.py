"""Attention and Mamba-2 side by side in one block ("P"; Falcon-H1): the block's weights are the attention's, the
Mamba-2 mixer's (without the gated norm's weight when mamba_norm is off) and one pre-norm; its ops are both mixers'
with one norm, one tensor-parallel entry and exit and one residual add."""

from __future__ import annotations

import pytest

from meshplan.cost.flops import ssd_flops_per_token
from meshplan.cost.layers import hybrid_block
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

# H = 64, A = 4 heads of 16, K = 2; Mamba-2: n_h = 8 heads of P = 16 (D_i = 128), G = 1, N = 16, k = 4
P = ModelSpec(name="p", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=128,
              vocab_size=256, norm="rmsnorm", mlp="swiglu", seq_length=64, layer_pattern="P-", mamba_heads=8,
              mamba_head_dim=16, mamba_state=16, mamba_groups=1, mamba_norm=False)


def test_params_by_hand():
    # attention: q 64·64 + k, v 2·64·32 + o 64·64 = 12,288
    # Mamba-2: in_proj 64·(2·128 + 2·16 + 8) = 18,944; conv1d (128 + 32)·5 = 800; dt_bias, A_log, D 3·8 = 24;
    # out_proj 128·64 = 8,192; no gated-norm weight (mamba_norm off): 27,960; the pre-norm 64
    assert P.block_params("parallel") == 12_288 + 27_960 + 64
    assert P.mamba_params() == 27_960 and P.num_attention_layers == 1
    assert ssd_flops_per_token(P) > 0


def test_ops_share_norm_and_residual():
    ops = hybrid_block(P, Plan(micro_batch=1, tp=2, dp=1, sequence_parallel=True), Stack(), "parallel")
    names = [o.name for o in ops]
    assert names.count("attn/norm") == 2 and "mamba/norm" not in names  # the forward and backward of one norm
    assert "mamba/residual" not in names and "mamba/tp_out" not in names and "attn/tp_out" in names
    assert {"attn/core", "mamba/in_proj", "mamba/ssd_scan", "mamba/out_proj"} <= set(names)


def test_falcon_h1_mixer_equals_transformers():
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.falcon_h1.modeling_falcon_h1")
    from transformers import FalconH1Config
    cfg = FalconH1Config(hidden_size=64, mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
                         mamba_n_groups=1, mamba_d_conv=4, mamba_rms_norm=False, num_attention_heads=4,
                         num_key_value_heads=2)
    with torch.device("meta"):
        mixer = modeling.FalconH1Mixer(cfg, layer_idx=0)
    assert sum(p.numel() for p in mixer.parameters()) == P.mamba_params()
