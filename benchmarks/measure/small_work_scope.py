"""What vTrain's released single-node times hold once a step (issue 79, item 4: records priced as written): a tool to
read a source's scope, never to set a constant. vTrain's simulator (VIA-Research/vTrain f8dda847, src/predictor.py)
builds a step as a graph: per micro-batch the traced layer kernels, then, where dp > 1, one exposed all-reduce of each
pipeline rank's fp16 parameter bytes (``param_size_by_rank``: word and position embeddings on the first rank, an
untied vocab / tp x h logit layer on the last, no vocabulary padding) priced by ``compute_comm_time`` from the
node's nccl-tests table (trace/a100/AR_GPU{n}_1M_1024M_LUT: the time at the size rounded to whole MiB, or above
1024 MiB the size over the 1024-MiB row's bus bandwidth), then the WU nodes (apex FusedAdam's kernels).

The released file (data/validation/vtrain_single_node_dev.jsonl, VIA-Research/vTrain data/ground_truth_single.csv)
carries that composition: within a plan the step times lie exactly on a line in the micro-batch count (``linearity``),
the line's slope is the same at every dp (``slope_spread``), and the intercept at dp > 1 is the dp-1 intercept plus
``compute_comm_time`` of the first rank's bytes (``rest_spread``: the intercept less that all-reduce, the same at every
dp to a microsecond). Timed runs would scatter; so the once-a-step part holds that all-reduce and a dp-independent
rest, and no more (sources.VTRAIN prices that scope). The table rows come from data/measured/
2026-11-29-vtrain-a100-allreduce.csv (the sizes the released plans need, copied from trace/a100).

``python benchmarks/measure/small_work_scope.py`` prints the three checks and the dp-1 intercepts at pipeline depth 1.
tests/test_small_work_scope.py shows the arithmetic on made-up plans and runs the checks on the released file.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshplan_validation.records import clean_record, read_runs

ROOT = Path(__file__).resolve().parents[2]
VTRAIN = ROOT / "data" / "validation" / "vtrain_single_node_dev.jsonl"
LUT = ROOT / "data" / "measured" / "2026-11-29-vtrain-a100-allreduce.csv"
MIB = 2 ** 20
VOCAB, SEQUENCE = 50257, 1024  # vTrainConfig's default vocab_size; the released runs' sequence (src/config.py)


def read_lut(path: Path = LUT) -> dict[int, dict[int, tuple[float, float]]]:
    """gpus -> size in MiB -> (seconds, bus bandwidth GB/s), as predictor.get_allreduce_LUT reads the table."""
    out: dict[int, dict[int, tuple[float, float]]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            out.setdefault(int(row["gpus"]), {})[int(row["size_bytes"]) // MIB] = (
                int(row["time_ns"]) * 1e-9, float(row["busbw_gbs"]))
    return out


def rank_bytes(layers: int, hidden: int, tp: int, pp: int, rank: int = 0) -> int:
    """predictor.py's param_size_by_rank: the fp16 bytes of one pipeline rank's parameters (its model_params list:
    per layer two LayerNorms' weights and biases, the QKV, output, up and down projections with their biases, the
    column-parallel ones and their biases over tp; L // pp layers a rank)."""
    h = hidden
    layer = 6 * h + 3 * h * (h // tp) + 3 * h // tp + h * (h // tp) + h * (4 * h // tp) + 4 * h // tp \
        + 4 * h * (h // tp)
    count = (layers // pp) * layer
    if rank == 0:
        count += (VOCAB // tp) * h + SEQUENCE * h
    if rank == pp - 1:
        count += (VOCAB // tp) * h
    return 2 * count


def all_reduce(size: int, gpus: int, lut: dict[int, dict[int, tuple[float, float]]]) -> float:
    """predictor.compute_comm_time in seconds: the table's time at the size rounded to MiB, else (above 1024 MiB)
    the size over the 1024-MiB row's bus bandwidth (GB/s read as GiB/s, as the code does)."""
    mib = round(size / MIB)
    if mib in lut[gpus]:
        return lut[gpus][mib][0]
    return mib / (lut[gpus][1024][1] * 1024)


def key(record: dict[str, Any]) -> tuple[int, ...]:
    """(layers, hidden, tp, pp, micro-batch, dp)."""
    p, m = record["parallel"], record["model"]
    return (int(m["num_layers"]), int(m["hidden_size"]), int(p["tp"]), int(p["pp"]), int(p["micro_batch_size"]),
            int(p["dp"]))


def lines(records: Sequence[dict[str, Any]]) -> dict[tuple[int, ...], tuple[float, float, float]]:
    """Per plan with two or more global batches: (slope, intercept, largest relative distance of a time from the
    line through its two smallest batches), seconds."""
    points: dict[tuple[int, ...], list[tuple[int, float]]] = {}
    for r in records:
        p = r["parallel"]
        n = int(p["global_batch_size"]) // (int(p["dp"]) * int(p["micro_batch_size"]))
        points.setdefault(key(r), []).append((n, float(r["measured"]["iteration_time_s"])))
    out = {}
    for k, pts in points.items():
        pts = sorted(pts)
        if len(pts) < 2:
            continue
        (n0, t0), (n1, t1) = pts[0], pts[1]
        slope = (t1 - t0) / (n1 - n0)
        intercept = t0 - slope * n0
        out[k] = (slope, intercept, max(abs(t - intercept - slope * n) / t for n, t in pts))
    return out


def checks(records: Sequence[dict[str, Any]], lut: dict[int, dict[int, tuple[float, float]]]) -> dict[str, Any]:
    """The three checks of the module docstring over every (layers, hidden, tp, pp, micro-batch) with more than one
    dp: ``linearity`` (relative), ``slope_spread`` and ``rest_spread`` (seconds, largest over the groups), the
    number of groups compared and each group's dp-independent rest (intercept less the all-reduce)."""
    fits = lines(records)
    groups: dict[tuple[int, ...], dict[int, tuple[float, float]]] = {}
    for (layers, hidden, tp, pp, mb, dp), (slope, intercept, _) in fits.items():
        reduce = all_reduce(rank_bytes(layers, hidden, tp, pp), dp, lut) if dp > 1 else 0.0
        groups.setdefault((layers, hidden, tp, pp, mb), {})[dp] = (slope, intercept - reduce)
    compared = {g: v for g, v in groups.items() if len(v) > 1}
    spread = [(max(s for s, _ in v.values()) - min(s for s, _ in v.values()),
               max(r for _, r in v.values()) - min(r for _, r in v.values())) for v in compared.values()]
    return {"linearity": max(f[2] for f in fits.values()), "groups": len(compared),
            "slope_spread": max(s for s, _ in spread), "rest_spread": max(r for _, r in spread),
            "rest": {g: min(v.values())[1] for g, v in groups.items()}}


def main() -> None:
    records = [clean_record(r) for r in read_runs(VTRAIN)]
    found = checks(records, read_lut())
    print("vTrain's released single-node times against its simulator's composition "
          "(benchmarks/measure/small_work_scope.py)\n")
    print(f"- largest distance of a step time from its plan's line: {100 * found['linearity']:.1e} %")
    print(f"- over {found['groups']} (model, tp, pp, micro-batch) groups with several dp: slopes differ by at most "
          f"{1e3 * found['slope_spread']:.1e} ms; the intercept less compute_comm_time of the first rank's fp16 "
          f"bytes differs by at most {1e3 * found['rest_spread']:.1e} ms\n")
    print("| layers | hidden | tp | micro-batch | once a step beyond the all-reduce (ms) |\n|---:|---:|---:|---:|---:|")
    for (layers, hidden, tp, pp, mb), rest in sorted(found["rest"].items()):
        if pp == 1:
            print(f"| {layers} | {hidden} | {tp} | {mb} | {1e3 * rest:.2f} |")


if __name__ == "__main__":
    main()
