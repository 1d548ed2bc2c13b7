"""How long a vLLM V0 tensor-parallel worker sleeps between two looks at the driver's input queue, measured on this
host (presets/engines/vllm-v0.toml ``tp_broadcast_poll``).

Under tensor parallelism vLLM V0's driver sends each iteration's input metadata to the other workers through a
shared-memory ring buffer (vllm/distributed/device_communicators/shm_broadcast.py ``MessageQueue``, the TP group's
``mq_broadcaster``: vllm/distributed/parallel_state.py, ``use_message_queue_broadcaster=True`` for the TP group, read in
the v0.5.3.post1 and v0.6.1.post2 wheels). A waiting worker checks the buffer's flags and, when nothing is written,
calls ``time.sleep(RINGBUFFER_SLEEP_INTERVAL)`` with RINGBUFFER_SLEEP_INTERVAL = 1e-7 s (``acquire_read``) before it
looks again. Linux rounds such a sleep up to the thread's timer slack, 50 us by default (prctl(2) PR_SET_TIMERSLACK,
/proc/self/timerslack_ns), so a worker looks about every 50-60 us, not every 0.1 us: a write waits up to one such
interval before a given worker sees it.

Here: the same call, ``time.sleep(1e-7)``, timed 5,000 times after 200 warm-up calls (time.perf_counter), its median,
10th and 90th percentiles, with this thread's timer slack. No GPU, no vLLM: the interval is the kernel's, not vLLM's
Python's.

Run: python benchmarks/measure/shm_poll_sleep.py [--out data/measured/2026-11-29-shm-poll-sleep.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

INTERVAL = 1e-7  # vLLM's RINGBUFFER_SLEEP_INTERVAL (shm_broadcast.py, v0.5.3.post1 and v0.6.1.post2)
CALLS, WARM = 5000, 200


def timer_slack() -> int | None:
    """This thread's timer slack in nanoseconds (Linux), None where the file is absent."""
    path = Path("/proc/self/timerslack_ns")
    return int(path.read_text()) if path.exists() else None


def sleeps(calls: int = CALLS) -> list[float]:
    """Seconds each of ``calls`` ``time.sleep(INTERVAL)`` calls took, sorted."""
    for _ in range(WARM):
        time.sleep(INTERVAL)
    out = []
    for _ in range(calls):
        start = time.perf_counter()
        time.sleep(INTERVAL)
        out.append(time.perf_counter() - start)
    return sorted(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    xs = sleeps()
    row = {"what": "seconds one time.sleep(1e-7) takes: a vLLM V0 worker's interval between two looks at the driver's "
                   "shared-memory input queue (shm_broadcast.py MessageQueue.acquire_read)",
           "made_by": "benchmarks/measure/shm_poll_sleep.py", "date": datetime.date.today().isoformat(),
           "host": platform.machine(), "kernel": platform.release(), "python": platform.python_version(),
           "timerslack_ns": timer_slack(), "calls": CALLS, "median_s": statistics.median(xs),
           "p10_s": xs[len(xs) // 10], "p90_s": xs[9 * len(xs) // 10]}
    print(json.dumps(row, indent=1))
    if args.out:
        args.out.write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    main()
