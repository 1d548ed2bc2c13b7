"""Reuse distance: how many bytes the step touches between two uses of the same memory (Mattson, Gecsei, Slutz &
Traiger, "Evaluation techniques for storage hierarchies", IBM Systems Journal 1970: an access hits a cache of
size C, LRU, when fewer than C distinct bytes were touched since the last access to the same data).

For each op, the bytes read and written by the ops between its inputs' last use and itself, weighted over its
inputs by their bytes. The step repeats, so the ops are walked twice and the second pass counts: a weight's last
use is then the previous step's weight-gradient and optimizer update, a whole step ago. Ops between are summed,
not de-duplicated (an upper bound on the distinct bytes: the same tensor read twice in between counts twice), and
views touch nothing. replay.py cycles each signature through enough copies of its inputs to span this distance,
so that the op finds its data as far down the memory hierarchy as it does in the step (a weight read in the
forward pass is out of every cache, the input of a pointwise op that the previous op wrote is in L2).

Optimizer ops run on storages the model trace names differently (trace/optimizer.py traces fake copies): the
storages they find already existing (parameters, gradients, the optimizer's state) were last touched about a
step ago, so they get ``outside`` (the step's total bytes); their own temporaries are measured within.
No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshplan.trace.graph import TracedOp


def reuse_distances(ops: Sequence[TracedOp], outside: float | None = None) -> list[float]:
    """Per op, the byte-weighted mean reuse distance of its inputs (the module docstring). With ``outside``
    None the sequence is cyclic (walked twice); else a storage first seen as an input is at ``outside`` bytes."""
    last: dict[int, float] = {}
    touched = 0.0
    dist = [0.0] * len(ops)
    for _ in range(1 if outside is not None else 2):
        for i, op in enumerate(ops):
            if op.kind == "view":
                continue
            weighted = weight = 0.0
            for t in op.inputs:
                seen = last.get(t.storage)
                d = outside if seen is None else touched - seen
                if d is None:  # first pass of a cyclic walk: not known yet
                    continue
                weighted += d * max(t.nbytes, 1)
                weight += max(t.nbytes, 1)
            dist[i] = weighted / weight if weight else (outside or touched)
            touched += op.nbytes
            for t in (*op.inputs, *op.outputs):  # touched by this op: the distance counts from its end
                last[t.storage] = touched
    return dist


def step_distances(trace_ops: Sequence[TracedOp], optimizer_ops: Sequence[TracedOp]) -> list[float]:
    """Reuse distances of a step's model ops (cyclic) then its optimizer ops (module docstring)."""
    total = sum(op.nbytes for op in (*trace_ops, *optimizer_ops) if op.kind != "view")
    return reuse_distances(trace_ops) + reuse_distances(optimizer_ops, outside=total)
