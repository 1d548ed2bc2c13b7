"""A training step's time predicted op by op from a calibration, and its peak memory from the trace.

    step = Σ_ops kernel(op) + Σ_forward ops host(op) + module calls × module cost        (CPU: one thread of
                                                                                          execution, in turn)
    step = max(GPU, host)                                                                (GPU: the host issues
    GPU  = Σ_ops that launch a kernel max(kernel(op) − dispatch, 0)                       while kernels run)
    host = Σ host + modules + dispatch × launches + Σ_ops that launch none kernel(op) + glue − modules

On a GPU each replayed time holds one dispatch (replay.py calls the op from Python and synchronises), so the GPU's
timeline takes it out and the host's charges it once per launch (hostbound.py); an op that launches no kernel (a
view) is host work alone. ``glue``: the step's Python between its top-level torch calls (glue.py), measured on the
machine at hand; it holds the module calls that host.py prices, so only the rest is added (``extra_glue``).

The CPU prediction leaves the glue out, though a CPU step pays it too: each replayed time holds one call from
Python (``torch.ops``, host.py's ``dispatch``), which in the step only the top-level calls pay (the backward's
ops run from the engine's C++, a composite op's inner ops from the dispatcher), and on a small host-bound model
that surplus is as large as the glue (tests/test_host_dispatch.py's many small ops, on this project's AMD EPYC
host: measured 0.99 ms, predicted 1.05 ms without the glue, 1.56 ms with it: +6 % → +57 %). On the zoo the glue
helps (data/measured/2025-11-25's CPU run on an Intel Xeon, the glue measured on the AMD EPYC host,
data/measured/2026-11-26-cpu-glue-for-loop.json: median |error| 5.1 % → 1.6 %, largest 11.2 % → 9.6 %); until
the surplus per nested op is measured and taken out, the CPU prediction stays as it was. On a GPU the same surplus
sits in ``dispatch × launches``: there the step still reads too fast with the glue (docs/MEASURED_GPU.md).

kernel(op): its signature's replayed time (replay.py: the op alone, dispatch included, step-like cache
conditions); an op that could not be replayed takes the NNLS fit of its class over the replayed ones (t = t₀ +
bytes · β + FLOPs · γ, all ≥ 0: calibrate.fit.nnls). host(op): autograd recording a forward op that makes a
floating-point result, plus the engine's cost of running its backward node (host.py). The optimizer's ops are
traced (trace/optimizer.py) and replayed like the model's. Peak memory: the trace's liveness peak
(trace/liveness.py, Adam's two states), or the optimizer step's if higher (parameters, gradients, states and the
largest set of its temporaries alive at once), plus what stays allocated through the whole step without being a
traced tensor (on a GPU the cuBLAS / cuBLASLt workspaces: blas_workspace.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from meshplan.calibrate.fit import NnlsFit, nnls
from meshplan.errors import SpecError
from meshplan.measure.host import HostCosts
from meshplan.measure.signature import signature_key
from meshplan.trace.classes import op_class
from meshplan.trace.fusion import FusedGroup, fused, fusion_groups
from meshplan.trace.graph import Trace, TracedOp
from meshplan.trace.liveness import peak_memory


@dataclass(frozen=True, kw_only=True, slots=True)
class OpPrediction:
    """One op of the step: its predicted kernel and host seconds, how many kernels eager mode launches for it,
    and its fused chain (-1: none) with its share of that chain's fused time."""

    index: int
    op: TracedOp
    cls: str
    kernel: float
    host: float
    source: str  # replay | fit
    launches: int
    group: int = -1
    fused: float = 0.0  # this op's share (by bytes) of its chain's fused-kernel time; its own kernel if unfused

    @property
    def seconds(self) -> float:
        return self.kernel + self.host


@dataclass(frozen=True, kw_only=True)
class StepPrediction:
    """Every op's prediction and the step's totals."""

    ops: tuple[OpPrediction, ...]
    module_calls: int
    host: HostCosts
    serial: bool  # CPU: host and kernels take turns; GPU: they overlap
    peak_bytes: int
    fits: Mapping[str, NnlsFit] = field(default_factory=dict, hash=False)
    groups: tuple[FusedGroup, ...] = ()
    glue: float = 0.0  # the step's measured Python glue, seconds (glue.py); module calls included

    @property
    def extra_glue(self) -> float:
        """The glue beyond the module calls host.py already prices (never negative)."""
        return max(self.glue - self.module_calls * self.host.module, 0.0)

    @property
    def gpu_timeline(self) -> float:
        """The kernels' time on a GPU: each launching op's replayed time less its one dispatch."""
        d = self.host.dispatch
        return sum(max(p.kernel - d * p.launches, 0.0) for p in self.ops if p.launches)

    @property
    def host_timeline(self) -> float:
        """The host's time on a GPU: its work per op, per module call, per launch, the views, and the glue."""
        launches = sum(p.launches for p in self.ops)
        views = sum(p.kernel for p in self.ops if not p.launches)
        return self.host_seconds + self.host.dispatch * launches + views + self.extra_glue

    @property
    def kernels(self) -> float:
        return sum(p.kernel for p in self.ops)

    @property
    def host_seconds(self) -> float:
        return sum(p.host for p in self.ops) + self.module_calls * self.host.module

    @property
    def seconds(self) -> float:
        if self.serial:
            return self.kernels + self.host_seconds
        return max(self.gpu_timeline, self.host_timeline)

    @property
    def fused_seconds(self) -> float:
        """The step if every fusible chain were one kernel (the same host work: an estimate of the kernels)."""
        kernels = sum(p.fused for p in self.ops)
        return kernels + self.host_seconds if self.serial else max(kernels, self.host_seconds)

    def by(self, key: str) -> dict[str, float]:
        """Predicted seconds per op class (``"cls"``) or phase (``"phase"``), host work included."""
        out: dict[str, float] = {}
        for p in self.ops:
            k = p.cls if key == "cls" else p.op.phase
            out[k] = out.get(k, 0.0) + p.seconds
        return out


def class_fits(ops: Sequence[TracedOp], kernel: Sequence[float]) -> dict[str, NnlsFit]:
    """Per op class, t = t₀ + bytes·β + FLOPs·γ (non-negative) over its measured ops' distinct signatures."""
    points: dict[str, dict[str, tuple[float, float, float]]] = {}
    for op, t in zip(ops, kernel, strict=True):
        if math.isfinite(t) and t > 0:
            points.setdefault(op_class(op), {})[signature_key(op)] = (op.nbytes, op.flops, t)
    fits = {}
    for cls, pts in points.items():
        rows = list(pts.values())
        if len(rows) >= 3:
            fits[cls] = nnls([[1.0] * len(rows), [r[0] for r in rows], [r[1] for r in rows]], [r[2] for r in rows])
    return fits


def _fitted(op: TracedOp, fits: Mapping[str, NnlsFit], fallback: float) -> float:
    fit = fits.get(op_class(op))
    if fit is None:
        return fallback
    t0, per_byte, per_flop = fit.coefs
    return t0 + per_byte * op.nbytes + per_flop * op.flops


def _host(op: TracedOp, host: HostCosts) -> float:
    """Autograd's work for a forward op with a floating-point result: recording it and running its node."""
    if op.phase != "fwd" or not op.outputs or not op.outputs[0].dtype.startswith(("float", "bfloat")):
        return 0.0
    return host.autograd + host.engine


def predict_step(trace: Trace, optimizer_ops: Sequence[TracedOp], times: Mapping[str, float], host: HostCosts,
                 *, serial: bool = True, optimizer: str = "adamw", workspace: Mapping[str, int] | None = None,
                 resident: int = 0) -> StepPrediction:
    """The step's prediction from replayed signature times (``times``: signature key → seconds, NaN: not
    replayed); ``resident``: bytes held through the whole step beside the traced tensors (blas_workspace.py)."""
    ops = [*trace.ops, *optimizer_ops]
    if not ops:
        raise SpecError("the traced step has no ops")
    kernel = [times.get(signature_key(op), math.nan) for op in ops]
    fits = class_fits(ops, kernel)
    measured = sorted(t for t in kernel if math.isfinite(t))
    fallback = measured[len(measured) // 2] if measured else 0.0
    model_groups, opt_groups = fusion_groups(trace.ops), fusion_groups(optimizer_ops)
    shift = max(model_groups, default=-1) + 1  # the optimizer's chains numbered after the model's
    groups = model_groups + [g + shift if g >= 0 else -1 for g in opt_groups]
    chains = {g.id: g for g in fused(trace.ops, model_groups)}
    n = len(trace.ops)
    chains |= {g.id + shift: replace(g, id=g.id + shift, ops=tuple(i + n for i in g.ops))
               for g in fused(optimizer_ops, opt_groups)}
    rows = []
    for i, (op, k) in enumerate(zip(ops, kernel, strict=True)):
        source = "replay" if math.isfinite(k) else "fit"
        seconds = k if math.isfinite(k) else _fitted(op, fits, fallback)
        rows.append(OpPrediction(index=i, op=op, cls=op_class(op), kernel=seconds, host=_host(op, host),
                                 source=source, launches=0 if op.kind == "view" else 1,
                                 group=groups[i] if groups[i] in chains else -1))
    rows = _with_fused(rows, chains, fits)
    return StepPrediction(ops=tuple(rows), module_calls=trace.module_calls, host=host, serial=serial,
                          peak_bytes=predict_peak(trace, optimizer_ops, optimizer, workspace) + resident, fits=fits,
                          groups=tuple(chains.values()))


def _with_fused(rows: list[OpPrediction], chains: Mapping[int, FusedGroup], fits: Mapping[str, NnlsFit],
                ) -> list[OpPrediction]:
    """Each op's share of its chain's fused time: the pointwise class fit at the chain's bytes and FLOPs (one
    launch), split by the ops' eager bytes; unfused ops keep their own kernel time."""
    fit = fits.get("pointwise") or fits.get("copy")
    out = []
    for r in rows:
        chain = chains.get(r.group)
        if chain is None or fit is None:
            out.append(replace(r, fused=r.kernel))
            continue
        t0, per_byte, per_flop = fit.coefs
        whole = t0 + per_byte * chain.nbytes + per_flop * chain.flops
        eager = sum(rows[i].op.nbytes for i in chain.ops) or 1.0
        out.append(replace(r, fused=min(whole * r.op.nbytes / eager, r.kernel) if r.kernel > 0 else 0.0))
    return out


def predict_peak(trace: Trace, optimizer_ops: Sequence[TracedOp], optimizer: str = "adamw",
                 workspace: Mapping[str, int] | None = None) -> int:
    """max(liveness peak of forward + backward, each op's live bytes plus the workspace it allocates inside itself
    (replay.workspaces, by signature), optimizer step: held bytes + gradients + its live temporaries)."""
    mem = peak_memory(trace, optimizer, master=False)  # torch.optim updates the model's own parameters in place
    inside = 0
    if workspace:
        inside = max((live + workspace.get(signature_key(op), 0) for op, live in zip(trace.ops, mem.timeline,
                                                                                      strict=True)), default=0)
    held = (trace.param_bytes + trace.bytes_of("buffer") + trace.bytes_of("input") + trace.bytes_of("grad")
            + mem.breakdown.get("optimizer", 0))
    first: dict[int, str] = {}  # storage -> "held" (existed before the step) or "made" (an optimizer temporary)
    spans: dict[int, list[int]] = {}
    sizes: dict[int, int] = {}
    for i, op in enumerate(optimizer_ops):
        for t in op.inputs:
            if first.setdefault(t.storage, "held") == "made":
                spans[t.storage][1] = i
        for t in op.outputs:
            if first.setdefault(t.storage, "made") == "made":
                spans.setdefault(t.storage, [i, i])[1] = i
                sizes[t.storage] = max(sizes.get(t.storage, 0), t.nbytes)
    live = max((sum(sizes[s] for s, (a, b) in spans.items() if a <= i <= b) for i in range(len(optimizer_ops))),
               default=0)
    return max(mem.peak, inside, held + live)
