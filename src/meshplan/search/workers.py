"""Parallel jobs: the size combinations of a search split into shares of about equal work, evaluated in this
process or by forked worker processes, which inherit the combinations instead of receiving them pickled."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshplan.search.combos import Combo
from meshplan.search.evaluate import Part, evaluate
from meshplan.search.explore import Explored
from meshplan.search.space import Space

# Plans before the settings grid (size combinations at about 8 placements each): below this one process is faster
# than forking two workers on a two-core machine. The work goes with the size combinations and unit keys (memory, the
# bound, pricing), whatever the grid of ZeRO / recompute / offload settings each is scored under: a search narrowed to
# one ZeRO stage without offload costs about what the full one does. benchmarks/measure/search_speed.py --repeat 8
# (medians, one / two workers): the quick start's Llama-3-70B on 1024 H100 (~190k) 0.33 / 0.43 s; Llama-3.1-405B on
# 16,384 H100 (~257k) 0.65 / 0.59 s, Megatron-1T (~340k) 0.58 / 0.55 s, DeepSeek-V3 (~441k) 0.66 / 0.52 s; GPT-3 175B
# (~425k, five in six of its plans SUMMA, whose jobs balance worse) is the exception at 0.42 / 0.51 s
PARALLEL_ABOVE = 220_000


@dataclass(frozen=True)
class Job:
    """The plans one worker evaluates: one tensor mode (layout, sequence parallelism) and some of the size
    combinations of that layout (indices into the combination list)."""

    mode: tuple[str, bool]
    combos: tuple[int, ...]
    weight: int  # candidates before placements (for the order in which jobs are handed out)


def worker_count(combos: list[Combo], workers: int) -> int:
    """``workers``, or for 0: up to 2 processes when the space is large, else 1."""
    if workers:
        return workers
    placed = sum(c.sizes for c in combos) * 8  # size combinations at about 8 placements each
    return min(2, os.cpu_count() or 1) if placed > PARALLEL_ABOVE else 1


def jobs(combos: list[Combo], space: Space, parts: int) -> list[Job]:
    """Each tensor mode's combinations in ``parts`` shares of about equal size, largest first. A share holds
    whole (tp, tp2, cp) groups: those decide the per-layer units, which are then computed by one job only."""
    out = []
    for mode in space.modes():
        groups: dict[tuple[int, int, int], list[int]] = {}
        for i, c in enumerate(combos):
            if c.layout == mode[0]:
                groups.setdefault((c.tp, c.tp2, c.cp), []).append(i)
        size = {key: sum(combos[i].sizes for i in members) for key, members in groups.items()}
        bins: list[list[int]] = [[] for _ in range(parts)]
        load = [0] * parts
        for key in sorted(groups, key=lambda k: -size[k]):  # longest processing time first
            b = load.index(min(load))
            bins[b] += groups[key]
            load[b] += size[key]
        out += [Job(mode, tuple(sorted(b)), w) for b, w in zip(bins, load, strict=True) if b]
    return sorted(out, key=lambda j: -j.weight)


def run_jobs(jobs: list[Job], combos: list[Combo], args: tuple, workers: int,
             progress: Callable[[int, int], None] | None = None) -> list[Part]:
    """Evaluate every job (``args``: evaluate's arguments after the combinations: model, cluster, space, top_k,
    eff, and an ``Explored`` each job starts afresh from, or None) in this process (``workers`` = 1) or in a pool of
    forked ones; ``progress(done, total)`` counts finished jobs."""
    results: list[Part] = []
    if workers == 1:
        for job in jobs:
            results.append(_evaluate(job, combos, args))
            if progress:
                progress(len(results), len(jobs))
        return results
    import multiprocessing  # noqa: PLC0415  (its sockets and pickling: only a search that forks needs them)

    _SHARED.update(combos=combos, args=args)
    try:
        with multiprocessing.get_context("fork").Pool(workers, initializer=ignore_interrupts) as pool:
            for part in pool.imap_unordered(_evaluate_shared, jobs):
                results.append(part)
                if progress:
                    progress(len(results), len(jobs))
    finally:
        _SHARED.clear()
    return results


_SHARED: dict[str, Any] = {}  # the candidates, inherited by forked workers instead of pickled


def ignore_interrupts() -> None:
    """A worker's start: Ctrl-C reaches every process of the terminal's group, and the parent alone answers it (it
    ends the pool); a worker that took it would print its own KeyboardInterrupt traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _evaluate(job: Job, combos: list[Combo], args: tuple) -> Part:
    model, cluster, space, top_k, eff, explored = args
    fresh = None if explored is None else Explored(explored.rate, explored.seed, explored.fits_only)
    return evaluate(job.mode, [combos[i] for i in job.combos], model, cluster, space, top_k, eff, fresh)


def _evaluate_shared(job: Job) -> Part:
    return _evaluate(job, _SHARED["combos"], _SHARED["args"])
