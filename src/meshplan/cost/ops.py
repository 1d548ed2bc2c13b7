"""Per-op cost of one micro-batch on one GPU: FLOPs, HBM bytes, saved activations and collectives.

Symbols: b micro-batch, s sequence, t tensor-parallel size, c context-parallel size, H hidden, F FFN,
A heads, K kv-heads, d head dim, V vocabulary, E experts, k top-k, Fe expert FFN, e ep, et etp,
T = b·s/c tokens a GPU processes in the tensor-parallel region, Tsp = T/t with sequence parallelism (else T),
a = 2 bytes per activation element (bf16).

Every record is flat (DESIGN.md): name ``"attn/qkv"``, phase ``fwd`` / ``bwd_x`` (input gradient) /
``bwd_w`` (weight gradient), kind ``gemm`` / ``attention`` / ``memory`` / ``collective``. Totals are sums.

Sources:
- GEMM FLOPs 2·m·k·n per pass; backward = input-gradient + weight-gradient GEMMs = 2 × forward
  (Narayanan et al. 2021, §5.1 / eq. 3).
- Saved activations per layer: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models"), §4 and Table 2: s·b·h·(34 + 5·a·s/h) bytes without parallelism; 10 + 24/t with tensor
  parallelism; 34/t with sequence parallelism; 5·a·s/h dropped by selective recompute; 2 with full recompute.
  Each op below stores what that paper lists for it, generalised to GQA, SwiGLU and no-dropout models.
- Megatron tensor parallelism: all-reduce after the row-parallel GEMM forward and before the column-parallel
  GEMM backward (Shoeybi et al. 2019, Fig. 3); with sequence parallelism all-gather / reduce-scatter instead,
  plus an all-gather of the saved input in the backward pass (Korthikanti et al. 2022, §4.2.2).
- FlashAttention: causal blocks above the diagonal are skipped (half the FLOPs); the backward pass recomputes
  the scores: 5 GEMMs vs 2 forward = 2.5 × (Dao et al. 2022, Alg. 2 and 4).
- Context parallelism: ring exchange of K and V, c-1 steps forward, K/V and dK/dV backward
  (Liu et al. 2023 "Ring Attention"; Megatron-Core context parallelism), overlapped with attention.
- MoE: token dispatch and combine all-to-all over the ep group, forward and backward (Lepikhin et al. 2020,
  GShard; Megatron-Core MoE), routing assumed balanced (the NVIDIA benchmark tables force-balance it).
- Mixed-precision Adam: fp32 master weights and two moments, 12 bytes per parameter (Rajbhandari et al.
  2020, ZeRO §3).
- Eager PyTorch (``stack.fusion = "eager"``) and PyTorch's cross-entropy (``stack.cross_entropy = "pytorch"``):
  the extra kernels of the unfused aten op sequences, counted kernel by kernel in ``EAGER`` below.
- flash-attn's varlen interface (``stack.varlen_attention``): the gathers and scatters that pack the rows around
  the kernel (``varlen_padding``); a fused QKV projection split with torch.split (``stack.qkv_concat``): the
  concatenation of the q, k, v gradients in the backward pass (``qkv_concat``).
- PyTorch FSDP (``stack.fsdp``): the HBM traffic that prepares each micro-batch's gradients for their reduction
  (flat-gradient cat, reduce-dtype cast, pre-divide), read from torch/distributed/fsdp (``fsdp_grad_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from meshplan.comm import Collective
from meshplan.cost.params import kind_params
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num

ACT_BYTES = 2  # bf16 activations
MASK_BYTES = 1  # dropout masks are stored as bytes
FP32 = 4
# Bytes per quantized element: fp8; MXFP8 adds one E8M0 scale per 32-element block (OCP Microscaling Formats
# (MX) v1.0 specification, §5: block size 32, 8-bit shared scale); NVFP4, 4 bits and one E4M3 scale per
# 16-element block (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", 2025).
LOW_PRECISION_BYTES = {"fp8": 1.0, "mxfp8": 1.0 + 1.0 / 32, "fp4": 0.5 + 1.0 / 16}


@dataclass(frozen=True, slots=True)
class OpCost:
    """One op in one pass on one GPU for one micro-batch."""

    name: str
    phase: str  # fwd | bwd_x | bwd_w | step
    kind: str  # gemm | attention | memory | collective
    flops: Num = 0.0
    nbytes: Num = 0.0  # HBM traffic, or the message size of a collective
    saved: Num = 0.0  # activation bytes kept from the forward pass for the backward pass
    m: Num = 0.0  # GEMM shape (m×k)·(k×n) of this pass, for shape-dependent efficiency
    n: Num = 0.0
    k: Num = 0.0
    collective: Collective | None = None
    overlap: str = ""  # "" exposed; "tp", "cp", "summa": may hide behind compute (see estimate.py)
    repeat: Num = 1.0  # a collective sent this many times (SUMMA panels), each of ``nbytes``
    # attention kernel: "flash_causal" / "flash" (one fused kernel: time = max(compute, memory)) or "unfused"
    # (batched score GEMMs and a separate softmax kernel: times add). m, n, k: queries·heads, keys, head dim.
    # GEMMs: "bf16" for one kept in 16 bits under a low-precision plan. Casts: "block_scaled" for the
    # quantization to a block-scaled format (MXFP8, NVFP4), whose kernel is slower than its bytes (efficiency.py)
    variant: str = ""
    # a grouped GEMM (MoE experts: one GEMM per local expert, run as one grouped kernel): m, n, k are the shape
    # of one group, ``groups`` of them; FLOPs and bytes are the totals. Flash attention: the kernel calls the op
    # is split into (ring context parallelism: one per step, each over n / groups keys)
    groups: Num = 1.0
    kernel: str = ""  # flash attention: the kernel family of the stack (stack.attention_kernel), efficiency.py
    window: Num = 0.0  # flash attention in a sliding window of this many keys (ModelSpec.sliding_window); 0: none
    # kernels the host launches one by one with the GPU waiting on it (per-expert GEMMs right after the
    # tokens-per-expert sync): the op takes at least launches × Efficiency.host_launch (roofline.op_time)
    launches: Num = 0.0


@dataclass(frozen=True, slots=True)
class Dims:
    """Token counts and sizes one GPU sees for one micro-batch under a plan."""

    tokens: Num  # T = b·s/c
    tokens_sp: Num  # Tsp: T/t with sequence parallelism, else T
    tp: Num
    seq: int
    micro_batch: Num
    grad_bytes: int
    dropout: bool
    stack: Stack  # how the software stack runs the ops (stack.py)
    eager: bool = False  # stack.fusion == "eager"


def token_rows(model: ModelSpec, plan: Plan) -> tuple[Num, Num]:
    """T = b·s/(c·tp2) rows per GPU (tp2 = 1 outside the summa layout); Tsp = T/t where the residual stream
    is sharded t-ways (sequence parallelism, or the summa layout's feature split)."""
    tokens = plan.micro_batch * model.seq_length / (plan.cp * plan.tp2)
    sharded = plan.sequence_parallel or plan.tensor_layout == "summa"
    return tokens, tokens / plan.tp if sharded else tokens


def dims(model: ModelSpec, plan: Plan, stack: Stack) -> Dims:
    """The rows (``token_rows``) and sizes the ops of one micro-batch on one GPU see, and the stack that runs them."""
    tokens, tokens_sp = token_rows(model, plan)
    return Dims(tokens=tokens, tokens_sp=tokens_sp, tp=plan.tp, seq=model.seq_length,
                micro_batch=plan.micro_batch, grad_bytes=plan.grad_bytes, dropout=model.dropout, stack=stack,
                eager=stack.fusion == "eager")


# ---- building blocks -------------------------------------------------------------------------------------
def gemm(name: str, m: Num, k: Num, n: Num, d: Dims, saved: Num | None = None, groups: Num = 1.0
         ) -> list[OpCost]:
    """(m×k)·(k×n) = m×n. Forward, input gradient (m×n)·(n×k), weight gradient (k×m)·(m×n).

    HBM bytes: read both operands, write the result; the weight gradient is accumulated (read + write) in
    the gradient buffer. ``saved`` defaults to the input (m×k), stored for the weight gradient.
    ``groups`` > 1: a grouped GEMM (Megatron-Core GroupedMLP / TE GroupedLinear, one GEMM per local expert):
    the m rows split evenly over ``groups`` weights of k×n each, so each group is an (m/g×k)·(k×n) GEMM and
    its weight gradient reduces over only m/g rows; weights and their gradients are g × k×n.
    """
    a = ACT_BYTES
    flops = 2.0 * m * k * n
    stored = m * k * a if saved is None else saved
    mg, weights = m / groups, k * n * groups
    return [
        OpCost(name, "fwd", "gemm", flops, a * (m * k + weights + m * n), stored, m=mg, n=n, k=k, groups=groups),
        OpCost(name, "bwd_x", "gemm", flops, a * (m * n + weights + m * k), m=mg, n=k, k=n, groups=groups),
        OpCost(name, "bwd_w", "gemm", flops, a * (m * k + m * n) + 2 * d.grad_bytes * weights, m=k, n=n, k=mg,
               groups=groups),
    ]


def elementwise(name: str, elems_in: Num, elems_out: Num, flops_per_elem: float, saved: Num = 0.0
                ) -> list[OpCost]:
    """A memory-bound op: the forward reads its input and writes its output; the backward reads the
    output gradient and the saved input and writes the input gradient."""
    a = ACT_BYTES
    return [
        OpCost(name, "fwd", "memory", flops_per_elem * elems_in, a * (elems_in + elems_out), saved),
        OpCost(name, "bwd_x", "memory", 2 * flops_per_elem * elems_in, a * (2 * elems_in + elems_out)),
    ]


def collective(name: str, phase: str, kind: str, nbytes: Num, axis: str, group: Num, overlap: str = "",
               repeat: Num = 1.0) -> OpCost:
    return OpCost(name, phase, "collective", nbytes=nbytes, collective=Collective(kind, nbytes, axis, group),
                  overlap=overlap, repeat=repeat)


def norm(name: str, model: ModelSpec, d: Dims) -> list[OpCost]:
    """Pre-norm over the residual stream; stores its input (Korthikanti: 2sbh per LayerNorm)."""
    elems = d.tokens_sp * model.hidden_size
    return elementwise(name, elems, elems, 5.0, saved=elems * ACT_BYTES)


def gathered_bytes(plan: Plan, quantized: bool = True) -> float:
    """Bytes per element of a sequence-parallel all-gather that feeds a GEMM: a low-precision GEMM's operand is
    quantized before it is gathered (Transformer Engine ``_Linear``: with fp8 and sequence parallelism the input is
    cast, then ``gather_along_first_dim``-ed, in the forward pass and again for the weight gradient, and the
    row-parallel output gradient likewise; torchao's Float8ColwiseParallel gathers float8 too). The reductions
    carry 16-bit partial sums, and LoRA's 16-bit adapters need the 16-bit input."""
    if not quantized or plan.finetune == "lora":
        return ACT_BYTES
    return LOW_PRECISION_BYTES.get(plan.precision, ACT_BYTES)


def tp_enter(name: str, model: ModelSpec, plan: Plan, d: Dims, quantized: bool = True, width: Num = 0
             ) -> list[OpCost]:
    """Entering a column-parallel GEMM ("f" in Shoeybi et al. 2019): identity forward, all-reduce backward;
    with sequence parallelism all-gather forward, reduce-scatter backward, plus re-gathering the saved input
    for the weight gradient (the gathers at the GEMM's input precision, ``gathered_bytes``). ``width``: the
    input's width when it is not H."""
    width = width or model.hidden_size
    full = d.tokens * width * ACT_BYTES
    if plan.sequence_parallel:
        gathered = d.tokens * width * gathered_bytes(plan, quantized)
        return [collective(name, "fwd", "all_gather", gathered, "tp", plan.tp, "tp"),
                collective(name, "bwd_x", "reduce_scatter", full, "tp", plan.tp, "tp"),
                collective(name + "/regather", "bwd_w", "all_gather", gathered, "tp", plan.tp, "tp")]
    return [collective(name, "bwd_x", "all_reduce", full, "tp", plan.tp, "tp")]


def tp_exit(name: str, model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """Leaving a row-parallel GEMM ("g"): all-reduce forward (reduce-scatter with sequence parallelism),
    identity backward (all-gather with sequence parallelism, of the output gradient the GEMM's backward reads, at
    its input precision)."""
    full = d.tokens * model.hidden_size * ACT_BYTES
    if plan.sequence_parallel:
        return [collective(name, "fwd", "reduce_scatter", full, "tp", plan.tp, "tp"),
                collective(name, "bwd_x", "all_gather", d.tokens * model.hidden_size * gathered_bytes(plan), "tp",
                           plan.tp, "tp")]
    return [collective(name, "fwd", "all_reduce", full, "tp", plan.tp, "tp")]


def residual(name: str, model: ModelSpec, d: Dims) -> list[OpCost]:
    """Dropout (if the model has it) and the residual add; stores the dropout mask (Korthikanti: sbh)."""
    elems = d.tokens_sp * model.hidden_size
    mask = elems * MASK_BYTES if d.dropout else 0.0
    return elementwise(name, 2 * elems, elems, 2.0, saved=mask)


# ---- attention ----------------------------------------------------------------------------------------------
def qkv_ops(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """Q, K, V projections. Standard: one column-parallel GEMM H → (A·d + 2·K·d)/t.
    MLA (DeepSeek-V3 §2.1.1): down-projections (replicated across TP) to the q and kv latents, then
    column-parallel up-projections; the decoupled RoPE key comes from the kv down-projection."""
    h, t, T = model.hidden_size, d.tp, d.tokens
    stored_input = d.tokens_sp * h * ACT_BYTES  # stored sharded under SP, re-gathered in backward
    if not model.is_mla:
        return gemm("attn/qkv", T, h, (model.q_dim + 2 * model.kv_dim) / t, d, saved=stored_input)
    a_heads = model.num_heads
    qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    ops: list[OpCost] = []
    if model.q_lora_rank:
        ops += gemm("attn/q_down", T, h, model.q_lora_rank, d, saved=stored_input)
        ops += gemm("attn/q_up", T, model.q_lora_rank, a_heads * qk / t, d)
    else:
        ops += gemm("attn/q", T, h, a_heads * qk / t, d, saved=stored_input)
    ops += gemm("attn/kv_down", T, h, model.kv_lora_rank + model.qk_rope_head_dim, d, saved=0.0)
    ops += gemm("attn/kv_up", T, model.kv_lora_rank, a_heads * (model.qk_nope_head_dim + model.v_head_dim) / t, d)
    return ops


def head_dims(model: ModelSpec) -> tuple[int, int]:
    """(query/key, value) head dimensions (MLA: d_nope + d_rope and d_v)."""
    if model.is_mla:
        return model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
    return model.head_dim, model.head_dim


def attention_elems(model: ModelSpec, d: Dims) -> tuple[Num, Num]:
    """Elements of this GPU's queries, keys and values together, and of the attention output: T·(A/t·d_qk +
    K/t·(d_qk + d_v)) and T·A/t·d_v (MLA: a key and a value per query head)."""
    heads = model.num_heads / d.tp
    kv_heads = heads if model.is_mla else model.num_kv_heads / d.tp
    d_qk, d_v = head_dims(model)
    return d.tokens * (heads * d_qk + kv_heads * (d_qk + d_v)), d.tokens * heads * d_v


def core_attention(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """softmax(Q·Kᵀ/√d)·V for A/t heads, T queries against s keys, causal.

    FLOPs: 2·T·s·(A/t)·(d_qk + d_v) for the two batched GEMMs, halved by the causal mask for a
    flash kernel that skips masked blocks; an unfused kernel computes the full square. A flash kernel in a sliding
    window of w < s keys does 2·T·a·(A/t)·(d_qk + d_v), a = ``ModelSpec.window_keys()``, on the windowed layers'
    share of the average layer (a record with ``window``); an unfused one still computes the square.
    Saved (Korthikanti §4.1): Q and K (4sbh), V (2sbh); unfused adds softmax output (2as²b), dropout mask
    (as²b) and dropout output (2as²b); FlashAttention stores the log-sum-exp instead (4 bytes per row).
    """
    a = ACT_BYTES
    heads, d_qk, d_v = model.num_heads / d.tp, *head_dims(model)
    T, s = d.tokens, d.seq
    full = 2.0 * T * s * heads * (d_qk + d_v)
    qkv_elems, out_elems = attention_elems(model, d)
    saved_qkv = qkv_elems * a
    if d.stack.flash_attention:
        shape = {"m": T * heads, "n": s, "k": d_qk, "variant": "flash_causal" if model.causal else "flash",
                 "kernel": d.stack.attention_kernel, "groups": plan.cp if d.stack.cp_comm == "ring" else 1}
        saved = saved_qkv + T * heads * FP32  # q, k, v and the log-sum-exp
        windowed = model.window_share
        ops = []
        if windowed < 1:  # the full-attention layers' share of the average layer
            flops = (full / 2 if model.causal else full) * (1 - windowed)
            ops += flash_records(flops, a * (qkv_elems + out_elems) * (1 - windowed),
                                 a * (2 * qkv_elems + 3 * out_elems) * (1 - windowed), saved, shape)
            saved = 0.0
        if windowed:  # the windowed layers': a query sees window_keys() keys on average
            flops = full * model.window_keys() / s * windowed
            ops += flash_records(flops, a * (qkv_elems + out_elems) * windowed,
                                 a * (2 * qkv_elems + 3 * out_elems) * windowed, saved,
                                 shape | {"window": model.sliding_window}, "attn/core/window")
        return ops
    scores = T * heads * s  # full square: the mask is applied, not skipped
    kept = scores * (2 * a + MASK_BYTES if d.dropout else a)  # softmax out (+ mask + dropout out)
    fwd_traffic, bwd_traffic = unfused_score_traffic(d.dropout)
    # Q·Kᵀ reduces over d, P·V over s (equal FLOPs): the pair runs like one GEMM of depth 2ds/(d+s)
    shape = {"m": T * heads, "n": s, "k": 2.0 * d_qk * s / (d_qk + s), "variant": "unfused"}
    return [
        OpCost("attn/core", "fwd", "attention", full, a * (qkv_elems + out_elems) + scores * fwd_traffic,
               saved_qkv, **shape),
        # the scores kept for the backward pass; selective recompute drops them (Korthikanti §5)
        OpCost("attn/scores", "fwd", "memory", saved=kept),
        OpCost("attn/core", "bwd_x", "attention", 2 * full,
               a * (2 * qkv_elems + 2 * out_elems) + scores * bwd_traffic, **shape),
    ]


def flash_records(flops: Num, fwd_bytes: Num, bwd_bytes: Num, saved: Num, shape: dict, name: str = "attn/core"
                  ) -> list[OpCost]:
    """A flash kernel's forward and backward records: the backward recomputes the scores and forms dS, dQ, dK and
    dV: 5 GEMMs against the forward's 2, 2.5 × its FLOPs (Dao et al. 2022, Alg. 2 and 4). The windowed layers' share
    is a sub-record, "attn/core/window", which the recompute modules of "attn/core" take along."""
    return [OpCost(name, "fwd", "attention", flops, fwd_bytes, saved, **shape),
            OpCost(name, "bwd_x", "attention", 2.5 * flops, bwd_bytes, **shape)]


def unfused_score_traffic(dropout: bool) -> tuple[float, float]:
    """Bytes per attention score that the unfused kernels move, forward and backward (Megatron-Core
    ``DotProductAttention``: baddbmm → fused scale-mask-softmax → attention dropout → bmm; each kernel reads its
    inputs from and writes its output to HBM in bf16). Forward: Q·Kᵀ writes S, the softmax reads S and writes
    P, P·V reads P: 4 elements. Backward: dO·Vᵀ writes dP, the softmax backward reads P and dP and writes dS,
    dQ = dS·K and dK = dSᵀ·Q read dS, dV = Pᵀ·dO reads P: 7 elements. Dropout adds, each way, a read and a
    write of the scores and the byte mask; at p = 0 PyTorch's dropout returns its input without a kernel
    (aten/src/ATen/native/Dropout.cpp), so a model without dropout moves none of that."""
    extra = 2 * ACT_BYTES + MASK_BYTES if dropout else 0.0
    return 4 * ACT_BYTES + extra, 7 * ACT_BYTES + extra


def kv_chunk(model: ModelSpec, d: Dims) -> Num:
    """Bytes of this GPU's K and V (its T rows, its heads)."""
    if model.is_mla:
        kv_width = model.num_heads * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim)
    else:
        kv_width = 2 * model.kv_dim
    return d.tokens * kv_width / d.tp * ACT_BYTES


def kv_exchange(name: str, axis: str, group: Num, how: str, chunk: Num) -> list[OpCost]:
    """Give every rank of a sequence-sharded group the whole sequence's K and V.

    ``ring`` (ring attention, Liu et al. 2023; Megatron-Core cp_comm_type="p2p"): g-1 steps forward, K/V and
    dK/dV backward, overlapped with the attention kernel. ``allgather`` (seed 003's fused attention for the
    2D context layout; Megatron-Core cp_comm_type="all_gather"): all-gather K and V before the kernel
    forward and again backward, reduce-scatter dK and dV after it; exposed.
    """
    if how == "ring":
        return [collective(name, "fwd", "p2p", (group - 1) * chunk, axis, group, "cp"),
                collective(name, "bwd_x", "p2p", 2 * (group - 1) * chunk, axis, group, "cp")]
    full = group * chunk
    return [collective(name, "fwd", "all_gather", full, axis, group),
            collective(name, "bwd_x", "all_gather", full, axis, group),
            collective(name, "bwd_x", "reduce_scatter", full, axis, group)]


def context_exchange(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """K/V exchange across the context-parallel ranks (none when c = 1: a group of one costs nothing)."""
    return kv_exchange("attn/cp_kv", "cp", plan.cp, d.stack.cp_comm, kv_chunk(model, d))


def attention_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    ops = norm("attn/norm", model, d)
    ops += tp_enter("attn/tp_in", model, plan, d)
    ops += qkv_ops(model, plan, d)
    ops += core_attention(model, plan, d)
    ops += context_exchange(model, plan, d)
    ops += gemm("attn/out", d.tokens, model.attn_out_dim / d.tp, model.hidden_size, d)
    ops += tp_exit("attn/tp_out", model, plan, d)
    ops += residual("attn/residual", model, d)
    return ops


# ---- Mamba-2 -------------------------------------------------------------------------------------------------
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


# ---- MLP and MoE ------------------------------------------------------------------------------------------
def mlp_gemms(prefix: str, model: ModelSpec, rows: Num, ffn: Num, d: Dims, input_saved: Num | None = None,
              groups: Num = 1.0, width: Num = 0) -> list[OpCost]:
    """fc1 (H → F, or H → 2F gate+up for SwiGLU), activation, fc2 (F → H). ``ffn`` is the local width;
    ``input_saved`` is what fc1 keeps of its input (the sequence-parallel shard, by default all rows);
    ``groups``: the rows split over that many experts' weights (grouped GEMMs); ``width``: the rows' width
    when it is not H (a latent MoE's experts)."""
    width = width or model.hidden_size
    width_in = 2 * ffn if model.gated else ffn
    ops = gemm(f"{prefix}/fc1", rows, width, width_in, d, saved=input_saved, groups=groups)
    act_in, act_out = rows * width_in, rows * ffn
    ops += elementwise(f"{prefix}/act", act_in, act_out, 8.0, saved=act_in * ACT_BYTES)
    ops += gemm(f"{prefix}/fc2", rows, ffn, width, d, groups=groups)
    return ops


def mlp_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    ops = norm("mlp/norm", model, d)
    ops += tp_enter("mlp/tp_in", model, plan, d)
    ops += mlp_gemms("mlp", model, d.tokens, model.ffn_hidden_size / d.tp, d,
                     input_saved=d.tokens_sp * model.hidden_size * ACT_BYTES)
    ops += tp_exit("mlp/tp_out", model, plan, d)
    ops += residual("mlp/residual", model, d)
    return ops


def moe_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """Router, dispatch all-to-all (ep), expert MLPs (sharded etp-ways), combine all-to-all, shared experts; a
    latent MoE (``moe_latent_size``) projects the routed tokens to the latent width before the dispatch and back
    after the combine, so the all-to-alls and the experts carry latent-wide rows.

    Megatron-Core runs MoE layers with sequence parallelism whenever t > 1, so each rank routes T/t tokens;
    the etp group all-gathers its members' tokens so the rank's E/e local experts see etp·T/t·k rows in all,
    etp·T/t·k·e/E each (balanced routing), against F_e/etp columns: grouped GEMMs of that many rows per expert
    (tile quantization per expert, wave quantization over all of them, weight-gradient depth = rows per expert).
    """
    k, latent = model.moe_topk, model.moe_latent_size
    routed = d.tokens / d.tp  # tokens this rank routes
    a = ACT_BYTES
    ops = norm("moe/norm", model, d)
    ops += gemm("moe/router", routed, model.hidden_size, model.num_experts, d)  # its input: the shared experts' too
    if latent:  # a latent MoE projects the routed tokens down before the dispatch (and back after the combine)
        ops += gemm("moe/latent_in", routed, model.hidden_size, latent, d, saved=0.0)
    h = model.moe_width  # the width the all-to-alls carry and the experts see
    sent = routed * k * h * a
    for phase in ("fwd", "bwd_x"):
        ops.append(collective("moe/dispatch", phase, "all_to_all", sent, "ep", plan.ep))
        ops.append(collective("moe/combine", phase, "all_to_all", sent, "ep", plan.ep))
    rows = routed * k * plan.etp
    ops.append(collective("moe/etp_gather", "fwd", "all_gather", rows * h * a, "etp", plan.etp))
    ops.append(collective("moe/etp_scatter", "fwd", "reduce_scatter", rows * h * a, "etp", plan.etp))
    ops.append(collective("moe/etp_gather", "bwd_x", "all_gather", rows * h * a, "etp", plan.etp))
    ops.append(collective("moe/etp_scatter", "bwd_x", "reduce_scatter", rows * h * a, "etp", plan.etp))
    # token permutation around the all-to-alls (Megatron-Core MoE token dispatcher: permute before dispatch,
    # unpermute + probability-weighted sum after combine): a gather and a scatter of the k·T/t routed rows
    ops += elementwise("moe/permute", routed * k * h, routed * k * h, 0.0)
    ops += elementwise("moe/unpermute", routed * k * h, routed * h, 2.0)
    # E/e local experts, each an (etp·k·T/t · e/E)-row GEMM: grouped GEMMs (balanced routing)
    ops += host_launched(mlp_gemms("moe/experts", model, rows, model.moe_ffn_hidden_size / plan.etp, d,
                                   groups=model.num_experts / plan.ep, width=h), d.stack)
    ops += grouped_mlp_eager(model, d.stack, rows, model.moe_ffn_hidden_size / plan.etp)
    if latent:
        ops += gemm("moe/latent_out", routed, latent, model.hidden_size, d)
    if model.shared_expert_ffn_size:
        ops += tp_enter("moe/shared_tp_in", model, plan, d)
        ops += mlp_gemms("moe/shared", model, d.tokens, model.shared_expert_ffn_size / d.tp, d, input_saved=0.0)
        ops += tp_exit("moe/shared_tp_out", model, plan, d)
    ops += residual("moe/residual", model, d)
    return ops


def grouped_mlp_eager(model: ModelSpec, stack: Stack, rows: Num, ffn: Num) -> list[OpCost]:
    """What Megatron-Core's TEGroupedMLP (the per-expert path, ``stack.expert_gemm = "per_expert"``) runs as eager
    PyTorch kernels around its fused ones, ``rows`` routed rows of F = ``ffn`` (per etp shard) on this GPU, in bf16
    (the router's probabilities keep the activations' dtype without moe_router_dtype; GPTOSSProvider sets none):

    - a clamped GLU (``glu_clamp``): weighted_bias_quick_geglu_impl clamps the gate and the linear half and
      concatenates them before its fused kernel (megatron/core/fusions/fused_bias_geglu.py): forward two clamps
      (read F, write F each) and the cat (read 2F, write 2F), 8F elements a row; backward two clamp gradients (read
      the gradient and the input, write F each, 6F) and the chunk's gradient, a cat (4F): 10F. The clamps keep their
      input, fc1's 2F-wide output, while the fused kernel keeps the clamped copy (the activation's saved input): 2F
      more saved a row. A sub-record of the activation, so the moe_act recompute runs it again and frees what it
      kept (its checkpoint keeps only fc1's output).
    - biased experts (``linear_bias``): TEGroupedMLP._apply_bias adds fc2's bias scaled by each row's routing
      probability as ``t + b·p`` per local expert and concatenates the pieces (megatron/core/transformer/moe/
      experts.py): forward b·p (write H), the add (read 2H, write H), the cat (read H, write H): 6H a row;
      backward the probabilities' gradient (a product, read H write H, and its row sum, read H) and the split's,
      a cat (2H), then the bias gradient (a product and its column sum, 3H). fc1's bias is added in the grouped
      GEMM (Transformer Engine GroupedLinear, skip_bias_add false), for free.
    A fused grouped MLP (``"grouped"``: Transformer Engine's CuTeDSL kernel applies the clamp and the scaled bias
    in its epilogues) runs none of these, nor does a stack of eager PyTorch (``stack.fusion = "eager"``), whose
    experts are not Megatron-Core's (``eager_layer``). The host time of the per-expert launches is not priced."""
    if stack.expert_gemm != "per_expert" or stack.fusion != "fused":
        return []
    a, h = ACT_BYTES, model.moe_width
    ops = []
    if model.glu_clamp:  # the clamps keep fc1's output for their gradients besides the clamped copy the kernel keeps
        ops += [OpCost("moe/experts/act/clamp", "fwd", "memory", 0.0, 8 * ffn * rows * a, 2 * ffn * rows * a),
                OpCost("moe/experts/act/clamp", "bwd_x", "memory", 0.0, 10 * ffn * rows * a)]
    if model.linear_bias:
        ops += [OpCost("moe/experts/fc2/bias", "fwd", "memory", 0.0, 6 * h * rows * a),
                OpCost("moe/experts/fc2/bias", "bwd_x", "memory", 0.0, 5 * h * rows * a),
                OpCost("moe/experts/fc2/bias", "bwd_w", "memory", 0.0, 3 * h * rows * a)]
    return ops


def host_launched(ops: list[OpCost], stack: Stack) -> list[OpCost]:
    """Mark the kernels of per-expert GEMMs (``stack.expert_gemm = "per_expert"``) as host-launched.

    Dropless MoE learns how many tokens each local expert got only on the device; Megatron-Core's token
    dispatcher copies the counts to the host (a device-to-host sync) before it can split the rows, and
    Transformer Engine's GroupedLinear then launches one cuBLAS GEMM per expert (``general_grouped_gemm`` over
    several streams), with fp8 / fp4 one quantization of the expert's input (forward) or output gradient
    (input-gradient pass) before it, plus the per-expert ``torch.split`` / ``torch.empty`` calls whose CPU cost
    TE's maintainers single out (NVIDIA/TransformerEngine#1499). After the sync the CPU has no lead, so
    the GPU waits on these launches whenever each expert's GEMM is shorter than the host's time to issue it.
    Kernels per expert and pass: the GEMM (here), and with low precision its quantization (forward and
    input-gradient passes; ``low_precision_casts`` gives those cast ops their own launches)."""
    if stack.expert_gemm != "per_expert":
        return ops
    return [replace(op, launches=op.groups) if op.kind == "gemm" else op for op in ops]


# ---- selective recompute: Megatron-Core's recompute modules -------------------------------------------------
@dataclass(frozen=True, slots=True)
class Recompute:
    """What one of Megatron-Core's selective recompute modules (``Plan.recompute_modules``) does to a layer's ops:
    the forward kernels it runs again before the backward pass (``reruns``), the tensor-parallel collectives inside
    it that run again with them (``collectives``), and the forward records whose saved activations its checkpoint
    frees (``frees``): the module's inner tensors under a plain checkpoint, which keeps only the module's input, or
    the module's output under Megatron's output-discarding checkpoint (``CheckpointWithoutOutput``), which the next
    op would have kept. ``all_to_all``: the module's token dispatch and combine run again too (the forward's EP
    time). Names match an op of that name and its sub-records ("attn/q" matches "attn/q/cast", not "attn/q_up"); a
    name ending in "/" matches every op below it."""

    reruns: tuple[str, ...]
    frees: tuple[str, ...]
    collectives: tuple[str, ...] = ()
    all_to_all: bool = False


# Megatron-Core megatron/core/transformer/transformer_config.py (recompute_modules) and transformer_layer.py, the
# modules as they act on the ops above:
RECOMPUTE_MODULES: dict[str, Recompute] = {
    # checkpoint(core_attention, q, k, v): q, k, v stay saved; an unfused kernel's softmax probabilities, dropout
    # mask and output are recomputed (Korthikanti et al. 2022 §5, "selective activation recomputation"); a flash
    # kernel keeps only its log-sum-exp besides q, k, v, so recomputing it frees next to nothing
    "core_attn": Recompute(("attn/core",), ("attn/scores",)),
    # output-discarding checkpoint of the norms that are modules of their own: in Megatron-Core's Transformer Engine
    # layer specs the attention's input norm and a dense MLP's pre-MLP norm are fused into linear_qkv / linear_fc1
    # (IdentityOp: nothing to recompute), a MoE layer's pre-MLP norm is not (its router and experts both read it):
    # its output, which the router keeps, is freed and recomputed (TransformerLayer.recompute_pre_mlp_layernorm)
    "layernorm": Recompute(("moe/norm",), ("moe/router",)),
    # output-discarding checkpoint of the experts' activation function: its output, fc2's saved input, is recomputed
    "moe_act": Recompute(("moe/experts/act",), ("moe/experts/fc2", "moe/experts/act/clamp")),
    # checkpoint(mlp, hidden) on layers with a dense MLP only ("if not isinstance(self.mlp, MoELayer)"): the MLP
    # module holds the pre-MLP norm fused into linear_fc1, so only its input stays saved and norm, fc1 with its
    # sequence-parallel gather, the activation and fc2 with its reduce-scatter run again
    "mlp": Recompute(("mlp/norm", "mlp/fc1", "mlp/act", "mlp/fc2"), ("mlp/fc1", "mlp/act", "mlp/fc2"),
                     ("mlp/tp_in", "mlp/tp_out")),
    # checkpoint(moe_layer, norm output): router, latent projections, permutation, dispatch, experts, combine and
    # shared experts run again; only the norm output the router keeps stays saved
    "moe": Recompute(("moe/router", "moe/latent_in", "moe/latent_out", "moe/permute", "moe/unpermute",
                      "moe/experts/", "moe/shared/"),
                     ("moe/latent_in", "moe/latent_out", "moe/experts/", "moe/shared/"),
                     ("moe/shared_tp_in", "moe/shared_tp_out"), all_to_all=True),
    "shared_experts": Recompute(("moe/shared/",), ("moe/shared/act", "moe/shared/fc2"),
                                ("moe/shared_tp_in", "moe/shared_tp_out")),
    # output-discarding checkpoint of multi-head latent attention's up-projections (and RoPE): the q, k, v the
    # attention core keeps are recomputed from the latents they keep (Megatron-Core qkv_up_proj_and_rope_apply; a
    # model without a query latent, q_lora_rank 0, runs its whole query projection there)
    "mla_up_proj": Recompute(("attn/q_up", "attn/kv_up", "attn/q"), ("attn/core",)),
}


@lru_cache(maxsize=64)
def _patterns(modules: tuple[str, ...], part: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(names, prefixes) of ``part`` ("reruns", "frees" or "collectives") of ``modules``: the exact names (with
    their "/"-sub-records) and the "/"-ended prefixes."""
    names = [p for m in modules for p in getattr(RECOMPUTE_MODULES[m], part)]
    return (tuple(p for p in names if not p.endswith("/")), tuple(p + "/" if not p.endswith("/") else p
                                                                   for p in names))


def _matches(name: str, patterns: tuple[tuple[str, ...], tuple[str, ...]]) -> bool:
    exact, prefixes = patterns
    return name in exact or name.startswith(prefixes)


def rerun_by(ops: list[OpCost], modules: tuple[str, ...]) -> list[bool]:
    """Per op: a forward kernel that the selective recompute of ``modules`` runs again in the backward pass."""
    patterns = _patterns(modules, "reruns")
    return [op.phase == "fwd" and op.kind != "collective" and _matches(op.name, patterns) for op in ops]


def tp_rerun_by(ops: list[OpCost], modules: tuple[str, ...]) -> list[bool]:
    """Per op: a forward tensor-parallel collective inside a module ``modules`` recompute, which runs again."""
    patterns = _patterns(modules, "collectives")
    return [op.phase == "fwd" and op.kind == "collective" and _matches(op.name, patterns) for op in ops]


def freed_by(ops: list[OpCost], modules: tuple[str, ...]) -> list[bool]:
    """Per op: a forward record whose saved activations the selective recompute of ``modules`` frees."""
    patterns = _patterns(modules, "frees")
    return [op.phase == "fwd" and _matches(op.name, patterns) for op in ops]


# ---- eager PyTorch: the kernels a fused stack does not launch -------------------------------------------------
# Bytes per element that each unfused aten kernel reads (r) and writes (w), bf16 = 2, fp32 = 4, in the order
# eager autograd runs them. A fused stack (Megatron / Transformer Engine kernels, torch.compile) does the same
# math in the passes the ops above already count; eager PyTorch pays these on top.
EAGER: dict[str, dict[str, tuple[tuple[str, int, int], ...]]] = {
    # RMSNorm as torchtitan (models/norms.py) and HF LlamaRMSNorm write it, less the fused norm counted in norm():
    # (x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight; per-row scalars neglected
    "rmsnorm": {
        "fwd": (("to fp32", 2, 4), ("pow", 4, 4), ("mean", 4, 0), ("mul rsqrt", 4, 4), ("type_as", 4, 2),
                ("mul weight", 2, 2), ("fused norm", -2, -2)),
        # mul weight: dx = g·w and dw = Σ g·x̂ (product, then the reduction); type_as; mul rsqrt: dx = g·r and
        # dr = Σ g·x; mean: expand; pow_backward = g · 2 · x.pow(1) (three kernels); the two paths to x added;
        # the fp32 upcast's backward
        "bwd_x": (("mul weight dx", 2, 2), ("mul weight dw", 4, 2), ("sum dw", 2, 0), ("type_as", 2, 4),
                  ("mul rsqrt dx", 4, 4), ("mul rsqrt dr", 8, 4), ("sum dr", 4, 0), ("mean expand", 0, 4),
                  ("pow(x, 1)", 4, 4), ("mul 2", 4, 4), ("mul g", 8, 4), ("add paths", 8, 4), ("to bf16", 4, 2),
                  ("fused norm", -4, -2)),
    },
    # F.layer_norm is one native kernel each way in eager mode too: nothing extra
    "layernorm": {"fwd": (), "bwd_x": ()},
    # rotary embedding as torchtitan's apply_rotary_emb (complex multiply on fp32 views), per element of q and k
    "rope": {"fwd": (("to fp32", 2, 4), ("complex mul", 4, 4), ("type_as", 4, 2)),
             "bwd_x": (("to fp32", 2, 4), ("complex mul", 4, 4), ("to bf16", 4, 2))},
    # SwiGLU: silu(gate) * up as two kernels, per element of the FFN width, beyond the one fused kernel counted
    # in mlp_gemms (fwd r 4 w 2, bwd r 8 w 2): silu (r 2 w 2) + mul (r 4 w 2); backward two muls and silu's
    "swiglu": {"fwd": (("silu", 2, 2), ("mul", 4, 2), ("fused act", -4, -2)),
               "bwd_x": (("mul dgate", 4, 2), ("mul dup", 4, 2), ("silu backward", 4, 2), ("fused act", -8, -2))},
    "gelu": {"fwd": (), "bwd_x": ()},  # one kernel each way, as counted in mlp_gemms
    # squared ReLU (Nemotron-H): relu then square, two kernels where mlp_gemms counts one fused act (fwd r 2 w 2, bwd
    # r 4 w 2): HF transformers' ReLUSquaredActivation is relu(x) then torch.square, which aten runs as pow(x, 2)
    # (UnaryOps.cpp); backward pow_backward = g * (2 * x.pow(1)) (FunctionsManual.cpp: three kernels, as in rmsnorm
    # above) and relu's threshold_backward(g, result)
    "relu2": {"fwd": (("relu", 2, 2), ("square", 2, 2), ("fused act", -2, -2)),
              "bwd_x": (("pow(x, 1)", 2, 2), ("mul 2", 2, 2), ("mul g", 4, 2), ("threshold_backward", 4, 2),
                        ("fused act", -4, -2))},
    # a linear's bias gradient: autograd of addmm reduces the output gradient in a kernel of its own
    "bias": {"fwd": (), "bwd_w": (("sum", 2, 0),)},
    # GQA's repeat_kv (torchtitan, HF): K and V copied to every query head (expand + reshape), per element of
    # the copy (the read of the n_rep times smaller source neglected); its backward sums the copies back
    "repeat_kv": {"fwd": (("copy", 0, 2),), "bwd_x": (("sum", 2, 0),)},
    # F.cross_entropy(logits.float()) beyond the fused loss counted in head_ops (fwd r 2 w 8, bwd r 4 w 2), per
    # logit: the upcast; log_softmax reads a row too long for shared memory three times (max, Σexp, write:
    # cunn_SoftMaxForward); backward: nll_loss_backward's zero fill, log_softmax_backward (Σ grad, then r grad
    # and out, w), the upcast's backward
    "cross_entropy": {"fwd": (("to fp32", 2, 4), ("log_softmax", 12, 4), ("fused loss", -2, -8)),
                      "bwd_x": (("zero fill", 0, 4), ("log_softmax backward", 12, 4), ("to bf16", 4, 2),
                                ("fused loss", -4, -2))},
}


def eager_bytes(kind: str, phase: str) -> int:
    """Extra HBM bytes per element of an eager op sequence in one pass (``EAGER``)."""
    return sum(r + w for _, r, w in EAGER[kind].get(phase, ()))


def eager_op(name: str, kind: str, elems: Num) -> list[OpCost]:
    """The extra memory-bound traffic of ``EAGER[kind]`` over ``elems`` elements, one record per pass."""
    return [OpCost(f"{name}/eager", phase, "memory", 0.0, per_elem * elems)
            for phase in ("fwd", "bwd_x", "bwd_w") if (per_elem := eager_bytes(kind, phase))]


def eager_layer(model: ModelSpec, plan: Plan, d: Dims, moe: bool = False) -> list[OpCost]:
    """What eager PyTorch adds to one layer: decomposed norms, rotary embedding, GQA copies, two-kernel SwiGLU,
    bias gradients (``EAGER``). MoE experts are run by fused grouped kernels in every stack modelled here."""
    if not d.eager:
        return []
    h, t, T = model.hidden_size, d.tp, d.tokens
    heads, kv_heads = model.num_heads / t, model.num_kv_heads / t
    ops = eager_op("attn/norm", model.norm, d.tokens_sp * h) + eager_op("mlp/norm", model.norm, d.tokens_sp * h)
    if model.position_embedding == "rope" and not model.is_mla:
        ops += eager_op("attn/rope", "rope", T * (heads + kv_heads) * model.head_dim)
    if model.num_kv_heads < model.num_heads and not model.is_mla:
        ops += eager_op("attn/repeat_kv", "repeat_kv", 2 * T * heads * model.head_dim)
    if model.qkv_bias:
        ops += eager_op("attn/qkv_bias", "bias", T * (model.q_dim + 2 * model.kv_dim) / t)
    if model.linear_bias:
        ops += eager_op("attn/out_bias", "bias", T * h)
    if not moe:
        ops += eager_op("mlp/act", model.mlp, T * model.ffn_hidden_size / t)
        if model.linear_bias:
            width_in = 2 * model.ffn_hidden_size if model.gated else model.ffn_hidden_size
            ops += eager_op("mlp/bias", "bias", T * (width_in / t + h))
    return ops


def quantize_bytes(plan: Plan, stack: Stack) -> float:
    """HBM bytes per element to quantize a GEMM operand (``low_precision_casts``): read the 16-bit tensor (twice
    when its scale comes from its own amax) and write a row-wise and a column-wise low-precision copy."""
    low = LOW_PRECISION_BYTES[plan.precision]
    amax = plan.precision == "fp4" or (plan.precision == "fp8" and stack.fp8_scaling == "current")
    return ACT_BYTES * (2 if amax else 1) + 2 * low


BLOCK_SCALED = ("mxfp8", "fp4")  # formats with a scale per block of 32 / 16 elements
SIXTEEN_BIT = ("bf16", "ssd")  # GEMM variants outside the low-precision region (the LM head, Mamba's SSD products)


def cast(name: str, phase: str, elems: Num, plan: Plan, stack: Stack, launches: Num = 0.0) -> OpCost:
    """The quantization of ``elems`` elements of a GEMM operand before the GEMM ``name`` (``quantize_bytes``)."""
    variant = "block_scaled" if plan.precision in BLOCK_SCALED else ""
    return OpCost(name + "/cast", phase, "memory", 0.0, quantize_bytes(plan, stack) * elems, launches=launches,
                  variant=variant)


def low_precision_casts(ops: list[OpCost], plan: Plan, stack: Stack) -> list[OpCost]:
    """With fp8 / fp4 GEMMs (Transformer Engine), each GEMM's activation operand is quantized before the
    forward GEMM and its output gradient before the backward GEMMs, each to a row-wise and a transposed
    (column-wise) copy for the weight-gradient GEMM (TE ``cast_transpose``): read 2 bytes, write 2 × the
    low-precision bytes per element. Weights are cast once per step (TE caches them across micro-batches),
    which is neglected. GEMMs marked ``variant="bf16"`` (the LM head) stay in 16 bits.
    Memory: TE's linear layers keep the quantized input for the weight gradient instead of the 16-bit one, so
    each GEMM's saved input shrinks to the low-precision bytes; every stack but torchtitan's
    (``stack.cross_entropy = "pytorch"``) runs TE (Megatron-Core, NeMo, llm-foundry's fp8). torchao's Float8Linear
    (torchtitan) keeps the 16-bit input and re-quantizes it in the backward pass, which its published peak memory
    confirms (8B FSDP: 76.8 GiB with float8 against 82.4 bf16, not the ~30 % less an fp8 copy would give). With
    LoRA the bf16 adapters re-read the 16-bit input, which stays.
    Host-launched GEMMs (per-expert MoE, ``host_launched``) launch one quantization per expert as well.
    A scale taken from the tensor itself needs its amax before the cast, one more read of the 16-bit tensor: fp8
    current scaling (``stack.fp8_scaling``) and NVFP4's per-tensor global scale ("the extra memory pass for
    per-tensor amax computation", Transformer Engine docs, GEMM profiling tutorial; there, on an H200, a layer's
    GEMMs with their quantization take 20.29 ms under current scaling against 18.98 ms under delayed scaling).
    Simplified: Blackwell reads a per-tensor fp8 operand column-wise, so there one copy would do; with sequence
    parallelism Transformer Engine casts the local shard before gathering it (``gathered_bytes``) and transposes
    the gathered fp8 rows for the weight gradient, where the cast here is charged once on the gathered rows."""
    low = LOW_PRECISION_BYTES.get(plan.precision)
    if low is None:
        return ops
    # the quantized operand: the input X (m×k) forward, the output gradient dY backward (the bwd_x record is
    # (m×n)·(n×k) with n and k swapped, so again m×k)
    casts = [cast(op.name, op.phase, op.groups * op.m * op.k, plan, stack, op.launches)
             for op in ops if op.kind == "gemm" and op.phase in ("fwd", "bwd_x") and op.variant not in SIXTEEN_BIT]
    if stack.cross_entropy != "pytorch" and plan.finetune != "lora":
        ops = [replace(op, saved=op.saved * low / ACT_BYTES)
               if op.kind == "gemm" and op.phase == "fwd" and op.variant not in SIXTEEN_BIT else op for op in ops]
    return ops + casts


# The GEMMs that carry adapters, by name prefix, per ``Plan.lora_targets``: "all" the attention and dense-MLP
# linears (Megatron-Bridge / NeMo 2 default), "qkv" the query/key/value projections (attn/qkv; MLA's attn/q*,
# attn/kv*), NeMo 1.x's default.
LORA_PREFIXES = {"all": ("attn/", "mlp/"), "qkv": ("attn/q", "attn/kv")}


def lora(ops: list[OpCost], plan: Plan, d: Dims) -> list[OpCost]:
    """LoRA fine-tuning (Hu et al. 2021): frozen base weights need no weight gradient, so every base GEMM's
    ``bwd_w`` (and the embedding's gradient scatter-add) is dropped; the input gradient still flows. Each
    targeted linear W (k×n) gains a rank-r path x·A·B (A: k×r, B: r×n) with all three passes, run in bf16
    (outside the fp8 region); A re-reads the base GEMM's saved input, B saves its m×r input."""
    if plan.finetune != "lora":
        return ops
    r, targets = plan.lora_rank, LORA_PREFIXES[plan.lora_targets]
    out: list[OpCost] = []
    for op in ops:
        if op.phase == "bwd_w" and op.kind in ("gemm", "memory"):
            continue
        out.append(op)
        if op.kind == "gemm" and op.phase == "fwd" and op.name.startswith(targets):
            rows = op.m * op.groups
            out += [replace(a, variant="bf16") for a in gemm(op.name + "/lora_a", rows, op.k, r, d, saved=0.0)
                    + gemm(op.name + "/lora_b", rows, r, op.n, d)]
    return out


# ---- flash-attn's variable-length interface: packing the rows around the kernel ---------------------------------
UNPAD_KERNELS = 8  # kernels of one flash_attn.bert_padding.unpad_input call (varlen_padding)


def varlen_padding(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """The copies around a FlashAttention call through flash-attn's varlen interface (``stack.varlen_attention``;
    flash_attn/bert_padding.py, as llm-foundry's MPT ``flash_attn_fn`` uses it), per element of the query, key and
    value and of the output (``attention_elems``, this GPU's heads):
    forward: ``unpad_input`` gathers each of q, k, v into packed rows (``IndexFirstAxis``: torch.gather, read 2 +
    write 2) and ``pad_input`` scatters the output into a zero-filled padded tensor (``IndexPutFirstAxis``: zeros
    2, index_put read 2 + write 2);
    backward: the gather's gradient scatters into zeros (2 + 2 + 2 per q, k, v element) and the output's gradient
    is gathered back (2 + 2).
    Saved: FlashAttention keeps its packed output for the backward pass, and the output projection keeps the padded
    copy pad_input made: 2 bytes per output element more than the unpacked path.
    Host: unpad_input reads the packed layout back to the host for each of q, k and v (``torch.nonzero`` needs its
    output size, ``seqlens.max().item()`` the longest sequence), so from the layer's first synchronisation to the
    FlashAttention call the GPU waits on the host for every kernel: ``UNPAD_KERNELS`` per call (the sum of the
    mask, nonzero's count and select, max, cumsum, F.pad's fill and copy, the gather), three calls per layer. The
    forward record takes at least that many host launches (``launches``, priced at ``Efficiency.host_launch`` as
    the per-expert MoE path after its tokens-per-expert sync: roofline.op_time); the backward has no sync."""
    if not d.stack.varlen_attention:
        return []
    qkv, out = attention_elems(model, d)
    a = ACT_BYTES
    return [OpCost("attn/varlen", "fwd", "memory", 0.0, 2 * a * qkv + 3 * a * out,  # gather; zeros + index_put
                   a * out, launches=3 * UNPAD_KERNELS),
            OpCost("attn/varlen", "bwd_x", "memory", 0.0, 3 * a * qkv + 2 * a * out)]  # zeros + scatter; gather


def qkv_concat(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """The backward of torch.split on the fused QKV projection's output (``stack.qkv_concat``): autograd's
    SplitWithSizesBackward concatenates the separate q, k and v gradients into one tensor, reading and writing
    2 + 2 bytes per element of q, k and v (this GPU's heads). MLA has no fused QKV projection to split."""
    if not d.stack.qkv_concat or model.is_mla:
        return []
    qkv, _ = attention_elems(model, d)
    return [OpCost("attn/qkv_concat", "bwd_x", "memory", 0.0, 2 * ACT_BYTES * qkv)]


# ---- PyTorch FSDP: preparing each micro-batch's gradients for the reduce-scatter -------------------------------
def fsdp_grad_bytes(plan: Plan, stack: Stack) -> int:
    """HBM bytes per unsharded parameter that PyTorch FSDP reads and writes on the GPU, every micro-batch (FSDP
    reduces the gradients after each backward pass unless ``no_sync``), to turn the weight gradients into the
    reduction's input (g = ``plan.grad_bytes``, the reduce dtype; the weights and their gradients are bf16 under
    FSDP's mixed precision). The weight-gradient GEMMs' own write is in ``gemm``.

    ``fsdp1`` (FlatParameter FSDP, torch/distributed/fsdp, PyTorch 1.13-2.x): the unit's weights are views of one
    flat parameter, so autograd assembles its gradient by concatenating the weight gradients (the backward of the
    flat parameter's split, read + write: 2 + 2); ``_post_backward_hook`` casts it to the reduce dtype when that
    differs (``flat_param.grad.to(reduce_dtype)``: 2 + g) and ``_reduce_grad`` divides it in place by the
    pre-divide factor (``_div_if_needed``: g + g) before the reduce-scatter: 18 bytes with fp32 reduction, 8 with
    bf16. ``fsdp2`` (per-parameter FSDP, ``fully_shard``): ``foreach_reduce`` copies the gradients into the
    reduce-scatter buffer in the reduce dtype (``foreach_reduce_scatter_copy_in``: 2 + g) and, reducing in fp32 or
    bf16, lets NCCL average (``ReduceOp.AVG``): no divide. FSDP issues these kernels on its post-backward stream,
    beside the next unit's backward; they are counted at their full memory-bound time (they take the SMs and HBM
    they need either way).
    Neglected: the work on the 1/N shards (casting the fp32 shard to bf16 before each all-gather, accumulating the
    reduced gradient shard): 12 + 12 bytes per parameter / N, under 3 at N ≥ 8; and in the peak memory the
    unit's transient unsharded gradient and its reduce-dtype copy, (2 + g) bytes per parameter of one unit.
    """
    g = plan.grad_bytes
    if stack.fsdp == "fsdp1":
        return 2 * ACT_BYTES + (ACT_BYTES + g if g != ACT_BYTES else 0) + 2 * g
    if stack.fsdp == "fsdp2":
        return ACT_BYTES + g
    return 0


def fsdp_grad_prep(name: str, params: Num, plan: Plan, stack: Stack) -> list[OpCost]:
    """The memory-bound op of ``fsdp_grad_bytes`` over ``params`` (this GPU's unsharded parameters of the unit) in
    the backward pass; nothing when no FSDP shards the model. Under LoRA the frozen weights have no gradient, and
    ``lora`` drops it with the other weight-gradient work."""
    per_param = fsdp_grad_bytes(plan, stack)
    return [OpCost(f"{name}/fsdp_grad", "bwd_w", "memory", 0.0, per_param * params)] if per_param else []


def layer_fsdp_grad(model: ModelSpec, plan: Plan, stack: Stack, kind: str) -> list[OpCost]:
    """``fsdp_grad_prep`` over one layer's parameters on this GPU (``memory.kind_params``: a MoE layer with its
    local experts)."""
    if stack.fsdp == "none":
        return []
    return fsdp_grad_prep("layer", kind_params(model, plan, kind).total, plan, stack)


def stack_extras(model: ModelSpec, plan: Plan, d: Dims, kind: str) -> list[OpCost]:
    """What the software stack adds to a layer: its model code's attention copies (flash-attn's varlen packing,
    the QKV split's backward concatenation; layers with attention) and FSDP's gradient preparation
    (``layer_fsdp_grad``)."""
    attention = varlen_padding(model, plan, d) + qkv_concat(model, plan, d) if kind in ("dense", "moe",
                                                                                        "attention") else []
    if model.is_hybrid and kind == "moe":
        attention = []
    return attention + layer_fsdp_grad(model, plan, d.stack, kind)


def dense_layer(model: ModelSpec, plan: Plan, stack: Stack) -> list[OpCost]:
    """One transformer layer with a dense MLP, one micro-batch, one GPU."""
    d = dims(model, plan, stack)
    if plan.tensor_layout == "summa":
        from meshplan.cost.summa import summa_layer

        return lora(summa_layer(model, plan, d) + stack_extras(model, plan, d, "dense"), plan, d)
    return low_precision_casts(lora(attention_block(model, plan, d) + mlp_block(model, plan, d)
                                    + eager_layer(model, plan, d) + stack_extras(model, plan, d, "dense"), plan, d),
                               plan, stack)


def moe_layer(model: ModelSpec, plan: Plan, stack: Stack) -> list[OpCost]:
    d = dims(model, plan, stack)
    return low_precision_casts(lora(attention_block(model, plan, d) + moe_block(model, plan, d)
                                    + eager_layer(model, plan, d, moe=True) + stack_extras(model, plan, d, "moe"),
                                    plan, d), plan, stack)


def hybrid_block(model: ModelSpec, plan: Plan, stack: Stack, kind: str) -> list[OpCost]:
    """One block of a hybrid model (``ModelSpec.layer_pattern``), one micro-batch, one GPU: its pre-norm, mixer
    and residual. Fused kernels only (plan.check refuses eager, SUMMA and LoRA plans for a hybrid)."""
    d = dims(model, plan, stack)
    block = {"mamba": mamba_block, "attention": attention_block, "mlp": mlp_block, "moe": moe_block}[kind]
    return low_precision_casts(block(model, plan, d) + stack_extras(model, plan, d, kind), plan, stack)


def layer_kinds(model: ModelSpec, plan: Plan, stack: Stack) -> dict[str, list[OpCost]]:
    """The ops of one layer of each kind the model has (``ModelSpec.block_counts``)."""
    if model.is_hybrid:
        return {kind: hybrid_block(model, plan, stack, kind) for kind in model.block_counts}
    builders = {"dense": dense_layer, "moe": moe_layer}
    return {kind: builders[kind](model, plan, stack) for kind in model.block_counts}


# ---- first and last pipeline stage ------------------------------------------------------------------------
def lookup(name: str, elems: Num, d: Dims, mask: Num = 0.0) -> list[OpCost]:
    """Gathering ``elems`` embedding values from the table (read and write 16 bits each; ``mask``: the dropout mask
    kept) and, backward, scatter-adding their gradients into the table's (read the 16-bit gradient, read and write
    the table's gradient)."""
    return [OpCost(name, "fwd", "memory", 0.0, 2 * elems * ACT_BYTES, mask),
            OpCost(name, "bwd_w", "memory", elems, elems * ACT_BYTES + elems * 2 * d.grad_bytes)]


def embedding_ops(model: ModelSpec, plan: Plan, stack: Stack) -> list[OpCost]:
    """Vocabulary-parallel embedding lookup (first stage): gather rows, all-reduce (reduce-scatter with SP)
    across TP; the backward scatter-adds into the table's gradient."""
    d = dims(model, plan, stack)
    h = model.hidden_size
    elems = d.tokens * h
    mask = d.tokens_sp * h * MASK_BYTES if d.dropout else 0.0
    ops = lookup("embed/lookup", elems, d, mask) + vocab_parallel_reduce("embed/tp", elems, plan)
    ops += fsdp_grad_prep("embed", model.embedding_params() / plan.tp, plan, stack)
    return lora(ops, plan, d)


def vocab_parallel_reduce(name: str, elems: Num, plan: Plan) -> list[OpCost]:
    """A vocabulary-parallel lookup's rows (each rank holds V/t rows of the table, so a token's embedding is on one
    rank and zeros on the others) summed across TP: all-reduce, or with sequence parallelism reduce-scatter into the
    sequence-sharded layout and all-gather its gradient back (Megatron-Core VocabParallelEmbedding)."""
    if not plan.sequence_parallel:
        return [collective(name, "fwd", "all_reduce", elems * ACT_BYTES, "tp", plan.tp, "tp")]
    return [collective(name, "fwd", "reduce_scatter", elems * ACT_BYTES, "tp", plan.tp, "tp"),
            collective(name, "bwd_x", "all_gather", elems * ACT_BYTES, "tp", plan.tp, "tp")]


def head_ops(model: ModelSpec, plan: Plan, stack: Stack) -> list[OpCost]:
    """Final norm, vocabulary-parallel LM head (H → V/t), cross-entropy (last stage) and the trainer's metric
    cross-entropies (``train_metrics``).

    The loss's traffic and what it keeps depend on ``stack.cross_entropy`` (``loss_ops``): Megatron's upcasts the
    logits to fp32 and keeps them for the backward pass, 4·T·V/t bytes (Korthikanti et al. 2022 §4.1, "4sbv/t" for
    the output layer), with three small all-reduces (max, sum, target logit) of T fp32 values each across TP.
    """
    d = dims(model, plan, stack)
    vocab = model.vocab_size / d.tp
    logits = d.tokens * vocab
    ops = norm("head/norm", model, d)
    ops += tp_enter("head/tp_in", model, plan, d, quantized=False)
    # the output layer is outside Transformer Engine's fp8 region: it runs in 16 bits whatever the plan's precision
    ops += [replace(op, variant="bf16") for op in gemm("head/logits", d.tokens, model.hidden_size, vocab, d,
                                                        saved=d.tokens_sp * model.hidden_size * ACT_BYTES)]
    ops += loss_ops(stack, logits, d.tokens)
    ops.append(collective("head/loss_tp", "fwd", "all_reduce", 3 * d.tokens * FP32, "tp", plan.tp))
    if stack.train_metrics:
        ops.append(train_metrics(stack.train_metrics, logits))
    if stack.cross_entropy == "pytorch":
        ops += eager_op("head/loss", "cross_entropy", logits)
    if d.eager:
        ops += eager_op("head/norm", model.norm, d.tokens_sp * model.hidden_size)
    ops += fsdp_grad_prep("head", model.head_params() / plan.tp, plan, stack)
    return lora(ops, plan, d)


def mtp_ops(model: ModelSpec, plan: Plan, stack: Stack) -> list[OpCost]:
    """What one multi-token-prediction depth (``ModelSpec.mtp_layers``; Megatron-Core MultiTokenPredictionLayer) runs
    on the last stage besides its layer and the head: the lookup of the next tokens' embeddings (the shared
    vocabulary-parallel table, its rows reduced across TP as the first stage's are: the MTP layer calls the same
    VocabParallelEmbedding), their norm and the previous hidden state's (enorm, hnorm), and eh_proj over the
    2H-wide concatenation (column-parallel: its input gathered, its H/t-wide output gathered back into the
    sequence-parallel layout). The depth's layer (``mtp_kinds``) and its final norm, shared LM head and loss are the
    ops of those kinds (``layer_kinds``, ``head_ops``), which estimate.units_for_recomputes adds per depth.
    Simplified: the MTP layer runs at the plan's precision (Megatron-Bridge keeps Nemotron 3 Super's in BF16,
    keep_mtp_spec_in_bf16), and its loss is scaled, not skipped."""
    if not model.mtp_layers:
        return []
    d = dims(model, plan, stack)
    h = model.hidden_size
    elems = d.tokens * h
    ops = lookup("mtp/embed_lookup", elems, d) + vocab_parallel_reduce("mtp/embed_tp", elems, plan)
    ops += norm("mtp/enorm", model, d) + norm("mtp/hnorm", model, d)
    ops += tp_enter("mtp/eh_proj/tp_in", model, plan, d, width=2 * h)
    ops += gemm("mtp/eh_proj", d.tokens, 2 * h, h / d.tp, d)
    return ops + tp_exit("mtp/eh_proj/tp_out", model, plan, d)


def loss_ops(stack: Stack, logits: Num, tokens: Num) -> list[OpCost]:
    """The cross-entropy over this GPU's logits, forward and backward. Megatron's vocabulary-parallel loss (and the
    fused part of PyTorch's, whose extra eager kernels ``EAGER["cross_entropy"]`` adds): reads the 16-bit logits,
    keeps an fp32 softmax (4 bytes per logit saved), backward reads it and writes the gradient. ``"flash"``:
    flash-attn's CrossEntropyLoss (csrc/xentropy, from apex's contrib xentropy kernel) reads the 16-bit logits
    twice (``cunn_SoftMaxXEntropyForward``: max and sum, then Σexp) and keeps them with one fp32 log-sum-exp per
    token; its backward (``cunn_SoftMaxXEntropyBackward``) re-reads them and writes the 16-bit gradient."""
    if stack.cross_entropy == "flash":
        return [OpCost("head/loss", "fwd", "memory", 6.0 * logits, logits * 2 * ACT_BYTES,
                       logits * ACT_BYTES + tokens * FP32),
                OpCost("head/loss", "bwd_x", "memory", 2.0 * logits, logits * 2 * ACT_BYTES)]
    return [OpCost("head/loss", "fwd", "memory", 6.0 * logits, logits * (ACT_BYTES + 2 * FP32), logits * FP32),
            OpCost("head/loss", "bwd_x", "memory", 2.0 * logits, logits * (FP32 + ACT_BYTES))]


def train_metrics(count: Num, logits: Num) -> OpCost:
    """``count`` cross-entropies over the 16-bit logits outside autograd, after the micro-batch's backward pass
    (Composer ``Trainer._eval_train_metrics`` → ``LanguageCrossEntropy.update``: ``torch.nn.CrossEntropyLoss`` with
    reduction "sum", under autocast): autocast casts the logits to fp32 and log_softmax reads the long rows three
    times (the forward kernels of ``EAGER["cross_entropy"]`` without the fused loss: 2 + 4 and 12 + 4 bytes per
    logit each); nll_loss's read of one logit per token is neglected. Their fp32 temporaries (8 bytes per logit)
    are not added to the peak memory: they live after the backward pass, when the activations are freed."""
    per_logit = sum(r + w for name, r, w in EAGER["cross_entropy"]["fwd"] if name != "fused loss")
    return OpCost("head/metrics", "bwd_x", "memory", 5.0 * count * logits, count * logits * per_logit)


def pipeline_p2p(model: ModelSpec, plan: Plan, stack: Stack) -> list[OpCost]:
    """Activations to the next stage forward and their gradients back, once per micro-batch and model chunk.

    Each tensor-parallel rank sends 1/t of the tensor over its own NIC: the sequence-parallel shard, or
    without sequence parallelism Megatron's scatter/gather optimisation (Narayanan et al. 2021 §4.1: split
    the replicated activation t ways, send the slices in parallel, all-gather them over NVLink on arrival).
    """
    d = dims(model, plan, stack)
    full = d.tokens * model.hidden_size * ACT_BYTES
    msg = full / d.tp
    ops = [collective("pp/send_act", "fwd", "p2p", msg, "pp", 2),  # between two neighbours; estimate.py
           collective("pp/send_grad", "bwd_x", "p2p", msg, "pp", 2)]  # counts it only when p > 1
    if not (plan.sequence_parallel or plan.tensor_layout == "summa"):
        ops += [collective("pp/gather_act", "fwd", "all_gather", full, "tp", plan.tp),
                collective("pp/gather_grad", "bwd_x", "all_gather", full, "tp", plan.tp)]
    return ops


# ---- a single linear layer under 2D tensor parallelism (seed 001) ----------------------------------------
def linear_2d(d_in: Num, d_out: Num, tokens: Num, tp_in: Num, tp_out: Num, dp: Num = 1,
              elem_bytes: int = ACT_BYTES) -> list[OpCost]:
    """Y = X·W for W of d_in × d_out sharded over a tp_in × tp_out grid, ``tokens`` split over dp.

    The per-GPU accounting of seed 001 (a notebook modelling one linear layer on an H100): each GPU holds
    N_local = (d_in/tp_in)·(d_out/tp_out) weights and b_local = tokens/dp rows.
        forward:      2·N_local·b_local FLOPs; HBM reads the weights; all-reduce of the d_out/tp_out
                      partial outputs over tp_in
        weight grad:  2·N_local·b_local FLOPs; HBM reloads the input and accumulates the gradient (r + w)
        input grad:   2·N_local·b_local FLOPs; HBM reads the weights; all-reduce of the d_in/tp_in
                      partial input gradients over tp_out
    Activations are assumed to stay in L2 between neighbouring kernels (the seed's assumption), so only the
    weights, the gradient and the reloaded input cross HBM.
    """
    din, dout, rows = d_in / tp_in, d_out / tp_out, tokens / dp
    n_local = din * dout
    flops = 2.0 * n_local * rows
    b = elem_bytes
    return [
        OpCost("linear/fwd", "fwd", "gemm", flops, n_local * b, m=rows, n=dout, k=din),
        collective("linear/tp_in", "fwd", "all_reduce", dout * rows * b, "tp_in", tp_in),
        OpCost("linear/wgrad", "bwd_w", "gemm", flops, (din * rows + 2 * n_local) * b, m=din, n=dout, k=rows),
        OpCost("linear/dgrad", "bwd_x", "gemm", flops, n_local * b, m=rows, n=din, k=dout),
        collective("linear/tp_out", "bwd_x", "all_reduce", din * rows * b, "tp_out", tp_out),
    ]
