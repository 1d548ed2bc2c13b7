"""The traced op graph: flat, frozen records, no torch objects (capture.py builds them; everything else reads them).

One ``TracedOp`` per aten op that ran, forward and backward, in execution order. Tensors are described by a
``TensorInfo`` that names their *storage* (an integer id, unique for the whole trace), so views and in-place
results point at the storage they alias and memory is never counted twice. Each storage appears once in
``Trace.storages`` with its size and role:

    param       a parameter of the module (persistent)
    buffer      a registered buffer (persistent)
    input       an example input (held by the caller for the whole step)
    grad        a parameter gradient returned by the backward pass (lives from its creation to the step end)
    activation  created in the forward pass (freed after its last use, which may be in the backward pass)
    temporary   created in the backward pass and not a parameter gradient

Phases follow the cost records (cost/records.py): ``fwd``; ``bwd_x`` (input gradients); ``bwd_w`` (ops whose results
reach a parameter gradient without leaving their autograd node, i.e. the weight-gradient GEMMs and bias reductions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PHASES = ("fwd", "bwd_x", "bwd_w")
ROLES = ("param", "buffer", "input", "grad", "activation", "temporary")
KINDS = ("gemm", "attention", "memory", "view")


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorInfo:
    """One tensor argument or result of an op: shape, dtype and the storage it lives in."""

    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch.": "float32", "bfloat16", "int64"
    itemsize: int
    storage: int  # id of the storage in Trace.storages
    stride: tuple[int, ...] = ()  # elements; () when not recorded (a record made by hand)
    offset: int = 0  # storage offset, elements

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of this tensor's elements (a view covers part of its storage)."""
        return self.numel * self.itemsize


@dataclass(frozen=True, kw_only=True, slots=True)
class Storage:
    """One allocation: ``nbytes`` bytes, created by op ``created`` (-1: existed before the trace)."""

    id: int
    nbytes: int
    role: str
    created: int = -1


@dataclass(frozen=True, kw_only=True, slots=True)
class TracedOp:
    """One aten op as it ran. FLOPs and bytes are for this op alone; ``flops_source`` says who counted them:
    ``flop_counter`` (torch.utils.flop_counter's registered formula), ``meshplan`` (flops.py's own formula) or
    ``none`` (no arithmetic counted: data movement only)."""

    index: int
    name: str  # module path + "/" + op, e.g. "transformer.h.0.attn.c_attn/addmm"
    target: str  # "aten.addmm.default"
    phase: str  # fwd | bwd_x | bwd_w
    kind: str  # gemm | attention | memory | view
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    flops: float
    flops_source: str
    bytes_read: float
    bytes_written: float
    # GEMM / attention shape for the efficiency model (records.OpCost): gemm (m×k)·(k×n) × groups (bmm batch);
    # attention m = batch·heads·queries, n = keys, k = head dim
    m: float = 0.0
    n: float = 0.0
    k: float = 0.0
    groups: float = 1.0
    causal: bool = False  # attention with a causal mask (flash kernels skip the masked half)
    module: str = ""  # module path (forward) or the module of the forward op this is the gradient of
    # the call as JSON (measure/replay.py rebuilds it on real tensors): arguments with each tensor as
    # {"tensor": i} (i indexes ``inputs``), dtypes, devices, layouts and memory formats as {"dtype": "float32"} …,
    # anything else that is not a number, string or None as {"opaque": type}; "" when not recorded
    call: str = ""
    tags: tuple[str, ...] = ()  # the aten op's tags that measure/fusion.py reads: "pointwise", "reduction"
    args: tuple[str, ...] = ()  # the schema name of each input (``mat1``, ``weight``; a list's tensors share one)
    results: tuple[int, ...] = ()  # each output's position in what the op returned (dropped Nones leave gaps)
    attrs: tuple[tuple[str, object], ...] = ()  # non-tensor arguments by schema name (dim, keepdim, groups …)

    def attr(self, name: str, default: Any = None) -> Any:  # a non-tensor argument: a number, a list, a string…
        return next((v for k, v in self.attrs if k == name), default)

    @property
    def nbytes(self) -> float:
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True, kw_only=True)
class Trace:
    """Everything one forward + backward pass did, in order."""

    name: str  # the module's class name
    ops: tuple[TracedOp, ...]
    storages: dict[int, Storage] = field(hash=False)
    params: int  # parameter count (tied parameters once)
    param_bytes: int
    forward_end: int  # index of the last forward op (the loss)
    module_calls: int = 0  # nn.Module forward calls in the forward pass, the root's included
    fused_dropout: int = 0  # SDPA calls with dropout traced as the GPU's fused kernel (trace/sdpa.py)
    grad_of: dict[int, int] = field(default_factory=dict, hash=False)  # parameter storage -> its gradient's
    names: dict[int, str] = field(default_factory=dict, hash=False)  # parameter / buffer storage -> its name

    def flops(self, phase: str | None = None, kind: str | None = None, source: str | None = None) -> float:
        """Sum of op FLOPs, optionally of one phase (``"bwd"`` = both backward phases), kind or source."""
        return sum(op.flops for op in self.ops
                   if (phase is None or op.phase == phase or (phase == "bwd" and op.phase != "fwd"))
                   and (kind is None or op.kind == kind) and (source is None or op.flops_source == source))

    def bytes_of(self, role: str) -> int:
        return sum(s.nbytes for s in self.storages.values() if s.role == role)
