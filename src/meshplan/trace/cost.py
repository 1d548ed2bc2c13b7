"""Traced ops → meshplan OpCost records → time on an accelerator (roofline.py), no torch needed.

Each aten op is one kernel (eager execution, nothing fused), timed alone on one GPU with roofline.op_time:
its compute and memory times combined as the roofline does (their larger, or their p-norm near the ridge point:
roofline.work_time) per kernel, ops one after another (one CUDA stream: the sum is the step's compute time).
Simplifications, stated here:
- GEMMs run at their operands' precision (bf16 / fp16; float32 at the fp32 rate, PyTorch's default
  ``torch.backends.cuda.matmul.allow_tf32 = False``; pass ``fp32_precision="tf32"`` for TF32).
- Fused attention is timed as a flash kernel; causal attention does half the FLOPs flop_counter counts (the
  masked blocks are skipped: Dao et al. 2022, as attention.core_attention), backward kernels at the backward rate.
- Element-wise and data-movement ops: their FLOPs at the fp32 CUDA-core rate against their HBM bytes (read
  every input, write every output); views cost nothing. Kernel launch overhead (a few µs per kernel, which
  dominates small models in eager mode) is not included.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.records import ALIGN_MAX, OpCost, alignment
from meshplan.roofline import op_time
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Accelerator
from meshplan.trace.classes import aten_name, op_class
from meshplan.trace.graph import Trace, TracedOp
from meshplan.trace.launches import gpu_kernels

DTYPE_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


def precision(op: TracedOp, fp32_precision: str = "fp32") -> str:
    """The precision a GEMM of this op runs at: its first floating-point input's dtype."""
    dtype = next((t.dtype for t in op.inputs if t.dtype.startswith(("float", "bfloat"))), "float32")
    return DTYPE_PRECISION.get(dtype, fp32_precision)


def op_cost(op: TracedOp) -> OpCost:
    """The OpCost of one traced op (name, phase, kind, FLOPs, HBM bytes, GEMM / attention shape), with the kernels
    its GPU implementation launches (launches.py: SDPA's flash backward 3, LayerNorm's and softmax's backward 2)."""
    kernels = float(gpu_kernels(aten_name(op.target)))
    if op.kind == "attention":
        flops = op.flops / 2 if op.causal else op.flops
        return OpCost(op.name, op.phase, "attention", flops, op.nbytes, m=op.m, n=op.n, k=op.k,
                      variant="flash_causal" if op.causal else "flash", kernels=kernels)
    if op.kind == "gemm":
        return OpCost(op.name, op.phase, "gemm", op.flops, op.nbytes, m=op.m, n=op.n, k=op.k, groups=op.groups,
                      kernels=kernels, align=gemm_alignment(op))
    return OpCost(op.name, op.phase, "memory", op.flops, op.nbytes, kernels=kernels)


def gemm_alignment(op: TracedOp) -> float:
    """The elements that divide every leading dimension and storage offset of a traced GEMM's matrices, as the
    tensors were laid out (records.OpCost.align): a matrix's leading dimension is the stride of its last two dims
    that is not 1 (a transposed view's is its row count); a vector (a bias) has none. Untraced strides: aligned.
    A convolution's are its channels, its weight's output and per-group input channels: cuDNN moves the tensors to
    NHWC for the tensor cores (channels innermost) and needs those to be multiples of 8 16-bit elements (NVIDIA cuDNN
    Developer Guide, "Legacy API", Tensor Core operations, "Data and Filter Formats"), whatever the image's strides.
    A grouped (depthwise) convolution runs cuDNN's direct kernels, not a tensor-core GEMM: no alignment rule."""
    if op_class(op) == "conv" and "weight" in op.args:
        if dict(op.attrs).get("groups", 1) != 1:
            return ALIGN_MAX
        weight = op.inputs[op.args.index("weight")]
        if len(weight.shape) >= 2:
            return float(alignment(float(weight.shape[0]), float(weight.shape[1])))
    sizes: list[float] = []
    for t in (*op.inputs, *op.outputs):
        if len(t.shape) < 2 or not t.stride:
            continue
        sizes += [float(st) for st, dim in zip(t.stride[-2:], t.shape[-2:], strict=True) if st != 1 and dim > 1]
        sizes.append(float(t.offset))
    return float(alignment(*sizes)) if sizes else ALIGN_MAX


def op_costs(trace: Trace) -> list[OpCost]:
    """OpCost records of every op that does work (views dropped); totals are sums."""
    return [op_cost(op) for op in trace.ops if op.kind != "view"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TimedOp:
    op: TracedOp
    cost: OpCost
    seconds: float


def time_traced_ops(trace: Trace, accelerator: Accelerator, efficiency: Efficiency = DEFAULT,
             fp32_precision: str = "fp32") -> list[TimedOp]:
    """Every op that does work with its roofline time on one ``accelerator``, in execution order."""
    timed = []
    for op in trace.ops:
        if op.kind == "view":
            continue
        cost = op_cost(op)
        seconds = float(op_time(cost, accelerator, precision(op, fp32_precision), efficiency))
        timed.append(TimedOp(op=op, cost=cost, seconds=seconds))
    return timed
