"""Which of vTrain's sweeps meshplan picks wrong, and which priced part makes it (issue 79, the small-work regime): a
tool to find mechanisms, never to set a constant. A sweep (benchmarks/measure/small_work_sweeps.py: one model, GPU
count and global batch of data/validation/vtrain_single_node_dev.jsonl) fails where the measured time of the plan
meshplan predicts fastest is more than 10 % over the measured best. For each failing sweep this lists the picked plan
and the measured best side by side, each as its parts (benchmarks/measure/small_work_parts.py: the plan's line in the
micro-batch count, per micro-batch and per step, and at pipeline depth 1 the per-layer split), measured against
priced; ``swing`` says how much of the pick's priced lead each part accounts for: the pick wins on price by
Σ (priced_best - priced_pick) and loses on measure by Σ (measured_pick - measured_best).

``python benchmarks/measure/small_work_picks.py`` prints the table. tests/test_small_work_picks.py shows the
arithmetic on made-up plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshplan_validation.records import clean_record
from small_work_parts import VTRAIN, cases, layer_split, lines, microbatches, plan_key, series
from small_work_sweeps import sweep_metrics, sweeps
from small_work_vtrain import vtrain_results

WITHIN = 0.10  # issue 46's bar for a pick: within 10 % of the measured best
PARTS = ("per_microbatch", "per_step")


def plan_name(record: dict[str, Any]) -> str:
    p = record["parallel"]
    return f"tp {p['tp']} pp {p['pp']} dp {p['dp']} mb {p['micro_batch_size']}"


def parts(record: dict[str, Any], fits: dict[tuple[int, ...], dict[str, tuple[float, float]]]
          ) -> dict[str, dict[str, float]]:
    """A run's step split by its plan's line (``small_work_parts.lines``): per series ("measured", "priced"), the
    ``n`` micro-batches' share n x slope and the per-step intercept, in seconds; empty where the plan ran at one
    global batch only."""
    fit = fits.get(plan_key(record))
    if fit is None:
        return {}
    n = microbatches(record)
    return {name: {"per_microbatch": n * fit[name][0], "per_step": fit[name][1]} for name in ("measured", "priced")}


def swing(pick: dict[str, dict[str, float]], best: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per part, how far it moves the comparison toward the wrong pick, in seconds: what the pick gains on price
    (priced best - priced pick) plus what it loses on measure (measured pick - measured best). Their sum is the
    pick's priced lead plus its measured deficit."""
    if not pick or not best:
        return {}
    return {part: (best["priced"][part] - pick["priced"][part]) + (pick["measured"][part] - best["measured"][part])
            for part in PARTS}


def failing(records: Sequence[dict[str, Any]], results: Sequence[Any]) -> list[dict[str, Any]]:
    """The sweeps whose pick is more than ``WITHIN`` over the measured best, worst first, each with its pick and best
    (record, predicted and measured seconds)."""
    by_id = {str(r["id"]): r for r in records}
    out = []
    for sweep in sweeps(records, results):
        m = sweep_metrics(sweep)
        if m["regret"] <= WITHIN:
            continue
        runs = {i: (p, t) for i, p, t in sweep}
        out.append({"regret": m["regret"], "runs": m["runs"], "spearman": m["spearman"],
                    "pick": (by_id[m["predicted_best"]], *runs[m["predicted_best"]]),
                    "best": (by_id[m["measured_best"]], *runs[m["measured_best"]])})
    return sorted(out, key=lambda f: -f["regret"])


def _layer(record: dict[str, Any], split: dict[tuple[int, ...], dict[str, dict[str, float]]]) -> str:
    key = plan_key(record)
    s = split.get((*key[:4], key[5]))
    if s is None:
        return "-"
    return f"{1e3 * s['measured']['layer']:.2f} / {1e3 * s['priced']['layer']:.2f}"


def rows(found: Sequence[dict[str, Any]], fits: dict[tuple[int, ...], dict[str, tuple[float, float]]],
         split: dict[tuple[int, ...], dict[str, dict[str, float]]]) -> list[str]:
    """Markdown rows, two a failing sweep (its pick, its measured best), in milliseconds, measured / priced."""
    out = ["| sweep | regret | plan | step: measured / priced | micro-batches | per step | per layer | swing: "
           "micro-batches, per step |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for f in found:
        (pr, pp, pm), (br, bp, bm) = f["pick"], f["best"]
        m = pr["model"]
        sweep = f"L{m['num_layers']} h{m['hidden_size']} gb {pr['parallel']['global_batch_size']} n " \
                f"{pr['hardware']['num_gpus']}"
        sw = swing(parts(pr, fits), parts(br, fits))
        regret = f"{100 * f['regret']:.1f} %"
        for label, rec, p, t in (("pick", pr, pp, pm), ("best", br, bp, bm)):
            q = parts(rec, fits)
            cells = [f"{1e3 * q['measured'][k]:.1f} / {1e3 * q['priced'][k]:.1f}" if q else "-" for k in PARTS]
            first = label == "pick"
            tail = ", ".join(f"{1e3 * sw[k]:+.1f}" for k in PARTS) if first and sw else ""
            out.append(f"| {sweep if first else ''} | {regret if first else ''} | {label}: {plan_name(rec)} | "
                       f"{1e3 * t:.1f} / {1e3 * p:.1f} | {cells[0]} | {cells[1]} | {_layer(rec, split)} | {tail} |")
    return out


def main() -> list[str]:
    records, results = vtrain_results(VTRAIN)
    clean = [clean_record(r) for r in records]
    times = series(clean, cases(clean))
    fits = lines(clean, times)
    found = failing(records, results)
    head = (f"{len(found)} of {len(sweeps(records, results))} sweeps pick a plan more than {100 * WITHIN:.0f} % over "
            "the measured best (benchmarks/measure/small_work_picks.py). Milliseconds, measured / priced; "
            "swing > 0: the part favours the wrong pick.")
    return [head, "", *rows(found, fits, layer_split(fits))]


if __name__ == "__main__":
    print("\n".join(main()))
