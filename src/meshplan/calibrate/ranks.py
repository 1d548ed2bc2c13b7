"""How local rank processes start (calibrate's collectives, check-step's data parallelism, the tests that run a
printed program over gloo): the start method that is safe from the process asking.

``fork`` copies only the calling thread. A lock that another thread of the parent held at that moment (an OpenMP or
intra-op pool's, an allocator's) stays held in the child, whose first use of it then waits forever: the ranks hang
and their parent waits for them. This project's test suite saw it once: a forked gloo rank asleep on a futex after
its sibling had exited. Python's multiprocessing docs say of the fork start method that "safely forking a
multithreaded process is problematic", and from Python 3.12 os.fork warns where it sees other threads.

So the ranks are forked only from a process that has a single thread, which is quick (PyTorch is already imported).
Otherwise on CPU they come from the ``forkserver``: a single-threaded server process, started once with PyTorch's
distributed modules imported (``PRELOAD``), forks each rank; as with ``spawn``, a rank imports the function it runs
by its module's name and re-runs a ``__main__`` script that has no ``if __name__ == "__main__"`` guard. CUDA needs
``spawn`` (a forked child cannot re-initialise it).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
import threading
from typing import Any

# what the fork server imports once, so that a rank it forks starts with them loaded (with the module of the
# function the ranks run: start_ranks); a server already running keeps what it loaded, and its ranks import the rest
PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor", "torch.distributed.tensor.parallel",
           "torch.distributed.fsdp", "meshplan.calibrate.collectives", "meshplan.measure.dp"]


def threads() -> int:
    """Threads of this process: the kernel's count where /proc has it (native threads included, which OpenMP and
    PyTorch's pools start and Python's ``threading`` does not see), else Python's."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def start_method(device: str, cuda_initialized: bool = False) -> str:
    """``fork`` for CPU ranks from a single-threaded process, ``forkserver`` for CPU ranks otherwise, ``spawn`` for
    CUDA ranks, for a parent whose CUDA is initialised, or where neither fork nor the fork server exists (Windows)."""
    methods = multiprocessing.get_all_start_methods()
    if device != "cpu" or cuda_initialized:
        return "spawn"
    if "fork" in methods and threads() == 1:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def start_ranks(fn: Any, args: tuple, world: int, device: str) -> None:
    """Run ``fn(rank, *args)`` in ``world`` local processes and wait for them all (torch.multiprocessing, which
    raises the first rank's error in the parent), started as ``start_method`` says."""
    import torch
    import torch.multiprocessing as mp

    method = start_method(device, torch.cuda.is_initialized())
    if method == "forkserver":
        multiprocessing.set_forkserver_preload([*PRELOAD, fn.__module__])
    mp.start_processes(fn, args=args, nprocs=world, join=True, start_method=method)


def run_ranks(fn: Any, args: tuple, world: int, device: str, prefix: str) -> Any:
    """Run ``fn(rank, world, rendezvous, out, *args)`` in ``world`` local processes (``start_ranks``), with a
    rendezvous file and a result file ``out`` in a temporary directory named from ``prefix``, and return what rank 0
    handed back there (``hand_back``)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        out = os.path.join(tmp, "result.pkl")
        start_ranks(fn, (world, os.path.join(tmp, "rendezvous"), out, *args), world, device)
        with open(out, "rb") as f:
            return pickle.load(f)


def hand_back(out: str, result: Any) -> None:
    """Rank 0's ``result`` for its parent (``run_ranks``), written to ``out`` whole or not at all."""
    with open(out + ".tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(out + ".tmp", out)
