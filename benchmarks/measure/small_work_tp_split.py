"""Where vTrain's per-tensor-parallel errors come from (issue 79, the small-work regime): a tool to find mechanisms,
never to set a constant. Each run of data/validation/vtrain_single_node_dev.jsonl lies on its plan's line in the
micro-batch count n (benchmarks/measure/small_work_parts.py): T = n x (L x layer + outside) + step, for the measured
time and for meshplan's alike. Where the plan was run at both depths (12 and 20 layers) the two lines fix one
layer's time, the rest of a micro-batch outside the layers and the part paid once a step, so a run's signed error
(priced - measured) / measured splits exactly into three shares:

    n x L x (layer_p - layer_m) / T_m  +  n x (outside_p - outside_m) / T_m  +  (step_p - step_m) / T_m

``python benchmarks/measure/small_work_tp_split.py`` prints, per tensor-parallel size, the median and mean signed
error and the mean of each share (data/measured/2026-12-01-vtrain-tp-errors.md reads it);
tests/test_small_work_tp_split.py shows the arithmetic on made-up plans.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from meshplan_validation.records import clean_record, read_runs
from small_work_parts import DEPTHS, VTRAIN, cases, microbatches, plan_key, step_times

SHARES = ("layers", "outside", "step")


def fits(records: Sequence[dict[str, Any]], times: np.ndarray) -> dict[tuple[int, ...], tuple[float, float]]:
    """Per plan run at two or more global batches: (seconds per micro-batch, seconds per step), the least-squares
    line of its step times ``times`` in the micro-batch count."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(plan_key(r), []).append(i)
    out = {}
    for key, idx in groups.items():
        n = np.array([microbatches(records[i]) for i in idx], dtype=float)
        if len(set(n.tolist())) >= 2:
            slope, intercept = np.polyfit(n, times[idx], 1)
            out[key] = (float(slope), float(intercept))
    return out


def shares(records: Sequence[dict[str, Any]], measured: np.ndarray, priced: np.ndarray
           ) -> list[tuple[int, float, dict[str, float]]]:
    """Per run whose plan has lines at both DEPTHS: (tp, signed error, its three shares, module docstring)."""
    m, p = fits(records, measured), fits(records, priced)
    short, deep = DEPTHS
    out = []
    for i, r in enumerate(records):
        tp, pp, dp, mb, layers, hidden = plan_key(r)
        a, b = (tp, pp, dp, mb, short, hidden), (tp, pp, dp, mb, deep, hidden)
        if not all(k in m and k in p for k in (a, b)):
            continue
        n, t = microbatches(r), float(measured[i])
        layer = {s: (f[b][0] - f[a][0]) / (deep - short) for s, f in (("m", m), ("p", p))}
        line = {"m": m[plan_key(r)], "p": p[plan_key(r)]}
        outside = {s: line[s][0] - layers * layer[s] for s in "mp"}
        parts = {"layers": n * layers * (layer["p"] - layer["m"]) / t, "outside": n * (outside["p"] - outside["m"]) / t,
                 "step": (line["p"][1] - line["m"][1]) / t}
        out.append((tp, float(priced[i]) / t - 1.0, parts))
    return out


def table(rows: Sequence[tuple[int, float, dict[str, float]]]) -> list[str]:
    """Markdown rows per tensor-parallel size: runs, median and mean signed error, the mean of each share."""
    by_tp: dict[int, list[tuple[float, dict[str, float]]]] = {}
    for tp, err, parts in rows:
        by_tp.setdefault(tp, []).append((err, parts))
    out = ["| tp | runs | median signed | mean signed | mean from the layers | mean from outside the layers | "
           "mean from once a step |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for tp, group in sorted(by_tp.items()):
        errs = [e for e, _ in group]
        mean = [statistics.fmean(parts[s] for _, parts in group) for s in SHARES]
        out.append(f"| {tp} | {len(group)} | {100 * statistics.median(errs):+.1f} % | "
                   f"{100 * statistics.fmean(errs):+.1f} % | " + " | ".join(f"{100 * x:+.1f} %" for x in mean) + " |")
    return out


def main() -> list[str]:
    records = [clean_record(r) for r in read_runs(VTRAIN)]
    measured = np.array([float(r["measured"]["iteration_time_s"]) for r in records])
    return table(shares(records, measured, step_times(cases(records))))


if __name__ == "__main__":
    print("\n".join(main()))
