"""How local ranks start (calibrate/ranks.py): forked only from a process of one thread, from the fork server
otherwise on CPU, spawned for CUDA; ranks started from a process with threads running still finish."""

from __future__ import annotations

import os
import tempfile
import threading
from datetime import timedelta

import pytest

from meshplan.calibrate import ranks

torch = pytest.importorskip("torch")


def test_only_a_single_threaded_process_forks(monkeypatch):
    monkeypatch.setattr(ranks, "threads", lambda: 1)
    assert ranks.start_method("cpu") == "fork"
    monkeypatch.setattr(ranks, "threads", lambda: 5)  # an OpenMP pool, a test runner's I/O thread, ...
    assert ranks.start_method("cpu") == "forkserver"
    assert ranks.start_method("cuda") == "spawn"
    monkeypatch.setattr(ranks, "threads", lambda: 1)
    assert ranks.start_method("cpu", cuda_initialized=True) == "spawn"  # a forked child cannot re-initialise CUDA


def test_the_thread_count_sees_a_thread_python_started():
    before = ranks.threads()
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert ranks.threads() == before + 1
    finally:
        stop.set()
        worker.join()


def _sum(rank: int, world: int, rendezvous: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    x = torch.tensor([float(rank + 1)])
    dist.all_reduce(x)
    if rank == 0:
        with open(out, "w") as f:
            f.write(str(x.item()))
    dist.destroy_process_group()


def test_ranks_started_beside_a_busy_thread_finish():
    """Two gloo ranks all-reduce 1 + 2 while this process runs a thread that holds a lock in a loop (what a fork
    would copy held): they come from the fork server and finish."""
    lock, stop = threading.Lock(), threading.Event()

    def busy() -> None:
        while not stop.is_set():
            with lock:
                pass

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        assert ranks.start_method("cpu") == "forkserver"
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "sum")
            ranks.start_ranks(_sum, (2, os.path.join(tmp, "rendezvous"), out), 2, "cpu")
            with open(out) as f:
                assert float(f.read()) == 3.0
    finally:
        stop.set()
        worker.join()
