"""How check-step times things, the same way for the calibration and for the step it predicts.

- Threads: ``torch.set_num_threads(threads)`` for the whole run (calibration, replay and the step alike). On a
  shared host, one thread per process is the robust choice: an OpenMP parallel region waits at its barrier for
  every thread, so one thread descheduled by another process stalls the op, by however long the neighbours
  keep the core (benchmarks/measure/conditions.py times one op on one thread and on all cores).
- Clock: ``"cpu"`` is this process's CPU time (``time.process_time``, CLOCK_PROCESS_CPUTIME_ID): with one
  thread on a CPU device it is the wall time the work would take on an idle core, and time spent descheduled
  while other processes run is not counted. ``"wall"`` is ``time.perf_counter`` after a device synchronisation
  (``torch.cuda.synchronize`` on a GPU, where queued kernels must finish). ``"auto"``: cpu for one thread on the
  CPU, wall otherwise (several threads' CPU time adds up across threads, and a GPU's time is not the host's).
- Load: ``os.getloadavg()`` before and after, reported beside every figure.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from meshplan.errors import SpecError

CLOCKS = ("auto", "cpu", "wall")


@dataclass(frozen=True, kw_only=True)
class Clock:
    """``now()`` in seconds and the synchronisation to call before reading it."""

    name: str  # cpu | wall
    device: str  # cpu | cuda

    def sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def now(self) -> float:
        self.sync()
        return time.process_time() if self.name == "cpu" else time.perf_counter()


def make_clock(name: str, device: str, threads: int) -> Clock:
    """The clock ``name`` (see the module docstring) for ``device`` at ``threads`` threads."""
    if name not in CLOCKS:
        raise SpecError(f"clock={name!r} must be one of {', '.join(CLOCKS)}")
    if name == "auto":
        name = "cpu" if device == "cpu" and threads == 1 else "wall"
    if name == "cpu" and device != "cpu":
        raise SpecError("clock='cpu' times the host's CPU, not a GPU: use wall (or auto) with device cuda")
    return Clock(name=name, device=device)


def check_threads(threads: int | None) -> int:
    """``threads`` if it is a usable intra-op thread count (None: this host's cores)."""
    cores = os.cpu_count() or 1
    if threads is None:
        return cores
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
        raise SpecError(f"threads={threads!r} must be an integer from 1 to 1024")
    return threads


@contextlib.contextmanager
def pinned_threads(threads: int) -> Iterator[None]:
    """``torch.set_num_threads(threads)`` inside the block, the previous count restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def load_average() -> float:
    """The 1-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0.0


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def time_calls(calls: list[Callable[[], Any]], clock: Clock, *, repeats: int, per_run: int,
               keep: int = 0) -> float:
    """Seconds per call: the median over ``repeats`` runs of ``per_run`` calls cycling through ``calls`` (after
    one warm-up pass over them), each result held in a ring of ``keep`` slots so that the allocator hands the
    next call fresh memory rather than the block the last one freed."""
    ring: list[Any] = [None] * max(1, keep)
    for i, call in enumerate(calls):
        ring[i % len(ring)] = call()
    runs = []
    for _ in range(repeats):
        start = clock.now()
        for i in range(per_run):
            ring[i % len(ring)] = calls[i % len(calls)]()
        runs.append((clock.now() - start) / per_run)
    return median(runs)


@contextlib.contextmanager
def quiet_profiler() -> Iterator[None]:
    """PyTorch's CPU profiler (kineto) writes a line to the process's stderr each time it starts and stops ("USDT: …
    profiler_start"), where check-step's output is its tables: file descriptor 2 points at /dev/null meanwhile (a
    Python exception raised inside still reaches the caller, and is printed after)."""
    import sys

    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
