"""A Gated DeltaNet block's per-op costs, one micro-batch, one GPU: in_proj, the short causal conv1d, the q/k L2
norms and the gates, the chunked gated delta-rule scan, the gated norm, out_proj (symbols: records.py; the layer:
mixer_params.deltanet_count).

Sources: Yang, Kautz and Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule" (ICLR 2025),
§2-3: the state S_t = S_{t-1}·α_t·(I − β_t·k_t·k_tᵀ) + β_t·v_t·k_tᵀ per value head (d_v × d_k), computed chunk by
chunk with the WY representation of Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over
Sequence Length" (NeurIPS 2024), §3; the kernels are flash-linear-attention's (fla
ops/gated_delta_rule/chunk.py ``chunk_gated_delta_rule_fwd``, which Hugging Face's Qwen3NextGatedDeltaNet calls
as ``chunk_gated_delta_rule``): chunk_scaled_dot_kkt_fwd, solve_tril, recompute_w_u_fwd,
chunk_gated_delta_rule_fwd_h, chunk_fwd_o; its backward first recomputes w, u and the chunk states
(``chunk_gated_delta_rule_bwd``) before its gradient kernels.
"""

from __future__ import annotations

from meshplan.cost.blocks import elementwise, gemm, norm, residual, tp_enter, tp_exit
from meshplan.cost.mamba import activation_product
from meshplan.cost.records import ACT_BYTES, FP32, Dims, OpCost
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan


def gdn_scan_ops(model: ModelSpec, d: Dims) -> list[OpCost]:
    """The chunked gated delta rule over chunks of C tokens, per value head (n_v/t on this rank; the queries and
    keys of n_k heads are shared by n_v/n_k value heads each, grouped-value attention):
    - K·Kᵀ (scaled by β and the decays), (C×d_k)·(d_k×C) per chunk: reads k, writes the fp32 C×C block;
    - its unit lower-triangular inverse (the UT transform), C³/3 multiply-adds, counted as (C×C)·(C×C/3);
    - w = A·(β·k·decay) and u = A·(β·v), (C×C)·(C×(d_k + d_v)): reads A, k and v, writes w and u;
    - the chunk recurrence, per chunk v_new = u − w·S and S ← decay·S + kᵀ·v_new, two (d_k×C)·(C×d_v)-sized
      products: reads k, w, u, writes v_new and the 16-bit chunk states (d_k·d_v each);
    - the output, q·S (C×d_k)·(d_k×d_v) and (q·kᵀ ∘ causal decay)·v_new ((C×d_k)·(d_k×C) and (C×C)·(C×d_v)), the
      masked half counted whole as the kernel computes it: reads q, k, v_new and the states, writes o.
    Per token and value head, forward: 6·d_k·d_v + C·(6·d_k + 4·d_v) + 2·C²/3 FLOPs (the paper's O(C·d + d²)
    per token). Each product's two backward records move and compute as much as its forward (``activation_product``);
    the backward's recomputation of w, u and the states is ``gdn/rerun``. Priced at the chunked-scan kernels'
    streaming rate (``variant="ssd"``: fla's kernels are Triton chunked scans like mamba_ssm's SSD)."""
    t, a = d.tp, ACT_BYTES
    heads = model.gdn_value_heads / t
    c, dk, dv = model.gdn_chunk, model.gdn_key_dim, model.gdn_value_dim
    chunks, tokens = d.tokens / c, d.tokens
    qk, v = tokens * model.gdn_key_heads / t * dk * a, tokens * heads * dv * a  # one of q, k; v (or v_new, o)
    w = tokens * heads * dk * a
    block = chunks * heads * c * c * FP32
    states = chunks * heads * dk * dv * a
    batch = chunks * heads
    ops = activation_product("gdn/kkt", c, dk, c, batch, qk + block)
    ops += activation_product("gdn/solve_tril", c, c, c / 3, batch, block + block / 2)
    ops += activation_product("gdn/wu", c, c, dk + dv, batch, block / 2 + qk + v + w + v)
    ops += activation_product("gdn/states", dk, c, dv, 2 * batch, qk + w + v + v + states)
    ops += activation_product("gdn/qk", c, dk, c, batch, 2 * qk)
    ops += activation_product("gdn/out", c, dk + c, dv, batch, qk + v + states + v)
    rerun = [op for op in ops if op.phase == "fwd" and op.name in ("gdn/kkt", "gdn/solve_tril", "gdn/wu",
                                                                    "gdn/states")]
    ops.append(OpCost("gdn/rerun", "bwd_x", "gemm", sum(op.flops for op in rerun), sum(op.nbytes for op in rerun),
                      variant="ssd"))
    return ops


def deltanet_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """A Gated DeltaNet block (HF Qwen3NextGatedDeltaNet.forward) split t ways by heads as attention is: pre-norm, the
    column-parallel in_proj (q, k, v, z, β, a), the depthwise causal conv1d + SiLU over q, k, v (2k + 4 FLOPs a
    channel: the k taps, SiLU), the L2 norms of q and k (4 FLOPs an element), the gates β = sigmoid(b) and
    g = −exp(A_log)·softplus(a + dt_bias) (per head, 10 FLOPs), the scan (``gdn_scan_ops``), the per-head gated
    RMSNorm norm(o)·w·silu(z) (8 FLOPs an element, as Mamba's), the row-parallel out_proj, the residual. The
    forward keeps the in_proj output (the conv's and gates' input), the normed q and k, and the scan's output."""
    h, t, tokens, a = model.hidden_size, d.tp, d.tokens, ACT_BYTES
    key, value = model.gdn_dims
    heads = model.gdn_value_heads / t
    conv = (2 * key + value) / t
    proj = conv + value / t + 2 * heads  # q, k, v; z; β, a
    ops = norm("gdn/norm", model, d)
    ops += tp_enter("gdn/tp_in", model, plan, d)
    ops += gemm("gdn/in_proj", tokens, h, proj, d, saved=d.tokens_sp * h * a)
    ops += elementwise("gdn/conv1d", tokens * conv, tokens * conv, 2.0 * model.gdn_conv + 4.0,
                       saved=tokens * proj * a)
    ops += elementwise("gdn/qk_l2norm", 2 * tokens * key / t, 2 * tokens * key / t, 4.0,
                       saved=2 * tokens * key / t * a)
    ops += elementwise("gdn/gates", 2 * tokens * heads, 2 * tokens * heads, 10.0)
    ops += gdn_scan_ops(model, d)
    ops += elementwise("gdn/gated_norm", 2 * tokens * value / t, tokens * value / t, 8.0,
                       saved=tokens * value / t * a)
    ops += gemm("gdn/out_proj", tokens, value / t, h, d)
    ops += tp_exit("gdn/tp_out", model, plan, d)
    ops += residual("gdn/residual", model, d)
    return ops
