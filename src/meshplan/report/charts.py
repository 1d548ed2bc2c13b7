"""The report's charts as Vega-Lite specs (plain dicts; vega.py embeds the runtime that draws them): the best plans'
step time by component and its difference from the best plan, memory per GPU against HBM, the pipeline timeline, the
per-op roofline and strong scaling. Numbers come from Estimates, the schedule simulator and sweep rows, as in
plots.py (the matplotlib pictures of the Python API and of ``meshplan sweep``); nothing here computes a cost.

Every chart takes its container's width (``vega.spec``), labels both axes with their units and names what it
compares in its title. Charts that the page's script redraws for other plans (compare.py) read a named data set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from meshplan.estimate import COMPONENTS, Estimate
from meshplan.report.plots import (
    COMPONENT_COLORS,
    KIND_COLORS,
    MEMORY_COLORS,
    SYSTEM_COLORS,
    PipelineRun,
    roofline_points,
)
from meshplan.report.vega import spec
from meshplan.units import GiB, fmt_bytes, fmt_time

TIMELINE_COLORS = {"forward": "#4C72B0", "backward": "#55A868", "idle (bubble)": "#F2C4C4"}


def time_unit(seconds: float) -> tuple[str, float]:
    """('s', 1) from a second up, else ('ms', 1000)."""
    return ("s", 1.0) if seconds >= 1.0 else ("ms", 1e3)


def _colours(mapping: dict[str, str], keys: Sequence[str]) -> dict[str, Any]:
    return {"domain": list(keys), "range": [mapping[k] for k in keys]}


def palette(keys: Sequence[str]) -> dict[str, Any]:
    """A colour scale giving ``keys`` the series colours (SYSTEM_COLORS) in turn."""
    return {"domain": list(keys), "range": [SYSTEM_COLORS[i % len(SYSTEM_COLORS)] for i in range(len(keys))]}


def bar_axis(field: str, labels: Sequence[str], limit: int = 240) -> dict[str, Any]:
    """The y axis of a bar chart: one band per label (a plan, a configuration), in their order, untitled."""
    return {"field": field, "type": "nominal", "sort": list(labels), "title": None, "axis": {"labelLimit": limit}}


def stacked_bars(title: str, y: dict[str, Any], rows: list[dict[str, Any]], ends: list[dict[str, Any]],
                 x: dict[str, Any], colour: dict[str, Any], tooltip: list[dict[str, Any]],
                 extra: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The best plans' or configurations' bars, one per label of ``y`` (34 px each, the first on top), stacked by
    ``colour``'s field in each row's ``order`` (``rows``: a ``value`` each, on ``x``), the ``text`` of ``ends`` after
    each bar (at its ``end``), and ``extra`` layers (limits, a zero rule) drawn between."""
    bars = {"data": {"values": rows}, "mark": {"type": "bar", "height": {"band": 0.7}},
            "encoding": {"y": y, "x": {"field": "value", "type": "quantitative", "stack": "zero"} | x, "color": colour,
                         "order": {"field": "order"}, "tooltip": tooltip}}
    text = [{"data": {"values": ends}, "mark": {"type": "text", "align": "left", "dx": 5, "fontSize": 11},
             "encoding": {"y": y, "x": {"field": "end", "type": "quantitative"}, "text": {"field": "text"}}}]
    return spec(height=34 * len(y["sort"]), title=title, layer=[bars, *extra, *(text if ends else [])])


def breakdown_rows(estimates: Sequence[Estimate], labels: Sequence[str], scale: float) -> list[dict[str, Any]]:
    """One row per plan and non-zero component: its exposed time (in the chart's unit) and share of the step."""
    return [{"plan": label, "component": c, "value": e.breakdown[c] * scale, "order": COMPONENTS.index(c),
             "time": fmt_time(e.breakdown[c]), "share": e.breakdown[c] / e.step_time}
            for e, label in zip(estimates, labels, strict=True) for c in COMPONENTS if e.breakdown.get(c, 0) > 0]


def breakdown_chart(estimates: Sequence[Estimate], labels: Sequence[str]) -> dict[str, Any]:
    """Horizontal bars, one per plan (the first on top), stacked by step-time component; the step time, MFU and the
    difference from the first plan at the end of each bar."""
    unit, scale = time_unit(max(e.step_time for e in estimates))
    best = estimates[0].step_time
    ends: list[dict[str, Any]] = [
        {"plan": label, "end": e.step_time * scale, "text": f"{fmt_time(e.step_time)} · MFU {e.mfu:.1%}"
         + ("" if i == 0 else f" · {e.step_time / best - 1:+.1%}")}
        for i, (e, label) in enumerate(zip(estimates, labels, strict=True))]
    shown = [c for c in COMPONENTS if any(e.breakdown.get(c, 0) > 0 for e in estimates)]
    top = max(t["end"] for t in ends)
    return stacked_bars(
        f"Step time by component ({unit}); the difference from plan #1 after each bar", bar_axis("plan", labels),
        breakdown_rows(estimates, labels, scale), ends,
        {"title": f"step time ({unit})", "scale": {"domain": [0, top * 1.45]}},
        {"field": "component", "type": "nominal", "title": "component", "scale": _colours(COMPONENT_COLORS, shown)},
        [{"field": "plan"}, {"field": "component"}, {"field": "time"}, {"field": "share", "format": ".1%"}])


def delta_chart(estimates: Sequence[Estimate], labels: Sequence[str]) -> dict[str, Any] | None:
    """Each plan's step time minus the first plan's, by component (diverging: slower components right of zero,
    faster left), with the net difference written beside: what the identical-looking bars differ in."""
    if len(estimates) < 2:
        return None
    best = estimates[0]
    span = max(abs(e.breakdown.get(c, 0) - best.breakdown.get(c, 0)) for e in estimates[1:] for c in COMPONENTS)
    unit, scale = time_unit(span)
    rows, names = [], []
    for e, label in zip(estimates[1:], labels[1:], strict=True):
        net = e.step_time - best.step_time
        name = f"{label} (net {'+' if net >= 0 else '−'}{fmt_time(abs(net))})"
        names.append(name)
        for c in COMPONENTS:
            d = e.breakdown.get(c, 0.0) - best.breakdown.get(c, 0.0)
            if abs(d) > 1e-9 * best.step_time:
                rows.append({"plan": name, "component": c, "value": d * scale, "order": COMPONENTS.index(c),
                             "delta": ("+" if d > 0 else "−") + fmt_time(abs(d))})
    shown = [c for c in COMPONENTS if any(r["component"] == c for r in rows)]
    return stacked_bars(
        f"Difference from plan #1 by component ({unit}; right: slower, left: faster)", bar_axis("plan", names, 320),
        rows, [], {"title": f"step time minus plan #1's ({unit})"},
        {"field": "component", "type": "nominal", "title": "component", "scale": _colours(COMPONENT_COLORS, shown)},
        [{"field": "plan"}, {"field": "component"}, {"field": "delta"}],
        [{"mark": {"type": "rule", "color": "#333"}, "encoding": {"x": {"datum": 0}}}])


def memory_chart(estimates: Sequence[Estimate], labels: Sequence[str], headroom: float) -> dict[str, Any]:
    """Memory per GPU of each plan (the pipeline rank with the larger footprint) stacked by part, against the HBM
    capacity and the share of it the search leaves free (``headroom``)."""
    hbm = estimates[0].cluster.accelerator.hbm_bytes
    rows = [{"plan": label, "part": k, "value": v / GiB, "order": list(MEMORY_COLORS).index(k), "bytes": fmt_bytes(v)}
            for e, label in zip(estimates, labels, strict=True) for k, v in e.memory.items() if v > 0]
    ends: list[dict[str, Any]] = [{"plan": label, "end": e.peak_memory / GiB, "text": fmt_bytes(e.peak_memory)
             + ("" if i == 0 else f" ({(e.peak_memory - estimates[0].peak_memory) / GiB:+.1f} GiB)")}
            for i, (e, label) in enumerate(zip(estimates, labels, strict=True))]
    limits = [{"x": hbm / GiB, "limit": f"HBM {fmt_bytes(hbm)}"}]
    if headroom:
        limits.append({"x": hbm * (1 - headroom) / GiB, "limit": f"{headroom:.0%} headroom"})
    shown = [k for k in MEMORY_COLORS if any(r["part"] == k for r in rows)]
    top = max([p["end"] for p in ends] + [hbm / GiB]) * 1.3
    return stacked_bars(
        f"Memory per GPU (GiB) against {fmt_bytes(hbm)} of HBM", bar_axis("plan", labels), rows, ends,
        {"title": "memory per GPU (GiB)", "scale": {"domain": [0, top]}},
        {"field": "part", "type": "nominal", "title": "part", "scale": _colours(MEMORY_COLORS, shown)},
        [{"field": "plan"}, {"field": "part"}, {"field": "bytes"}],
        [{"data": {"values": limits}, "mark": {"type": "rule", "strokeDash": [5, 3], "color": "#C44E52"},
          "encoding": {"x": {"field": "x", "type": "quantitative"}, "tooltip": [{"field": "limit"}]}}])


def timeline_rows(run: PipelineRun, width_px: float = 900.0) -> tuple[list[dict[str, Any]], str, float]:
    """The blocks of a simulated schedule and its idle intervals as rows (times in the chart's unit), each block
    labelled with its micro-batch (``micro.chunk`` when interleaved) where about ``width_px`` wide a chart holds it;
    the unit and its scale."""
    tl = run.timeline
    unit, scale = time_unit(tl.step_time)
    px = width_px / tl.step_time if tl.step_time > 0 else 0.0
    rows = []
    for r, (row, starts, ends) in enumerate(zip(run.table, tl.starts, tl.ends, strict=True)):
        for action, s, e in zip(row, starts, ends, strict=True):
            text = str(action.micro) if run.vpp == 1 else f"{action.micro}.{action.chunk}"
            kind = "forward" if action.kind == "F" else "backward"
            rows.append({"rank": r, "start": s * scale, "end": e * scale, "kind": kind, "what": f"{kind} {text}",
                         "label": text if (e - s) * px >= 6.5 * len(text) + 6 else ""})
        rows += [{"rank": r, "start": s * scale, "end": (s + w) * scale, "kind": "idle (bubble)",
                  "what": f"idle {fmt_time(w)}", "label": ""} for s, w in run.idle()[r]]
    return rows, unit, scale


def timeline_chart(run: PipelineRun, title: str, data: str | None = None) -> dict[str, Any]:
    """Per-rank Gantt chart of a simulated pipeline schedule: forward and backward blocks, idle time (the bubble) in
    red, micro-batch numbers where they fit. ``data``: read the named data set instead of this run's rows."""
    rows, unit, _ = timeline_rows(run)
    source = {"name": data} if data else {"values": rows}
    y = {"field": "rank", "type": "ordinal", "title": "pipeline rank"}
    x = {"field": "start", "type": "quantitative", "title": f"time within the step ({unit}); DP reduction and "
                                                           "optimizer step not shown"}
    return spec(
        height=max(60, 24 * run.pp), title=title, data=source,
        layer=[{"mark": {"type": "bar", "stroke": "white", "strokeWidth": 0.3},
                "encoding": {"y": y, "x": x, "x2": {"field": "end"},
                             "color": {"field": "kind", "type": "nominal", "title": None,
                                       "scale": _colours(TIMELINE_COLORS, list(TIMELINE_COLORS))},
                             "tooltip": [{"field": "rank"}, {"field": "what"}]}},
               {"mark": {"type": "text", "fontSize": 9, "color": "white"},
                "encoding": {"y": y, "x": {"field": "mid", "type": "quantitative"}, "text": {"field": "label"}},
                "transform": [{"calculate": "(datum.start + datum.end) / 2", "as": "mid"}]}])


def roofline_chart(est: Estimate, label_top: int = 6) -> dict[str, Any]:
    """Every op of the plan at its arithmetic intensity (FLOP per HBM byte) and achieved FLOP/s, log-log, under
    the compute and HBM roofs of the plan's precision (and of 16-bit and FP32 math); marker area by the op's share of
    the step. The ``label_top`` most expensive ops carry numbers (the table below names them), ops whose points
    nearly coincide sharing one label, so that no two labels print over each other."""
    acc, precision = est.cluster.accelerator, est.plan.precision
    peak, bw = acc.flops(precision), acc.hbm_bandwidth
    points = roofline_points(est)
    xs = [p.intensity for p in points] + [peak / bw]
    lo, hi = min(xs) / 4, max(xs) * 4
    roofs = [(f"{precision} {peak / 1e12:.0f} TFLOP/s, HBM {bw / 1e12:.2f} TB/s", peak)]
    if acc.half_flops != peak:
        roofs.append((f"bf16 (attention) {acc.half_flops / 1e12:.0f} TFLOP/s", acc.half_flops))
    if "fp32" in acc.peak_flops:
        roofs.append((f"fp32 (element-wise) {acc.peak_flops['fp32'] / 1e12:.0f} TFLOP/s", acc.peak_flops["fp32"]))
    lines = [{"roof": name, "x": x, "y": min(value, x * bw)} for name, value in roofs
             for x in (lo, value / bw, hi)]
    ops = [{"op": p.name, "phase": p.phase, "kind": p.kind, "intensity": p.intensity, "achieved": p.achieved,
            "share": p.share} for p in points]
    tags = [{"x": x, "y": y, "tag": tag} for (x, y), tag in op_tags(points, label_top)]
    log_x = {"type": "log", "domain": [lo, hi]}
    ymin = min([p.achieved for p in points] + [lo * bw]) / 3
    log_y = {"type": "log", "domain": [ymin, peak * 2.5]}
    return spec(
        height=360, title=f"Per-op roofline of plan #1 on {acc.name}",
        layer=[{"data": {"values": lines}, "mark": {"type": "line", "color": "#333", "strokeWidth": 1.3},
                "encoding": {"x": {"field": "x", "type": "quantitative", "scale": log_x,
                                   "title": "arithmetic intensity (FLOP per HBM byte)"},
                             "y": {"field": "y", "type": "quantitative", "scale": log_y,
                                   "title": "achieved FLOP/s per GPU", "axis": {"format": "~s"}},
                             "strokeDash": {"field": "roof", "type": "nominal", "title": "roof"}}},
               {"data": {"values": ops}, "mark": {"type": "circle", "opacity": 0.75, "stroke": "white"},
                "encoding": {"x": {"field": "intensity", "type": "quantitative"},
                             "y": {"field": "achieved", "type": "quantitative"},
                             "size": {"field": "share", "type": "quantitative", "title": "share of the step",
                                      "scale": {"range": [20, 700]}, "legend": {"format": ".0%"}},
                             "color": {"field": "kind", "type": "nominal", "title": "op kind",
                                       "scale": _colours(KIND_COLORS, [k for k in KIND_COLORS
                                                                       if any(p.kind == k for p in points)])},
                             "tooltip": [{"field": "op"}, {"field": "phase"}, {"field": "kind"},
                                         {"field": "intensity", "format": ".3~s", "title": "FLOP/byte"},
                                         {"field": "achieved", "format": ".3~s", "title": "FLOP/s"},
                                         {"field": "share", "format": ".1%"}]}},
               {"data": {"values": tags}, "mark": {"type": "text", "align": "left", "dx": 7, "dy": -7,
                                                    "fontSize": 11, "fontWeight": 600},
                "encoding": {"x": {"field": "x", "type": "quantitative"}, "y": {"field": "y", "type": "quantitative"},
                             "text": {"field": "tag"}}}])


def op_tags(points: Sequence[Any], top: int) -> list[tuple[tuple[float, float], str]]:
    """Numbers 1..``top`` for the most expensive op names (by their costliest point), one label per group of points
    that lie within 0.3 decades of each other in both coordinates ("1, 3")."""
    best: dict[str, Any] = {}
    for p in sorted(points, key=lambda p: -p.share):
        best.setdefault(p.name, p)
    groups: list[tuple[tuple[float, float], list[int]]] = []
    for n, p in enumerate(list(best.values())[:top], 1):
        for (x, y), members in groups:
            if abs(math.log10(p.intensity / x)) < 0.3 and abs(math.log10(p.achieved / y)) < 0.3:
                members.append(n)
                break
        else:
            groups.append(((p.intensity, p.achieved), [n]))
    return [(xy, ", ".join(map(str, members))) for xy, members in groups]


def tagged_ops(est: Estimate, top: int = 6) -> list[str]:
    """The op names ``op_tags`` numbers, in order."""
    return list(dict.fromkeys(p.name for p in sorted(roofline_points(est), key=lambda p: -p.share)))[:top]


def scaling_charts(rows: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Strong scaling from sweep rows: the best plan's tokens/s (log-log) and its MFU (from 0, with room above the
    highest point) against the GPU count, one line per system × NVLink domain."""
    data = [{"series": f"{r['system']} NVL{r['nvlink_domain']}", "gpus": r["gpus"], "tokens_per_s": r["tokens_per_s"],
             "mfu": r["mfu"], "plan": r["plan"], "step": fmt_time(r["step_time_s"])}
            for r in rows if r.get("feasible")]
    series = list(dict.fromkeys(d["series"] for d in data))
    colour = {"field": "series", "type": "nominal", "title": "system", "scale": palette(series)}
    gpus = sorted({d["gpus"] for d in data})
    x = {"field": "gpus", "type": "quantitative", "title": "GPUs", "scale": {"type": "log", "base": 2},
         "axis": {"values": gpus, "grid": True}}
    tip = [{"field": "series"}, {"field": "gpus"}, {"field": "plan"}, {"field": "step"},
           {"field": "tokens_per_s", "format": ".3~s", "title": "tokens/s"}, {"field": "mfu", "format": ".1%"}]
    top = max((d["mfu"] for d in data), default=0.5) * 1.25
    throughput = spec(height=260, title="Tokens/s of the best plan", data={"values": data},
                      mark={"type": "line", "point": True},
                      encoding={"x": x, "y": {"field": "tokens_per_s", "type": "quantitative", "scale": {"type": "log"},
                                              "title": "tokens/s (best plan)", "axis": {"format": "~s"}},
                                "color": colour, "tooltip": tip})
    mfu = spec(height=260, title="MFU of the best plan", data={"values": data}, mark={"type": "line", "point": True},
               encoding={"x": x, "y": {"field": "mfu", "type": "quantitative", "title": "MFU (%)",
                                       "scale": {"domain": [0, min(1.0, top)]}, "axis": {"format": ".0%"}},
                         "color": colour, "tooltip": tip})
    return throughput, mfu
