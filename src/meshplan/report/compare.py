"""Compare two plans, and trust one: the sections that follow the plans picked in the plan space (or in their
menus), the best plans, the Pareto front and the user's own config (``meshplan report --from``).

The comparison puts two plans' step-time breakdowns, memory and pipeline timelines side by side and explains the
difference per component: the plan fields each component depends on (``DRIVERS``: which of them differ between the
two, and how) and, for the bubble, its closed form (p − 1)/(v·m). The page's script (compare.js) draws it for the
pair picked; the charts' specs are made here, their data filled in there from detail.py's plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshplan.estimate import COMPONENTS
from meshplan.report.charts import TIMELINE_COLORS
from meshplan.report.detail import Detailed, page_data
from meshplan.report.plots import MEMORY_COLORS
from meshplan.report.sections import Section
from meshplan.report.trust import trust_rows
from meshplan.report.vega import spec

# step-time component -> (the plan fields it depends on, what it is); estimate.py and step/ compute them
DRIVERS: dict[str, tuple[tuple[str, ...], str]] = {
    "compute": (("pp", "tp", "cp", "micro-batch", "micro-batches", "framework"),
                "the layers' kernels on the busiest rank: its share of the layers (pp) and of each layer (tp, cp), "
                "at the micro-batch's size"),
    "recompute": (("recompute", "pp", "tp"), "forward work run again in the backward pass"),
    "tp": (("tp", "sp", "in NVLink", "micro-batch"), "tensor-parallel collectives not hidden behind the GEMMs"),
    "cp": (("cp", "in NVLink"), "the K/V exchange of context parallelism not hidden behind attention"),
    "ep": (("ep", "etp", "in NVLink"), "the experts' all-to-all (and expert-TP collectives) left exposed"),
    "pp": (("pp", "vpp", "micro-batches"), "activations sent between pipeline stages"),
    "host": (("framework", "micro-batch", "tp"), "the GPU waiting on the host to issue its kernels (the stack's "
                                                  "host_dispatch per kernel; CUDA graphs: one launch per layer)"),
    "bubble": (("pp", "vpp", "micro-batches", "schedule"), "the pipeline's idle time, about (p − 1)/(v·m) of the "
                                                            "pipelined time"),
    "dp": (("dp", "ZeRO", "in NVLink", "pp"), "the data-parallel gradient reduction left exposed (and a tied "
                                                "embedding's, between the pipeline's first and last stage)"),
    "optimizer": (("ZeRO", "offload", "dp"), "the optimizer step over this GPU's share of the states"),
    "offload": (("offload",), "host copies left exposed"),
}
# component -> (plan field, text in its value, what it adds): said only where plan A's or B's value holds that text
# (issue 48: the text named a 2D grid and ZeRO-3 beside two 1D ZeRO-1 plans); compare.js appends them
DRIVER_EXTRAS: dict[str, tuple[str, str, str]] = {
    "tp": ("tp", "×", " (on the 2D grid: its broadcasts and K/V exchange)"),
    "dp": ("ZeRO", "3", " (with ZeRO-3: and the weight gathers)"),
}
MEMORY_DRIVERS: dict[str, tuple[tuple[str, ...], str]] = {
    "weights": (("tp", "pp", "ep", "ZeRO"), "this GPU's share of the parameters"),
    "grads": (("tp", "pp", "ep", "ZeRO"), "its share of the gradients (sharded from ZeRO-2)"),
    "optimizer": (("tp", "pp", "ZeRO", "dp", "offload"), "its share of the optimizer states (sharded from ZeRO-1)"),
    "activations": (("micro-batch", "recompute", "sp", "tp", "cp", "pp", "vpp", "schedule", "offload"),
                    "activations kept for the backward pass, for every micro-batch in flight (more with interleaving: "
                    "Narayanan et al. 2021, §2.2)"),
    "buffers": (("tp", "micro-batch", "ZeRO"), "communication and workspace buffers"),
}


def compare_section(plans: Sequence[Detailed], pair: tuple[int, int], hbm: float) -> Section:
    """The comparison of ``pair`` (ids of ``plans``), with every held plan's data for the page's script (the plan
    space reads them too) and the charts it fills in."""
    options = [{"id": d.id, "label": f"{d.origin}: {d.est.plan.describe()}"} for d in plans]
    context = {"options": options, "pair": pair,
               "data": {"plans": page_data(plans, hbm, pair),
                        "compare": {"pair": list(pair), "drivers": _drivers(DRIVERS),
                                    "memory_drivers": _drivers(MEMORY_DRIVERS), "components": list(COMPONENTS)}}}
    found = {"compare-breakdown": breakdown_pair_chart(), "compare-memory": memory_pair_chart(),
             "compare-timeline-a": timeline_template("A"), "compare-timeline-b": timeline_template("B")}
    return Section("compare", "Compare", "sections/compare.html.j2", context, found)


def trust_section(plans: Sequence[Detailed], headroom: float, shown: int) -> Section:
    return Section("trust", "Trust", "sections/trust.html.j2", {"plans": trust_rows(plans, headroom), "shown": shown})


def _drivers(table: dict[str, tuple[tuple[str, ...], str]]) -> dict[str, dict[str, Any]]:
    return {k: {"fields": list(fields), "what": what} | (
        {"extra": dict(zip(("field", "value", "text"), DRIVER_EXTRAS[k], strict=True))} if k in DRIVER_EXTRAS else {})
        for k, (fields, what) in table.items()}


def pair_of(plans: Sequence[Detailed], text: str | None) -> tuple[int, int]:
    """``--compare``: two of ``#1``, ``#2`` ... (the best plans), ``front1`` ... (the front, fastest first) or
    ``mine`` (the ``--from`` config), comma-separated; default: the config against #1, else #1 against #2 (or the
    slowest plan of the front)."""
    from meshplan.errors import SpecError

    names = {}
    front = 0
    for d in plans:
        for part in d.origin.split(", "):
            if part == "front":
                front += 1
                names[f"front{front}"] = d.id
            names["mine" if part == "your config" else part] = d.id
    if text is None:
        first = names.get("mine", names.get("#1", 0))
        second = names.get("#1") if "mine" in names else names.get("#2", plans[-1].id if plans else 0)
        return first, second if second is not None else first
    picked = [t.strip() for t in text.split(",")]
    unknown = [t for t in picked if t not in names]
    if "mine" in unknown:
        raise SpecError(f"compare={text!r}: 'mine' is the plan of --from, which is not given")
    if len(picked) != 2 or unknown:
        shown = [n for n in names if not n.startswith("front")] + ["front1 … front" + str(front)] * (front > 0)
        raise SpecError(f"compare={text!r} must name two of {', '.join(shown)} (comma-separated)")
    return names[picked[0]], names[picked[1]]


def breakdown_pair_chart() -> dict[str, Any]:
    """Both plans' step time per component, side by side (data filled in by compare.js: component, plan, value)."""
    return spec(
        height=26 * len(COMPONENTS), title=["Step time by component", "A against B"], data={"name": "rows"},
        mark={"type": "bar"},
        encoding={"y": {"field": "component", "type": "nominal", "sort": list(COMPONENTS), "title": None},
                  "yOffset": {"field": "plan", "type": "nominal", "sort": ["A", "B"]},
                  "x": {"field": "value", "type": "quantitative", "title": "exposed time per step (s)"},
                  "color": {"field": "plan", "type": "nominal", "title": "plan",
                            "scale": {"domain": ["A", "B"], "range": ["#4C72B0", "#DD8452"]}},
                  "tooltip": [{"field": "plan"}, {"field": "component"}, {"field": "time"}]})


def memory_pair_chart() -> dict[str, Any]:
    """Both plans' memory per GPU per part, side by side, against the HBM capacity."""
    return spec(
        height=26 * len(MEMORY_COLORS), title="Memory per GPU by part: A against B", data={"name": "rows"},
        layer=[{"mark": {"type": "bar"},
                "encoding": {"y": {"field": "part", "type": "nominal", "sort": list(MEMORY_COLORS), "title": None},
                             "yOffset": {"field": "plan", "type": "nominal", "sort": ["A", "B"]},
                             "x": {"field": "value", "type": "quantitative", "title": "memory per GPU (GiB)"},
                             "color": {"field": "plan", "type": "nominal", "title": "plan",
                                       "scale": {"domain": ["A", "B"], "range": ["#4C72B0", "#DD8452"]}},
                             "tooltip": [{"field": "plan"}, {"field": "part"}, {"field": "gib", "title": "GiB"}]}}])


def timeline_template(slot: str) -> dict[str, Any]:
    """One plan's pipeline timeline (rows filled in by compare.js from detail.compact_timeline, or timeline.js)."""
    y = {"field": "rank", "type": "ordinal", "title": "pipeline rank"}
    return spec(
        height=120, title=f"Pipeline timeline of {slot}", data={"name": "rows"},
        layer=[{"mark": {"type": "bar", "stroke": "white", "strokeWidth": 0.3},
                "encoding": {"y": y, "x": {"field": "start", "type": "quantitative", "title": "time within the step"},
                             "x2": {"field": "end"},
                             "color": {"field": "kind", "type": "nominal", "title": None,
                                       "scale": {"domain": [*TIMELINE_COLORS, "busy (blocks merged)"],
                                                 "range": [*TIMELINE_COLORS.values(), "#7F9FD0"]}},
                             "tooltip": [{"field": "rank"}, {"field": "what"}]}},
               {"mark": {"type": "text", "fontSize": 9, "color": "white"},
                # every row (a merged timeline's have no label: an empty text draws nothing), so that the layer's
                # extent is never empty (Vega warned "Infinite extent for field mid")
                "transform": [{"calculate": "(datum.start + datum.end) / 2", "as": "mid"}],
                "encoding": {"y": y, "x": {"field": "mid", "type": "quantitative"}, "text": {"field": "label"}}}])
