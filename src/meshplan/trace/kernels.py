"""Graph-level effects, op by op: how many kernels eager mode launches for an op, the fixed host / launch seconds
each kernel pays, and the fused chain it would belong to under a fusing compiler (fusion.py) with its share of
that chain's single kernel's time. These are the columns that explain eager against fused in ``trace``'s and
``check-step``'s per-op tables. No torch here.

Fixed cost per kernel: the accelerator's fitted t₀ (roofline.overhead: ``gemm_overhead`` for tensor-core
kernels, ``attention_overhead`` for flash attention where the attention rate was measured, ``kernel_overhead`` for
the rest; a calibrated system has them, the presets 0). A fused chain is one
memory-bound kernel: its FLOPs and the bytes it moves from memory (fusion.fused), timed by the same roofline
(one t₀), shared among its ops in proportion to the bytes each moved in eager mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meshplan.cost.records import OpCost
from meshplan.roofline import op_time, overhead
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Accelerator
from meshplan.trace.cost import TimedOp
from meshplan.trace.fusion import fused, fusion_groups
from meshplan.trace.graph import Trace


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelRow:
    """One timed op's graph-level columns."""

    launches: int  # kernels eager mode launches for it (views: none)
    overhead: float  # fixed seconds its kernels pay (in its time already)
    group: int  # fused chain (-1: none)
    fused: float  # its share of the chain's fused time (its own time when not in a chain)


def kernel_rows(trace: Trace, timed: Sequence[TimedOp], acc: Accelerator, eff: Efficiency = DEFAULT,
                ) -> dict[int, KernelRow]:
    """op index → KernelRow for every timed op."""
    groups = fusion_groups(trace.ops)
    chains = {c.id: c for c in fused(trace.ops, groups)}
    own = {t.op.index: t for t in timed}
    chain_time = {g: float(op_time(OpCost(f"fused/{g}", "fwd", "memory", c.flops, c.nbytes), acc, "fp32", eff))
                  for g, c in chains.items()}
    eager_bytes = {g: sum(trace.ops[i].nbytes for i in c.ops) or 1.0 for g, c in chains.items()}
    rows = {}
    for index, t in own.items():
        g = groups[index] if groups[index] in chains else -1
        share = chain_time[g] * t.op.nbytes / eager_bytes[g] if g >= 0 else t.seconds
        rows[index] = KernelRow(launches=int(t.cost.kernels), overhead=float(overhead(t.cost, acc)), group=g,
                                fused=share)
    return rows


def fused_summary(rows: dict[int, KernelRow]) -> tuple[int, int, float]:
    """(kernels eager, kernels fused, seconds fused) over ``rows``."""
    eager = sum(r.launches for r in rows.values())
    chains = {r.group for r in rows.values() if r.group >= 0}
    alone = sum(r.launches for r in rows.values() if r.group < 0)
    return eager, alone + len(chains), sum(r.fused for r in rows.values())
