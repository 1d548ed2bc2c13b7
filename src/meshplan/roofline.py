"""Op time from its cost and the accelerator: the roofline (Williams, Waterman & Patterson 2009).

A kernel streams its HBM traffic while its math units work, so its time is the larger of the two
(seed 000: time = max(compute time, memory-access time)), each derated by the efficiency model
(efficiency.py). Tensor-core GEMMs run at the plan's precision (bf16, fp8 …); attention kernels at bf16;
element-wise math on the CUDA cores (fp32 rate), which memory bandwidth dominates anyway.
"""

from __future__ import annotations

from meshplan.comm import all_reduce_traffic
from meshplan.efficiency import Efficiency
from meshplan.hardware import Accelerator
from meshplan.ops import OpCost
from meshplan.xp import Num, maximum


def compute_time(op: OpCost, acc: Accelerator, precision: str, eff: Efficiency) -> Num:
    """Math time at the sustained clock: GEMMs at the plan's precision with their shape's efficiency,
    attention at the 16-bit rate (flash kernels: attention efficiency; unfused: batched score GEMMs),
    element-wise math at the fp32 CUDA-core rate."""
    clock = eff.clock(acc)
    if op.kind == "gemm":
        precision = "bf16" if op.variant == "bf16" else precision
        rate = acc.flops(precision) * clock * eff.mamf(acc, precision)
        return op.flops / (rate * eff.gemm_efficiency(op.m, op.n, op.k, acc.num_sms))
    if op.kind == "attention":
        if op.variant == "unfused":
            rate = acc.half_flops * clock * eff.mamf(acc, "bf16")
            return op.flops / (rate * eff.gemm_efficiency(op.m, op.n, op.k, acc.num_sms))
        rate = eff.attention_efficiency(op.k, op.n, backward=op.phase != "fwd", causal=op.variant == "flash_causal")
        return op.flops / (acc.half_flops * clock * rate)
    return op.flops / (acc.peak_flops.get("fp32", acc.half_flops / 16) * clock)


def memory_time(op: OpCost, acc: Accelerator, eff: Efficiency) -> Num:
    return op.nbytes / (acc.hbm_bandwidth * eff.memory)


def op_time(op: OpCost, acc: Accelerator, precision: str, eff: Efficiency) -> Num:
    """Seconds for a compute op: max(compute, memory) for one kernel that streams while it computes; the
    sum for unfused attention, whose score GEMMs and softmax are separate kernels (the scores round-trip
    through HBM between them)."""
    if op.variant == "unfused":
        return compute_time(op, acc, precision, eff) + memory_time(op, acc, eff)
    return maximum(compute_time(op, acc, precision, eff), memory_time(op, acc, eff))


def optimistic_time(ops: list[OpCost], acc: Accelerator, network_bandwidth: float, utilization: float = 0.8,
                    precision: str = "bf16", algorithm: str = "multicast") -> Num:
    """An upper bound on speed: FLOPs, HBM traffic and network traffic of all ``ops`` fully overlap.

    time = max(ΣFLOP / (u·peak), ΣHBM bytes / (u·HBM bandwidth), Σnetwork bytes / network bandwidth)
    The all-reduce traffic counts on both the network and HBM (it is read from and written to HBM); the
    derating u (thermal/clock throttling) applies to FLOP/s and HBM, not to the network (seed 001).
    """
    flops = sum((op.flops for op in ops if op.kind != "collective"), 0.0)
    hbm = sum((op.nbytes for op in ops if op.kind != "collective"), 0.0)
    net = sum((all_reduce_traffic(op.collective.nbytes, op.collective.group, algorithm)
               for op in ops if op.kind == "collective"), 0.0)
    compute = flops / (utilization * acc.flops(precision))
    memory = (hbm + net) / (utilization * acc.hbm_bandwidth)
    return maximum(maximum(compute, memory), net / network_bandwidth)
