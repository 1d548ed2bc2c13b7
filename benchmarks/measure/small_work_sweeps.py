"""Sweeps of equal work in the small-work regime (issue 46, "It must show"): runs that share the model, the GPUs,
the global batch and the sequence and differ only in their plan (tp, pp, dp, micro-batch). Within a sweep meshplan
is judged as a planner: the Spearman rank correlation of its predicted times against the measured ones
(scipy.stats.spearmanr), and the regret of its pick, the measured time of the run it predicts fastest over the
measured best, minus 1 (0 when it picks the fastest run).

A throughput (tokens/s) is turned into a time as its inverse: within a sweep the work per step is the same, so
1 / throughput orders the runs as their step times do.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from scipy.stats import spearmanr

from meshplan_validation.result import RunResult

SWEEP_MIN_RUNS = 3  # a sweep: at least this many runs of equal work (issue 46's rank correlation needs an order)
_TIME_METRICS = ("iteration_time_s",)


def sweep_key(record: dict[str, Any]) -> tuple[Any, ...]:
    """What a sweep's runs share: the model's shape, the GPU and their count, the global batch and the sequence."""
    m, hw, par = record.get("model") or {}, record.get("hardware") or {}, record.get("parallel") or {}
    shape = tuple(m.get(k) for k in ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size"))
    return (*shape, m.get("seq_length"), hw.get("gpu"), hw.get("num_gpus"), par.get("global_batch_size"),
            record.get("framework"), record.get("precision"))


def as_time(metric: str, value: float) -> float:
    """A step time, or a quantity proportional to it within a sweep of equal work (1 / throughput)."""
    return value if metric in _TIME_METRICS else 1.0 / value


def sweeps(records: Sequence[dict[str, Any]], results: Sequence[RunResult]
           ) -> list[list[tuple[str, float, float]]]:
    """The sweeps of equal work among the evaluated runs (``sweep_key`` and the measured metric): each a list of (id,
    predicted time, measured time), by id, of at least SWEEP_MIN_RUNS runs."""
    by_id = {str(r["id"]): r for r in records}
    groups: dict[tuple[Any, ...], list[tuple[str, float, float]]] = {}
    for r in results:
        if r.skipped or r.predicted is None or r.measured is None or r.id not in by_id:
            continue
        run = (r.id, as_time(r.metric, r.predicted), as_time(r.metric, r.measured))
        # one metric a sweep: 1 / throughput ranks against other throughputs only, not against step times
        groups.setdefault((*sweep_key(by_id[r.id]), r.metric), []).append(run)
    return [sorted(g) for _, g in sorted(groups.items(), key=lambda kv: str(kv[0])) if len(g) >= SWEEP_MIN_RUNS]


def spearman(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Spearman's rank correlation of the predicted and the measured times (ties take their mean rank)."""
    return float(spearmanr(predicted, measured).statistic)


def regret(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """The measured time of the run predicted fastest over the measured best, minus 1 (the first such run on a tie
    of predictions)."""
    pick = min(range(len(predicted)), key=lambda i: predicted[i])
    return measured[pick] / min(measured) - 1.0


def sweep_metrics(sweep: Sequence[tuple[str, float, float]]) -> dict[str, Any]:
    pred, meas = [p for _, p, _ in sweep], [m for _, _, m in sweep]
    best = min(range(len(meas)), key=lambda i: meas[i])
    pick = min(range(len(pred)), key=lambda i: pred[i])
    return {"runs": len(sweep), "spearman": spearman(pred, meas), "regret": regret(pred, meas),
            "measured_best": sweep[best][0], "predicted_best": sweep[pick][0]}


def pooled(metrics: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Over the sweeps: their count, their runs, the mean and the lowest Spearman, the median and the largest
    regret, and the share of sweeps whose pick is within 10 % of the measured best (issue 46's bar)."""
    if not metrics:
        return {"sweeps": 0, "runs": 0, "mean_spearman": None, "min_spearman": None, "median_regret": None,
                "max_regret": None, "within_10pct": None}
    rho = [m["spearman"] for m in metrics]
    reg = [m["regret"] for m in metrics]
    return {"sweeps": len(metrics), "runs": sum(m["runs"] for m in metrics), "mean_spearman": statistics.mean(rho),
            "min_spearman": min(rho), "median_regret": statistics.median(reg), "max_regret": max(reg),
            "within_10pct": sum(r <= 0.10 for r in reg) / len(reg)}


def _f(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f} %" if pct else f"{x:.2f}"


def sweep_section(records: Sequence[dict[str, Any]], results: Sequence[RunResult]
                  ) -> tuple[list[str], dict[str, Any]]:
    """The ACCURACY.md subsection "Sweeps of equal work" and its summary entry."""
    found = sweeps(records, results)
    metrics = [sweep_metrics(s) for s in found]
    summary = {"per_sweep": metrics, "pooled": pooled(metrics)}
    out = ["", "### Sweeps of equal work", "",
           f"Runs (≥ {SWEEP_MIN_RUNS}) sharing the model, the GPUs, the global batch, the sequence, the stack and the "
           "precision, differing only in their plan. Spearman: rank correlation of predicted and measured step "
           "times (issue 46 asks ≥ 0.85). Regret: measured time of the run meshplan predicts fastest over the "
           "measured best, minus 1 (issue 46 asks ≤ 10 %).", ""]
    if not found:
        return [*out, "No sweep of equal work in the set."], summary
    out += ["| sweep (first run) | runs | Spearman | regret | measured best | meshplan's pick |",
            "|---|---:|---:|---:|---|---|"]
    for s, m in zip(found, metrics, strict=True):
        out.append(f"| {s[0][0]} | {m['runs']} | {_f(m['spearman'])} | {_f(m['regret'], True)} | "
                   f"{m['measured_best']} | {m['predicted_best']} |")
    p = summary["pooled"]
    out += ["", f"Pooled: {p['sweeps']} sweep(s), {p['runs']} runs; Spearman mean {_f(p['mean_spearman'])}, "
            f"lowest {_f(p['min_spearman'])}; regret median {_f(p['median_regret'], True)}, largest "
            f"{_f(p['max_regret'], True)}; picks within 10 % of the best: {_f(p['within_10pct'], True)}."]
    return out, summary
