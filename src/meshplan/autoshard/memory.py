"""Memory per device under a sharding: the traced step's liveness (trace/liveness.py) with every storage at the
share of it a device holds.

A storage created by an op takes the placement its creator's strategy gives the result (a Partial result is held
whole); a parameter, input or buffer takes its source node's; a parameter's gradient and its Adam state take the
parameter's (the gradient after its reduction: the unreduced gradient of one parameter while it is reduced is not
counted); the state is memory.OPTIMIZER_STATE's, with an fp32 master copy beside 16-bit parameters (mixed precision,
as estimate counts it: Adam 12 bytes, 6 x a bf16 parameter's) and the parameter its own master at fp32 or wider
(torch.optim: Adam 2 x; trace/liveness.optimizer_per_byte). Lifetimes are the trace's (liveness.lifetimes): the
ideal allocator that frees each tensor after its last use. With every tensor replicated this is exactly
``trace.liveness.peak_memory`` (tests/test_autoshard_models.py).

A model traced with fewer layers than it has (blocks.Group.layers > traced) adds, at every op, the persistent
bytes (parameters, gradients, optimizer state) and the activations saved for the backward pass of the blocks it
did not trace: exact when all saved activations are live (the end of the forward pass, where a training step's
peak usually is), an upper bound elsewhere.

Each point's memory is linear in the strategy variables (``row``), so the integer program constrains it directly:
at the unsharded peak and the end of the forward pass first, then at each point where a solution's own peak
exceeded the limit (solve.py adds them until none does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.autoshard.problem import Problem
from meshplan.trace.liveness import lifetimes, optimizer_per_byte


@dataclass(frozen=True, kw_only=True)
class DeviceMemory:
    peak: float  # bytes per device
    index: int  # op at the peak
    timeline: np.ndarray  # bytes per device during each op


class Accounting:
    """Per storage of the trace: the template node deciding its share and the bytes per strategy."""

    def __init__(self, problem: Problem, optimizer: str | None = None) -> None:
        self.problem = problem
        trace = problem.flow.trace
        self.spans = lifetimes(trace)
        self.vectors: dict[int, tuple[int, np.ndarray]] = {}  # storage -> (node key, bytes per strategy)
        created: dict[int, tuple[int, np.ndarray]] = {}
        for key, node in problem.nodes.items():
            for sid in {s for c in node.created for s in c}:
                created[sid] = (key, np.array([c.get(sid, 0.0) for c in node.created]))
        self._map_storages(created)
        name = optimizer or problem.optimizer_name  # the one the problem prices the step of
        self.state = 1.0 + optimizer_per_byte(trace, name, master=None)[0]  # a parameter and its state
        self.extra_rows = self._extension()

    def _map_storages(self, created: dict[int, tuple[int, np.ndarray]]) -> None:
        problem, trace = self.problem, self.problem.flow.trace
        n = len(trace.ops)
        for op in trace.ops:
            twin = trace.ops[problem.template[op.index]]
            for t, tt in zip(op.outputs, twin.outputs, strict=True):
                if trace.storages[t.storage].created == op.index and tt.storage in created:
                    self.vectors[t.storage] = created[tt.storage]
        for number, src in enumerate(problem.flow.sources):
            tkey = problem.template[n + number]
            tsrc = problem.flow.sources[tkey - n]
            if tsrc.storage in created:
                self.vectors[src.storage] = created[tsrc.storage]
        params = {s.storage: n + i for i, s in enumerate(problem.flow.sources) if s.role == "param"}
        for param, grad in trace.grad_of.items():
            if param in self.vectors and param in params:
                key, vec = self.vectors[param]
                ratio = trace.storages[grad].nbytes / max(trace.storages[param].nbytes, 1)
                self.vectors[grad] = (key, vec * ratio)

    def _factor(self, sid: int) -> float:
        return self.state if self.problem.flow.trace.storages[sid].role == "param" else 1.0

    def _extension(self) -> dict[int, np.ndarray]:
        """Bytes of the untraced blocks (module docstring), per template node, at every op."""
        rows: dict[int, np.ndarray] = {}
        trace, end = self.problem.flow.trace, self.problem.flow.trace.forward_end
        for group in self.problem.blocks.groups:
            extra = group.layers - group.traced
            if extra <= 0:
                continue
            block = set(group.blocks[0])
            for sid, (a, b) in self.spans.items():
                if sid not in self.vectors:
                    continue
                storage = trace.storages[sid]
                inside = storage.created in block or (storage.role in ("param", "grad") and self._reads(sid, block))
                if inside and (storage.role in ("param", "grad") or (a <= end < b and storage.role == "activation")):
                    key, vec = self.vectors[sid]
                    rows[key] = rows.get(key, 0.0) + extra * self._factor(sid) * vec
        return rows

    def _reads(self, sid: int, block: set[int]) -> bool:
        trace = self.problem.flow.trace
        param = next((p for p, g in trace.grad_of.items() if g == sid), sid)
        return any(t.storage == param for i in block for t in trace.ops[i].inputs)

    def row(self, point: int) -> dict[int, np.ndarray]:
        """Bytes per device live during op ``point``, as coefficients of each node's strategies."""
        row: dict[int, np.ndarray] = {k: v.copy() for k, v in self.extra_rows.items()}
        for sid, (a, b) in self.spans.items():
            if a <= point <= b and sid in self.vectors:
                key, vec = self.vectors[sid]
                row[key] = row.get(key, 0.0) + self._factor(sid) * vec
        return row

    def evaluate(self, choice: dict[int, int]) -> DeviceMemory:
        """The liveness timeline per device under ``choice`` (template node -> strategy)."""
        n = len(self.problem.flow.trace.ops)
        delta = np.zeros(n + 1)
        for sid, (a, b) in self.spans.items():
            if sid in self.vectors:
                key, vec = self.vectors[sid]
                nbytes = self._factor(sid) * vec[choice[key]]
            else:  # a storage no node decides (an unused constant): whole on every device
                nbytes = float(self.problem.flow.trace.storages[sid].nbytes)
            delta[a] += nbytes
            delta[b + 1] -= nbytes
        base = sum(float(v[choice[k]]) for k, v in self.extra_rows.items())
        timeline = np.cumsum(delta[:n]) + base
        index = int(np.argmax(timeline)) if n else 0
        return DeviceMemory(peak=float(timeline[index]) if n else base, index=index, timeline=timeline)
