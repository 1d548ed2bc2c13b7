"""``meshplan trace``: load a model factory, trace it, time it on a system; JSON or tables.

Bad input becomes a SpecError naming the field and the value (the CLI prints it as one line, exit 2); a
missing torch becomes MissingDependency with the install command.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from meshplan.errors import MissingDependency, SpecError
from meshplan.specs.hardware import Accelerator, load_system
from meshplan.trace.cost import TimedOp, time_traced_ops
from meshplan.trace.graph import Trace
from meshplan.trace.kernels import KernelRow, fused_summary, kernel_rows
from meshplan.trace.liveness import PeakMemory, optimizer_name, peak_memory
from meshplan.units import fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from rich.console import Console, JustifyMethod


def parse_shape(text: str) -> tuple[int, ...]:
    """``"2x32"`` → (2, 32)."""
    try:
        shape = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise SpecError(f"input-shape={text!r} must be positive integers separated by 'x' (e.g. 2x32)")
    return shape


def user_code() -> contextlib.AbstractContextManager:
    """Around the user's code (importing a module, calling its factory, its forward): what it prints goes to stderr,
    so that ``--json`` keeps stdout one JSON object."""
    return contextlib.redirect_stdout(sys.stderr)


def load_factory(ref: str) -> Any:
    """``package.module:factory`` or ``path/to/model.py:factory`` → the factory (or an nn.Module object)."""
    with user_code():
        return _load_factory(ref)


def _load_factory(ref: str) -> Any:
    where, sep, attr = ref.rpartition(":")
    if not sep or not where or not attr:
        raise SpecError(f"model={ref!r} must be MODULE:FACTORY (e.g. mypkg.models:make_model or model.py:make)")
    path = Path(where)
    if where.endswith(".py") and not path.is_file():
        raise SpecError(f"model={ref!r}: no such file {where!r}")
    try:
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(f"_meshplan_trace_{path.stem}", path)
            assert spec is not None and spec.loader is not None  # a .py file that exists: a source loader
            module = importlib.util.module_from_spec(spec)
            sys.path.insert(0, str(path.resolve().parent))  # the file may import its neighbours
            try:
                spec.loader.exec_module(module)
            finally:
                sys.path.remove(str(path.resolve().parent))
        else:
            module = importlib.import_module(where)
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            raise MissingDependency("torch", "torch") from None
        raise SpecError(f"model={ref!r}: no module named {exc.name!r}") from None
    except SyntaxError as exc:
        raise SpecError(f"model={ref!r}: syntax error in {exc.filename} line {exc.lineno}") from None
    except SystemExit as exc:  # the module calls sys.exit() at import (a script without a __main__ guard)
        raise SpecError(f"model={ref!r}: importing {where} called sys.exit({exc.code!r}); guard its script "
                        "code with if __name__ == '__main__'") from None
    except Exception as exc:  # noqa: BLE001  (the user's module raised while being imported)
        raise SpecError(f"model={ref!r}: importing {where} failed: {first_line(exc)}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SpecError(f"model={ref!r}: {where} has no attribute {attr!r}") from None


def build_from_factory(factory: Any, ref: str) -> Any:
    """The module, built inside FakeTensorMode (no memory) when the factory allows, else for real."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    if isinstance(factory, torch.nn.Module):
        model = factory
    else:
        with user_code():
            model = _build(factory, ref, FakeTensorMode)
    if not isinstance(model, torch.nn.Module):
        raise SpecError(f"model={ref!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _build(factory: Any, ref: str, fake_mode: Any) -> Any:
    try:
        with fake_mode(allow_non_fake_inputs=True):
            return factory()
    except (Exception, SystemExit):  # e.g. .item() in __init__: build it for real, then trace with fakes
        try:
            return factory()
        except (Exception, SystemExit) as exc:
            raise SpecError(f"model={ref!r}: the factory failed: {first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message (for a SpecError)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


@dataclass(frozen=True, kw_only=True)
class TraceReport:
    """A traced step on one GPU: the trace, each kernel's time, the liveness peak."""

    trace: Trace
    timed: list[TimedOp]
    memory: PeakMemory
    system: str
    accelerator: Accelerator
    inputs: tuple[tuple[tuple[int, ...], str], ...]

    @cached_property
    def kernels(self) -> dict[int, KernelRow]:
        """Graph-level columns per timed op (kernels.py: launches, fixed overhead, fused chain)."""
        return kernel_rows(self.trace, self.timed, self.accelerator)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.timed)

    def time_of(self, phase: str) -> float:
        return sum(t.seconds for t in self.timed if t.op.phase == phase)

    def to_dict(self, top: int) -> dict[str, Any]:
        tr, total = self.trace, self.seconds or 1.0
        ranked = sorted(self.timed, key=lambda t: -t.seconds)[:top]
        k = self.kernels
        eager, fused_kernels, fused_s = fused_summary(k)
        return {
            "model": tr.name, "params": tr.params, "system": self.system, "accelerator": self.accelerator.name,
            "inputs": [{"shape": list(s), "dtype": d} for s, d in self.inputs], "ops": len(tr.ops),
            "flops": {p: tr.flops(p) for p in ("fwd", "bwd_x", "bwd_w")} | {"total": tr.flops()},
            "gemm_flops": tr.flops(kind="gemm"), "attention_flops": tr.flops(kind="attention"),
            "time_s": {p: self.time_of(p) for p in ("fwd", "bwd_x", "bwd_w")} | {"total": self.seconds},
            "peak_memory_bytes": self.memory.peak,
            "peak_op": {"index": self.memory.index, "name": self.memory.op_name, "phase": self.memory.phase},
            "memory_breakdown": self.memory.breakdown, "saved_activation_bytes": self.memory.saved,
            "hbm_bytes": self.accelerator.hbm_bytes, "fused_dropout_attention": tr.fused_dropout,
            "kernels": {"eager": eager, "fused": fused_kernels, "fused_time_s": fused_s},
            "top_ops": [{"index": t.op.index, "name": t.op.name, "target": t.op.target, "phase": t.op.phase,
                         "kind": t.op.kind, "flops": t.op.flops, "bytes": t.op.nbytes, "time_s": t.seconds,
                         "share": t.seconds / total, "launches": k[t.op.index].launches,
                         "overhead_s": k[t.op.index].overhead, "fused_group": k[t.op.index].group,
                         "fused_s": k[t.op.index].fused} for t in ranked],
        }


def input_dtypes(model: Any, shapes: list[tuple[int, ...]], dtypes: tuple[str, ...], param_dtype: str | None
                 ) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each input: the ``--dtype`` given (one for all or one each), else token ids (int64) for a
    model with an embedding and the parameters' floating dtype for any other (a CNN takes float images: issue 48, an
    int64 default failed on a dtype clash); a floating input follows ``param_dtype`` when it is given, as the
    parameters it meets do."""
    import torch

    if not dtypes:
        embeds = any(isinstance(m, torch.nn.Embedding) for m in model.modules())
        floats = [p.dtype for p in model.parameters() if p.is_floating_point()]
        dtypes = ("int64",) if embeds or not floats else (str(floats[0]).removeprefix("torch."),)
    out = []
    for i, shape in enumerate(shapes):
        d = dtypes[i] if len(dtypes) > 1 else dtypes[0]
        if param_dtype is not None and d.startswith(("float", "bfloat", "half")):
            d = param_dtype
        out.append((shape, d))
    return out


def trace_report(ref: str, shapes: tuple[str, ...], dtypes: tuple[str, ...], system_ref: str,
                 param_dtype: str | None = None, optimizer: str = "adam") -> TraceReport:
    """Parse and check the arguments, build the model (fake when it can be), trace, time and find the peak."""
    parsed = [parse_shape(s) for s in shapes]
    if not parsed:
        raise SpecError("input-shape is required (e.g. --input-shape 2x32)")
    if dtypes and len(dtypes) not in (1, len(parsed)):
        given = " ".join(f"--dtype {d}" for d in dtypes)
        raise SpecError(f"{given}: give one --dtype or one per --input-shape ({len(parsed)} inputs)")
    optimizer = optimizer_name(optimizer)
    system = load_system(system_ref)
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        raise MissingDependency("torch", "torch") from None
    from meshplan.trace.capture import torch_dtype, trace_module

    for d in dtypes:
        torch_dtype(d)
    if param_dtype is not None:
        torch_dtype(param_dtype, "param-dtype")
    model = build_from_factory(load_factory(ref), ref)
    inputs = tuple(input_dtypes(model, parsed, dtypes, param_dtype))
    # FakeTensorMode logs the traceback of an op whose meta kernel fails before raising it; the one-line error
    # below says the same, so the log stays quiet
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        with user_code():
            trace = trace_module(model, inputs, param_dtype=param_dtype)
    except SpecError:
        raise
    except Exception as exc:
        shown = " ".join("x".join(map(str, s)) for s in parsed)
        raise SpecError(f"model={ref!r} failed on input-shape={shown}: {first_line(exc)}") from None
    finally:
        fake_log.setLevel(level)
    acc = system.accelerator
    return TraceReport(trace=trace, timed=time_traced_ops(trace, acc), memory=peak_memory(trace, optimizer),
                       system=system_ref, accelerator=acc, inputs=inputs)


def trace_tables(report: TraceReport, console: Console, top: int) -> None:
    """The summary (FLOPs, time, peak memory and where) and the top ops by time with their share, kernel
    launches, fixed overhead and fused chain (``top`` 0: every op in order)."""
    from rich.table import Table

    tr, mem, total = report.trace, report.memory, report.seconds or 1.0
    inputs = ", ".join(f"{'x'.join(map(str, s))} {d}" for s, d in report.inputs)
    summary = Table(title=f"{tr.name} ({fmt_count(tr.params)} params), input {inputs}, on one "
                    f"{report.accelerator.name}", show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    fwd = sum(1 for op in tr.ops if op.phase == "fwd")
    summary.add_row("aten ops", f"{len(tr.ops)} ({fwd} forward, {len(tr.ops) - fwd} backward; "
                    f"{len(report.timed)} kernels, the rest views)")
    summary.add_row("FLOPs", f"{fmt_count(tr.flops())} = forward {fmt_count(tr.flops('fwd'))} + backward "
                    f"{fmt_count(tr.flops('bwd'))} (GEMM {fmt_count(tr.flops(kind='gemm'))}, attention "
                    f"{fmt_count(tr.flops(kind='attention'))})")
    summary.add_row("time (fwd+bwd)", f"{fmt_time(report.seconds)} = forward {fmt_time(report.time_of('fwd'))} + "
                    f"input grads {fmt_time(report.time_of('bwd_x'))} + weight grads "
                    f"{fmt_time(report.time_of('bwd_w'))} (roofline per kernel, no launch overhead)")
    cap = report.accelerator.hbm_bytes
    summary.add_row("peak memory", f"{fmt_bytes(mem.peak)} of {fmt_bytes(cap)} at op {mem.index} {mem.op_name} "
                    f"({mem.phase})" + ("" if mem.peak <= cap else "  DOES NOT FIT"))
    summary.add_row("at the peak", ", ".join(f"{k} {fmt_bytes(v)}" for k, v in mem.breakdown.items() if v))
    summary.add_row("saved for backward", fmt_bytes(mem.saved))
    if tr.fused_dropout:
        summary.add_row("attention", f"{tr.fused_dropout} SDPA calls with dropout: the GPU's fused kernel "
                        "(dropout inside, as FlashAttention), not the CPU's math fallback")
    eager, fused_kernels, fused_s = fused_summary(report.kernels)
    summary.add_row("fused", f"{eager} kernels in eager mode, {fused_kernels} with every element-wise chain fused: "
                    f"{fmt_time(fused_s)} (kernels.py)")
    console.print(summary)
    shown = sorted(report.timed, key=lambda t: -t.seconds)[:top] if top else report.timed
    table = Table(title=f"top {top} ops by time" if top else "every op, in order", title_justify="left")
    for col, justify in (("#", "right"), ("op", "left"), ("phase", "left"), ("aten", "left"), ("out shape", "left"),
                         ("FLOPs", "right"), ("bytes", "right"), ("time", "right"), ("share", "right"),
                         ("launches", "right"), ("overhead", "right"), ("fused", "right"), ("fused time", "right")):
        table.add_column(col, justify=cast("JustifyMethod", justify))
    for t in shown:
        op, k = t.op, report.kernels[t.op.index]
        out = "x".join(map(str, op.outputs[0].shape)) if op.outputs else ""
        table.add_row(str(op.index), op.name, op.phase, op.target.removeprefix("aten."), out, fmt_count(op.flops),
                      fmt_bytes(op.nbytes), fmt_time(t.seconds), f"{t.seconds / total:.1%}", str(k.launches),
                      fmt_time(k.overhead), "-" if k.group < 0 else str(k.group), fmt_time(k.fused))
    console.print(table)
