"""Low-precision GEMMs (fp8, MXFP8, NVFP4; Transformer Engine): the quantization of each GEMM's operands and
the smaller saved inputs (byte sizes: records.LOW_PRECISION_BYTES)."""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.records import ACT_BYTES, LOW_PRECISION_BYTES, OpCost
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num


def quantize_bytes(plan: Plan, stack: Stack) -> float:
    """HBM bytes per element to quantize a GEMM operand (``low_precision_casts``): read the 16-bit tensor (twice
    when its scale comes from its own amax) and write a row-wise and a column-wise low-precision copy."""
    low = LOW_PRECISION_BYTES[plan.precision]
    amax = plan.precision == "fp4" or (plan.precision == "fp8" and stack.fp8_scaling_mode.current)
    return ACT_BYTES * (2 if amax else 1) + 2 * low


BLOCK_SCALED = ("mxfp8", "fp4")  # formats with a scale per block of 32 / 16 elements
SIXTEEN_BIT = ("bf16", "ssd")  # GEMM variants outside the low-precision region (the LM head, Mamba's SSD products)


def cast(name: str, phase: str, elems: Num, plan: Plan, stack: Stack, launches: Num = 0.0) -> OpCost:
    """The quantization of ``elems`` elements of a GEMM operand before the GEMM ``name`` (``quantize_bytes``)."""
    variant = "block_scaled" if plan.precision in BLOCK_SCALED else ""
    return OpCost(name + "/cast", phase, "memory", 0.0, quantize_bytes(plan, stack) * elems, launches=launches,
                  launch_host=stack.host.per_kernel, variant=variant)


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
    if not stack.loss.eager and plan.finetune != "lora":
        ops = [replace(op, saved=op.saved * low / ACT_BYTES)
               if op.kind == "gemm" and op.phase == "fwd" and op.variant not in SIXTEEN_BIT else op for op in ops]
    return ops + casts
