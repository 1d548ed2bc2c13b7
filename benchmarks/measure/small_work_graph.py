"""What vTrain's released single-node times hold per micro-batch (issue 79, the small-work regime): a tool to read a
source's scope, never to set a constant. vTrain's predictor (VIA-Research/vTrain f8dda847, src/predictor.py
create_layer_graph) composes a step from one traced layer's kernels: on each pipeline rank, per micro-batch, its layers'
forward and backward (and the graph's recompute forward on every rank but the last, outside the micro-batch's
dependency chain), the last rank's logits and loss; 1F1B makes the last rank's time per micro-batch the step's slope
and the others' time per micro-batch its fill.

Two depths (12 and 20 layers) at one width, tp and micro-batch split each line of ``small_work_scope.lines`` again:
``layer`` = (slope(20, pp) - slope(12, pp)) / (8 / pp), one layer's time per micro-batch at depth pp, and ``rest`` =
slope - (L / pp) x layer, what the bottleneck rank adds outside its layers. The release shows (``checks``):
- ``layer`` is the same at pp 1, 2 and 4 (``layer_spread``) and ``rest`` the same at pp 2 and 4 (``rest_spread``):
  the last rank sets the slope at every depth, its layers at one time whatever the depth;
- the fill holds each earlier rank's layer at that same time (``fill_excess``: (intercept(20, 2) - intercept(12, 2))
  / 4 - (intercept(20, 1) - intercept(12, 1)) / 8 - layer, at equal dp; the second term is the update's share,
  paid once a step at either depth). So every rank's layer costs the same in the slope and in the fill, at every
  depth, as at pp 1, where vTrain's graph runs no recompute (the last rank's rule): no recompute reaches the step
  (sources.VTRAIN prices none; where the GPU dominates, tp 1, hidden 2048, micro-batch 2 -> 4, a sample costs 2.01 ms
  a layer, three passes' work at meshplan's GPU price, 0.75 x its four: data/measured/2026-11-29-vtrain-graph-scope.md);
- ``falls``: where a layer's time per micro-batch falls as the micro-batch doubles (more work, less time): each
  (width, tp, micro-batch) is one traced layer, timed once in vTrain's profiling run, with its host gaps; no pricing
  that never charges more work less can follow those points.

``python benchmarks/measure/small_work_graph.py`` prints the layer times and the checks; tests/test_small_work_graph.py
shows the arithmetic on made-up lines and runs the checks on the released file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshplan_validation.records import clean_record, read_runs
from small_work_scope import VTRAIN, lines

DEPTHS = (12, 20)
Lines = dict[tuple[int, ...], tuple[float, float, float]]


def at_min_dp(fits: Lines) -> dict[tuple[int, ...], tuple[float, float, int]]:
    """(layers, hidden, tp, pp, micro-batch) -> (slope, intercept, dp) of the plan's line at its smallest dp, from
    ``small_work_scope.lines``' (slope, intercept, distance) per (layers, hidden, tp, pp, micro-batch, dp)."""
    out: dict[tuple[int, ...], tuple[float, float, int]] = {}
    for (layers, hidden, tp, pp, mb, dp), (slope, icpt, _) in sorted(fits.items(), key=lambda kv: -kv[0][5]):
        out[(layers, hidden, tp, pp, mb)] = (slope, icpt, dp)
    return out


def split(fits: Lines) -> dict[tuple[int, int, int], dict[str, Any]]:
    """Per (hidden, tp, micro-batch) with both depths at pp 1: ``layer`` (pp 1's), and per depth pp the layer time
    ``layers[pp]``, the rest ``rest[pp]`` and, where both depths ran at pp 1 and pp at one dp, ``fill_excess[pp]``."""
    lo, hi = DEPTHS
    best = at_min_dp(fits)
    out: dict[tuple[int, int, int], dict[str, Any]] = {}
    for (layers, hidden, tp, pp, mb) in sorted(best):
        if layers != lo or pp != 1 or (hi, hidden, tp, 1, mb) not in best:
            continue
        row: dict[str, Any] = {"layers": {}, "rest": {}, "fill_excess": {}}
        one = (best[(lo, hidden, tp, 1, mb)], best[(hi, hidden, tp, 1, mb)])
        row["layer"] = (one[1][0] - one[0][0]) / (hi - lo)
        for depth in (1, 2, 4):
            a, b = best.get((lo, hidden, tp, depth, mb)), best.get((hi, hidden, tp, depth, mb))
            if a is None or b is None:
                continue
            layer = (b[0] - a[0]) / ((hi - lo) / depth)
            row["layers"][depth], row["rest"][depth] = layer, a[0] - lo / depth * layer
            if depth == 2 and a[2] == b[2] == one[0][2] == one[1][2]:
                row["fill_excess"][depth] = (b[1] - a[1]) / 4 - (one[1][1] - one[0][1]) / 8 - layer
        out[(hidden, tp, mb)] = row
    return out


def falls(rows: dict[tuple[int, int, int], dict[str, Any]]) -> list[tuple[int, int, int, float, float]]:
    """(hidden, tp, micro-batch, its layer time, the next smaller micro-batch's) wherever the time falls as the
    micro-batch grows."""
    out = []
    for (hidden, tp, mb), row in sorted(rows.items()):
        smaller = [(m, r) for (h, t, m), r in rows.items() if (h, t) == (hidden, tp) and m < mb]
        if smaller:
            m, r = max(smaller, key=lambda x: x[0])
            if row["layer"] < r["layer"]:
                out.append((hidden, tp, mb, row["layer"], r["layer"]))
    return out


def checks(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The largest spreads of the module docstring, in seconds, and the falling points."""
    rows = split(lines(records))
    layer = [max(r["layers"].values()) - min(r["layers"].values()) for r in rows.values()]
    rest = [abs(r["rest"][2] - r["rest"][4]) for r in rows.values() if 2 in r["rest"] and 4 in r["rest"]]
    fill = [abs(v) for r in rows.values() for v in r["fill_excess"].values()]
    return {"groups": len(rows), "layer_spread": max(layer), "rest_spread": max(rest), "fill_groups": len(fill),
            "fill_excess": max(fill), "falls": falls(rows), "rows": rows}


def main() -> None:
    found = checks([clean_record(r) for r in read_runs(VTRAIN)])
    print(f"{found['groups']} (width, tp, micro-batch) groups. Largest spread of a layer's time per micro-batch over "
          f"pp 1 / 2 / 4: {found['layer_spread'] * 1e3:.1e} ms; of the rest over pp 2 / 4: "
          f"{found['rest_spread'] * 1e3:.1e} ms; largest fill excess (the earlier ranks' recompute) over "
          f"{found['fill_groups']} groups: {found['fill_excess'] * 1e3:.1e} ms.\n")
    print("| hidden | tp | micro-batch | layer (ms) | rest at pp 1 | rest at pp 2, 4 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for (hidden, tp, mb), r in found["rows"].items():
        deep = r["rest"].get(2)
        print(f"| {hidden} | {tp} | {mb} | {r['layer'] * 1e3:.2f} | {r['rest'][1] * 1e3:.2f} | "
              f"{'-' if deep is None else f'{deep * 1e3:.2f}'} |")
    print("\nA layer's time per micro-batch falls as the micro-batch doubles (hidden, tp, micro-batch: ms, against the "
          "smaller micro-batch's):")
    for hidden, tp, mb, t, before in found["falls"]:
        print(f"- {hidden}, tp {tp}, micro-batch {mb}: {t * 1e3:.2f} < {before * 1e3:.2f}")


if __name__ == "__main__":
    main()
