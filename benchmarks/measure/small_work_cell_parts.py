"""The parts of the layer cells that decide vTrain's failing picks (issue 79, the small-work regime): a tool to find
mechanisms, never to set a constant. benchmarks/measure/small_work_picks.py lists the sweeps whose pick is more than
10 % over the measured best; each pick and best run one layer cell (tp, micro-batch, hidden) at every pipeline depth
(small_work_layer_oracle.py). Here each such cell's one layer a micro-batch (forward and backward, vTrain's graph has
no recompute at the last rank) is split:

- measured: the release's layer (small_work_parts.py: the line of the 20-layer model less the 12-layer one's, per
  layer, the data-parallel sizes pooled), and in it the graph's four TP all-reduces after the layer's traced kernels
  (VIA-Research/vTrain f8dda847 src/predictor.py create_layer_graph: two ``_add_tp_communication`` CommNodes after each
  Fwd / Bwd LayerNode, each ``compute_comm_time`` of b·s·h fp16 bytes from the node's nccl-tests table:
  small_work_scope.all_reduce); what is left, ``trace``, is the one CUPTI trace of the cell's layer (kernels and the
  host's gaps between them), which the release gives only whole;
- priced: meshplan's layer (the same split of its step times) and its own op records of one layer (cost/layers,
  step/passes.time_ops): the GPU seconds of the GEMMs (the QKV, output and MLP projections), of the attention core
  (scores, softmax, context) and of the rest (norms, residuals, activation), the host seconds of the pass's launches
  (step/host: launches x per_launch + the records' own), the exposed all-reduces, and ``restart``: what the priced
  layer holds beyond max(H, G) per pass plus the all-reduces (flow lines from an empty queue, step/host.segment_time:
  after each all-reduce the host waits for, ``stack.blocking_collectives``, and from every pass's start under
  ``stack.drained_passes`` "layers", vTrain's scope since 2026-11-30).

``python benchmarks/measure/small_work_cell_parts.py`` prints the table. tests/test_small_work_cell_parts.py shows the
arithmetic on made-up ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshplan.cost.layers import layer_kinds
from meshplan.specs.efficiency import DEFAULT
from meshplan.step.host import exposed, launches, on_host, per_launch
from meshplan.step.passes import time_ops
from meshplan_validation.case import Case
from meshplan_validation.records import clean_record
from small_work_layer_oracle import Cell, cell_of, cell_times
from small_work_parts import cases, layer_split, lines, series
from small_work_picks import failing
from small_work_scope import SEQUENCE, all_reduce, read_lut
from small_work_vtrain import VTRAIN, vtrain_results

GEMMS = ("attn/qkv", "attn/out", "mlp/fc1", "mlp/fc2")  # the layer's four projections (cost/layers)
ATTENTION = ("attn/core", "attn/scores")  # scores, softmax and context (cost/attention)
PARTS = ("gemm", "attention", "other", "host", "all_reduce")


def kind(name: str) -> str:
    """The part of an op record's name: "gemm", "attention" or "other"."""
    if name in GEMMS:
        return "gemm"
    return "attention" if name in ATTENTION else "other"


def split(ops: Sequence[Any], times: Sequence[float], host: Any) -> dict[str, float]:
    """One layer's forward and backward from its op records and their GPU seconds: the GPU seconds of each ``kind``,
    the host seconds of the launches, the exposed all-reduces' seconds (over more than one rank), and ``flow``, Σ
    over the two passes of max(host, GPU) plus the all-reduces (each pass's kernels as one flow line in steady state,
    its all-reduces after them, as vTrain's graph composes a layer)."""
    out = dict.fromkeys((*PARTS, "flow"), 0.0)
    for forward in (True, False):
        h = g = c = 0.0
        for op, t in zip(ops, times, strict=True):
            if (op.phase == "fwd") != forward:
                continue
            h += float(launches(op)) * per_launch(op, host) + float(op.host)
            if op.collective is None:
                g += t
                out[kind(op.name)] += t
            elif exposed(op, host) and float(op.collective.group) > 1:
                c += t
        out["host"] += h
        out["all_reduce"] += c
        out["flow"] += max(h, g) + c
    return out


def additive_share(trace: float, parts: dict[str, float]) -> float:
    """Where a traced layer lies between the bounds of its priced parts: 0 at Σ max(H, G) per pass (the lead carried,
    host and GPU overlapped), 1 at H + G (every launch waiting for the kernel before); below 0 under the overlapped
    bound, above 1 over the additive one."""
    low = parts["flow"] - parts["all_reduce"]
    high = parts["host"] + parts["gemm"] + parts["attention"] + parts["other"]
    return (trace - low) / (high - low) if high > low else 0.0


def graph_all_reduce(cell: Cell, lut: dict[int, dict[int, tuple[float, float]]]) -> float:
    """The four TP all-reduces vTrain's graph adds to one layer a micro-batch (module docstring): 4 x
    compute_comm_time(b·s·h·2 bytes over tp); none at tp 1."""
    tp, mb, hidden = cell
    return 0.0 if tp == 1 else 4 * all_reduce(mb * SEQUENCE * hidden * 2, tp, lut)


def priced_parts(case: Case) -> dict[str, float]:
    """``split`` of one run's dense layer as meshplan prices it."""
    host = on_host(case.stack, case.cluster.python_host).host
    ops = layer_kinds(case.model, case.plan, case.stack)["dense"]
    times = [float(t) for t in time_ops(ops, case.cluster, case.plan, case.efficiency(DEFAULT))]
    return split(ops, times, host)


def deciding_cells(records: Sequence[dict[str, Any]], results: Sequence[Any]) -> list[Cell]:
    """The cells of the failing sweeps' picks and measured bests, in order of first appearance."""
    out: list[Cell] = []
    for f in failing(records, results):
        for rec, *_ in (f["pick"], f["best"]):
            if cell_of(rec) not in out:
                out.append(cell_of(rec))
    return out


def rows(cells: Sequence[Cell], times: dict[Cell, tuple[float, float]], parts: dict[Cell, dict[str, float]],
         lut: dict[int, dict[int, tuple[float, float]]]) -> list[str]:
    """Markdown rows, milliseconds a layer and micro-batch."""
    out = ["| cell (tp, mb, h) | measured | its all-reduces | its trace | priced | GEMM | attention | other | host | "
           "all-reduces | restart | priced bound | trace between max and sum |", "|---|" + "---:|" * 10 + "---|---:|"]
    for c in cells:
        if c not in times or c not in parts:
            continue
        m, p = times[c]
        q, ar = parts[c], graph_all_reduce(c, lut)
        gpu = q["gemm"] + q["attention"] + q["other"]
        bound = "host" if q["host"] > gpu else "GPU"
        out.append(f"| {c} | {1e3 * m:.2f} | {1e3 * ar:.2f} | {1e3 * (m - ar):.2f} | {1e3 * p:.2f} | "
                   + " | ".join(f"{1e3 * q[k]:.2f}" for k in PARTS)
                   + f" | {1e3 * (p - q['flow']):+.2f} | {bound} | {additive_share(m - ar, q):.2f} |")
    return out


def main() -> list[str]:
    records, results = vtrain_results(VTRAIN)
    clean = [clean_record(r) for r in records]
    found = cases(clean)
    times = cell_times(layer_split(lines(clean, series(clean, found))))
    cells = deciding_cells(records, results)
    parts: dict[Cell, dict[str, float]] = {}
    for r, c in zip(clean, found, strict=True):
        if int(r["parallel"]["pp"]) == 1 and cell_of(r) in times and cell_of(r) not in parts:
            parts[cell_of(r)] = priced_parts(c)
    head = ("The layer cells of the failing sweeps' picks and bests (benchmarks/measure/small_work_cell_parts.py), "
            "milliseconds a layer and micro-batch; measured: the release's layer, its graph's all-reduces and the "
            "traced rest; priced: meshplan's layer, its GPU parts, host and all-reduces, and the restarts beyond "
            "max(H, G) per pass plus the all-reduces; the trace's place between Σ max(H, G) per pass (0) and "
            "H + G (1).")
    lut = read_lut()
    return [head, "", *rows(cells, times, parts, lut), "", "Every cell at pipeline depth 1:", "",
            *rows(sorted(times), times, parts, lut)]


if __name__ == "__main__":
    print("\n".join(main()))
