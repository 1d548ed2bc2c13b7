"""What vTrain's released step pays once, against the optimizer's own GPU time (issue 79, the small-work regime): a
tool to find mechanisms, never to set a constant. The per-step part of a plan (benchmarks/measure/small_work_parts.py:
the intercept of its step times' line in the micro-batch count) holds, in a Megatron-DeepSpeed step, the data-parallel
gradient all-reduce, the optimizer's kernels and its per-tensor host loops. Beside it: meshplan's priced per-step part
and two of its rows, the optimizer's memory-bound update (``optimizer/adam``: channels.optimizer_time, 28 bytes a
parameter at fp16 gradients) and the gradient all-reduce (``dp/grad_all_reduce``). Their ratio tells which terms the
released times can hold: a step near 1.3 x the update alone leaves no room for a host loop of ~150 tensors at tens of
microseconds each, and a part that does not grow from dp 2 to dp 8 holds no ring all-reduce (2 (n - 1) / n of the
gradient bytes a rank).

``python benchmarks/measure/small_work_step.py`` prints the table (pipeline depth 1, the micro-batch sizes pooled
by the median: the per-step part does not depend on them). tests/test_small_work_step.py shows the arithmetic.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan_validation.case import Case
from meshplan_validation.records import clean_record, read_runs
from small_work_parts import VTRAIN, cases, lines, plan_key, series

ROWS = ("optimizer/adam", "dp/grad_all_reduce")


def priced_rows(case: Case) -> dict[str, float]:
    """The seconds of meshplan's ``ROWS`` for one run (0 where the plan has none: no all-reduce at dp 1)."""
    e = estimate(case.model, case.cluster, case.plan, case.stack, case.efficiency(DEFAULT))
    seconds = {op.name: float(op.seconds) for op in e.ops}
    return {name: seconds.get(name, 0.0) for name in ROWS}


def entries(records: Sequence[dict[str, Any]], found: Sequence[Case],
            fits: dict[tuple[int, ...], dict[str, tuple[float, float]]]) -> list[dict[str, Any]]:
    """One entry per fitted plan at pipeline depth 1: its key, measured and priced per-step part, and ``ROWS``."""
    out, seen = [], set()
    for record, case in zip(records, found, strict=True):
        key = plan_key(record)
        if key in seen or key not in fits or key[1] != 1:
            continue
        seen.add(key)
        out.append({"key": key, "measured": fits[key]["measured"][1], "priced": fits[key]["priced"][1],
                    **priced_rows(case)})
    return out


def table(found: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown rows by (tp, dp, layers, hidden), the micro-batch sizes pooled by the median, in milliseconds, with
    the measured per-step part over the priced update."""
    pooled: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for e in found:
        tp, _pp, dp, _mb, layers, hidden = e["key"]
        pooled.setdefault((tp, dp, layers, hidden), []).append(e)
    out = ["| tp | dp | layers | hidden | per step: measured | priced | update (optimizer/adam) | gradient all-reduce "
           "| measured / update |", "|" + "---:|" * 9]
    for (tp, dp, layers, hidden), group in sorted(pooled.items()):
        def med(name: str, group: list[dict[str, Any]] = group) -> float:
            return statistics.median(g[name] for g in group)
        out.append(f"| {tp} | {dp} | {layers} | {hidden} | {1e3 * med('measured'):.2f} | {1e3 * med('priced'):.2f} | "
                   f"{1e3 * med(ROWS[0]):.2f} | {1e3 * med(ROWS[1]):.2f} | {med('measured') / med(ROWS[0]):.2f} |")
    return out


def main() -> list[str]:
    records = [clean_record(r) for r in read_runs(VTRAIN)]
    found = cases(records)
    fits = lines(records, series(records, found))
    return ["Milliseconds a step (benchmarks/measure/small_work_step.py).", "", *table(entries(records, found, fits))]


if __name__ == "__main__":
    print("\n".join(main()))
