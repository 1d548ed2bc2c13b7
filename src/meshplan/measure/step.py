"""The real training step: forward, the loss as the trace takes it, backward, ``optimizer.step()``,
``zero_grad(set_to_none=True)``, run on real tensors and timed (warm-up steps, then the median of several), and
its peak memory.

The loss is the trace's (capture.loss_of): a 0-d floating output if the model returns one (Hugging Face with
labels), else the sum of its first floating output. The model's output is dropped as soon as the loss is taken,
so only what autograd saved stays alive through the backward pass, as in the trace's liveness analysis.

Host time: the process's CPU time (every thread: the caller's and, on a GPU, the autograd engine's device thread
that runs the backward) from the step's start to its return, before the synchronisation that waits for its last
kernels: the host's own timeline, which a GPU step is when the host is the bottleneck (docs/MEASURED_GPU.md).

Peak memory: on a GPU, ``torch.cuda.max_memory_allocated`` over the step (the caching allocator's count of
live tensor bytes, not its reserved pool); on a CPU, the profiler's memory events (every allocation and free
the CPU allocator made during the step, ``torch.profiler`` with ``profile_memory=True``) added to the bytes
held when the step starts (parameters, buffers, optimizer state and inputs; gradients are None then).
"""

from __future__ import annotations

import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from meshplan.measure.timing import Clock, load_average, median, quiet_profiler
from meshplan.trace.capture import loss_of


@dataclass(frozen=True, kw_only=True)
class StepTiming:
    """Times of the measured steps (seconds, by the run's clock) and the conditions they ran in."""

    clock: str
    times: tuple[float, ...]
    wall: tuple[float, ...]  # the same steps by the wall clock
    load_before: float
    load_after: float
    page_faults: float  # minor page faults per step (median): fresh memory the allocator had to map
    host: tuple[float, ...] = ()  # the process's CPU time over each step before its final synchronisation

    @property
    def seconds(self) -> float:
        return median(list(self.times))

    @property
    def spread(self) -> float:
        """(max − min) / median of the timed steps."""
        return (max(self.times) - min(self.times)) / self.seconds if self.seconds > 0 else 0.0


def make_step(model: Any, inputs: Sequence[Any], optimizer: Any) -> Callable[[], None]:
    """One training step as a closure."""

    def step() -> None:
        loss = loss_of(model(*inputs))
        assert loss is not None  # a training step: some output needs a gradient
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def time_steps(step: Callable[[], None], clock: Clock, *, warmup: int = 3, steps: int = 7) -> StepTiming:
    """``warmup`` untimed steps, then ``steps`` timed ones."""
    import time

    for _ in range(warmup):
        step()
    before = load_average()
    times, wall, faults, host = [], [], [], []
    for _ in range(steps):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        w0, t0 = time.perf_counter(), clock.now()
        c0 = time.process_time()
        step()
        host.append(time.process_time() - c0)
        t1 = clock.now()
        times.append(t1 - t0)
        wall.append(time.perf_counter() - w0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return StepTiming(clock=clock.name, times=tuple(times), wall=tuple(wall), load_before=before,
                      load_after=load_average(), page_faults=median([float(f) for f in faults]), host=tuple(host))


def held_bytes(model: Any, inputs: Sequence[Any], optimizer: Any) -> int:
    """Bytes of the distinct storages held between steps: parameters, buffers, optimizer state, inputs."""
    import torch

    seen: dict[int, int] = {}

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()

    for t in [*model.parameters(), *model.buffers(), *inputs]:
        add(t)
    for state in optimizer.state.values():
        for t in state.values():
            add(t)
    return sum(seen.values())


def peak_bytes(step: Callable[[], None], held: int, device: str) -> int:
    """Peak live tensor bytes during one ``step`` (the module docstring)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    sizes: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation:
            sizes.append((e.start_time_ns, e.extra_fields.alloc_size))
        stack.extend(e.children)
    live = peak = 0
    for _, size in sorted(sizes):
        live += size
        peak = max(peak, live)
    return held + peak
