"""check-step: calibrate on this machine, trace a model, predict one training step, run it for real, compare.

    trace (fake tensors; real ones when shapes depend on values) + the optimizer step's ops
    host costs (host.py)
    rounds × [ replay every op signature (replay.py) ; time the real step (step.py) ]   interleaved, so that a
                                                                                         change of load on a
                                                                                         shared host hits both
    predict (predict.py: median replay per signature) ; peak memory measured ; per-op in-step times (profile.py)
    the step's Python glue (glue.py: the host's time between its top-level torch calls), into the prediction

glibc's malloc (the CPU allocator under PyTorch) returns freed memory to the system whenever the free space at
the top of its heap passes a threshold, and maps allocations above another one afresh; a training step frees most
of its activations at its end, so the next step page-faults them in again (benchmarks/measure/conditions.py: 2,016
faults per step of GPT-2 at 4x128, 92.1 ms against 87.2 ms with freed memory kept; the count varies from run to run).
``allocator="keep"`` (the default) sets both thresholds out of reach (mallopt M_TRIM_THRESHOLD, M_MMAP_THRESHOLD;
glibc manual, "Malloc Tunable Parameters") so that freed memory is reused, as PyTorch's CUDA caching allocator
does on a GPU and as jemalloc or TCMalloc do, which PyTorch's performance tuning guide recommends for CPUs
("Switch Memory allocator"); ``"system"`` leaves glibc as it is and the faults are reported with the step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from meshplan.errors import SpecError
from meshplan.measure.blas_workspace import calls_of_ops, resident_workspace
from meshplan.measure.glue import Glue, measure_glue
from meshplan.measure.host import HostCosts, measure_host
from meshplan.measure.predict import StepPrediction, predict_step
from meshplan.measure.profile import op_profile
from meshplan.measure.replay import ReplaySettings, replay_all, workspaces
from meshplan.measure.reuse import step_distances
from meshplan.measure.signature import signatures
from meshplan.measure.step import StepTiming, held_bytes, make_step, peak_bytes, time_steps
from meshplan.measure.timing import load_average, make_clock, median, pinned_threads
from meshplan.trace.graph import Trace, TracedOp

ALLOCATORS = ("keep", "system")


@dataclass(frozen=True, kw_only=True)
class CheckSettings:
    """How check-step measures (timing.py says why one thread and the CPU clock are the defaults)."""

    device: str = "cpu"
    threads: int = 1
    clock: str = "auto"
    warmup: int = 3
    steps: int = 7
    rounds: int = 2
    profile_ops: bool = True
    allocator: str = "keep"
    optimizer: str = "adamw"  # whose state the peak memory counts (memory.OPTIMIZER_STATE, trace/liveness.py)
    replay: ReplaySettings = field(default_factory=ReplaySettings)

    def __post_init__(self) -> None:
        for name, low in (("warmup", 0), ("steps", 1), ("rounds", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 1000:
                raise SpecError(f"{name}={value!r} must be an integer from {low} to 1000")
        if self.allocator not in ALLOCATORS:
            raise SpecError(f"allocator={self.allocator!r} must be one of {', '.join(ALLOCATORS)}")


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """The real step: its timing over every round, peak memory, and each traced op's in-step time."""

    timing: StepTiming
    peak_bytes: int
    op_seconds: tuple[float | None, ...] = ()  # aligned with StepPrediction.ops
    glue: Glue | None = None  # the step's Python glue (glue.py), which the prediction holds too


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    name: str
    machine: dict[str, Any]
    settings: CheckSettings
    trace: Trace
    optimizer_ops: tuple[TracedOp, ...]
    prediction: StepPrediction
    measurement: Measurement
    replay_spread: float  # largest relative difference between two rounds' replayed totals

    @property
    def error(self) -> float:
        """predicted / measured − 1 of the step time."""
        return self.prediction.seconds / self.measurement.timing.seconds - 1.0

    @property
    def memory_error(self) -> float:
        return self.prediction.peak_bytes / self.measurement.peak_bytes - 1.0


def keep_freed_memory() -> bool:
    """mallopt(M_TRIM_THRESHOLD) and mallopt(M_MMAP_THRESHOLD) out of reach (the module docstring); False where
    the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    return bool(mallopt(m_trim_threshold, 1 << 30)) and bool(mallopt(m_mmap_threshold, 1 << 30))


def machine(device: str, threads: int) -> dict[str, Any]:
    """What the figures were measured on."""
    import os

    import torch

    from meshplan.calibrate.bench import device_info

    info = device_info(device)
    out = {"device": device, "name": info["name"], "cores": os.cpu_count() or 1, "threads": threads,
           "torch": torch.__version__, "python": platform.python_version(), "system": platform.system()}
    if device.startswith("cuda"):  # what blas_workspace.py sizes the cuBLAS workspace by
        out["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    return out


def step_resident(device: str, ops: Sequence[TracedOp]) -> int:
    """Bytes a step on ``device`` holds beside its tensors: on a GPU the BLAS handles' workspaces
    (blas_workspace.py, at this device's compute capability and this process's environment); none on a CPU."""
    if not device.startswith("cuda"):
        return 0
    import os

    import torch

    major, minor = torch.cuda.get_device_capability()
    return resident_workspace(calls_of_ops(ops), (major, minor), os.environ)


def trace_step(model: Any, inputs: Sequence[Any], make_optimizer: Callable[[list], Any], device: str = "cpu"
               ) -> tuple[Trace, list]:
    """The model's trace (fake tensors, or its real ones when fake tensors cannot run it) and the optimizer's, as
    ``device`` runs it (a CPU takes its own attention path: trace_module's ``gpu``)."""
    from meshplan.trace.capture import trace_module
    from meshplan.trace.optimizer import trace_optimizer

    try:
        trace = trace_module(model, inputs, gpu=not device.startswith("cpu"))
    except Exception:  # noqa: BLE001  shapes that depend on values (MoE routing), or a meta kernel stricter than
        trace = trace_module(model, inputs, real=True)  # the real one (grouped_mm's wants bf16): trace it for real
    return trace, trace_optimizer(list(model.parameters()), make_optimizer)


def check_step(name: str, model: Any, inputs: Sequence[Any], make_optimizer: Callable[[list], Any],
               settings: CheckSettings) -> CheckResult:
    """Predict and measure one training step of ``model(*inputs)`` (the module docstring)."""
    if settings.allocator == "keep" and settings.device == "cpu":
        keep_freed_memory()
    clock = make_clock(settings.clock, settings.device, settings.threads)
    with pinned_threads(settings.threads):
        trace, opt_ops = trace_step(model, inputs, make_optimizer, settings.device)
        sigs = signatures([*trace.ops, *opt_ops])
        distances = step_distances(trace.ops, opt_ops)
        optimizer = make_optimizer(list(model.parameters()))
        step = make_step(model, inputs, optimizer)
        host = measure_host(clock, settings.device)
        rounds, timings = [], []
        for r in range(settings.rounds):
            rounds.append(replay_all(sigs, clock, settings.replay, settings.device, distances))
            timings.append(time_steps(step, clock, warmup=settings.warmup if r == 0 else 1, steps=settings.steps))
        times = {s.key: median([t[s.key] for t in rounds]) for s in sigs}
        prediction = predict_step(trace, opt_ops, times, host, serial=settings.device == "cpu",
                                  optimizer=settings.optimizer, workspace=workspaces(sigs, settings.device),
                                  resident=step_resident(settings.device, [*trace.ops, *opt_ops]))
        peak = peak_bytes(step, held_bytes(model, inputs, optimizer), settings.device)
        per_op: list[float | None] = []
        if settings.profile_ops:
            per_op = op_profile(step, clock, [p.op.target for p in prediction.ops])
        glue = measure_glue(step, settings.device)
    prediction = replace(prediction, glue=glue.seconds)
    totals = [sum(t[s.key] * s.count for s in sigs if t[s.key] == t[s.key]) for t in rounds]
    timing = StepTiming(clock=clock.name, times=tuple(x for t in timings for x in t.times),
                        wall=tuple(x for t in timings for x in t.wall), load_before=timings[0].load_before,
                        host=tuple(x for t in timings for x in t.host),
                        load_after=load_average(), page_faults=median([t.page_faults for t in timings]))
    return CheckResult(name=name, machine=machine(settings.device, settings.threads), settings=settings,
                       trace=trace, optimizer_ops=tuple(opt_ops), prediction=prediction,
                       measurement=Measurement(timing=timing, peak_bytes=peak, op_seconds=tuple(per_op),
                                               glue=glue),
                       replay_spread=(max(totals) - min(totals)) / min(totals) if min(totals) > 0 else 0.0)


__all__ = ["CheckResult", "CheckSettings", "HostCosts", "Measurement", "check_step"]
