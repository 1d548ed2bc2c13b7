"""The serving report's section under a load (serve/load/): the chosen configuration's TTFT and TPOT at p50 and the
target percentile against the offered request rate (or concurrency), the targets as dashed rules, and its KV cache's
occupancy over the simulated run at the load asked for. Numbers come from serve/load/ (load_sweep, LoadResult);
nothing here simulates anything."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshplan.report.sections import Section
from meshplan.report.vega import spec

COLOURS = {"TTFT": "#4C72B0", "TPOT": "#DD8452"}


def latency_rows(sweep: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per level, metric (TTFT, TPOT) and percentile, in milliseconds."""
    rows = []
    for s in sweep:
        p = s["percentile"]
        for metric in ("ttft", "tpot"):
            for key, name in ((f"{metric}_p50", "p50"), (f"{metric}_p", f"p{p}")):
                rows.append({"load": s["load"], "metric": metric.upper(), "percentile": name, "ms": s[key] * 1e3})
    return rows


def latency_chart(rows: list[dict[str, Any]], metric: str, slo: float, unit: str) -> dict[str, Any]:
    """``metric``'s p50 (solid) and target percentile (dashed) against the load, log latency; the target a rule."""
    mine = [r for r in rows if r["metric"] == metric]
    x = {"field": "load", "type": "quantitative", "title": unit}
    y = {"field": "ms", "type": "quantitative", "title": f"{metric} (ms, log scale)", "scale": {"type": "log"}}
    layers: list[dict[str, Any]] = [
        {"mark": {"type": "line", "point": True, "color": COLOURS[metric]},
         "encoding": {"x": x, "y": y, "strokeDash": {"field": "percentile", "type": "nominal", "title": "percentile"},
                      "tooltip": [{"field": "load", "format": ".3~s"}, {"field": "percentile"},
                                  {"field": "ms", "format": ".1f", "title": "ms"}]}}]
    if slo:
        layers.append({"data": {"values": [{"y": slo * 1e3}]},
                       "mark": {"type": "rule", "strokeDash": [5, 3], "color": "#C44E52"},
                       "encoding": {"y": {"field": "y", "type": "quantitative"}}})
    return spec(height=260, title=f"{metric} against the load", data={"values": mine}, layer=layers)


def kv_chart(timeline: dict[str, list[float]]) -> dict[str, Any]:
    """The KV cache's occupancy (share of its capacity) over the run, and the running requests."""
    rows = [{"t": t, "kv": kv, "running": n} for t, kv, n in
            zip(timeline.get("start_s", []), timeline.get("kv_occupancy", []), timeline.get("running", []),
                strict=False)]
    x = {"field": "t", "type": "quantitative", "title": "time (s)"}
    return spec(height=220, title="KV-cache occupancy over the run", data={"values": rows},
                mark={"type": "area", "color": "#DD8452", "opacity": 0.7, "line": True},
                encoding={"x": x, "y": {"field": "kv", "type": "quantitative", "title": "KV cache occupied",
                                        "axis": {"format": "%"}, "scale": {"domain": [0, 1]}},
                          "tooltip": [{"field": "t", "format": ".1f"}, {"field": "kv", "format": ".1%"},
                                      {"field": "running"}]})


def load_section(label: str, sweep: Sequence[dict[str, Any]], timeline: dict[str, list[float]],
                 slo: tuple[float, float], closed: bool) -> Section:
    """The section (module docstring) for the configuration ``label``."""
    rows = latency_rows(sweep)
    unit = "concurrency (clients)" if closed else "offered load (requests/s)"
    charts = {"load-ttft": latency_chart(rows, "TTFT", slo[0], unit),
              "load-tpot": latency_chart(rows, "TPOT", slo[1], unit), "load-kv": kv_chart(timeline)}
    context = {"label": label, "levels": len(sweep), "unit": unit,
               "percentile": sweep[0]["percentile"] if sweep else 99}
    return Section("load", "Under load", "sections/serve_load.html.j2", context, charts)
