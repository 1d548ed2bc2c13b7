"""Which element-wise chains a fusing compiler would make one kernel, and what that kernel would move.

The rule is TorchInductor's (Ansel et al., "PyTorch 2", ASPLOS 2024, §4.3: pointwise and reduction nodes fuse
vertically with their producers and horizontally with siblings; matrix multiplies, convolutions and other
library calls stay separate kernels, "extern kernels"), applied to the traced ops by data flow:

- fusible: pointwise ops (the aten ``pointwise`` tag), copies and casts, random draws (Inductor generates them
  in the kernel: Philox), and views, which only pass a storage on;
- a reduction (the ``reduction`` tag, norms, softmax, sums) joins the chain that feeds it and ends it: its output
  starts a new chain;
- everything else (GEMMs, convolutions, attention, gathers and scatters) is a barrier;
- chains do not cross phases (forward, backward, optimizer): Inductor compiles the forward and backward graphs
  separately (AOTAutograd), and the optimizer step as its own graph.

A fused chain reads each input from outside the chain once and writes only what is used outside it (read by a
later op outside the chain, e.g. an activation saved for the backward pass, or a storage that existed before the
step: parameters, gradients, optimizer state); what flows inside it stays in registers. Eager PyTorch launches
one kernel per op and round-trips every intermediate through memory; the difference, op by op, is the eager vs
fused columns of check-step's and trace's per-op tables. No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meshplan.trace.classes import op_class
from meshplan.trace.graph import TracedOp

FUSIBLE = ("pointwise", "copy", "random")
REDUCING = ("reduction", "norm", "softmax")


@dataclass(frozen=True, kw_only=True)
class FusedGroup:
    """One fused kernel: its ops (indices), FLOPs and the bytes it reads and writes from memory."""

    id: int
    ops: tuple[int, ...]
    flops: float
    bytes_read: float
    bytes_written: float

    @property
    def nbytes(self) -> float:
        return self.bytes_read + self.bytes_written


def _phase(op: TracedOp) -> str:
    return "bwd" if op.phase.startswith("bwd") else op.phase


def fusion_groups(ops: Sequence[TracedOp]) -> list[int]:
    """The fused chain of each op (-1: a kernel of its own, or a view outside any chain)."""
    parent: dict[int, int] = {}

    def find(g: int) -> int:
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    producer: dict[int, int] = {}  # storage -> open chain that last wrote it
    closed: set[int] = set()
    phase_of: dict[int, str] = {}
    group = [-1] * len(ops)
    for i, op in enumerate(ops):
        cls = op_class(op)
        if cls == "view":
            continue
        if cls not in FUSIBLE and cls not in REDUCING:
            for t in op.outputs:
                producer.pop(t.storage, None)
            continue
        feeders = {find(producer[t.storage]) for t in op.inputs if t.storage in producer}
        feeders = {g for g in feeders if g not in closed and phase_of[g] == _phase(op)}
        if feeders:
            g = min(feeders)
            for other in feeders - {g}:
                parent[other] = g
        else:
            g = len(parent)
            parent[g] = g
            phase_of[g] = _phase(op)
        group[i] = g
        if cls in REDUCING:
            closed.add(g)
            for t in op.outputs:
                producer.pop(t.storage, None)
        else:
            for t in op.outputs:
                producer[t.storage] = g
    roots = {g: find(g) for g in parent}
    renumber: dict[int, int] = {}
    return [-1 if g < 0 else renumber.setdefault(roots[g], len(renumber)) for g in group]


def fused(ops: Sequence[TracedOp], groups: Sequence[int]) -> list[FusedGroup]:
    """Each chain with more than one op: its FLOPs and the bytes a single kernel would move."""
    readers: dict[int, set[int]] = {}
    created_in: dict[int, int] = {}
    for i, op in enumerate(ops):
        for t in op.inputs:
            readers.setdefault(t.storage, set()).add(i)
        if op_class(op) != "view":
            for t in op.outputs:
                created_in.setdefault(t.storage, i)
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        if g >= 0:
            members.setdefault(g, []).append(i)
    out = []
    for g, idx in members.items():
        if len(idx) < 2:
            continue
        inside = set(idx)
        written = {t.storage: t.nbytes for i in idx for t in ops[i].outputs}
        read: dict[int, float] = {}
        for i in idx:
            for t in ops[i].inputs:
                if t.storage not in written or created_in.get(t.storage, -1) not in inside:
                    read[t.storage] = max(read.get(t.storage, 0.0), t.nbytes)
        kept = {s: b for s, b in written.items()
                if (readers.get(s, set()) - inside) or created_in.get(s, -1) not in inside}
        out.append(FusedGroup(id=g, ops=tuple(idx), flops=sum(ops[i].flops for i in idx),
                              bytes_read=sum(read.values()), bytes_written=sum(kept.values())))
    return out
