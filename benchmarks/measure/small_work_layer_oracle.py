"""Which priced part decides vTrain's small-work picks (issue 79): a tool to rule mechanisms in or out, never to set a
constant. Each run of data/validation/vtrain_single_node_dev.jsonl is re-priced with one layer's time per micro-batch
(benchmarks/measure/small_work_parts.py: its (tp, micro-batch, hidden) cell at pipeline depth 1, the data-parallel
sizes pooled by the median) replaced, and the sweeps' picks (benchmarks/measure/small_work_sweeps.py) counted again.
vTrain's graph holds one traced layer per cell at every depth (small_work_graph.py), and a 1F1B step of n
micro-batches over pp stages runs each stage's L / pp layers n + pp - 1 times on its critical path, so a layer that
costs d more moves a run's step by d x L / pp x (n + pp - 1) (``moved``).

The layer is priced as: meshplan does (``priced``); as the release measures it (``measured``, the oracle); as the
closest time non-decreasing in the micro-batch at each (tp, hidden) (``monotone``: pool-adjacent-violators, what any
pricing that charges more work no less time could at best reach); and as four queue disciplines of meshplan's own host
and GPU seconds per op (``composed``, step/host.queue_step): max(H, G) per pass (the lead carries), the flow line of
each pass from an empty queue (Johnson 1954), the sum over kernels of max(host, GPU) plus one kernel's smaller (every
kernel reached one at a time), and H + G (every launch blocking).
``python benchmarks/measure/small_work_layer_oracle.py`` prints the table; tests/test_small_work_layer_oracle.py shows
the arithmetic on made-up numbers.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from meshplan.cost.layers import layer_kinds
from meshplan.specs.efficiency import DEFAULT
from meshplan.step.host import exposed, launches, on_host, per_launch, queue_step
from meshplan.step.passes import time_ops
from meshplan_validation.case import Case
from meshplan_validation.records import clean_record
from small_work_parts import cases, layer_split, lines, microbatches, series
from small_work_sweeps import sweep_metrics, sweeps
from small_work_vtrain import VTRAIN, vtrain_results

Cell = tuple[int, int, int]  # (tp, micro-batch, hidden)
WITHIN = 0.10  # issue 46's bar for a pick
DISCIPLINES = ("max", "empty queue", "one at a time", "blocking")


def cell_times(split: dict[tuple[int, ...], dict[str, dict[str, float]]]) -> dict[Cell, tuple[float, float]]:
    """Per cell at pipeline depth 1: (measured, priced) seconds of one layer a micro-batch, the median over the
    data-parallel sizes (small_work_parts.table's pooling)."""
    pooled: dict[Cell, list[dict[str, dict[str, float]]]] = {}
    for (tp, pp, _dp, mb, hidden), parts in split.items():
        if pp == 1:
            pooled.setdefault((tp, mb, hidden), []).append(parts)
    return {c: (statistics.median(g["measured"]["layer"] for g in group),
                statistics.median(g["priced"]["layer"] for g in group)) for c, group in pooled.items()}


def monotone(values: Sequence[float]) -> list[float]:
    """The least-squares non-decreasing sequence closest to ``values`` (pool adjacent violators, equal weights)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (a, na), (b, nb) = blocks.pop(-2), blocks.pop()
            blocks.append([(a * na + b * nb) / (na + nb), na + nb])
    return [mean for mean, count in blocks for _ in range(int(count))]


def monotone_cells(measured: dict[Cell, float]) -> dict[Cell, float]:
    """``monotone`` over the micro-batches of each (tp, hidden)."""
    out: dict[Cell, float] = {}
    for tp, hidden in {(c[0], c[2]) for c in measured}:
        mbs = sorted(c[1] for c in measured if c[0] == tp and c[2] == hidden)
        out.update({(tp, mb, hidden): v for mb, v in zip(mbs, monotone([measured[(tp, mb, hidden)] for mb in mbs]),
                                                         strict=True)})
    return out


def moved(record: dict[str, Any], delta: float) -> float:
    """Seconds a run's step moves when its layer costs ``delta`` more a micro-batch: delta x L / pp x (n + pp - 1)."""
    p = record["parallel"]
    pp = int(p["pp"])
    return delta * int(record["model"]["num_layers"]) / pp * (microbatches(record) + pp - 1)


def cell_of(record: dict[str, Any]) -> Cell:
    p = record["parallel"]
    return int(p["tp"]), int(p["micro_batch_size"]), int(record["model"]["hidden_size"])


def repriced(records: Sequence[dict[str, Any]], results: Sequence[Any], priced: dict[Cell, float],
             layer: Callable[[Cell], float]) -> list[Any]:
    """The results with each run's layer at ``layer(cell)`` instead of ``priced[cell]`` (cells not in ``priced``, or
    unpriced runs, kept)."""
    by_id = {str(r["id"]): r for r in records}
    out = []
    for r in results:
        c = cell_of(by_id[r.id]) if r.id in by_id else None
        if c in priced and r.predicted is not None:
            r = dataclasses.replace(r, predicted=r.predicted + moved(by_id[r.id], layer(c) - priced[c]))
        out.append(r)
    return out


def picks(records: Sequence[dict[str, Any]], results: Sequence[Any]) -> tuple[int, int, float, float]:
    """(sweeps whose pick is within WITHIN of the measured best, sweeps, the largest regret, median |error|)."""
    metrics = [sweep_metrics(s) for s in sweeps(records, results)]
    errors = [abs(r.predicted / r.measured - 1) for r in results if r.predicted is not None and r.measured]
    return (sum(m["regret"] <= WITHIN for m in metrics), len(metrics), max((m["regret"] for m in metrics), default=0.0),
            float(np.median(errors)) if errors else 0.0)


def _pass(pairs: list[tuple[Any, float]], host: Any) -> tuple[float, float, float, float, float]:
    """One pass's (host H, GPU G, exposed collectives C, flow line from an empty queue, Σ per-kernel max + one
    kernel's smaller), its ops in issue order; a collective adds its call to H and its time to C."""
    h_sum = g_sum = c_sum = one_by_one = largest_min = issued = done = 0.0
    for op, g in pairs:
        n = float(launches(op))
        h = n * per_launch(op, host) + float(op.host)
        h_sum += h
        if op.collective is not None:
            c_sum += g if exposed(op, host) and np.all(np.asarray(op.collective.group) > 1) else 0.0
            continue
        k = max(n, 1.0)
        g_sum, one_by_one, largest_min = g_sum + g, one_by_one + k * max(h, g) / k, max(largest_min, min(h, g) / k)
        issued, done = (float(x) for x in queue_step(issued, done, n, h, g))
    return h_sum, g_sum, c_sum, max(issued, done), one_by_one + largest_min


def composed(case: Case) -> dict[str, float]:
    """One layer's forward and backward (no recompute: vTrain's graph has none) under each of DISCIPLINES, from
    meshplan's own ops, op times and host costs of ``case``; the exposed collectives added after."""
    host = on_host(case.stack, case.cluster.python_host).host
    ops = layer_kinds(case.model, case.plan, case.stack)["dense"]
    times = [float(t) for t in time_ops(ops, case.cluster, case.plan, case.efficiency(DEFAULT))]
    out = dict.fromkeys(DISCIPLINES, 0.0)
    for forward in (True, False):
        pairs = [(op, t) for op, t in zip(ops, times, strict=True) if (op.phase == "fwd") == forward]
        h, g, c, queue, one = _pass(pairs if forward else pairs[::-1], host)
        for name, v in zip(DISCIPLINES, (max(h, g), queue, one, h + g), strict=True):
            out[name] += v + c
    return out


def composed_cells(records: Sequence[dict[str, Any]], found: Sequence[Case], cells: Sequence[Cell]
                   ) -> dict[Cell, dict[str, float]]:
    """``composed`` for each cell, from its first run at pipeline depth 1."""
    out: dict[Cell, dict[str, float]] = {}
    for r, c in zip(records, found, strict=True):
        if int(r["parallel"]["pp"]) == 1 and cell_of(r) in cells and cell_of(r) not in out:
            out[cell_of(r)] = composed(c)
    return out


def by_depth(records: Sequence[dict[str, Any]], results: Sequence[Any], cell: Cell) -> dict[int, float]:
    """Median priced / measured step of the cell's runs by pipeline depth."""
    by_id = {str(r["id"]): r for r in records}
    ratios: dict[int, list[float]] = {}
    for r in results:
        rec = by_id.get(r.id)
        if rec is not None and cell_of(rec) == cell and r.predicted is not None:
            ratios.setdefault(int(rec["parallel"]["pp"]), []).append(r.predicted / r.measured)
    return {pp: statistics.median(v) for pp, v in sorted(ratios.items())}


def _row(name: str, result: tuple[int, int, float, float]) -> str:
    ok, n, worst, median = result
    return f"| {name} | {ok} of {n} | {100 * worst:.1f} % | {100 * median:.1f} % |"


def main() -> list[str]:
    records, results = vtrain_results(VTRAIN)
    clean = [clean_record(r) for r in records]
    found = cases(clean)
    cells = cell_times(layer_split(lines(clean, series(clean, found))))
    measured, priced = {c: v[0] for c, v in cells.items()}, {c: v[1] for c, v in cells.items()}
    steady = monotone_cells(measured)
    rules = composed_cells(clean, found, list(cells))

    def score(layer: Callable[[Cell], float]) -> tuple[int, int, float, float]:
        return picks(records, repriced(records, results, priced, layer))

    out = ["| layer priced as | picks within 10 % | largest regret | median abs error |", "|---|---:|---:|---:|",
           _row("meshplan (shipped)", score(priced.__getitem__)),
           _row("measured (oracle)", score(measured.__getitem__)),
           _row("monotone in the micro-batch (best monotone)", score(steady.__getitem__))]
    for rule in DISCIPLINES:
        out.append(_row(f"{rule}, every cell", score(lambda c, rule=rule: rules[c][rule])))
        out.append(_row(f"{rule}, tp 1 cells only", score(lambda c, rule=rule: rules[c][rule] if c[0] == 1
                                                          else priced[c])))
    base = score(priced.__getitem__)[0]
    out += ["", "| cell (tp, micro-batch, hidden) | layer ms measured / priced | picks: this cell measured, the "
            "rest priced | the rest measured, this cell priced |", "|---|---:|---:|---:|"]
    for c in sorted(cells):
        gain = score(lambda q, c=c: measured[q] if q == c else priced[q])[0]
        loss = score(lambda q, c=c: priced[q] if q == c else measured[q])[0]
        if gain != base or loss != len(sweeps(records, results)):
            out.append(f"| {c} | {1e3 * measured[c]:.2f} / {1e3 * priced[c]:.2f} | {gain} | {loss} |")
    out += ["", "Priced / measured step by pipeline depth (median):"]
    out += [f"- cell {c}: " + ", ".join(f"pp {pp}: {v:.3f}" for pp, v in by_depth(records, results, c).items())
            for c in ((1, 4, 1024), (2, 4, 1024), (4, 2, 2048))]
    return out


if __name__ == "__main__":
    print("\n".join(main()))
