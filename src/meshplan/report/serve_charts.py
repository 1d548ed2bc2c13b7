"""The serving report's charts as Vega-Lite specs (vega.spec: the page's width, labelled axes): throughput against
latency over the decode batch for the best configurations' shapes (serve/curves.py), memory per GPU against HBM and
the decode iteration by kind of op for the best configurations. Numbers come from serve/ (ServeEstimate, Curve);
nothing here prices anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from meshplan.report.charts import bar_axis, palette, stacked_bars
from meshplan.report.vega import spec
from meshplan.units import GiB, fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from meshplan.serve.curves import Curve
    from meshplan.serve.estimate import ServeEstimate

# the parts of an inference GPU's memory (serve/memory.py), bottom to top, and their colours
MEMORY_PARTS = {"weights": "#4C72B0", "KV cache of the batch": "#DD8452", "activations (one layer)": "#55A868",
                "workspace": "#8C8C8C", "KV pool left free": "#EFE3D3"}
# the kinds of the decode step's ops (ServeEstimate.kinds) as the report names them, and their colours
# (the decode step's GEMMs stream the weights; attention reads the KV cache; element-wise: norms, activation,
# sampling, KV writes; collectives: TP all-reduce, EP dispatch / combine, PP send; the engine's host time)
STEP_KINDS = {"gemm": ("GEMMs", "#4C72B0"), "attention": ("attention (KV-cache reads)", "#DD8452"),
              "memory": ("element-wise", "#55A868"), "collective": ("collectives", "#C44E52"),
              "host": ("engine host time", "#937860")}
LABELLED_BATCHES = (1, 8, 64, 512)  # the curves write these batches (and each configuration's own) beside the point
SLO_COLOR = "#C44E52"


def curve_rows(curves: Sequence[Curve], chosen: Sequence[int]) -> list[dict[str, Any]]:
    """One row per curve and batch: the latencies (ms) and output tokens/s per GPU, whether the batch fits, whether it
    is the configuration's own (``chosen``: the batch of each curve's best configuration) and its label (on the
    first curve only, so that labels of curves that run close do not print over each other)."""
    rows = []
    for n, (c, own) in enumerate(zip(curves, chosen, strict=True)):
        for b, tpot, ttft, rate, fits in zip(c.batch.tolist(), c.tpot.tolist(), c.ttft.tolist(),
                                             c.tokens_per_s_per_gpu.tolist(), c.fits.tolist(), strict=True):
            if not (np.isfinite(tpot) and np.isfinite(ttft) and rate > 0):
                continue
            rows.append({"config": c.label, "batch": b, "tpot": tpot * 1e3, "ttft": ttft * 1e3, "per_gpu": rate,
                         "fits": "fits" if fits else "KV cache or max_seqs exceeded", "own": b == own,
                         "label": str(b) if n == 0 and fits and b in LABELLED_BATCHES else "",
                         "tpot_text": fmt_time(tpot), "ttft_text": fmt_time(ttft), "rate_text": fmt_count(rate)})
    return rows


def curve_chart(rows: list[dict[str, Any]], x: str, slo: float, title: str) -> dict[str, Any]:
    """Output tokens/s per GPU against ``x`` ("tpot" or "ttft", ms; log-log), one line per configuration through the
    batches that fit, the ones that do not as hollow points, each configuration's own batch a diamond, the target
    ``slo`` (seconds; 0: none) a dashed rule."""
    name = {"tpot": "time per output token, TPOT", "ttft": "time to first token, TTFT"}[x]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    xs = [r[x] for r in rows] + ([slo * 1e3] if slo else [])
    enc_x = {"field": x, "type": "quantitative", "title": f"{name} (ms, log scale)",
             "scale": {"type": "log", "domain": [min(xs) / 1.3, max(xs) * 1.3]}}
    enc_y = {"field": "per_gpu", "type": "quantitative", "title": "output tokens/s per GPU (log scale)",
             "scale": {"type": "log"}, "axis": {"format": "~s"}}
    colour = {"field": "config", "type": "nominal", "title": "configuration", "scale": palette(configs),
              "legend": {"columns": 1}}
    tip = [{"field": "config", "title": "configuration"}, {"field": "batch"}, {"field": "rate_text",
                                                                                 "title": "tokens/s per GPU"},
           {"field": "tpot_text", "title": "TPOT"}, {"field": "ttft_text", "title": "TTFT"}, {"field": "fits"}]
    fits, out = "datum.fits == 'fits'", "datum.fits != 'fits'"
    layers = [] if not slo else _target(x, slo)
    layers += [
        {"transform": [{"filter": fits}], "mark": {"type": "line", "strokeWidth": 1.6, "point": False},
         "encoding": {"x": enc_x, "y": enc_y, "color": colour, "order": {"field": "batch"}}},
        {"transform": [{"filter": out}], "mark": {"type": "point", "size": 30, "filled": False},
         "encoding": {"x": enc_x, "y": enc_y, "color": colour, "tooltip": tip}},
        {"transform": [{"filter": fits}], "mark": {"type": "point", "filled": True, "opacity": 0.9},
         "encoding": {"x": enc_x, "y": enc_y, "color": colour, "tooltip": tip,
                      "shape": {"condition": {"test": "datum.own", "value": "diamond"}, "value": "circle"},
                      "size": {"condition": {"test": "datum.own", "value": 150}, "value": 30},
                      "stroke": {"condition": {"test": "datum.own", "value": "#111"}, "value": None}}},
        {"transform": [{"filter": "datum.label != ''"}],
         "mark": {"type": "text", "align": "left", "dx": 5, "dy": -6, "fontSize": 10, "color": "#444"},
         "encoding": {"x": enc_x, "y": enc_y, "text": {"field": "label"}}}]
    return spec(height=300, title=title, data={"values": rows}, layer=layers)


def _target(x: str, slo: float) -> list[dict[str, Any]]:
    """A latency target as a dashed rule with its name at the top, drawn under the points (which keep their
    tooltips)."""
    target = [{"x": slo * 1e3, "text": f"{x.upper()} target {fmt_time(slo)}"}]
    return [{"data": {"values": target}, "mark": {"type": "rule", "strokeDash": [5, 3], "color": SLO_COLOR},
             "encoding": {"x": {"field": "x", "type": "quantitative"}, "tooltip": [{"field": "text"}]}},
            {"data": {"values": target}, "mark": {"type": "text", "align": "left", "baseline": "top", "dx": 4,
                                                  "y": 4, "fontSize": 11, "color": SLO_COLOR},
             "encoding": {"x": {"field": "x", "type": "quantitative"}, "text": {"field": "text"}}}]


def memory_parts(e: ServeEstimate) -> dict[str, float]:
    """Bytes per GPU by part (MEMORY_PARTS): what the configuration holds, and the KV pool it leaves free."""
    m = e.memory
    return {"weights": float(m.weights), "KV cache of the batch": float(m.kv_used),
            "activations (one layer)": float(m.activations), "workspace": float(m.workspace),
            "KV pool left free": max(float(m.kv_pool) - float(m.kv_used), 0.0)}


def serving_memory_chart(plans: Sequence[ServeEstimate], labels: Sequence[str]) -> dict[str, Any]:
    """Memory per GPU of each configuration stacked by part (up to what the engine allocates: its share of the HBM
    when it takes a share of the total, memory.py), against the HBM and that share."""
    acc, engine = plans[0].cluster.accelerator, plans[0].engine
    rows = [{"config": label, "part": k, "value": v / GiB, "order": list(MEMORY_PARTS).index(k), "bytes": fmt_bytes(v)}
            for e, label in zip(plans, labels, strict=True) for k, v in memory_parts(e).items() if v > 0]
    ends = [{"config": label, "end": max(sum(memory_parts(e).values()), acc.hbm_bytes) / GiB,
             "text": f"{fmt_bytes(float(e.memory.total))} used · {float(e.memory.max_sequences(e.plan.dpa)):,.0f} "
                     f"sequences fit"} for e, label in zip(plans, labels, strict=True)]
    limits = [{"x": acc.hbm_bytes / GiB, "limit": f"HBM {fmt_bytes(acc.hbm_bytes)}"}]
    if engine.mode("memory_basis").of_total:  # the engine's share of the HBM (vLLM: gpu_memory_utilization)
        share = float(plans[0].memory.capacity)
        name = f"{engine.name}'s {engine.memory_utilization:.0%}: {fmt_bytes(share)}"
        limits.append({"x": share / GiB, "limit": name})
    dashes = {"domain": [r["limit"] for r in limits], "range": [[6, 3], [2, 2]][:len(limits)]}
    shown = [k for k in MEMORY_PARTS if any(r["part"] == k for r in rows)]
    return stacked_bars(
        f"Memory per GPU (GiB) against {fmt_bytes(acc.hbm_bytes)} of HBM", bar_axis("config", labels, 340), rows, ends,
        {"title": "memory per GPU (GiB)", "scale": {"domain": [0, acc.hbm_bytes / GiB * 1.6]}},
        {"field": "part", "type": "nominal", "title": "part",
         "scale": {"domain": shown, "range": [MEMORY_PARTS[k] for k in shown]}, "legend": {"columns": 2}},
        [{"field": "config"}, {"field": "part"}, {"field": "bytes"}],
        [{"data": {"values": limits}, "mark": {"type": "rule", "color": SLO_COLOR, "strokeWidth": 1.5},
          "encoding": {"x": {"field": "x", "type": "quantitative"}, "tooltip": [{"field": "limit"}],
                       "strokeDash": {"field": "limit", "type": "nominal", "title": "limit", "scale": dashes,
                                      "legend": {"direction": "vertical", "columns": 1}}}}])


def step_kinds(e: ServeEstimate) -> dict[str, float]:
    """The decode step's seconds by kind of op (STEP_KINDS' keys; an op without a kind counts as element-wise)."""
    out = dict.fromkeys(STEP_KINDS, 0.0)
    for name, t in e.breakdown.items():
        out[e.kinds.get(name, "memory")] += t
    return out


def step_chart(plans: Sequence[ServeEstimate], labels: Sequence[str]) -> dict[str, Any]:
    """One decode iteration of each configuration (at its running batch) stacked by kind of op, in ms, with the
    iteration's time and the configuration's TPOT after the bar."""
    rows: list[dict[str, Any]] = []
    ends: list[dict[str, Any]] = []
    for e, label in zip(plans, labels, strict=True):
        kinds = step_kinds(e)
        total = sum(kinds.values())
        rows += [{"config": label, "kind": STEP_KINDS[k][0], "value": v * 1e3, "order": list(STEP_KINDS).index(k),
                  "time": fmt_time(v), "share": v / total} for k, v in kinds.items() if v > 0]
        ends.append({"config": label, "end": total * 1e3,
                     "text": f"{fmt_time(total)} per iteration · TPOT {fmt_time(e.metrics.tpot)}"})
    shown = [v[0] for k, v in STEP_KINDS.items() if any(r["kind"] == v[0] for r in rows)]
    top = max(r["end"] for r in ends)
    return stacked_bars(
        "One decode iteration at the running batch, by kind of op (ms)", bar_axis("config", labels, 340), rows, ends,
        {"title": "time per decode iteration (ms)", "scale": {"domain": [0, top * 1.6]}},
        {"field": "kind", "type": "nominal", "title": "kind of op",
         "scale": {"domain": shown, "range": [c for n, c in STEP_KINDS.values() if n in shown]},
         "legend": {"columns": 3}},
        [{"field": "config"}, {"field": "kind"}, {"field": "time"}, {"field": "share", "format": ".1%"}])
