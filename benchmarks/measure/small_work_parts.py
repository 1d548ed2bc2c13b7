"""Where vTrain's released single-node step times go (issue 79, the small-work regime): a tool to find mechanisms,
never to set a constant. Every run of data/validation/vtrain_single_node_dev.jsonl is one model (12 or 20 layers,
hidden 1024 or 2048) at one plan (tp, pp, dp, micro-batch) and one global batch, so within a plan the step time is a
line in the number of micro-batches per rank, n = global batch / (dp x micro-batch): its slope is the time of one
micro-batch (forward, full recompute and backward) and its intercept the time paid once a step (the optimizer, the
data-parallel reduction). Two depths at one width split the slope again: (slope(20) - slope(12)) / 8 is the time of
one layer per micro-batch, slope(12) - 12 x that the per-micro-batch part outside the layers (embedding, LM head,
loss, the loop). The same lines are fitted to meshplan's step times (``priced``), to its GPU-only step (the passes'
host costs at zero: ``gpu``) and to its host (``host``: the step's growth per unit of the passes' host cost,
(T(20 h) - T(10 h)) / 10, where every pass is host-bound), so each measured part stands beside what meshplan
charges for it.

``python benchmarks/measure/small_work_parts.py`` prints the table by tensor-parallel size, micro-batch and width
(pipeline depth 1, every data-parallel size pooled by the median). tests/test_small_work_parts.py shows the
arithmetic on a made-up plan.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan_validation.case import Case, map_run
from meshplan_validation.record_fields import fill_from_siblings, lenders
from meshplan_validation.records import clean_record, read_runs

ROOT = Path(__file__).resolve().parents[2]
VTRAIN = ROOT / "data" / "validation" / "vtrain_single_node_dev.jsonl"
DEPTHS = (12, 20)  # vTrain's released models' layer counts: the per-layer split needs both at one width
SERIES = ("measured", "priced", "gpu", "host")


def cases(records: Sequence[dict[str, Any]]) -> list[Case]:
    """Each record mapped as ``meshplan validate`` maps it."""
    index = lenders(records)  # the siblings indexed once, as run_validation does
    return [map_run(fill_from_siblings(r, records, index), False) for r in records]


def step_times(found: Sequence[Case], host_scale: float = 1.0) -> np.ndarray:
    """meshplan's step times of the cases with their stacks' host seconds per kernel and per collective call times
    ``host_scale`` (0: the GPU alone; the optimizer's per-tensor loop is kept)."""
    out = []
    for c in found:
        stack = c.stack.with_(host_dispatch=c.stack.host_dispatch * host_scale,
                              collective_host=c.stack.collective_host * host_scale)
        out.append(estimate(c.model, c.cluster, c.plan, stack, c.efficiency(DEFAULT)).step_time)
    return np.array(out, dtype=float)


def series(records: Sequence[dict[str, Any]], found: Sequence[Case]) -> dict[str, np.ndarray]:
    """The four step-time series of the module docstring, one value per record."""
    measured = np.array([float(r["measured"]["iteration_time_s"]) for r in records])
    high, higher = step_times(found, 10.0), step_times(found, 20.0)
    return {"measured": measured, "priced": step_times(found), "gpu": step_times(found, 0.0),
            "host": (higher - high) / 10.0}


def plan_key(record: dict[str, Any]) -> tuple[int, ...]:
    """(tp, pp, dp, micro-batch, layers, hidden): the runs that differ only in their global batch."""
    p, m = record["parallel"], record["model"]
    return (int(p["tp"]), int(p["pp"]), int(p["dp"]), int(p["micro_batch_size"]), int(m["num_layers"]),
            int(m["hidden_size"]))


def microbatches(record: dict[str, Any]) -> int:
    p = record["parallel"]
    return int(p["global_batch_size"]) // (int(p["dp"]) * int(p["micro_batch_size"]))


def lines(records: Sequence[dict[str, Any]], times: dict[str, np.ndarray]
          ) -> dict[tuple[int, ...], dict[str, tuple[float, float]]]:
    """Per plan with at least two global batches: each series' (seconds per micro-batch, seconds per step), the least
    squares line of its step times in the micro-batch count."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(plan_key(r), []).append(i)
    out: dict[tuple[int, ...], dict[str, tuple[float, float]]] = {}
    for key, idx in groups.items():
        n = np.array([microbatches(records[i]) for i in idx], dtype=float)
        if len(set(n.tolist())) < 2:
            continue
        out[key] = {}
        for name in SERIES:
            slope, intercept = np.polyfit(n, times[name][idx], 1)
            out[key][name] = (float(slope), float(intercept))
    return out


def residual(records: Sequence[dict[str, Any]], times: dict[str, np.ndarray], name: str = "measured") -> float:
    """The largest |step time - its plan's line| / step time over the plans with at least three global batches: 0
    where every plan's step times lie exactly on a line in the micro-batch count (independent measurements of a
    step would scatter about it)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(plan_key(r), []).append(i)
    worst = 0.0
    for idx in groups.values():
        n = np.array([microbatches(records[i]) for i in idx], dtype=float)
        if len(set(n.tolist())) < 3:
            continue
        t = times[name][idx]
        worst = max(worst, float(np.max(np.abs(t - np.polyval(np.polyfit(n, t, 1), n)) / t)))
    return worst


def layer_split(fits: dict[tuple[int, ...], dict[str, tuple[float, float]]]
                ) -> dict[tuple[int, ...], dict[str, dict[str, float]]]:
    """Per (tp, pp, dp, micro-batch, hidden) with both DEPTHS fitted: each series' seconds per layer and micro-batch,
    per micro-batch outside the layers, and per step (the shallower model's intercept)."""
    short, deep = DEPTHS
    out: dict[tuple[int, ...], dict[str, dict[str, float]]] = {}
    for key, fit in fits.items():
        if key[4] != short or (*key[:4], deep, key[5]) not in fits:
            continue
        other = fits[(*key[:4], deep, key[5])]
        out[(*key[:4], key[5])] = {}
        for name in SERIES:
            layer = (other[name][0] - fit[name][0]) / (deep - short)
            out[(*key[:4], key[5])][name] = {"layer": layer, "outside": fit[name][0] - short * layer,
                                             "step": fit[name][1]}
    return out


def table(split: dict[tuple[int, ...], dict[str, dict[str, float]]]) -> list[str]:
    """Markdown rows by (tp, micro-batch, hidden) at pipeline depth 1, the data-parallel sizes pooled by the median,
    in milliseconds."""
    pooled: dict[tuple[int, int, int], list[dict[str, dict[str, float]]]] = {}
    for (tp, pp, _dp, mb, hidden), parts in split.items():
        if pp == 1:
            pooled.setdefault((tp, mb, hidden), []).append(parts)
    out = ["| tp | micro-batch | hidden | per layer: measured | priced | host | GPU | outside the layers: "
           "measured | priced | per step: measured | priced |", "|" + "---:|" * 11]
    for (tp, mb, hidden), group in sorted(pooled.items()):
        def ms(name: str, part: str, group: list[dict[str, dict[str, float]]] = group) -> str:
            return f"{1e3 * statistics.median(g[name][part] for g in group):.2f}"
        out.append(f"| {tp} | {mb} | {hidden} | {ms('measured', 'layer')} | {ms('priced', 'layer')} | "
                   f"{ms('host', 'layer')} | {ms('gpu', 'layer')} | {ms('measured', 'outside')} | "
                   f"{ms('priced', 'outside')} | {ms('measured', 'step')} | {ms('priced', 'step')} |")
    return out


def main(path: Path = VTRAIN) -> list[str]:
    records = [clean_record(r) for r in read_runs(path)]
    times = series(records, cases(records))
    split = layer_split(lines(records, times))
    head = (f"Largest distance of a step time from its plan's line: measured {100 * residual(records, times):.2e} %, "
            f"priced {100 * residual(records, times, 'priced'):.2e} %.")
    return [head, "", "Milliseconds. Per layer: one layer's forward, recompute and backward for a micro-batch; outside "
            "the layers: the rest of a micro-batch; per step: what a step pays once (benchmarks/measure/"
            "small_work_parts.py).", "", *table(split)]


if __name__ == "__main__":
    print("\n".join(main()))
