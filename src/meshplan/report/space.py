"""The plan-space view: every feasible plan the search scored, as a sample of step time against memory per GPU, with
the Pareto front of time, memory and GPU count highlighted and the plans it rejected shaded by reason.

The points come from the search's own scoring (``search(..., explore=...)``: search/explore.py), the front's plans
re-estimated in float64 (detail.py); the fronts found at the report's other GPU counts (the scaling searches) join
them as diamonds. The page's script colours the sample by the axis chosen above the chart (space.js) and lets two
plans of the front be picked for the comparison below it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from meshplan.report.sections import Section
from meshplan.report.vega import spec
from meshplan.search.explore import LAYOUTS, SCHEDULES, STATUS
from meshplan.specs.refusals import stack_refusals
from meshplan.specs.stack import load_stack, stack_names
from meshplan.units import GiB, fmt_bytes

if TYPE_CHECKING:
    from meshplan.report.detail import Detailed
    from meshplan.search.explore import PlanSpace
    from meshplan.search.run import SearchResult

# the colour axes the page offers: column -> its title
_AXIS_TITLES = {"tp": "tensor parallel (tp; tp×tp2 on the 2D grid)", "pp": "pipeline parallel (pp)",
        "cp": "context parallel (cp)", "ep": "expert parallel (ep)", "zero": "ZeRO stage",
        "recompute": "activation recompute", "framework": "frameworks that run the plan", "offload": "offload"}
REGIONS = {"memory exceeds HBM": "#E8A0A0", "memory within the headroom": "#F3D9A4"}


def significant(values: np.ndarray) -> list[float]:
    """Four significant digits, as both reports' spaces send their figures to the page (a sample of thousands of
    points: the JSON stays small, the tooltips print at most four digits)."""
    return [float(f"{v:.4g}") for v in values.tolist()]


def columns(ps: PlanSpace, model: Any = None, space: Any = None) -> dict[str, Any]:  # lists, and the vocabularies
    """The sample's columns as the page reads them: times in seconds, memory in GiB (4 significant digits), and
    each categorical column as codes into ``vocab[column]`` (returned under ``"vocab"``)."""
    c = ps.columns
    tensor = np.array([f"{a}×{b}" if b > 1 else str(a) for a, b in zip(c["tp"].tolist(), c["tp2"].tolist(),
                                                                        strict=True)])
    recompute = np.array(ps.grid[0])[c["recompute"]]
    zero = np.array(ps.grid[1])[c["zero"]]
    opt, act = np.array(ps.grid[2])[c["offload_optimizer"]], np.array(ps.grid[3])[c["offload_activations"]]
    off = np.where(opt & act, "optimizer+activations", np.where(opt, "optimizer", np.where(act, "activations",
                                                                                             "none")))
    text = {"tp": tensor, "recompute": recompute, "zero": zero.astype(str), "offload": off,
            "framework": frameworks(c, (recompute, zero, opt, act), model, space),
            "status": np.array(STATUS)[c["status"]],
            "schedule": np.where(c["pp"] > 1, np.array(SCHEDULES)[c["schedule"]], "-"),
            "placement": np.array([",".join(p) for p in ps.placements])[c["placement"]]}
    out: dict[str, list[Any]] = {"time": significant(c["time"]), "memory": significant(c["memory"] / GiB)}
    for name in ("dp", "pp", "cp", "ep", "vpp", "micro_batch"):
        out[name] = c[name].tolist()
    vocab = {}
    for name, values in text.items():
        listed = values.tolist()  # a set of Python strings: numpy's sort of long strings took most of the time
        vocab[name] = _ordered(set(listed))
        index = {v: i for i, v in enumerate(vocab[name])}
        out[name] = [index[v] for v in listed]
    out["sp"] = c["sequence_parallel"].astype(int).tolist()
    return out | {"vocab": vocab}


def _ordered(values: Iterable[str]) -> list[str]:
    """Numbers in numeric order ("2×2" after "2", "16" after "8"), words as they are."""
    def key(v: str) -> tuple:
        head = v.split("×")[0]
        return (0, int(head), v) if head.isdigit() else (1, 0, v)
    return sorted((str(v) for v in values), key=key)


def frameworks(c: dict[str, np.ndarray], settings: tuple[np.ndarray, ...], model: Any = None,
               space: Any = None) -> np.ndarray:
    """Per sampled plan, the framework presets whose ``[supports]`` run it (specs/supports.py, as ``Supports.problems``
    judges one plan; with the ``model`` and the search's ``space``, none of the preset's refusals refusing it either),
    joined by commas; "none" for a plan only meshplan models (the 2D layout, for one). ``settings``: each plan's
    recompute, ZeRO stage, optimizer and activation offload."""
    recompute, zero, opt, act = settings
    names = [n for n in stack_names() if n not in ("any", "generic")]
    runs = []
    layout = np.array(LAYOUTS)[c["layout"]]
    schedule = np.array(SCHEDULES)[c["schedule"]]
    for name in names:
        stack = load_stack(name)
        s = stack.supports
        ok = np.isin(layout, s.layouts) & np.isin(zero.astype(int), s.zero) & np.isin(recompute, s.recompute)
        for axis in ("tp", "pp", "cp", "ep"):
            ok &= (c[axis] <= 1) | (axis in s.axes)
        ok &= (c["pp"] <= 1) | np.isin(schedule, s.schedules)
        ok &= (s.sequence_parallel | ~c["sequence_parallel"]) & (s.offload_optimizer | ~opt)
        ok &= (s.offload_activations | ~act) & (s.uneven_stages | (c["last_stage_layers"] == 0))
        modules = space.recompute_modules if space is not None else ("core_attn",)  # the space's, else Plan's
        if not s.runs_modules(modules):  # its selective recompute is another
            ok &= recompute != "selective"
        if model is not None and space is not None:
            view = _Sampled(c, recompute, zero.astype(int), opt, act, space)
            for rule in stack_refusals(stack):
                ok &= ~np.broadcast_to(np.asarray(rule.test(view, model, stack), dtype=bool), ok.shape)
        runs.append(ok)
    table = np.array(runs).T if runs else np.zeros((len(zero), 0), dtype=bool)
    # each plan's frameworks as the bits of one integer: the few distinct sets are named once each
    distinct, inverse = np.unique(table.astype(np.int64) @ (1 << np.arange(len(names), dtype=np.int64)),
                                  return_inverse=True)
    named = [", ".join(n for j, n in enumerate(names) if code >> j & 1) or "none" for code in distinct.tolist()]
    return np.array(named)[inverse] if named else np.array([])


class _Sampled:
    """The sampled plans as a refusal's test reads them (specs/refusals.py): their columns, their settings, and the
    fields every plan of the search's space shares."""

    def __init__(self, c: dict[str, np.ndarray], recompute: np.ndarray, zero: np.ndarray, opt: np.ndarray,
                 act: np.ndarray, space: Any) -> None:
        self.__dict__.update({k: c[k] for k in ("dp", "tp", "pp", "cp", "ep", "etp", "vpp", "last_stage_layers",
                                                "sequence_parallel")})
        self.recompute, self.zero, self.offload_optimizer, self.offload_activations = recompute, zero, opt, act
        self.optimizer, self.offload_layers = space.optimizer, space.offload_layers
        self.precision, self.grad_bytes = space.precision, space.grad_bytes


def space_section(result: SearchResult, plans: Sequence[Detailed], others: Sequence[dict[str, Any]]) -> Section:
    """The plan-space section: the chart (on a canvas: thousands of points), the colour-axis control, the counts."""
    ps = result.explored
    assert ps is not None  # drawn only for a search that explored (html.py)
    hbm = result.cluster.accelerator.hbm_bytes
    usable = hbm * (1 - result.space.headroom)
    cols = columns(ps, result.model, result.space)
    fitting = sum(1 for s in cols["status"] if cols["vocab"]["status"][s] == "fits")
    front = sum(1 for d in plans if "front" in d.origin)
    context = {"axes": _AXIS_TITLES, "shown": len(ps), "fitting": fitting, "drawn": ps.drawn, "front": front,
               "evaluated": result.evaluated, "others": sorted({o["gpus"] for o in others}),
               "hbm": fmt_bytes(hbm), "usable": fmt_bytes(usable),
               "data": {"space": {"columns": cols, "others": list(others), "axes": _AXIS_TITLES,
                                  "regions": regions(hbm, usable, cols), "gpus": result.cluster.num_gpus}}}
    return Section("space", "Plan space", "sections/space.html.j2", context, {"space": space_chart()},
                   {"space": "canvas"})


def regions(hbm: float, usable: float, cols: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The shaded bands of memory per GPU where plans are rejected, each with its reason."""
    top = max(cols["memory"] + [hbm / GiB]) * 1.5
    out = [{"reason": "memory exceeds HBM", "y": hbm / GiB, "y2": top}]
    if usable < hbm:
        out.append({"reason": "memory within the headroom", "y": usable / GiB, "y2": hbm / GiB})
    return out


def space_chart() -> dict[str, Any]:
    """The scatter's spec; its data sets (``points``, ``regions``, ``plans``, ``others``, ``picked``) and the colour
    field the page's script fills in (space.js)."""
    x = {"field": "time", "type": "quantitative", "scale": {"type": "log"},
         "title": "step time (s, log scale)"}
    y = {"field": "memory", "type": "quantitative", "scale": {"type": "log"},
         "title": "memory per GPU (GiB, log scale)"}
    tip = [{"field": "plan"}, {"field": "step"}, {"field": "memory", "title": "memory (GiB)", "format": ".4~r"},
           {"field": "status", "title": "verdict"}, {"field": "framework"}]
    return spec(
        height=460, title="Every plan the search scored: step time against memory per GPU",
        layer=[
            {"name": "regions", "data": {"name": "regions"}, "mark": {"type": "rect", "opacity": 0.35},
             "encoding": {"y": {"field": "y", "type": "quantitative"}, "y2": {"field": "y2"},
                          "fill": {"field": "reason", "type": "nominal", "title": "rejected",
                                   "scale": {"domain": list(REGIONS), "range": list(REGIONS.values())}},
                          "tooltip": [{"field": "reason", "title": "rejected"}]}},
            {"name": "rejected", "data": {"name": "rejected"}, "mark": {"type": "point", "shape": "cross",
                                                                        "size": 16, "color": "#999", "opacity": 0.5},
             "encoding": {"x": x, "y": y, "tooltip": tip}},
            {"name": "sample", "data": {"name": "points"}, "mark": {"type": "circle", "size": 14, "opacity": 0.55},
             "params": [{"name": "zoom", "select": "interval", "bind": "scales"}],
             "encoding": {"x": x, "y": y, "color": {"field": "tp", "type": "ordinal"}, "tooltip": tip}},
            {"name": "others", "data": {"name": "others"},
             "mark": {"type": "point", "shape": "diamond", "size": 70, "filled": True, "color": "#8172B3",
                      "stroke": "#333", "strokeWidth": 0.6, "opacity": 0.8},
             "encoding": {"x": x, "y": y, "tooltip": [{"field": "plan"}, {"field": "gpus", "title": "GPUs"},
                                                     {"field": "step"},
                                                     {"field": "memory", "title": "memory (GiB)", "format": ".4~r"},
                                                     {"field": "front3d", "title": "on the 3D front"}]}},
            {"name": "front", "data": {"name": "plans"}, "transform": [{"filter": "datum.on2d"}],
             "mark": {"type": "line", "interpolate": "step-after", "color": "#222", "strokeWidth": 1.2}, "encoding": {
                 "x": x, "y": y, "order": {"field": "time"}}},
            {"name": "plans", "data": {"name": "plans"},
             "mark": {"type": "point", "filled": True, "stroke": "#111", "cursor": "pointer"},
             "encoding": {"x": x, "y": y, "shape": {"field": "kind", "type": "nominal", "title": "held in full",
                                                    "scale": {"domain": ["best plan", "Pareto front", "your config"],
                                                              "range": ["diamond", "circle", "square"]}},
                          "size": {"condition": {"test": "datum.front3d", "value": 140}, "value": 70},
                          "strokeWidth": {"condition": {"test": "datum.front3d", "value": 2.2}, "value": 0.8},
                          "color": {"field": "tp", "type": "ordinal"},
                          "tooltip": tip + [{"field": "origin"}, {"field": "front3d",
                                                                  "title": "on the front of time, memory, GPUs"},
                                            {"field": "hint"}]}},
            *({"name": f"picked-{slot}", "data": {"name": "picked"},
               "transform": [{"filter": f"datum.slot == '{slot}'"}],
               "mark": {"type": "text", "fontSize": 15, "fontWeight": 700, "dx": dx, "dy": -11, "color": "#C44E52"},
               "encoding": {"x": x, "y": y, "text": {"field": "slot"}}} for slot, dx in (("A", -12), ("B", 12))),
        ])
