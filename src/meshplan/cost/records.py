"""Per-op cost records of one micro-batch on one GPU: ``OpCost`` (FLOPs, HBM bytes, saved activations,
collectives), the byte sizes they count in, and ``Dims``, the rows and sizes a plan gives the ops.

Symbols (every module of cost/): b micro-batch, s sequence, t tensor-parallel size, c context-parallel size,
H hidden, F FFN, A heads, K kv-heads, d head dim, V vocabulary, E experts, k top-k, Fe expert FFN, e ep, et etp,
T = b·s/c tokens a GPU processes in the tensor-parallel region, Tsp = T/t with sequence parallelism (else T),
a = 2 bytes per activation element (bf16).

Every record is flat (DESIGN.md): name ``"attn/qkv"``, phase ``fwd`` / ``bwd_x`` (input gradient) /
``bwd_w`` (weight gradient), kind ``gemm`` / ``attention`` / ``memory`` / ``collective``. Totals are sums.
The modules that build them: blocks (GEMM, element-wise op, collective, norm, tensor-parallel entry and exit,
residual), attention, mamba, mlp_moe, eager, casts, lora, fsdp, embed_head, pipeline, linear_2d, summa, and
layers, which composes one layer of each kind; recompute says what selective recompute runs again and frees.

Sources:
- Saved activations per layer: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models"), §4 and Table 2: s·b·h·(34 + 5·a·s/h) bytes without parallelism; 10 + 24/t with tensor
  parallelism; 34/t with sequence parallelism; 5·a·s/h dropped by selective recompute; 2 with full recompute.
  Each op stores what that paper lists for it, generalised to GQA, SwiGLU and no-dropout models.
- Mixed-precision Adam: fp32 master weights and two moments, 12 bytes per parameter (Rajbhandari et al.
  2020, ZeRO §3); the optimizer's bytes are memory.py's (``OPTIMIZER_STATE``), not a record here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.collectives.comm import Collective
from meshplan.specs.layouts import layout_of
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num, minimum

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
    overlap: str = ""  # "" exposed; "tp", "cp", "summa": may hide behind compute (see step/passes.py)
    repeat: Num = 1.0  # a collective sent this many times (SUMMA panels), each of ``nbytes``
    # attention kernel: "flash_causal" / "flash" (one fused kernel: time = roofline.work_time(compute, memory)) or
    # "unfused" (batched score GEMMs and a separate softmax kernel: times add). m, n, k: queries·heads, keys, head dim.
    # GEMMs: "bf16" for one kept in 16 bits under a low-precision plan. Casts: "block_scaled" for the
    # quantization to a block-scaled format (MXFP8, NVFP4), whose kernel is slower than its bytes (efficiency.py)
    variant: str = ""
    # a grouped GEMM (MoE experts: one GEMM per local expert, run as one grouped kernel): m, n, k are the shape
    # of one group, ``groups`` of them; FLOPs and bytes are the totals. Flash attention: the kernel calls the op
    # is split into (ring context parallelism: one per step, each over n / groups keys)
    groups: Num = 1.0
    kernel: str = ""  # flash attention: the kernel family of the stack (stack.attention_kernel), efficiency.py
    window: Num = 0.0  # flash attention in a sliding window of this many keys (ModelSpec.sliding_window); 0: none
    # kernels the host launches one by one with the GPU waiting on it (the per-expert MoE path right after the
    # tokens-per-expert sync, mlp_moe.host_launched): the op takes at least launches × ``launch_host``
    # (roofline.op_time)
    launches: Num = 0.0
    # host seconds, on an x86 DGX host, to issue each of ``launches``: the stack's cost per kernel
    # (HostCost.per_kernel), times what the module that issues it costs beyond a kernel (mlp_moe.EXPERT_KERNELS)
    launch_host: Num = 0.0
    # a kernel a release runs at this many times the time its work takes (a regression its maintainers state:
    # Stack.dglu_slowdown, cost/mlp_moe.dglu_regressed); roofline.op_time multiplies its time
    slowdown: Num = 1.0
    # kernels the record stands for when the stack launches them one by one (an eager aten op sequence of
    # cost/eager.py: one per aten op; unfused attention's GEMMs and softmax): the GPU pays a t₀ for each
    # (roofline.overhead) and the host issues each (step/passes.launches)
    kernels: Num = 1.0
    # a GEMM: the elements, a power of two up to ``ALIGN_MAX``, that divide every leading dimension of its operands
    # and result (row-major activations: the weight's two dims, in every pass; never the token count), which sets
    # whether the library's 16-byte-aligned tensor-core kernels can run it (roofline.compute_time, specs/alignment.py)
    align: Num = 32.0
    # seconds the host spends on the record beyond its launches, at the cluster's host speed: a framework's Python
    # that launches no kernel (DeepSpeed ZeRO-3's module hooks, cost/wrapper_work.py); the host's timeline only
    # (step/host.py), no GPU time
    host: Num = 0.0


def same_record(a: OpCost, b: OpCost) -> bool:
    """Whether two records hold the same values, field for field, of the same types, numbers bit for bit (-0.0 is not
    0.0; arrays also of one shape and layout, as NumPy's vector and scalar loops may differ in the last bit), any other
    value the same object or an equal string or tuple: whatever prices one prices the other alike."""
    if type(a) is not type(b):
        return False
    for name in OpCost.__slots__:
        x, y = getattr(a, name), getattr(b, name)
        if x is y:
            continue
        if type(x) is not type(y):
            return False
        if isinstance(x, np.ndarray):
            if (x.shape != y.shape or x.dtype != y.dtype or x.strides != y.strides or x.dtype.kind not in "biuf"
                    or not bool((x.view(f"u{x.dtype.itemsize}") == y.view(f"u{y.dtype.itemsize}")).all())):
                return False
        elif isinstance(x, (float, int, np.number)):
            if np.asarray(x).tobytes() != np.asarray(y).tobytes():
                return False
        elif not (isinstance(x, (str, tuple)) and x == y):
            return False
    return True


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
    eager: bool = False  # stack.fusion_mode.per_op: one kernel per aten op


def token_rows(model: ModelSpec, plan: Plan) -> tuple[Num, Num]:
    """T = b·s/(c·tp2) rows per GPU under the summa layout (its tp2 splits the sequence), b·s/c otherwise (the tp2d
    layout's tp2 splits features); Tsp = T/t where the residual stream is sharded t-ways (sequence parallelism, or
    the 2D layouts' feature split of h over tp)."""
    layout = layout_of(plan.tensor_layout)
    rows_split = plan.tp2 if layout.rows_split else 1
    tokens = plan.micro_batch * model.seq_length / (plan.cp * rows_split)
    sharded = plan.sequence_parallel or layout.grid
    return tokens, tokens / plan.tp if sharded else tokens


def dims(model: ModelSpec, plan: Plan, stack: Stack) -> Dims:
    """The rows (``token_rows``) and sizes the ops of one micro-batch on one GPU see, and the stack that runs them."""
    tokens, tokens_sp = token_rows(model, plan)
    return Dims(tokens=tokens, tokens_sp=tokens_sp, tp=plan.tp, seq=model.seq_length,
                micro_batch=plan.micro_batch, grad_bytes=plan.grad_bytes, dropout=model.dropout, stack=stack,
                eager=stack.fusion_mode.per_op)


ALIGN_MAX = 32.0  # elements: 16 bytes of the narrowest GEMM operand meshplan prices (NVFP4, half a byte)


def alignment(*sizes: Num) -> Num:
    """The largest power of two, at most ``ALIGN_MAX``, that divides every one of ``sizes`` (1 for a fractional
    size: a dimension split unevenly): a GEMM's ``align`` from its operands' leading dimensions."""
    plain = [x for x in sizes if type(x) in (int, float)]
    out: Num = ALIGN_MAX
    if plain:
        best = int(ALIGN_MAX)
        for x in plain:
            while best > 1 and x % best:
                best //= 2
        out = float(best)
    for x in sizes:  # the batch's arrays (the search's: every size whole, ``_whole_aligned``)
        if type(x) not in (int, float):
            out = minimum(out, _aligned(np.asarray(x, dtype=float)))
    return out


def _aligned(a: np.ndarray) -> Num:
    """``alignment`` of each size of ``a``. Where every one is a whole number below 2^62 (an int64), the lowest set bit
    of n | ``ALIGN_MAX``, which is that of n capped at ``ALIGN_MAX`` and ``ALIGN_MAX`` for 0: a third of the NumPy
    calls of the general case below, the same numbers (tests/test_gemm_alignment.py)."""
    if bool(((np.floor(a) == a) & (np.abs(a) < 2.0**62)).all()):
        n = a.astype(np.int64) | int(ALIGN_MAX)
        return (n & -n).astype(float)
    whole = np.isfinite(a) & (a == np.floor(a))
    small = whole & (np.abs(a) < 2.0**62)  # a float past 2^62 steps by 2^10: a multiple of 32
    n = np.where(small, a, 1.0).astype(np.int64)
    # an integer's largest power-of-two divisor is its lowest set bit (n & -n); 0 divides by every power
    own = np.where((n == 0) | (whole & ~small), ALIGN_MAX, np.minimum(n & -n, int(ALIGN_MAX)))
    return np.where(whole, own.astype(float), 1.0)
