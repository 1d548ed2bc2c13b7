"""Peak memory of a traced step by liveness analysis over its storages (no torch needed).

A storage is live from the op that creates it to the last op that reads or writes it (any view of it counts,
since views share the storage id). During op i its inputs and outputs are both live:

    live(i) = Σ nbytes(s) over storages s with created(s) ≤ i ≤ last_use(s)

Persistent storages are live for the whole step: parameters, buffers and the example inputs (held by the
caller), and parameter gradients from their creation to the end of the step (PyTorch's default
``zero_grad(set_to_none=True)`` frees them before the next forward pass). Saved-for-backward activations need
no special case: their last use is the backward op that reads them. Optimizer state is a constant added to every
op: memory.OPTIMIZER_STATE's, per byte of parameter by memory.per_parameter_byte: beside 16-bit parameters mixed
precision's (an fp32 master copy and the state: Adam's 12 bytes, 6 × a bf16 parameter's, as estimate counts them),
at fp32 torch.optim's updating the parameters in place (Adam's exp_avg and exp_avg_sq: 2 × the parameter bytes);
``master`` overrides the rule (check-step passes False: it runs torch.optim on the model as it is).
The optimizers are named as Plan.optimizer names them, ``momentum`` for ``sgd-momentum``, and ``none`` for no
optimizer at all (the forward and backward passes alone).

This is the ideal an allocator reaches when every tensor is freed right after its last use; eager PyTorch
frees a tensor when its last Python / autograd reference goes, which can be a little later (the
measured CPU run in tests/test_trace.py shows by how much), and the CUDA caching allocator adds fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.errors import SpecError
from meshplan.memory import MASTER_BYTES, OPTIMIZER_STATE, per_parameter_byte
from meshplan.trace.graph import Trace

PERSISTENT = ("param", "buffer", "input")
OPTIMIZER_ALIASES = {"momentum": "sgd-momentum"}  # the names ``trace --optimizer`` took before it took Plan.optimizer's
NO_OPTIMIZER = "none"  # no optimizer: no state, no step


def optimizer_name(name: str) -> str:
    """Plan.optimizer's name for ``name`` (an alias mapped), ``none`` kept; anything else refused in one line."""
    name = OPTIMIZER_ALIASES.get(name, name)
    if name != NO_OPTIMIZER and name not in OPTIMIZER_STATE:
        raise SpecError(f"optimizer={name!r} must be one of {', '.join((*OPTIMIZER_STATE, NO_OPTIMIZER))}")
    return name


def optimizer_per_byte(trace: Trace, optimizer: str, master: bool | None = None) -> tuple[float, float]:
    """(state, step traffic) per parameter byte of ``trace`` (memory.per_parameter_byte at the parameters' mean
    width). ``master`` None: mixed precision when the parameters are narrower than fp32 (the sharding planner's
    rule: a bf16 model trained as Megatron trains it, as estimate prices it)."""
    name = optimizer_name(optimizer)
    if name == NO_OPTIMIZER:
        return 0.0, 0.0
    width = param_width(trace)
    return per_parameter_byte(name, width, width < MASTER_BYTES if master is None else master)


def param_width(trace: Trace) -> float:
    """Bytes per element of the parameters the ops read (their bytes over their elements; fp32 when none is read)."""
    widths: dict[int, int] = {}
    for op in trace.ops:
        for t in op.inputs:
            s = trace.storages.get(t.storage)
            if s is not None and s.role == "param":
                widths.setdefault(t.storage, t.itemsize)
    elements = sum(trace.storages[s].nbytes / w for s, w in widths.items() if w)
    return sum(trace.storages[s].nbytes for s in widths) / elements if elements else float(MASTER_BYTES)


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


def peak_memory(trace: Trace, optimizer: str = "adam", master: bool | None = None) -> PeakMemory:
    """The largest ``live(i)`` (first one on ties) and what is live then; the optimizer's state as torch.optim keeps
    it, or as mixed precision does with ``master`` (None: by the parameters' width, ``optimizer_per_byte``)."""
    n = len(trace.ops)
    opt = int(optimizer_per_byte(trace, optimizer, master)[0] * trace.param_bytes)
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
