"""Mamba-1 blocks ("S" in layer_pattern; HF mamba / falcon_mamba): the mixer's weights equal transformers'
MambaMixer's, the selective scan counts 9·D_i·N + 2·D_i FLOPs a token, and a plan that splits the blocks over
tensor-parallel ranks is refused (their x_proj reads every channel)."""

from __future__ import annotations

import pytest

from meshplan.cost.flops import ssd_flops_per_token
from meshplan.cost.mamba1 import mamba1_block
from meshplan.cost.records import dims
from meshplan.specs.check import check
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

# H = 32, D_i = 64, N = 16, r = 2, k = 4; two Mamba-1 blocks
M1 = ModelSpec(name="m1", num_layers=2, hidden_size=32, num_heads=1, ffn_hidden_size=32, vocab_size=128,
               norm="rmsnorm", layer_pattern="SS", ssm_inner=64, ssm_dt_rank=2, mamba_state=16, mamba_conv=4,
               position_embedding="none", seq_length=16)


def test_mixer_weights_by_hand():
    # in_proj 32·128 = 4,096; conv1d 64·5 = 320; x_proj 64·(2 + 32) = 2,176; dt_proj 2·64 + 64 = 192;
    # A_log 64·16 = 1,024; D 64; out_proj 64·32 = 2,048
    assert M1.mamba1_params() == 4_096 + 320 + 2_176 + 192 + 1_024 + 64 + 2_048 == 9_920


def test_mixer_weights_equal_transformers():
    torch = pytest.importorskip("torch")
    mamba = pytest.importorskip("transformers.models.mamba.modeling_mamba")
    from transformers import MambaConfig
    cfg = MambaConfig(hidden_size=32, intermediate_size=64, state_size=16, time_step_rank=2, conv_kernel=4)
    with torch.device("meta"):
        module = mamba.MambaMixer(cfg, layer_idx=0)
    assert sum(p.numel() for p in module.parameters()) == M1.mamba1_params()


def test_scan_flops_and_tp():
    plan = Plan(micro_batch=2)
    scan = [o for o in mamba1_block(M1, plan, dims(M1, plan, Stack())) if o.name == "mamba1/scan"]
    assert scan[0].flops == (9 * 16 + 2) * 64 * 32  # 2 sequences of 16 tokens
    assert ssd_flops_per_token(M1) == 2 * (9 * 16 + 2) * 64  # two blocks
    assert any("Mamba-1" in r for r in check(M1, None, Plan(tp=2, dp=1), Stack()))


def test_jamba_norms_over_dt_b_c():
    # Jamba's RMSNorms over Δ (r = 2) and B, C (N = 16 each): 2 + 32 = 34 weights more than MambaMixer's 9,920
    from dataclasses import replace
    jamba = replace(M1, ssm_norms=True)
    assert jamba.mamba1_params() == 9_920 + 34
    plan = Plan(micro_batch=2)
    norms = [o for o in mamba1_block(jamba, plan, dims(jamba, plan, Stack())) if o.name == "mamba1/dt_bc_norm"]
    assert norms[0].flops == 5.0 * 32 * 34  # 32 tokens, r + 2N = 34 channels, 5 FLOPs each
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.jamba.modeling_jamba")
    from transformers import JambaConfig
    cfg = JambaConfig(hidden_size=32, mamba_expand=2, mamba_d_state=16, mamba_dt_rank=2, mamba_d_conv=4)
    with torch.device("meta"):
        module = modeling.JambaMambaMixer(cfg, layer_idx=0)
    assert sum(p.numel() for p in module.parameters()) == jamba.mamba1_params()
