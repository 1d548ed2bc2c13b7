"""A Mamba-1 block's per-op costs, one micro-batch, one GPU (one tensor-parallel rank: specs/check.py refuses
tp > 1, its x_proj reading every channel): in_proj, the causal conv1d, x_proj and dt_proj, the selective scan,
out_proj (symbols: records.py; the layer: model.py ``mamba1_params``).

Sources: Gu and Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces", §3.3 (the
hardware-aware selective scan: one fused kernel reads Δ, A, B, C and x from HBM, discretizes and scans the D_i·N
state in SRAM, writes y; the backward recomputes the states) and Fig. 3; mamba_ssm ``selective_scan_fn`` with
z (the SiLU gate fused) and D, as transformers' MambaMixer.cuda_kernels_forward calls it (mamba_inner_fn). FLOPs
of the scan: 9·D_i·N per token (discretize exp(Δ·A) and Δ·B·x, the recurrence's multiply-add, C·h: the count of
the flop-count helper of mamba_ssm's selective scan benchmark, ``flops = 9 * B * L * D * N``) plus D_i each for
the skip D·x and the gate z.
"""

from __future__ import annotations

from meshplan.cost.blocks import elementwise, gemm, norm, residual
from meshplan.cost.records import ACT_BYTES, FP32, Dims, OpCost
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan


def selective_scan(model: ModelSpec, d: Dims) -> list[OpCost]:
    """The fused selective scan: forward reads x, Δ, z (16 bits, D_i each per token), B and C (fp32 in mamba_ssm,
    N each) and writes y (D_i); the backward reads them, the output gradient and writes dx, dΔ, dz, dB, dC,
    recomputing the states (no HBM state: the chunk's last state is kept per 2,048 tokens, neglected)."""
    d_i, n, tokens = model.ssm_inner, model.mamba_state, d.tokens
    flops = (9.0 * n + 2.0) * d_i * tokens
    fwd_bytes = tokens * (4 * d_i * ACT_BYTES + 2 * n * FP32)
    return [OpCost("mamba1/scan", "fwd", "memory", flops, fwd_bytes),
            OpCost("mamba1/scan", "bwd_x", "memory", 2 * flops, 2 * fwd_bytes)]


def mamba1_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """A Mamba-1 block (HF MambaBlock: norm, MambaMixer, residual): in_proj H → 2·D_i (x and z), the depthwise
    conv1d + SiLU over x (2k + 4 FLOPs a channel, as mamba.py's), x_proj D_i → r + 2N (Δ's low rank, B, C), dt_proj
    r → D_i with its bias and softplus, the scan (``selective_scan``), out_proj D_i → H. The forward keeps the
    in_proj output (mamba_inner_fn's saved xz), the conv output, Δ, B and C."""
    h, tokens, a = model.hidden_size, d.tokens, ACT_BYTES
    d_i, n, r = model.ssm_inner, model.mamba_state, model.ssm_dt_rank
    ops = norm("mamba1/norm", model, d)
    ops += gemm("mamba1/in_proj", tokens, h, 2 * d_i, d, saved=tokens * h * a)
    ops += elementwise("mamba1/conv1d", tokens * d_i, tokens * d_i, 2.0 * model.mamba_conv + 4.0,
                       saved=tokens * 2 * d_i * a)
    ops += gemm("mamba1/x_proj", tokens, d_i, r + 2 * n, d, saved=tokens * d_i * a)
    if model.ssm_norms:  # Jamba's RMSNorms over Δ, B and C before dt_proj and the scan (5 FLOPs an element)
        ops += elementwise("mamba1/dt_bc_norm", tokens * (r + 2 * n), tokens * (r + 2 * n), 5.0,
                           saved=tokens * (r + 2 * n) * a)
    ops += gemm("mamba1/dt_proj", tokens, r, d_i, d, saved=tokens * (r + 2 * n) * a)
    ops += elementwise("mamba1/dt_softplus", tokens * d_i, tokens * d_i, 5.0, saved=tokens * d_i * a)
    ops += selective_scan(model, d)
    ops += gemm("mamba1/out_proj", tokens, d_i, h, d)
    ops += residual("mamba1/residual", model, d)
    return ops
