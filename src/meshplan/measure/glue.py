"""The step's Python glue: the host time a training step spends in its own Python between the ops it calls
(the modules' forward bodies, ``nn.Module.__call__``, hooks, argument handling, the optimizer's per-parameter
loops, ``zero_grad``), which no op record holds (issue 46; docs/MEASURED_GPU.md, "Where the step's time goes").

Mechanism: a ``TorchFunctionMode`` sees every call the step's Python makes into torch (``torch.*``,
``torch.nn.functional.*``, ``Tensor`` methods and properties, ``loss.backward()``), at the top level only: while
the mode runs a call it is off the mode stack, so the calls nested inside (``F.linear`` → ``torch._C._nn.linear``,
the whole backward pass inside ``Tensor.backward``) are not seen again. A ``TorchDispatchMode`` beneath it only
notes whether a call reached an aten op. Per step, on the calling thread's CPU clock (``time.thread_time``: the
host's own work, not time descheduled while the shared machine runs other processes; a GPU step's waits happen
inside op calls):

    raw   = Σ gaps between one top-level call's return and the next call's entry
          + Σ durations of the calls that reached no aten op (``x.shape``, ``x.size()``, ``x.dim()``: host work
            that replay does not time)
    glue  = raw − n_op · d_op − n_empty · d_empty                      (floored at 0)

d_op and d_empty are the mode's own cost that lands in ``raw``, measured here by the same mode on loops of N calls
(``OVERHEAD_CALLS``) whose true glue is known:

    d_op    = raw(N × ``torch.neg(x)``) / N − t(N × ``id(x)``) / N            the loop's own glue is ``id``'s loop
    d_empty = raw(N × ``x.dim()``) / N − t(N × ``x.dim()``) / N               every such call is glue, unwatched

On this project's 2-core AMD EPYC host (one thread): d_op 1.5 µs, d_empty 2.0 µs; a busy loop of 2 ms between two
ops adds 2.006 ms to the glue, one of 0.5 ms 0.497 ms (tests/test_glue.py checks 2 ms within 0.3 ms). The
calibration's calls take plain tensors; a call on ``nn.Parameter`` arguments that need a gradient leaves 0.3 µs
more in its gap (``F.linear``: 1.87 against 1.55 µs a call, the loop's own ``id`` call taken out), part of it the
mode's: at most 0.3 µs × n_op, 0.05 to 0.2 ms on the zoo's models, a few % of their glue.

The ops' own time (dispatch, kernel, autograd recording, the engine running backward nodes) is inside the
top-level calls and stays out of the glue: replay.py and host.py price it. Module calls are in the gaps:
host.py's ``module`` × module calls is the part of the glue check-step already priced, so predict.py adds only
the rest. The glue does not depend on how fast the kernels are (it is outside them), so the same host spends it on
a CPU or a GPU step; check-step measures it on the device the step runs on with the same code.

The gaps also hold the frees of the tensors whose last reference the Python drops there: check-step keeps glibc's
freed memory on a CPU (check.keep_freed_memory), as a GPU's caching allocator does, so that they cost no page
mapping (without it the glue of the zoo's GPT-2 varied from 4.0 to 8.7 ms a step, with it from 3.5 to 4.4 ms).

Why its own watched steps rather than profile.py's: profile.py's ``TorchDispatchMode`` sits below autograd and
sees every aten op, the nested ones and the backward's included, with its Python around each; which of them
Python called, and so where the glue lies, is not in its rows, and watching the top-level calls there would add
the function mode's cost to the per-op times it records. torch.profiler's events would tell the levels apart, at
a larger and less regular cost per op (profile.py's docstring).

Not counted: the Python inside a top-level call before it reaches aten (``F.layer_norm``'s argument checks), which
is inside a call; on a GPU the mode sees the same calls (the host's Python is the same), and a call that blocks on
a full launch queue blocks inside the call, not in a gap.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshplan.measure.timing import median

OVERHEAD_CALLS = 2000


@dataclass(frozen=True, kw_only=True)
class Glue:
    """The step's Python glue (seconds, the median over the measured steps) and how it was obtained."""

    seconds: float
    raw: float  # before the mode's own cost is taken out
    op_calls: int  # top-level calls that reached an aten op
    empty_calls: int  # top-level calls that reached none
    op_overhead: float  # d_op, seconds per call
    empty_overhead: float  # d_empty, seconds per call
    aten_ops: int = 0  # aten ops the watched step dispatched, nested ones included (n_op of them called from Python)

    def to_dict(self) -> dict[str, float]:
        return {"glue_s": self.seconds, "raw_s": self.raw, "op_calls": self.op_calls,
                "empty_calls": self.empty_calls, "op_overhead_s": self.op_overhead,
                "empty_overhead_s": self.empty_overhead, "aten_ops": self.aten_ops}


@functools.cache
def _mode_classes() -> tuple[type, type]:
    """The two modes' classes, made once (a class made afresh per step runs its first calls cold)."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    now = time.thread_time

    class Reached(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.hit = False
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.hit = True
            self.count += 1
            return func(*args, **(kwargs or {}))

    class Gaps(TorchFunctionMode):
        def __init__(self, reached: Reached) -> None:
            super().__init__()
            self.reached = reached
            self.raw = 0.0
            self.ops = 0
            self.empty = 0
            self.last = now()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            t0 = now()
            reached = self.reached
            reached.hit = False
            out = func(*args, **(kwargs or {}))
            t1 = now()
            self.raw += t0 - self.last
            if reached.hit:
                self.ops += 1
            else:
                self.empty += 1
                self.raw += t1 - t0
            self.last = now()
            return out

    return Gaps, Reached


def raw_glue(fn: Callable[[], Any]) -> tuple[float, int, int, int]:
    """(raw seconds, op calls, empty calls, aten ops) of one ``fn()`` under the modes (the module docstring)."""
    gaps_cls, reached_cls = _mode_classes()
    reached = reached_cls()
    gaps = gaps_cls(reached)
    with reached, gaps:
        gaps.last = time.thread_time()
        fn()
        end = time.thread_time()
    return gaps.raw + end - gaps.last, gaps.ops, gaps.empty, reached.count


def _plain(fn: Callable[[], Any], repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        runs.append(time.thread_time() - start)
    return median(runs)


def mode_overhead(device: str = "cpu", repeats: int = 5) -> tuple[float, float]:
    """(d_op, d_empty) of the module docstring, seconds per call, on ``device``."""
    import torch

    x = torch.ones(1, device=device)
    n = OVERHEAD_CALLS

    def ops() -> None:
        for _ in range(n):
            torch.neg(x)

    def ids() -> None:
        for _ in range(n):
            id(x)

    def dims() -> None:
        for _ in range(n):
            x.dim()

    ops()
    d_op = median([raw_glue(ops)[0] for _ in range(repeats)]) / n - _plain(ids, repeats) / n
    d_empty = median([raw_glue(dims)[0] for _ in range(repeats)]) / n - _plain(dims, repeats) / n
    return max(d_op, 0.0), max(d_empty, 0.0)


def measure_glue(step: Callable[[], Any], device: str = "cpu", repeats: int = 3) -> Glue:
    """The glue of ``step`` (already warm), the median over ``repeats`` watched steps."""
    d_op, d_empty = mode_overhead(device)
    raw_glue(step)  # the first watched step runs the modes' paths cold
    runs = [raw_glue(step) for _ in range(repeats)]
    raws = [r[0] for r in runs]
    raw = median(raws)
    _, n_op, n_empty, n_aten = runs[raws.index(min(raws, key=lambda r: abs(r - raw)))]
    return Glue(seconds=max(raw - n_op * d_op - n_empty * d_empty, 0.0), raw=raw, op_calls=n_op,
                empty_calls=n_empty, op_overhead=d_op, empty_overhead=d_empty, aten_ops=n_aten)
