"""Plans evaluated per second by the exhaustive search, and the wall time of the whole CLI call.

Run: python benchmarks/measure/search_speed.py [--repeat N] [--out FILE]  (N alternating one- and two-worker runs per
case, medians; --out writes the measurement as JSON, with benchmarks/measure/estimate_speed.py's, for
benchmarks/docs/speed_doc.py, which renders docs/SPEED.md from it: data/measured/*-search-speed.json)
Peers, for scale (measured on this kind of machine): the seed-003 reference evaluates about
150-200 plans/s; Calculon about 160 plans/s stock and 1,850 plans/s with its logging silenced.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import meshplan
from meshplan.search import SearchResult, Space, search
from meshplan.specs.hardware import Cluster, load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model
from meshplan.specs.stack import Stack

# peers' plans per second, measured on this kind of machine (the docstring): printed beside meshplan's
PEERS = (("the seed-003 reference model (Subramanian et al. 2024, arXiv 2410.00273)", 150, 200),
         ("Calculon, stock", 160, 160), ("Calculon, its logging silenced", 1850, 1850))


def rate_text(low: float, high: float) -> str:
    """A peer's plans per second, or their range."""
    return f"{low:,.0f}" if low == high else f"{low:,.0f}-{high:,.0f}"


CASES = [  # model, system, GPUs, global batch (sequences), NVLink domain override
    ("gpt3-175b", "a100", 1024, 1536, None),
    ("megatron-1t", "b200", 4096, 4096, 8),
    ("llama3.1-405b", "h100", 16384, 2048, None),
    ("deepseek-v3", "h100", 2048, 8192, None),
    ("llama3-70b", "h100", 1024, 512, None),  # the README's quick start: below search.PARALLEL_ABOVE
    # three tiers (8 x 256 x 8: NVLink, 3,072-GPU pods, the 1:7 aggregation layer): more placements are distinct
    ("llama3.1-405b", "h100-meta-24k", 16384, 2048, None),
]


def cli_seconds(args: list[str]) -> float:
    exe = shutil.which("meshplan") or sys.executable
    cmd = [exe, *args] if exe.endswith("meshplan") else [exe, "-m", "meshplan.cli", *args]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - start


def _spin(n: int) -> float:
    start, total = time.perf_counter(), 0
    for i in range(n):
        total += i * i
    return time.perf_counter() - start


def core_contention(n: int = 3_000_000) -> float:
    """How much slower one CPU-bound process runs while a second one runs on the other core."""
    import multiprocessing

    alone = min(_spin(n) for _ in range(2))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        together = max(pool.map(_spin, [n, n]))
    return together / alone


def case_label(name: str, system: str, gpus: int, domain: int | None) -> str:
    return f"{name} on {gpus} x {system}" + (f" (NVLink {domain})" if domain else "")


def whole_space(gbs: int) -> Space:
    """Every plan meshplan models (the generic stack), no headroom, by time: the whole space, not Space's defaults."""
    return Space(global_batch=gbs, stack=Stack(), headroom=0.0, prefer_simple=False)


def case_cluster(system: str, gpus: int, domain: int | None) -> Cluster:
    return load_system(system).cluster(gpus, **({"nvlink_domain": domain} if domain else {}))


def timed(model: ModelSpec, cluster: Cluster, gbs: int, repeat: int) -> tuple[SearchResult, float, float]:
    """The one-process result and the median seconds of one and of two workers over ``repeat`` alternating runs
    (alternating, so that a slow spell of the shared machine falls on both)."""
    space, one, two = whole_space(gbs), [], []
    for _ in range(repeat):
        result = search(model, cluster, space, top_k=1, workers=1)
        one.append(result.seconds)
        two.append(search(model, cluster, space, top_k=1, workers=2).seconds)
    return result, statistics.median(one), statistics.median(two)


def framework_searches() -> list[dict[str, Any]]:
    """The searches a user runs with the command line's defaults, Space's (megatron-core, MEMORY_HEADROOM, simplest of
    the equivalents first), one process, against their targets: the quick start, the 1T model and DeepSeek-V3 (an MoE,
    whose wide error band keeps the most plans timed: search/best.py) within 1 s, a strong-scaling table over 8 GPU
    counts within 2 s, the seed-003 sweep (3 systems x NVLink 4 / 8 / 64 x 6 counts) within 10 s."""
    def space(gbs: int) -> Space:
        return Space(global_batch=gbs)

    def seconds(runs: list[tuple[str, str, int, int, int | None]]) -> float:
        start = time.perf_counter()
        for name, system, gpus, gbs, domain in runs:
            overrides = {"nvlink_domain": domain} if domain else {}
            search(load_model(name), load_system(system).cluster(gpus, **overrides), space(gbs), top_k=10, workers=1)
        return time.perf_counter() - start

    rows = [("quick start: llama3-70b on 1024 x h100", seconds([("llama3-70b", "h100", 1024, 512, None)]), 1.0),
            ("megatron-1t on 4096 x b200 (NVLink 8)", seconds([("megatron-1t", "b200", 4096, 4096, 8)]), 1.0),
            # an MoE model's error band (41 % on Hopper) keeps the most plans timed: every plan within it can lead
            ("deepseek-v3 on 2048 x h100 (MoE)", seconds([("deepseek-v3", "h100", 2048, 8192, None)]), 1.0),
            ("strong scaling: llama3-70b on 8 counts 128-16384 x h100",
             seconds([("llama3-70b", "h100", 128 * 2**i, 2048, None) for i in range(8)]), 2.0),
            ("seed-003 sweep: megatron-1t, 3 systems x NVLink 4/8/64 x 6 counts",
             seconds([("megatron-1t", system, 256 * 2**i, 4096, nv) for system in ("a100", "h200", "b200")
                      for nv in (4, 8, 64) for i in range(6)]), 10.0)]
    print(f"\n{'with --framework megatron-core (one process)':<66} {'seconds':>8} {'target':>7}")
    for label, took, target in rows:
        print(f"{label:<66} {took:>8.2f} {target:>6.0f}s {'ok' if took <= target else 'over'}")
    return [{"search": label, "seconds": took, "target_s": target} for label, took, target in rows]


def best_plan(result: SearchResult) -> str:
    return result.plans[0].plan.describe() if result.plans else "none feasible"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="alternating runs per case; medians are printed")
    parser.add_argument("--out", type=Path, help="also write the measurement as JSON (benchmarks/docs/speed_doc.py)")
    args = parser.parse_args()
    repeat = max(1, args.repeat)
    cases: list[dict[str, Any]] = []
    print(f"{'case':<44} {'plans evaluated':>16} {'feasible':>12} {'1 core s':>9} {'plans/s/core':>13} "
          f"{'2 workers s':>12}  best plan")
    for name, system, gpus, gbs, domain in CASES:
        result, one, two = timed(load_model(name), case_cluster(system, gpus, domain), gbs, repeat)
        label = case_label(name, system, gpus, domain)
        print(f"{label:<44} {result.evaluated:>16,} {result.feasible:>12,} {one:>9.2f} "
              f"{result.evaluated / one:>13,.0f} {two:>12.2f}  {best_plan(result)}")
        cases.append({"model": name, "system": system, "gpus": gpus, "global_batch": gbs, "nvlink_domain": domain,
                      "evaluated": result.evaluated, "feasible": result.feasible, "one_core_s": one,
                      "two_workers_s": two, "best": best_plan(result)})
    print("peers, plans/s: " + "; ".join(f"{who} {rate_text(low, high)}" for who, low, high in PEERS))
    # Byte-compile meshplan first, as any install or first run does: with PYTHONDONTWRITEBYTECODE set (as on the
    # project's machines) an editable install would otherwise recompile its sources on every CLI start (~40 ms).
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(meshplan.__file__).parent)], check=True,
                   capture_output=True)
    args_cli = ["plan", "--model", "megatron-1t", "--system", "b200", "--gpus", "4096", "--global-batch", "4096",
                "--nvlink-domain", "8", "--json"]
    runs = sorted(cli_seconds(args_cli) for _ in range(3))
    print(f"whole CLI call, megatron-1t on 4096 x b200 (start-up included): median {runs[1]:.2f} s "
          f"(min {runs[0]:.2f} s)")
    framework = framework_searches()
    contention = core_contention()
    print(f"two CPU-bound processes on this machine each run {contention:.2f}x slower than one alone")
    if args.out:
        import estimate_speed

        measured = {"made_by": "benchmarks/measure/search_speed.py", "date": datetime.date.today().isoformat(),
                    "repeat": repeat, "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "cases": cases,
                    "cli": {"args": args_cli, "median_s": runs[1], "min_s": runs[0]}, "framework": framework,
                    "contention": contention, "estimate": estimate_speed.measure(),
                    "peers": [{"peer": who, "low": low, "high": high} for who, low, high in PEERS]}
        args.out.write_text(json.dumps(measured, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
