"""Check the DGX A100's host speed (``Cluster.python_host``: its host CPU's time for PyTorch's Python-side work against
the x86 DGX H100 host the stacks' host constants refer to) against the small-work dev set's twin runs. No longer a fit
(issue 79: fitted on Megatron-LM's CI twins, 1.57 did not earn its place out of source): the preset's value is a
measured single-task integer speed ratio (SPEC CPU2017 SPECspeed2017_int, presets/hardware/a100.toml), and this script
reports what the twins read at it.

Megatron-LM's CI ran the same test cases, with the same flags and harness, on one DGX H100 and one DGX A100 (its H100
values written at 6aad2116 / aa96ab73, 2024-02-01, its A100 values at a59d6fe6 / 7cb35c14, about six weeks later:
data/validation/small_work.jsonl, groups ``megatron_lm_ci_golden_2024_h100`` / ``_a100``; data/validation/README.md).
A twin pair differs only in the system: its GPUs, which meshplan prices, and its host CPU (2 x Xeon Platinum 8480C
against 2 x AMD EPYC 7742), which it prices through python_host. What the harness adds (per-micro-batch timer syncs,
per-step logging) is host work of both, which the CI profile prices (Stack.microbatch_host, fitted on the CI's fit
half, and Stack.iteration_host: meshplan_validation/sources.py). Printed: each twin pair's errors at python_host 1 and
at the preset's measured value, and, for reference only, the value under which the A100 runs would read their H100
twins' errors (the least-squares f of Σ_runs (e_A100(f) − e_H100)², a scan of f in steps of 0.01 from 1 to 3, on the
fit half and on all pairs; 1.57 on the fit half when it was the shipped fit): whatever else the A100 runs' prices miss
is folded into that number, which is why it is not shipped.

Run: python benchmarks/measure/fit_host_speed.py
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from meshplan.specs.hardware import load_system
from meshplan_validation.case import map_run
from meshplan_validation.evaluate import evaluate_case
from meshplan_validation.records import read_runs
from meshplan_validation.selection import in_fit_set

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "data" / "validation" / "small_work.jsonl"
TWINS = ("megatron_lm_ci_golden_2024_a100", "megatron_lm_ci_golden_2024_h100")
SCAN = np.round(np.arange(1.0, 3.0001, 0.01), 2)


def twins(path: Path = RUNS) -> list[tuple[dict, dict]]:
    """(A100 record, H100 record) pairs of the same test case: ids equal but for the system suffix."""
    records = read_runs(path)
    a100 = {r["id"].removesuffix("_8xa100"): r for r in records if r.get("group") == TWINS[0]}
    h100 = {r["id"].removesuffix("_8xh100"): r for r in records if r.get("group") == TWINS[1]}
    return [(a100[k], h100[k]) for k in sorted(a100) if k in h100]


def error(record: dict, python_host: float = 1.0) -> float:
    """predicted / measured − 1 of ``record`` with its cluster's python_host set."""
    case = map_run(record)
    case = replace(case, cluster=replace(case.cluster, python_host=python_host))
    result = evaluate_case(case)
    assert result.error is not None
    return result.error


def fit(pairs: list[tuple[dict, dict]]) -> tuple[float, float]:
    """The scan's least-squares python_host over ``pairs`` and its root-mean-square error gap."""
    targets = [error(h) for _, h in pairs]
    gaps = [sum((error(a, f) - t) ** 2 for (a, _), t in zip(pairs, targets, strict=True)) for f in SCAN]
    best = int(np.argmin(gaps))
    return float(SCAN[best]), float(np.sqrt(gaps[best] / len(pairs)))


def measured() -> float:
    """The DGX A100 preset's python_host: the measured ratio (presets/hardware/a100.toml)."""
    return float(load_system("a100").cluster(8).python_host)


def main() -> None:
    pairs = twins()
    fit_pairs = [p for p in pairs if in_fit_set(p[0]["id"])]
    f = measured()
    gaps = {name: [error(a, f) - error(h) for a, h in ps] for name, ps in (("fit half", fit_pairs), ("all", pairs))}
    print(f"DGX A100 python_host as measured: {f:.2f}; mean A100 - H100 twin error gap there: "
          + ", ".join(f"{n} {100 * float(np.mean(g)):+.1f} points ({len(g)} pairs)" for n, g in gaps.items()))
    for name, ps in (("fit half", fit_pairs), ("all pairs", pairs)):
        best, rms = fit(ps)
        print(f"for reference, the value the twins alone would give ({name}, {len(ps)}): {best:.2f} "
              f"(rms gap {100 * rms:.1f} points)")
    print("run | half | H100 twin error | A100 error at 1 | A100 error at the measured value")
    for a, h in pairs:
        half = "fit" if in_fit_set(a["id"]) else "check"
        print(f"{a['id']} | {half} | {100 * error(h):+.1f} % | {100 * error(a):+.1f} % | {100 * error(a, f):+.1f} %")


if __name__ == "__main__":
    main()
