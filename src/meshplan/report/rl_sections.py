"""The RL report's own sections (rl_html.py puts them on the shared page):

- the iteration's timeline by phase and GPU pool, the best plan of each set-up on one time axis (colocated and split
  side by side: each row a pool, each bar a phase), with the phases' table (ranked_rl.phase_rows);
- the rollout's tail: the running sequences of the best synchronous plan's first engine instance over the rollout
  (the batch thinning as responses end, the longest ending the phase);
- memory per GPU by phase and pool against HBM, each bar stacked by part, with the table (ranked_rl.memory_rows).
Numbers come from rl/; nothing here computes a cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshplan.report.charts import palette, time_unit
from meshplan.report.ranked_rl import PHASE_NAMES, POOL_NAMES, memory_rows, phase_rows, pools_text
from meshplan.report.sections import Section
from meshplan.report.vega import spec
from meshplan.units import GiB, fmt_bytes, fmt_time

if TYPE_CHECKING:
    from meshplan.rl.estimate import RLEstimate

PHASE_ORDER = list(PHASE_NAMES.values())


def lane(name: str, e: RLEstimate, pool: str) -> str:
    """A timeline row: the set-up, its GPUs and the pool ("split 8R+8T · rollout pool")."""
    return f"{name} {pools_text(e)} · {POOL_NAMES[pool]}"


def rl_timeline_rows(best: dict[str, RLEstimate]) -> tuple[list[dict[str, Any]], list[str], str]:
    """One row per phase segment of each set-up's best plan (times in the chart's unit), the lanes in order, the
    unit."""
    longest = max((e.iteration_time for e in best.values()), default=0.0)
    unit, scale = time_unit(longest)
    rows, lanes = [], []
    for name, e in best.items():
        for pool in ("all", "rollout", "train"):
            mine = [s for s in e.segments if s.pool == pool]
            if not mine:
                continue
            row = lane(name, e, pool)
            lanes.append(row)
            rows += [{"lane": row, "phase": PHASE_NAMES[s.phase], "start": s.start * scale, "end": s.end * scale,
                      "seconds": fmt_time(s.seconds), "order": PHASE_ORDER.index(PHASE_NAMES[s.phase])}
                     for s in mine]
    return rows, lanes, unit


def rl_timeline_chart(best: dict[str, RLEstimate]) -> dict[str, Any]:
    rows, lanes, unit = rl_timeline_rows(best)
    shown = [p for p in PHASE_ORDER if any(r["phase"] == p for r in rows)]
    y = {"field": "lane", "type": "nominal", "sort": lanes, "title": None, "axis": {"labelLimit": 320}}
    return spec(height=max(80, 34 * len(lanes)), title="One iteration of the best plan of each set-up, by GPU pool",
                data={"values": rows},
                mark={"type": "bar", "stroke": "white", "strokeWidth": 0.5, "height": {"band": 0.7}},
                encoding={"y": y, "x": {"field": "start", "type": "quantitative", "title": f"time in the iteration "
                                                                                          f"({unit})"},
                          "x2": {"field": "end"},
                          "color": {"field": "phase", "type": "nominal", "title": None, "scale": palette(shown),
                                    "legend": {"columns": 4}},
                          "tooltip": [{"field": "lane", "title": "pool"}, {"field": "phase"},
                                      {"field": "seconds", "title": "time"}]})


def tail_chart(e: RLEstimate) -> dict[str, Any] | None:
    """The running sequences of the first instance over the rollout (rollout.Rollout.running), None without them."""
    run = e.rollout.running
    if not run.get("start_s"):
        return None
    values = [{"t": t, "running": r} for t, r in zip(run["start_s"], run["running"], strict=True)]
    return spec(height=180, title=f"The rollout's tail ({e.plan.setup}): sequences running on one engine instance",
                data={"values": values}, mark={"type": "area", "line": True, "opacity": 0.6, "interpolate": "step"},
                encoding={"x": {"field": "t", "type": "quantitative", "title": "time in the rollout (s)"},
                          "y": {"field": "running", "type": "quantitative", "title": "running sequences"},
                          "tooltip": [{"field": "t", "format": ".1f", "title": "s"}, {"field": "running"}]})


def rl_timeline_section(best: dict[str, RLEstimate]) -> Section:
    synchronous = [e for e in best.values() if e.rollout.running]
    charts = {"rl-timeline": rl_timeline_chart(best)}
    tail = tail_chart(synchronous[0]) if synchronous else None
    if tail:
        charts["rl-tail"] = tail
    note = ("A colocated plan runs every phase on every GPU in turn; split pools overlap the rollout of the next step "
            "with the trainer's phases, then both hold for the weight transfer. The tail: a synchronous rollout lasts "
            "until its longest response ends, the engine's batch thinning as the others finish.")
    return Section("rl-timeline", "Timeline", "sections/rl_timeline.html.j2",
                   {"header": ["phase", *(f"{n} ({pools_text(e)})" for n, e in best.items())],
                    "rows": phase_rows(best), "note": note, "tail": bool(tail)}, charts)


def rl_memory_chart(best: dict[str, RLEstimate]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    bars: list[str] = []
    for name, e in best.items():
        for m in e.memory:
            bar = f"{name} · {PHASE_NAMES[m.phase]} · {POOL_NAMES[m.pool]}"
            bars.append(bar)
            rows += [{"bar": bar, "part": part, "GiB": size / GiB, "size": fmt_bytes(size)}
                     for part, size in m.parts.items() if size > 0]
    parts = sorted({str(r["part"]) for r in rows})
    hbm = next(iter(best.values())).cluster.accelerator.hbm_bytes / GiB
    y = {"field": "bar", "type": "nominal", "sort": bars, "title": None, "axis": {"labelLimit": 360}}
    return spec(height=max(80, 22 * len(bars)), title="Memory per GPU by phase and pool against HBM",
                layer=[{"data": {"values": rows}, "mark": {"type": "bar", "height": {"band": 0.75}},
                        "encoding": {"y": y, "x": {"field": "GiB", "type": "quantitative", "stack": "zero",
                                                   "title": "GiB per GPU"},
                                     "color": {"field": "part", "type": "nominal", "title": None,
                                               "scale": palette(parts), "legend": {"columns": 3}},
                                     "tooltip": [{"field": "bar", "title": "phase"}, {"field": "part"},
                                                 {"field": "size"}]}},
                       {"data": {"values": [{"hbm": hbm}]}, "mark": {"type": "rule", "color": "#C44E52",
                                                                      "strokeDash": [4, 3]},
                        "encoding": {"x": {"field": "hbm", "type": "quantitative"}}}])


def rl_memory_section(best: dict[str, RLEstimate]) -> Section:
    hbm = fmt_bytes(next(iter(best.values())).cluster.accelerator.hbm_bytes)
    note = (f"The dashed line is the GPU's {hbm}. Colocated, the engine sleeps while the trainer works (its weights "
            "and KV cache freed) and the trainer's offloaded state waits on the host while the engine generates.")
    return Section("rl-memory", "Memory", "sections/rl_memory.html.j2",
                   {"header": ["phase", *(f"{n} ({pools_text(e)})" for n, e in best.items())],
                    "rows": memory_rows(best), "note": note}, {"rl-memory": rl_memory_chart(best)})
