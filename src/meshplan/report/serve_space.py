"""The configuration space of a serving search: every configuration the search weighed (``search(..., keep=True)``,
serve/weighed.py) as output tokens/s per GPU against a latency (TPOT, TTFT or end-to-end, chosen above the chart),
coloured by a chosen axis (tp, pp, the instances' pools, quantisation, batch; dpa and ep for a mixture of experts),
with the Pareto front of throughput and that latency joined by a line, the best configurations as numbered diamonds,
and the configurations rejected for memory or a latency target drawn as grey marks by reason, the region past each
target shaded. The ones rejected before pricing (divisibility, max_seqs, a format the GPU lacks) have no figures to
draw: the rejected table counts them.

Above SERVE_SAMPLE drawable configurations, a uniform sample is drawn (seeded: the page is the same every time) and
every configuration on a front is kept. The page's script (serve.js) builds the rows from the columns and redraws the
chart when the latency or the colour axis changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from meshplan.report.sections import Section
from meshplan.report.space import significant
from meshplan.report.vega import spec
from meshplan.serve import check
from meshplan.units import GiB

if TYPE_CHECKING:
    from meshplan.report.ranked import Ranked
    from meshplan.serve.search import ServeSearchResult
    from meshplan.serve.weighed import Weighed

SERVE_SAMPLE = 6000
REJECTED = {check.MEMORY: "memory: the KV cache does not fit", check.TTFT: "TTFT above its target",
            check.TPOT: "TPOT above its target"}  # the reasons drawn, as the legend names them
SHAPES = {"memory: the KV cache does not fit": "cross", "TTFT above its target": "triangle-up",
          "TPOT above its target": "triangle-down"}
X_AXES = {"tpot": ("time per output token, TPOT", "ms", 1e3), "ttft": ("time to first token, TTFT", "ms", 1e3),
          "e2e": ("end-to-end latency", "s", 1.0)}  # key -> (title, unit, factor from seconds)
INTS = ("tp", "pp", "dpa", "ep", "batch", "replicas", "prefill_replicas")


def axes(moe: bool) -> dict[str, str]:
    """The colour axes the page offers: column -> title."""
    out = {"tp": "tensor parallel (tp)", "pp": "pipeline stages (pp)"}
    if moe:
        out |= {"dpa": "data-parallel attention groups (dpa)", "ep": "expert parallel (ep)"}
    return out | {"pools": "instances: xN co-located, or P prefill + D decode (disaggregated)",
                  "quant": "quantisation: weights / activations / KV cache", "batch": "decode batch per instance"}


def drawable(w: Weighed) -> np.ndarray:
    """The rows with figures worth drawing: fitting ones and those rejected for memory or a target, finite."""
    c = w.columns
    drawn = [w.reasons.index(r) for r in REJECTED if r in w.reasons]
    ok = (c["reason"] < 0) | np.isin(c["reason"], drawn)
    for k in ("ttft", "tpot", "e2e", "memory"):
        ok &= np.isfinite(c[k]) & (c[k] > 0)
    return np.flatnonzero(ok & (c["tokens_per_s"] > 0))


def front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The Pareto front of the lowest ``x`` and the highest ``y``: a point on it has no other point at most as far
    in x with more y (ties: the first)."""
    order = np.lexsort((-y, x))
    on = np.zeros(len(x), dtype=bool)
    best = -np.inf
    for i in order:
        if y[i] > best:
            on[i], best = True, y[i]
    return on


def pick(w: Weighed, sample: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows drawn (all drawable ones, or a seeded uniform sample of ``sample`` and every front) and each one's
    fronts as a bit mask (1: TPOT, 2: TTFT, 4: end-to-end)."""
    rows = drawable(w)
    c = w.columns
    fits = rows[c["reason"][rows] < 0]
    per_gpu = c["tokens_per_s"] / c["gpus"]
    bits = np.zeros(len(c["tp"]), dtype=np.int64)
    for bit, x in ((1, "tpot"), (2, "ttft"), (4, "e2e")):
        bits[fits[front(c[x][fits], per_gpu[fits])]] |= bit
    if len(rows) > sample:
        rest = rows[bits[rows] == 0]
        chosen = np.random.default_rng(0).choice(rest, size=max(sample - int(np.sum(bits[rows] > 0)), 0),
                                                 replace=False)
        rows = np.sort(np.concatenate([rows[bits[rows] > 0], chosen]))
    return rows, bits[rows]


def serving_columns(result: ServeSearchResult, rows: np.ndarray, bits: np.ndarray) -> dict[str, Any]:
    """The drawn rows as the page reads them: integers, latencies in seconds and memory in GiB (4 significant
    digits), tokens/s per GPU, the scheme and the verdict as codes into ``vocab``, the fronts' bits."""
    w = result.weighed
    assert w is not None  # drawn only for a search that weighed its configurations (serve_html.py)
    c = {k: v[rows] for k, v in w.columns.items()}
    out: dict[str, Any] = {k: c[k].tolist() for k in INTS}
    out |= {k: significant(c[k]) for k in ("ttft", "tpot", "e2e")}
    out |= {"per_gpu": significant(c["tokens_per_s"] / c["gpus"]), "memory": significant(c["memory"] / GiB),
            "front": bits.tolist()}
    verdicts = ["fits", *REJECTED.values()]
    names = {i: REJECTED.get(r, r) for i, r in enumerate(w.reasons)}
    out["verdict"] = [0 if r < 0 else verdicts.index(names[r]) for r in c["reason"].tolist()]
    labels = [q.label for q in w.quants]
    out["quant"] = c["quant"].tolist()
    pools = sorted({(int(p), int(r)) for p, r in zip(c["prefill_replicas"], c["replicas"], strict=True)})
    vocab = {"verdict": verdicts, "quant": labels,
             "pools": [f"{p}P+{r}D" if p else f"x{r}" for p, r in pools]}
    for k in ("tp", "pp", "dpa", "ep", "batch"):
        vocab[k] = [str(v) for v in sorted(set(out[k]))]
    return out | {"vocab": vocab}


def serving_space_section(result: ServeSearchResult, ranked: Ranked, sample: int = SERVE_SAMPLE) -> Section:
    """The configuration-space section: the chart (on a canvas), the latency and colour controls, the counts; the
    best configurations marked from the search's ranked rows (ranked_serving.from_serving)."""
    assert result.weighed is not None  # as in serving_columns
    rows, bits = pick(result.weighed, sample)
    s = result.space
    drawn = len(drawable(result.weighed))
    best = [{"rank": f"#{i}", "plan": label, "tpot": m["tpot_s"], "ttft": m["ttft_s"], "e2e": m["e2e_s"],
             "per_gpu": m["tokens_per_s_per_gpu"], "memory": m["memory_bytes"] / GiB}
            for i, (label, m) in enumerate(zip(ranked.labels, ranked.metrics, strict=True), 1)]
    slo = {"tpot": s.tpot_slo, "ttft": s.ttft_slo}
    context = {"axes": axes(result.model.is_moe), "x_axes": {k: v[0] for k, v in X_AXES.items()}, "shown": len(rows),
               "drawable": drawn, "evaluated": result.evaluated, "feasible": result.feasible,
               "undrawn": result.evaluated - drawn,
               "data": {"serve_space": {"columns": serving_columns(result, rows, bits),
                                        "axes": axes(result.model.is_moe), "x_axes": X_AXES, "best": best,
                                        "slo": slo, "shapes": SHAPES}}}
    return Section("space", "Configuration space", "sections/serve_space.html.j2", context,
                   {"serve-space": serving_space_chart()}, {"serve-space": "canvas"})


def serving_space_chart() -> dict[str, Any]:
    """The scatter's spec: its data sets (``points``, ``rejected``, ``best``, ``slo``), the x field and the colour
    field are filled in by the page's script (serve.js) for the axes chosen."""
    x = {"field": "x", "type": "quantitative", "scale": {"type": "log"}, "title": "latency"}
    y = {"field": "per_gpu", "type": "quantitative", "scale": {"type": "log"},
         "title": "output tokens/s per GPU (log scale)", "axis": {"format": "~s"}}
    tip = [{"field": "plan", "title": "configuration"}, {"field": "rate", "title": "tokens/s per GPU"},
           {"field": "tpot_text", "title": "TPOT"}, {"field": "ttft_text", "title": "TTFT"},
           {"field": "e2e_text", "title": "end-to-end"},
           {"field": "memory", "title": "memory per GPU (GiB)", "format": ".4~r"},
           {"field": "verdict"}]
    return spec(
        height=440, title="Every configuration the search weighed: throughput per GPU against latency",
        layer=[
            {"name": "slo-region", "data": {"name": "slo"}, "mark": {"type": "rect", "opacity": 0.12,
                                                                     "color": "#C44E52"},
             "encoding": {"x": {"field": "x", "type": "quantitative"}, "x2": {"field": "x2"},
                          "tooltip": [{"field": "text"}]}},
            {"name": "slo-rule", "data": {"name": "slo"}, "mark": {"type": "rule", "strokeDash": [5, 3],
                                                                   "color": "#C44E52"},
             "encoding": {"x": {"field": "x", "type": "quantitative"}, "tooltip": [{"field": "text"}]}},
            {"name": "rejected", "data": {"name": "rejected"},
             "mark": {"type": "point", "size": 22, "color": "#8a8a8a", "opacity": 0.45, "strokeWidth": 1},
             "encoding": {"x": x, "y": y, "tooltip": tip,
                          "shape": {"field": "verdict", "type": "nominal", "title": "rejected",
                                    "scale": {"domain": list(SHAPES), "range": list(SHAPES.values())},
                                    "legend": {"direction": "vertical", "columns": 1}}}},
            {"name": "points", "data": {"name": "points"}, "mark": {"type": "circle", "size": 18, "opacity": 0.7},
             "params": [{"name": "zoom", "select": "interval", "bind": "scales"}],
             "encoding": {"x": x, "y": y, "color": {"field": "tp", "type": "ordinal"}, "tooltip": tip}},
            {"name": "front", "data": {"name": "points"}, "transform": [{"filter": "datum.onFront"}],
             "mark": {"type": "line", "interpolate": "step-after", "color": "#222", "strokeWidth": 1.2},
             "encoding": {"x": x, "y": y, "order": {"field": "x"}}},
            {"name": "best", "data": {"name": "best"},
             "mark": {"type": "point", "shape": "diamond", "filled": True, "size": 120, "color": "#FFD43B",
                      "stroke": "#111", "strokeWidth": 1.2},
             "encoding": {"x": x, "y": y, "tooltip": [{"field": "rank"}, *tip[:6]]}},
            {"name": "best-rank", "data": {"name": "best"}, "transform": [{"filter": "datum.rank == '#1'"}],
             "mark": {"type": "text", "dx": 9, "dy": -9, "fontSize": 12, "fontWeight": 700, "align": "left"},
             "encoding": {"x": x, "y": y, "text": {"field": "rank"}}},
        ])
