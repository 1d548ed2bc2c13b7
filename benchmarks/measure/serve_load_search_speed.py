"""Time ``meshplan serve --rate`` as a search, in-process (issue 81 deliverable 4, issue 83 item 4: at most 1 s).

Each case is one command line run through the CLI in this process (click's test runner), its search under the load
(serve/load/under_load.py: the steady-state shortlist, the idle-instance bound, each shape's fewest replicas by
simulation) timed end to end, best of three, beside a fixed reference workload timed in the same process so that a
loaded machine shows as a ratio (the reference: 200,000 NumPy float sums of a 1,000-element array); the CPU seconds
of this process beside the wall seconds (a machine shared with other work stretches the wall time, less the CPU
time), judged against the target.

Run: python benchmarks/measure/serve_load_search_speed.py
"""

from __future__ import annotations

import time

import numpy as np
from click.testing import CliRunner

from meshplan.cli.main import cli

BASE = "serve --input-len 1000 --output-len 200"
CASES = (  # label, arguments
    ("8B, 8 H100, 50 req/s, targets, ranked", "--model llama3-8b --system h100 --gpus 8 --rate 50 --ttft-slo 500ms "
     "--tpot-slo 30ms"),
    ("8B, 8 H100, 1 req/s, recommend", "--model llama3-8b --system h100 --gpus 8 --rate 1 --ttft-slo 500ms "
     "--tpot-slo 30ms --recommend"),
    ("70B, 64 H100, 50 req/s ShareGPT, recommend", "--model llama3-70b --system h100 --gpus 64 --rate 50 "
     "--lengths sharegpt --ttft-slo 1s --tpot-slo 100ms --recommend"),
    ("70B, 8 H100, 50 req/s, no targets", "--model llama3-70b --system h100 --gpus 8 --rate 50"),
)
TARGET_S = 1.0


def reference() -> float:
    """Seconds of the fixed reference workload (module docstring)."""
    x = np.arange(1000, dtype=float)
    start = time.perf_counter()
    for _ in range(200_000):
        x.sum()
    return time.perf_counter() - start


def timed(args: list[str]) -> tuple[float, float, str]:
    """Best wall and CPU seconds of three runs, and the output."""
    runner = CliRunner()
    best, cpu, out = float("inf"), float("inf"), ""
    for _ in range(3):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = runner.invoke(cli, args)
        best = min(best, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
        out = result.output
        if result.exit_code:
            raise SystemExit(f"{' '.join(args)}: exit {result.exit_code}\n{out}")
    return best, cpu, out


def main() -> None:
    print(f"{'case':<46}{'wall s':>8}{'CPU s':>7}{'ref s':>7}{'ratio':>7}  (target {TARGET_S:g} s)")
    for label, extra in CASES:
        ref = reference()
        seconds, cpu, _ = timed((BASE + " " + extra).split())
        verdict = "met" if cpu <= TARGET_S else "MISSED"
        print(f"{label:<46}{seconds:>8.2f}{cpu:>7.2f}{ref:>7.2f}{seconds / ref:>7.2f}  {verdict} (CPU)")


if __name__ == "__main__":
    main()
