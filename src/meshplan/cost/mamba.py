"""A Mamba-2 block's per-op costs, one micro-batch, one GPU: in_proj, causal conv1d, the chunked SSD scan, the
gated norm, out_proj (Dao & Gu 2024; mamba_ssm's kernels as Megatron-Core's MambaMixer calls them; symbols:
records.py)."""

from __future__ import annotations

from meshplan.cost.blocks import elementwise, gemm, norm, residual, tp_enter, tp_exit
from meshplan.cost.records import ACT_BYTES, FP32, Dims, OpCost
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.xp import Num


def activation_product(name: str, m: Num, k: Num, n: Num, batch: Num, nbytes: Num) -> list[OpCost]:
    """``batch`` products (m×k)·(k×n) of two activations (no weight), ``nbytes`` the HBM traffic of the forward
    kernel, each of the two gradient kernels moving as much: mamba_ssm's Triton SSD kernels (16-bit dots outside
    Transformer Engine's fp8 region, priced by their measured streaming rate: ``variant`` "ssd", roofline.py);
    both backward records are ``bwd_x`` (activation gradients, needed whatever is frozen)."""
    flops = 2.0 * m * k * n * batch
    return [OpCost(name, "fwd", "gemm", flops, nbytes, m=m, n=n, k=k, groups=batch, variant="ssd"),
            OpCost(name, "bwd_x", "gemm", flops, nbytes, m=m, n=k, k=n, groups=batch, variant="ssd"),
            OpCost(name, "bwd_x", "gemm", flops, nbytes, m=k, n=n, k=m, groups=batch, variant="ssd")]


def ssd_ops(model: ModelSpec, d: Dims) -> list[OpCost]:
    """The state-space dual (SSD) scan of Mamba-2 as mamba_ssm's chunked kernels run it (Dao & Gu 2024, §6-7;
    mamba_ssm ops/triton/ssd_combined.py; Megatron-Core's MambaMixer calls them through
    ``mamba_split_conv1d_scan_combined``), over chunks of Q tokens, per head (n_h/t on this rank, P channels, state
    N) and per group of heads sharing B and C (G/t):
    - chunk states Bᵀ·X, (N×Q)·(Q×P) per chunk and head: reads B and x;
    - C·Bᵀ, (Q×N)·(N×Q) per chunk and group: reads B and C, writes the fp32 Q×Q block;
    - chunk scan (C·Bᵀ∘L)·X + C·state, (Q×(Q+N))·((Q+N)×P) per chunk and head, the causal mask counted whole (the
      kernel computes its diagonal blocks in full): reads C·Bᵀ, C and x, writes y.
    Between them the chunk states pass through HBM: written in fp32 and read by the state passing, which writes
    them in 16 bits for the scan (4 + 4 + 2 + 2 bytes per state element per chunk); each backward kernel moves
    about as much as its forward kernel, the states twice over. The backward first runs the forward's C·Bᵀ, chunk
    states and state passing again (mamba_ssm ``_mamba_chunk_scan_combined_bwd``: ``_bmm_chunk_fwd``,
    ``_chunk_state_fwd``, ``_state_passing_fwd`` before its gradient kernels), ``mamba/ssd_rerun``. The per-token
    dt / cumsum kernels are neglected. Every record is priced at the kernels' measured streaming rate
    (``variant="ssd"``, efficiency.py ``Efficiency.ssd``)."""
    t, a = d.tp, ACT_BYTES
    heads, groups = model.mamba_heads / t, model.mamba_groups / t
    q, n, p = model.mamba_chunk, model.mamba_state, model.mamba_head_dim
    chunks, tokens = d.tokens / q, d.tokens
    x, bc = tokens * heads * p * a, tokens * groups * n * a  # x (or y); one of B, C
    cb = chunks * groups * q * q * FP32
    ops = activation_product("mamba/ssd_state", n, q, p, chunks * heads, bc + x)
    ops += activation_product("mamba/ssd_cb", q, n, q, chunks * groups, 2 * bc + cb)
    ops += activation_product("mamba/ssd_scan", q, q + n, p, chunks * heads, cb + bc + 2 * x)
    states = chunks * heads * n * p
    ops += [OpCost("mamba/ssd_states", "fwd", "memory", 0.0, 12.0 * states, variant="ssd"),
            OpCost("mamba/ssd_states", "bwd_x", "memory", 0.0, 24.0 * states, variant="ssd")]
    rerun = [op for op in ops if op.phase == "fwd" and op.name != "mamba/ssd_scan"]
    ops.append(OpCost("mamba/ssd_rerun", "bwd_x", "gemm", sum(op.flops for op in rerun),
                      sum(op.nbytes for op in rerun), variant="ssd"))
    return ops


def mamba_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """A Mamba-2 block (module docstring of model.py) as Megatron-Core's MambaMixer runs it: pre-norm, the
    column-parallel in_proj (its heads and groups split t-ways, as attention's heads are), the causal conv1d +
    SiLU over x, B, C, the SSD scan (``ssd_ops``), the gated RMSNorm y·rsqrt(mean y²)·w·silu(z), the row-parallel
    out_proj, the residual. Memory-efficient path (``mamba_split_conv1d_scan_combined``): the forward keeps the
    in_proj output (z, x, B, C, dt) and the scan's output, and the backward recomputes the conv1d from it."""
    h, t, tokens = model.hidden_size, d.tp, d.tokens
    a = ACT_BYTES
    inner, conv = model.mamba_inner / t, model.mamba_conv_dim / t
    proj = inner + conv + model.mamba_heads / t  # z, x·B·C, dt
    flops_conv = 2.0 * model.mamba_conv + 4.0  # the k-tap causal filter, its bias and SiLU, per channel
    ops = norm("mamba/norm", model, d)
    ops += tp_enter("mamba/tp_in", model, plan, d)
    ops += gemm("mamba/in_proj", tokens, h, proj, d, saved=d.tokens_sp * h * a)
    ops += elementwise("mamba/conv1d", tokens * conv, tokens * conv, flops_conv, saved=tokens * proj * a)
    ops.append(OpCost("mamba/conv1d_recompute", "bwd_x", "memory", flops_conv * tokens * conv,
                      2 * a * tokens * conv))
    ops += ssd_ops(model, d)
    ops += elementwise("mamba/gated_norm", 2 * tokens * inner, tokens * inner, 8.0, saved=tokens * inner * a)
    ops += gemm("mamba/out_proj", tokens, inner, h, d)
    ops += tp_exit("mamba/tp_out", model, plan, d)
    ops += residual("mamba/residual", model, d)
    return ops
