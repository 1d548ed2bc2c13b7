"""Parallel jobs: the size combinations of a search split into shares of about equal work, evaluated in this
process or by forked worker processes, which inherit the combinations instead of receiving them pickled."""

from __future__ import annotations

import itertools
import math
import os
import signal
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from meshplan.search.candidates import Twin, rows_kept
from meshplan.search.combos import Combo
from meshplan.search.evaluate import Part, Start, evaluate
from meshplan.search.explore import Explored
from meshplan.search.key_store import twin_times
from meshplan.search.space import Space

if TYPE_CHECKING:
    from multiprocessing.pool import Pool

T = TypeVar("T")

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
    """``workers``, or for 0: up to 2 processes when the space is large (at most ``most_processes``), else 1."""
    if workers:
        return workers
    if _FORKED:  # a worker of ``forked_map``: its siblings hold the other cores
        return 1
    placed = sum(c.sizes for c in combos) * 8  # size combinations at about 8 placements each
    return min(2, os.cpu_count() or 1, most_processes()) if placed > PARALLEL_ABOVE else 1


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


# What a search's result must keep when another search's is at least as good: ``(rank, light)``, the result's rank
# (lower is better; the first search wins a tie) and the result without what a loser's need not keep (run.py)
Losing = tuple[Callable[[Any], float], Callable[[Any], Any]]


# A search's result from its parts (``finish(s, parts, ahead)``): ``ahead``, where another search is finished first,
# gives (its rank, its index) when called (a worker waits for it), against which the result may come light where it
# ranks after (run._finish)
Finish = Callable[[int, list[Part], Callable[[], tuple[float, int]] | None], T]


def run_searches(searches: list[tuple[list[Job], list[Combo], tuple]], workers: int, finish: Finish[T],
                 progress: Callable[[int, int], None] | None = None, losing: Losing | None = None) -> list[T]:
    """Evaluate every job of one or more searches (each: its jobs, combinations and evaluate's arguments after the
    combinations: model, cluster, space, top_k, eff, and an ``Explored`` each job starts afresh from, or None) in
    this process (``workers`` = 1) or in this one and a pool of ``workers`` - 1 forked ones, each process taking the
    next task when it is free (``_evaluated``; search/variants.py's expert-GEMM searches share the pool: a pool each
    would fork twice), and return ``finish(s, parts, ahead)`` of each search ``s``; ``progress(done,
    total)`` counts finished jobs. Each search's parts come in its jobs' order, whichever process finished first, so
    that what a search keeps (the first example of a refusal, the order of equal plans) does not depend on the
    processes' timing. Searches with the same jobs (variants.py's, whose combinations the expert GEMMs do not
    change) are twins: a job of every one of them is one task, which computes the memory of a group once for all
    where it can (search/memory_pass.py). In a pool, this process finishes the search whose parts hold the fastest
    plan (run._finish's ranking and refinement: a third of DeepSeek-V3's CPU seconds) while the workers finish the
    others, at once on two cores; with ``losing``, a worker's result that ranks after this process's comes back
    ``light`` (DeepSeek-V3's losing search: 0.28 MB of estimates pickled and unpickled, ~50 ms, for its counts). In
    this process alone with ``losing``, that search is finished first too, and each other one given its rank
    (``ahead``), so that one ranking after it is not ranked in full (DeepSeek-V3's per-expert search: 10 estimates)."""
    tasks = _tasks(searches)
    parts: list[list[Part | None]] = [[None] * len(shares) for shares, _, _ in searches]
    total, done = sum(len(shares) for shares, _, _ in searches), 0
    with _pool((searches, tasks), workers, finish, losing) as pool:
        for (ss, j), found in _evaluated(searches, tasks, pool):
            for s, part in zip(ss, found, strict=True):
                parts[s][j] = part
            done += len(ss)
            if progress:
                progress(done, total)
        found_parts = [[p for p in ps if p is not None] for ps in parts]
        here = min(range(len(found_parts)), key=lambda s: min((p.best.fastest for p in found_parts[s]),
                                                                default=math.inf))
        if pool is None:  # with ``losing``, the search whose parts hold the fastest plan first, the others after it
            if losing is None:
                return [finish(s, ps, None) for s, ps in enumerate(found_parts)]
            mine, rank = finish(here, found_parts[here], None), losing[0]
            return [mine if s == here else finish(s, ps, lambda: (rank(mine), here)) for s, ps in
                    enumerate(found_parts)]
        later = {s: pool.apply_async(_finish_shared, (s, ps, here)) for s, ps in enumerate(found_parts) if s != here}
        mine = finish(here, found_parts[here], None)
        if losing is not None:  # what the workers' results are ranked against: one copy each (``_finish_shared``)
            os.write(_SHARED["ranked"][1], struct.pack("d", losing[0](mine)) * len(later))
        return [mine if s == here else later[s].get() for s in range(len(found_parts))]


def _tasks(searches: list[tuple[list[Job], list[Combo], tuple]]) -> list[tuple[tuple[int, ...], int]]:
    """The tasks, heaviest first over every search: (the searches, the job), a job of all the searches where they
    have the same jobs, else of one search."""
    first_shares, first_combos, _ = searches[0]
    if all(shares == first_shares and combos == first_combos for shares, combos, _ in searches[1:]):
        together = tuple(range(len(searches)))
        return [(together, j) for j in sorted(range(len(first_shares)), key=lambda j: -first_shares[j].weight)]
    return sorted((((s,), j) for s, (shares, _, _) in enumerate(searches) for j in range(len(shares))),
                  key=lambda t: -searches[t[0][0]][0][t[1]].weight)


@contextmanager
def _pool(searches: tuple[list[tuple[list[Job], list[Combo], tuple]], list[tuple[tuple[int, ...], int]]], workers: int,
          finish: Finish[Any], losing: Losing | None) -> Iterator[Pool | None]:
    """``workers`` processes: this one and a pool of ``workers`` - 1 forked ones, which inherit the searches,
    ``finish`` and ``losing`` (``_SHARED``), the tasks to take (``searches``: the searches and their tasks; their
    numbers in ``_handout``'s pipe) and a pipe on which this process sends them the rank of its result; None for one
    worker (this process alone)."""
    if workers == 1:
        yield None
        return
    import multiprocessing  # noqa: PLC0415  (its sockets and pickling: only a search that forks needs them)

    tokens = _handout(range(len(searches[1])))  # first: it may raise, and then no other pipe is left open
    ranked = os.pipe()  # the rank of this process's result, for the workers (a pipe: no shared ctypes to import)
    _SHARED.update(searches=searches[0], tasks=searches[1], finish=finish, losing=losing, ranked=ranked,
                   tokens=tokens, helpers=workers - 1)
    try:
        with multiprocessing.get_context("fork").Pool(workers - 1, initializer=ignore_interrupts) as pool:
            yield pool
            pool.close()  # every task answered: the workers take their sentinels and exit (``with`` terminates
            pool.join()  # them, which is for a pool left early: an error, Ctrl-C)
    finally:
        _SHARED.clear()
        for end in (*ranked, tokens):
            os.close(end)


def _evaluated(searches: list[tuple[list[Job], list[Combo], tuple]], tasks: list[tuple[tuple[int, ...], int]],
               pool: Pool | None) -> Iterator[tuple[tuple[tuple[int, ...], int], list[Part]]]:
    """Each task and its searches' parts, in this process (no ``pool``) or, with a pool, in this process and the
    pool's alike: each process takes the next task (``_handout``, the heaviest first) when it is free, this one's
    parts as they come, then the workers'."""
    if pool is None:
        with rows_kept():  # a layout's size rows built once for its tensor modes' tasks (candidates.mode_pool)
            for task in tasks:
                yield task, _evaluate_task(searches, task)
        return
    helpers = [pool.apply_async(_evaluate_shared) for _ in range(_SHARED["helpers"])]
    with rows_kept():
        for t in _taken(_SHARED["tokens"]):
            yield tasks[t], _evaluate_task(searches, tasks[t])
    for helper in helpers:
        for t, found in helper.get():
            yield tasks[t], found


def _handout(numbers: Iterable[int]) -> int:
    """The read end of a pipe that holds ``numbers`` (in their order), for the processes that share the work to take
    one at a time (``_taken``): written whole before any process forks and read without waiting, so that an empty
    pipe means every number is taken; each a 4-byte read, which Linux serves whole to one reader (fs/pipe.c pipe_read
    copies under the pipe's mutex)."""
    data = b"".join(struct.pack("I", n) for n in numbers)
    read, write = os.pipe()
    try:
        if len(data) > 4096:  # the least a pipe holds (one page) may be too few: room for every number
            import fcntl  # noqa: PLC0415  (only for a long list)

            fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, len(data))
        os.set_blocking(write, False)  # a pipe too small raises (BlockingIOError), it does not wait for ever
        if os.write(write, data) != len(data):
            raise BlockingIOError(f"a pipe too small for {len(data) // 4} numbers")
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
    os.set_blocking(read, False)
    return read


def _taken(tokens: int) -> Iterator[int]:
    """The numbers this process takes from ``_handout``'s pipe, until it is empty."""
    while True:
        try:
            data = os.read(tokens, 4)
        except BlockingIOError:
            return
        if not data:
            return
        yield struct.unpack("I", data)[0]


def forked_map(call: Callable[[int], T], order: Sequence[int], done: Callable[[int, int], None] | None = None
               ) -> list[T]:
    """``call(i)`` for every i of ``order``, in this process and forked ones (one an idle core, at most one an i:
    ``idle_cores``), which inherit ``call``, each i's result pickled back; each process takes the next i of ``order``
    when it is free (``_handout``: the heaviest first, the longest processing time first), the results in the order
    of the i's. ``done(finished, total)`` counts them (this process's as they come, then the workers'). Where calls
    fail, the error of the least i is raised, as a loop over the i's in order raises it. With fewer than two idle
    cores, the loop in this process: forked processes that wait for busy cores took 1.2x its CPU seconds and 1.26x
    its wall time (the 8-count strong-scaling plan under a load of 10 on two cores), where two idle cores take ~0.6x
    its wall time. A search in a worker, or in this process meanwhile, runs in that process alone
    (``worker_count``)."""
    processes = min(idle_cores(), len(order), most_processes())
    if processes < 2:
        out = []
        for i in sorted(order):
            out.append(call(i))
            if done:
                done(len(out), len(order))
        return out
    import multiprocessing  # noqa: PLC0415  (its sockets and pickling: only a search that forks needs them)

    results: dict[int, tuple[bool, Any]] = {}
    _FORKED.update(call=call, tokens=_handout(order))
    try:
        with multiprocessing.get_context("fork").Pool(processes - 1, initializer=ignore_interrupts) as pool:
            helpers = [pool.apply_async(_calls_forked) for _ in range(processes - 1)]
            for i, ok, result in itertools.chain(_calls(), (r for helper in helpers for r in helper.get())):
                results[i] = ok, result
                if done:
                    done(len(results), len(order))
            pool.close()
            pool.join()
    finally:
        os.close(_FORKED["tokens"])
        _FORKED.clear()
    failed = [i for i, (ok, _) in results.items() if not ok]
    if failed:
        raise results[min(failed)][1]
    return [results[i][1] for i in sorted(results)]


# The most processes a search may use, where the user (or a benchmark) sets it: 1 keeps every search in its own
# process whatever the machine's load, so that its CPU seconds are the same work on every run. Unset, the machine
# decides: ``forked_map`` forks where two cores are idle (the 1-minute load average, which a benchmark's own runs one
# after the other hold near 1 on an otherwise idle machine, so that a command timed over rounds would fork in some and
# not in others: +10-20 % CPU seconds between the two, 2026-11-30), a large space's search where the machine has two.
WORKERS_VARIABLE = "MESHPLAN_WORKERS"


def most_processes() -> int:
    """``$MESHPLAN_WORKERS`` (a positive integer), or the machine's cores where it is unset or empty."""
    given = os.environ.get(WORKERS_VARIABLE, "").strip()
    if not given:
        return os.cpu_count() or 1
    if not given.isdigit() or int(given) < 1:
        from meshplan.errors import SpecError  # noqa: PLC0415  (a wrong value only)

        raise SpecError(f"{WORKERS_VARIABLE}={given!r} must be a positive integer (the most processes a search uses)")
    return int(given)


def idle_cores() -> int:
    """The cores that the machine's other work leaves idle: the count less the 1-minute load average (what ``make
    -l`` reads), the count where the system keeps none."""
    cores = os.cpu_count() or 1
    try:
        return cores - int(os.getloadavg()[0])
    except OSError:
        return cores


def _calls() -> Iterator[tuple[int, bool, Any]]:
    """The i's a process of ``forked_map`` takes, each with whether its call returned and what it returned or
    raised (raised by the parent: forked_map)."""
    for i in _taken(_FORKED["tokens"]):
        try:
            yield i, True, _FORKED["call"](i)
        except Exception as exc:  # noqa: BLE001  (raised by the parent: forked_map)
            yield i, False, exc


def _calls_forked() -> list[tuple[int, bool, Any]]:
    return list(_calls())


_SHARED: dict[str, Any] = {}  # the candidates and the finish, inherited by forked workers instead of pickled
_FORKED: dict[str, Any] = {}  # forked_map's call and its i's to take, inherited by its workers (and: a process is one)


def ignore_interrupts() -> None:
    """A worker's start: Ctrl-C reaches every process of the terminal's group, and the parent alone answers it (it
    ends the pool); a worker that took it would print its own KeyboardInterrupt traceback. SIGTERM ends the worker
    whatever handler it inherited: Pool.terminate sends it to a worker that may be waiting for the task queue's lock,
    which the terminating parent holds (multiprocessing/pool.py _help_stuff_finish); a handler a library installed
    in the parent (a test process had one) ran and returned, the worker waited on, and the parent's join hung."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _evaluate_task(searches: list[tuple[list[Job], list[Combo], tuple]], task: tuple[tuple[int, ...], int]
                   ) -> list[Part]:
    """The parts of a task's searches for its job, in order, the memory passes of the first reused by the next
    where they hold (evaluate's ``memo``), its size rows and their pool too (candidates.mode_pool), and the
    compute-op times of its shapes where the ops are the same (key_store.twin_times)."""
    memo: dict = {}
    twin = Twin()
    with twin_times():
        return [_evaluate(searches[s][0][task[1]], searches[s][1], searches[s][2], (memo, twin)) for s in task[0]]


def _evaluate(job: Job, combos: list[Combo], args: tuple, shared: tuple[dict, Twin]) -> Part:
    model, cluster, space, top_k, eff, explored = args
    fresh = None if explored is None else Explored(explored.rate, explored.seed, explored.fits_only)
    return evaluate(job.mode, [combos[i] for i in job.combos], model, cluster, space, top_k, eff,
                    Start(explore=fresh, memo=shared[0], twin=shared[1]))


def _finish_shared(s: int, parts: list[Part], here: int) -> Any:
    """Search ``s``'s result, in a worker; with ``losing``, once the parent has ranked its own (search ``here``'s),
    light where it ranks after that one (a finite rank: a search without plans keeps its result whole). The parent's
    rank is read when the finish first asks for it (``ahead``: run._finish, once its fastest plan is refined) or
    after it, whichever comes first."""
    finish, losing = _SHARED["finish"], _SHARED["losing"]
    if losing is None:
        return finish(s, parts, None)
    theirs: list[float] = []

    def ahead() -> tuple[float, int]:
        if not theirs:  # waits for the parent's (8 bytes: at once)
            theirs.extend(struct.unpack("d", os.read(_SHARED["ranked"][0], 8)))
        return theirs[0], here

    result, (rank, light) = finish(s, parts, ahead), losing
    return light(result) if math.isfinite(ahead()[0]) and (rank(result), s) > ahead() else result


def _evaluate_shared() -> list[tuple[int, list[Part]]]:
    """A worker's share of the tasks (``_evaluated``): each task it takes and its searches' parts."""
    searches, tasks = _SHARED["searches"], _SHARED["tasks"]
    with rows_kept():
        return [(t, _evaluate_task(searches, tasks[t])) for t in _taken(_SHARED["tokens"])]
