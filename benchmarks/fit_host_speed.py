"""Fit a system's host speed (``Cluster.python_host``: its host CPU's time for PyTorch's Python-side work against the
x86 DGX H100 host the stacks' host constants refer to) on the fit half of the small-work dev set's twin runs.

Megatron-LM's CI ran the same test cases, with the same flags and harness, on one DGX H100 and one DGX A100 (its H100
values written at 6aad2116 / aa96ab73, 2024-02-01, its A100 values at a59d6fe6 / 7cb35c14, about six weeks later:
data/validation/small_work.jsonl, groups ``megatron_lm_ci_golden_2024_h100`` / ``_a100``; data/validation/README.md).
A twin pair differs only in the system: its GPUs, which meshplan prices, and its host CPU (2 x Xeon Platinum 8480C
against 2 x AMD EPYC 7742), which it prices through python_host. What the harness adds (per-micro-batch timer syncs,
per-step logging) is host work of both, which the CI profile prices (Stack.microbatch_host, fitted on the same fit
half, and Stack.iteration_host: meshplan_validation/sources.py). Whatever else the A100 runs' prices miss is folded into
the fit too: on the fit half's 3 runs 1.57, on all 9 pairs 1.60, on the check half's 6 alone 1.62 (1.56, 1.60, 1.62
before the roofline's ridge, 2026-11-28; 1.55, 1.59, 1.61 with the GEMM tiles before 2026-11-27; 1.53, 1.58, 1.60
before the profile priced its loop's host work). So the DGX
A100's python_host is the one under which each fit-half A100 run reads the error of its H100 twin (priced at
python_host 1): the least-squares f of Σ_runs (e_A100(f) − e_H100)², by a scan of f in steps of 0.01 from 1 to 3 (the
error only grows with f: more host time never shortens a step). The check half's twins are reported beside it; the
value is copied into presets/hardware/a100.toml by hand.

Run: python benchmarks/fit_host_speed.py
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from meshplan_validation.case import map_run
from meshplan_validation.evaluate import evaluate_case
from meshplan_validation.records import read_runs
from meshplan_validation.selection import in_fit_set

ROOT = Path(__file__).resolve().parents[1]
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


def main() -> None:
    pairs = twins()
    fit_pairs = [p for p in pairs if in_fit_set(p[0]["id"])]
    f, rms = fit(fit_pairs)
    print(f"DGX A100 python_host fitted on {len(fit_pairs)} fit-half A100 runs (of {len(pairs)} twin pairs): {f:.2f} "
          f"(rms error gap to the H100 twins {100 * rms:.1f} points)")
    print("run | half | H100 twin error | A100 error at 1 | A100 error at the fit")
    for a, h in pairs:
        half = "fit" if in_fit_set(a["id"]) else "check"
        print(f"{a['id']} | {half} | {100 * error(h):+.1f} % | {100 * error(a):+.1f} % | {100 * error(a, f):+.1f} %")


if __name__ == "__main__":
    main()
