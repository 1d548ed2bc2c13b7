"""Op signatures: the distinct calls of a traced step (same aten op, arguments, shapes, strides and dtypes), each
with the ops that make it. A signature is what replay.py measures once; every op that shares it is predicted
from that one measurement (TASO, Jia et al. SOSP 2019, §6: "the cost of each operator is measured once per
configuration and cached"; seed 002, MetaFlow: a graph's time from measuring a few representative operators).

No torch here: signatures are read from the trace's records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from meshplan.trace.graph import TensorInfo, TracedOp


@dataclass(frozen=True, kw_only=True, slots=True)
class Signature:
    """One distinct call: ``count`` ops of the step make it (``indices``: their positions in the op list)."""

    key: str
    target: str  # "aten.addmm.default"
    call: str  # TracedOp.call
    inputs: tuple[TensorInfo, ...]
    kind: str
    indices: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.indices)

    @property
    def replayable(self) -> bool:
        """Whether replay can rebuild the call: its arguments were recorded and none is opaque."""
        return bool(self.call) and '"opaque"' not in self.call


def tensor_key(t: TensorInfo) -> str:
    return f"{'x'.join(map(str, t.shape))}:{','.join(map(str, t.stride))}+{t.offset}:{t.dtype}"


def signature_key(op: TracedOp) -> str:
    """Target, call and every input's shape, strides, offset and dtype (views of one storage are not told apart
    from separate tensors: a replayed call gets one buffer per input)."""
    return "|".join([op.target, op.call, *(tensor_key(t) for t in op.inputs)])


def signatures(ops: Iterable[TracedOp]) -> list[Signature]:
    """The distinct signatures of ``ops``, in order of first appearance."""
    found: dict[str, list[int]] = {}
    first: dict[str, TracedOp] = {}
    for i, op in enumerate(ops):
        key = signature_key(op)
        found.setdefault(key, []).append(i)
        first.setdefault(key, op)
    return [Signature(key=key, target=first[key].target, call=first[key].call, inputs=first[key].inputs,
                      kind=first[key].kind, indices=tuple(idx)) for key, idx in found.items()]
