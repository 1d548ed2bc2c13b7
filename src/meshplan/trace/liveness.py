"""Peak memory of a traced step by liveness analysis over its storages (no torch needed).

A storage is live from the op that creates it to the last op that reads or writes it (any view of it counts,
since views share the storage id). During op i its inputs and outputs are both live:

    live(i) = Σ nbytes(s) over storages s with created(s) ≤ i ≤ last_use(s)

Persistent storages are live for the whole step: parameters, buffers and the example inputs (held by the
caller), and parameter gradients from their creation to the end of the step (PyTorch's default
``zero_grad(set_to_none=True)`` frees them before the next forward pass). Saved-for-backward activations need
no special case: their last use is the backward op that reads them. Optimizer state (Adam's exp_avg and
exp_avg_sq: 2 × the parameter bytes, torch.optim.Adam) is a constant added to every op.

This is the ideal an allocator reaches when every tensor is freed right after its last use; eager PyTorch
frees a tensor when its last Python / autograd reference goes, which can be a little later (the
measured CPU run in tests/test_trace.py shows by how much), and the CUDA caching allocator adds fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.trace.graph import Trace

PERSISTENT = ("param", "buffer", "input")
OPTIMIZER_STATE = {"adam": 2.0, "adamw": 2.0, "sgd": 0.0, "momentum": 1.0, "none": 0.0}  # × parameter bytes


@dataclass(frozen=True, kw_only=True)
class PeakMemory:
    peak: int  # bytes, including optimizer state
    index: int  # op at which the peak occurs
    op_name: str
    phase: str
    breakdown: dict[str, int] = field(hash=False)  # role (graph.ROLES) + "optimizer" -> bytes live at the peak
    timeline: tuple[int, ...] = field(repr=False)  # live bytes during each op, optimizer state included
    saved: int  # activation bytes live when the forward pass ends (kept for the backward pass)


def lifetimes(trace: Trace) -> dict[int, tuple[int, int]]:
    """storage id -> (first op, last op) during which it is live."""
    last = len(trace.ops) - 1
    first_use: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for op in trace.ops:
        for t in (*op.inputs, *op.outputs):
            first_use.setdefault(t.storage, op.index)
            last_use[t.storage] = op.index
    spans = {}
    for sid, s in trace.storages.items():
        if s.role in PERSISTENT:
            spans[sid] = (0, last)
        elif s.role == "grad":
            spans[sid] = (max(s.created, 0), last)
        elif s.created >= 0:
            spans[sid] = (s.created, last_use.get(sid, s.created))
        else:  # existed before and is not a parameter / buffer / input: a constant the model built
            spans[sid] = (first_use.get(sid, 0), last_use.get(sid, 0))
    return spans


def peak_memory(trace: Trace, optimizer: str = "adam") -> PeakMemory:
    """The largest ``live(i)`` (first one on ties) and what is live then."""
    if optimizer not in OPTIMIZER_STATE:
        raise ValueError(f"optimizer={optimizer!r} must be one of {', '.join(OPTIMIZER_STATE)}")
    n = len(trace.ops)
    opt = int(OPTIMIZER_STATE[optimizer] * trace.param_bytes)
    spans = lifetimes(trace)
    delta = [0] * (n + 1)
    for sid, (a, b) in spans.items():
        delta[a] += trace.storages[sid].nbytes
        delta[b + 1] -= trace.storages[sid].nbytes
    timeline, live = [], opt
    for i in range(n):
        live += delta[i]
        timeline.append(live)
    index = max(range(n), key=lambda i: (timeline[i], -i)) if n else 0
    breakdown = {"optimizer": opt}
    saved = 0
    for sid, (a, b) in spans.items():
        s = trace.storages[sid]
        if a <= index <= b:
            breakdown[s.role] = breakdown.get(s.role, 0) + s.nbytes
        if s.role == "activation" and a <= trace.forward_end < b:
            saved += s.nbytes
    op = trace.ops[index] if n else None
    return PeakMemory(peak=timeline[index] if n else opt, index=index, op_name=op.name if op else "",
                      phase=op.phase if op else "", breakdown=breakdown, timeline=tuple(timeline), saved=saved)
