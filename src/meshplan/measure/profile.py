"""Per-op times inside the real step, one per traced op: the data a per-op comparison and the learned model need.

A ``TorchDispatchMode`` sees the same ops the trace recorded (trace/capture.py records at this level too), so
each measured op lines up with one traced op; torch.profiler would record every op at every dispatch level
(``aten::linear`` and the ``aten::addmm`` inside it), whose matching to the trace is ambiguous, and by the wall
clock, which counts the time a loaded host takes the core away. The mode reads the run's clock around each call
(timing.py), so the Python of the mode itself is not counted, though it disturbs the caches and branch history
between ops: the ops' sum comes to 1.0x the uninstrumented step for the zoo's GPT-2 (ops of 10 us to 3 ms) but
1.4x for a small MLP-Mixer whose ops take a few us (tests/test_check_step.py).

Alignment: the targets of the measured ops against the trace's (difflib's longest matching blocks); an op the
real step ran that the trace did not (or the reverse: a data-dependent branch) is left unmatched.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Any

from meshplan.measure.timing import Clock, median


def _timer(clock: Clock) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpTimer(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[str, float]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            start = clock.now()
            out = func(*args, **(kwargs or {}))
            self.rows.append((str(func), clock.now() - start))
            return out

    return OpTimer()


def timed_ops(step: Callable[[], None], clock: Clock) -> list[tuple[str, float]]:
    """(target, seconds) of every op one ``step`` dispatched, in order."""
    timer = _timer(clock)
    with timer:
        step()
    return [(t, s) for t, s in timer.rows if not t.startswith("profiler.")]


# the trace decomposes an op that has no FLOP formula when it can (capture.py, as FlopCounterMode): batch norm's
# training kernel shows there under the name of the kernel it decomposes to
SAME = {"aten._native_batch_norm_legit.default": "aten.native_batch_norm.default",
        "aten._native_batch_norm_legit_functional.default": "aten.native_batch_norm.default"}


def align(traced: Sequence[str], measured: Sequence[str]) -> dict[int, int]:
    """traced op index → measured op index, for the ops both sequences share in order."""
    matcher = difflib.SequenceMatcher(None, [SAME.get(t, t) for t in traced], [SAME.get(t, t) for t in measured],
                                      autojunk=False)
    pairs = {}
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            pairs[block.a + k] = block.b + k
    return pairs


def op_profile(step: Callable[[], None], clock: Clock, traced: Sequence[str], repeats: int = 3,
               ) -> list[float | None]:
    """Median in-step seconds of each traced op over ``repeats`` steps (None: not matched in any)."""
    samples: list[list[float]] = [[] for _ in traced]
    for _ in range(repeats):
        rows = timed_ops(step, clock)
        for i, j in align(traced, [t for t, _ in rows]).items():
            samples[i].append(rows[j][1])
    return [median(s) if s else None for s in samples]
