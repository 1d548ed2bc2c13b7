"""search/workers.py: the search split into jobs finds the same in one process as in two."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.search import Space, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model


def test_two_workers_find_what_one_finds():
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(64)
    space = Space(global_batch=64, offload_optimizer=(False,), offload_activations=(False,))
    one = search(model, cluster, space, top_k=5, workers=1)
    two = search(model, cluster, space, top_k=5, workers=2)
    assert [e.plan for e in one.plans] == [e.plan for e in two.plans]
    assert (one.evaluated, one.feasible, one.rejected) == (two.evaluated, two.feasible, two.rejected)


def _same(a, b) -> None:
    """Two results alike in everything but the time they took (the refusals' examples and the plans' order too)."""
    left, right = a.to_dict(), b.to_dict()
    for d in (left, right):
        d.pop("seconds"), d.pop("plans_per_second")
    assert left == right


def test_forked_parts_merge_in_the_jobs_order(monkeypatch):
    """Forked workers finish in any order; their parts are merged in the jobs' order, so the first example of each
    refusal is the one the same jobs give in one process (before, the example of a refusal found in several jobs
    was whichever job finished first)."""
    from meshplan.search import workers

    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(64)
    space = Space(global_batch=64)  # offload on: Megatron-Core's refusals, found in several jobs
    forked = search(model, cluster, space, top_k=3, workers=2)
    evaluated = workers._evaluated
    monkeypatch.setattr(workers, "_evaluated", lambda searches, tasks, _: evaluated(searches, tasks, None))
    here = search(model, cluster, space, top_k=3, workers=2)  # the two workers' four jobs, in this process
    assert sum(1 for reason in forked.rejected if "refuses" in reason) >= 2
    _same(forked, here)


def test_searches_in_one_pool_find_what_each_finds_alone():
    """run.searches (search/variants.py: the expert-GEMM choices) runs several searches' jobs in one pool; each
    result is the one its search gives alone."""
    from meshplan.search.run import searches

    model, cluster = load_model("qwen3-30b-a3b"), load_system("h100").cluster(64)
    base = Space(global_batch=64, offload_optimizer=(False,), offload_activations=(False,))
    spaces = [replace(base, stack=base.stack.with_(expert_gemm=g)) for g in ("per_expert", "grouped")]
    together = searches(model, cluster, spaces, top_k=3, workers=2)
    for space, result in zip(spaces, together, strict=True):
        _same(result, search(model, cluster, space, top_k=3, workers=2))


@pytest.mark.parametrize("processes", [2, 1])
def test_fastest_searches_keep_the_winner_whole_and_of_the_loser_its_counts(monkeypatch, processes):
    """run.fastest_searches (search/variants.py): in a pool this process finishes the search whose parts hold the
    fastest plan, and a worker's result that it beats comes back without its plans (its counts and its fastest plan's
    step time kept): the winner is the one its search gives alone, the loser counts what it counts alone. In one
    process the same: the search whose parts hold the fastest plan finished first, the loser light without its
    listing ever ranked (run._finish: ``select._within`` runs for the winner alone)."""
    from meshplan.search import run, select
    from meshplan.search.run import fastest_searches

    model, cluster = load_model("qwen3-30b-a3b"), load_system("h100").cluster(64)
    base = Space(global_batch=64, offload_optimizer=(False,), offload_activations=(False,))
    spaces = [replace(base, stack=base.stack.with_(expert_gemm=g)) for g in ("per_expert", "grouped")]
    alone = [search(model, cluster, space, top_k=3, workers=1) for space in spaces]
    monkeypatch.setattr(run, "worker_count", lambda combos, workers: processes)  # a pool, small as the space is
    within, listed = select._within, []
    monkeypatch.setattr(select, "_within", lambda kept, *rest: listed.append(kept) or within(kept, *rest))
    found = fastest_searches(model, cluster, spaces, top_k=3)
    win = min(range(len(spaces)), key=lambda s: (alone[s].fastest.step_time, s))
    _same(found[win], alone[win])
    lose = found[1 - win]
    assert not lose.plans and lose.fastest.detail is None  # beaten: light
    assert len(listed) == 1  # the winner's (one process: the loser's listing not ranked; a worker's not seen here)
    assert lose.fastest.step_time == alone[1 - win].fastest.step_time
    assert (lose.evaluated, lose.feasible, lose.bounded, lose.rejected) == (
        alone[1 - win].evaluated, alone[1 - win].feasible, alone[1 - win].bounded, alone[1 - win].rejected)


def _stuck(_: int) -> int:
    import time

    time.sleep(120)  # a worker busy (or, as in the hang, waiting on the task queue's lock) when the pool is ended
    return 0


def test_a_pool_is_ended_whatever_sigterm_handler_the_process_had():
    """A library in the parent process (a test process had one) installed a SIGTERM handler that returns: the forked
    workers inherited it, Pool.terminate's SIGTERM ran it and the worker went on waiting, and the search's process
    waited for it for ever. The workers' initializer restores SIGTERM's default, so ending the pool ends them."""
    import multiprocessing
    import os
    import signal
    import threading
    import time

    from meshplan.search.workers import ignore_interrupts

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        pool = multiprocessing.get_context("fork").Pool(1, initializer=ignore_interrupts)
        pool.map_async(_stuck, [0])
        time.sleep(0.5)  # the worker is in its task
        pids = [p.pid for p in pool._pool]  # the workers, to clean up if the pool does not end them
        ender = threading.Thread(target=pool.terminate, daemon=True)
        ender.start()
        ender.join(20)
        hung = ender.is_alive()
        for pid in pids:
            if hung:
                os.kill(pid, signal.SIGKILL)
        assert not hung, "Pool.terminate did not end a worker that inherited a SIGTERM handler"
    finally:
        signal.signal(signal.SIGTERM, previous)


def _square_or_fail(i: int) -> int:
    if i in (2, 3):
        raise ValueError(f"count {i}")
    return i * i


def test_forked_map_returns_in_index_order_and_raises_the_least_failure(monkeypatch):
    """forked_map hands out the i's largest first and returns their results in the i's order, forked (two idle cores)
    or in this process (none); where calls fail, the least i's error, as a loop over the i's in order raises."""
    import pytest

    from meshplan.search import workers

    for idle in (1, 2):
        monkeypatch.setattr(workers, "idle_cores", lambda idle=idle: idle)
        seen: list[tuple[int, int]] = []
        assert workers.forked_map(lambda i: i * i, [4, 0, 1, 3, 2], lambda d, t, seen=seen: seen.append((d, t))
                                  ) == [0, 1, 4, 9, 16]  # 0², 1², 2², 3², 4²
        assert seen == [(d, 5) for d in range(1, 6)]
        with pytest.raises(ValueError, match="count 2"):
            workers.forked_map(_square_or_fail, [3, 2, 1, 0])


def test_a_search_in_a_forked_map_worker_runs_alone(monkeypatch):
    """A worker of forked_map searches in its own process (worker_count 1): its siblings hold the other cores. A
    space of 8·10^6 placed plans would fork two workers elsewhere (PARALLEL_ABOVE) on a machine of two cores."""
    from types import SimpleNamespace

    from meshplan.search import workers

    large = [SimpleNamespace(sizes=10**6)]
    monkeypatch.setattr(workers, "idle_cores", lambda: 2)
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 2)
    assert workers.worker_count(large, 0) == 2
    assert workers.forked_map(lambda i: workers.worker_count(large, 0), [0, 1]) == [1, 1]


def _pid_after(i: int) -> tuple[int, int]:
    import os
    import time

    time.sleep(0.1)  # long enough that this process, which starts at once, takes some under any load
    return i, os.getpid()


def test_forked_map_works_in_this_process_beside_its_workers(monkeypatch):
    """forked_map forks one process fewer than it uses: this one takes the next i when it is free, as the workers do
    (each i taken once, from a pipe written whole before the fork: workers._handout)."""
    import os

    from meshplan.search import workers

    monkeypatch.setattr(workers, "idle_cores", lambda: 2)
    found = workers.forked_map(_pid_after, list(range(16)))
    assert [i for i, _ in found] == list(range(16))
    assert os.getpid() in {pid for _, pid in found}  # this process took some (it starts on them at once)


def test_handout_gives_each_number_once_to_every_reader_together():
    """A number written to _handout's pipe is read by one process only, whichever reads first; a long list (more
    than a page of numbers) fits too."""
    import multiprocessing
    import os

    from meshplan.search import workers

    numbers = list(range(3000))
    tokens = workers._handout(numbers)
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            helpers = [pool.apply_async(_taken_list, (tokens,)) for _ in range(2)]
            mine = list(workers._taken(tokens))
            theirs = [n for helper in helpers for n in helper.get()]
            pool.close()  # the workers take their sentinels and exit, as search/workers.py's pools end: the
            pool.join()  # ``with``'s terminate() would SIGTERM them, and a process that ran Ray before (test_sweep
            # in this xdist worker) handed its forks a SIGTERM handler that left one waiting on the pool's lock
    finally:
        os.close(tokens)
    assert sorted(mine + theirs) == numbers


def _taken_list(tokens: int) -> list[int]:
    from meshplan.search import workers

    return list(workers._taken(tokens))


def test_meshplan_workers_caps_the_processes_whatever_the_idle_cores(monkeypatch):
    """``MESHPLAN_WORKERS=1`` keeps forked_map's calls and a large space's search in this process, where two idle
    cores of two would fork (workers.most_processes: a benchmark's CPU seconds the same work in every run); unset or
    empty, the machine's cores; anything but a positive integer is refused with the variable named."""
    import os
    from types import SimpleNamespace

    import pytest

    from meshplan.errors import SpecError
    from meshplan.search import workers

    large = [SimpleNamespace(sizes=10**6)]  # 8·10^6 placed plans > PARALLEL_ABOVE
    monkeypatch.setattr(workers, "idle_cores", lambda: 2)
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 2)
    for unset in (None, "", " "):
        if unset is None:
            monkeypatch.delenv("MESHPLAN_WORKERS", raising=False)
        else:
            monkeypatch.setenv("MESHPLAN_WORKERS", unset)
        assert workers.most_processes() == 2  # the cores
        assert workers.worker_count(large, 0) == 2
    monkeypatch.setenv("MESHPLAN_WORKERS", "1")
    assert workers.most_processes() == 1
    assert workers.worker_count(large, 0) == 1
    assert workers.worker_count(large, 3) == 3  # a caller's own count stands
    assert {pid for _, pid in workers.forked_map(_pid_after, [0, 1, 2])} == {os.getpid()}
    for wrong in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv("MESHPLAN_WORKERS", wrong)
        with pytest.raises(SpecError, match=f"MESHPLAN_WORKERS='{wrong}' must be a positive integer"):
            workers.most_processes()
