"""The plans the report holds in full, for the plan space, the comparison and the trust panel: the best plans, the
Pareto front of step time and memory the search found (re-estimated in float64), and the user's own plan (``--from``),
each with its breakdown, memory and simulated pipeline timeline as the page's script reads them.

A timeline of every block can be long (2·m·v·p blocks: 5,120 for 64 micro-batches on 4 ranks with 10 chunks), so the
plans past ``BLOCKS`` blocks in all keep their ranks' busy and idle intervals only (``compact_timeline``'s ``merged``:
the idle intervals a chart 1,000 pixels wide shows), which is what a side-by-side comparison of bubbles needs. Those of
a ``tables.build`` table the page simulates itself when it first shows them (``replay_inputs``, templates/timeline.js:
the same numbers), so that writing the report does not replay every plan's every action (issue 48).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from meshplan.estimate import COMPONENTS, Estimate, estimate
from meshplan.pipeline.registry import schedule_of
from meshplan.report.charts import time_unit
from meshplan.report.plots import pipeline_run, pipeline_times, short_label
from meshplan.report.split_runs import PipelineRun
from meshplan.report.tiers import tier_axes, tier_headers
from meshplan.units import GiB, fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from meshplan.search.run import SearchResult

BLOCKS = 12_000  # timeline rows the page keeps in all (about 25 bytes each); past them, busy and idle intervals
MERGED_PIXELS = 500  # a merged timeline keeps the idle intervals of at least 1/500 of the step


@dataclass(frozen=True)
class Detailed:
    """One plan the report holds in full: ``origin`` says why (``#2``, ``front``, ``your config``, or several)."""

    id: int
    origin: str
    est: Estimate
    on_front: bool = False  # on the Pareto front of step time, memory and GPU count


def detailed_plans(result: SearchResult, top: int, mine: Estimate | None = None) -> list[Detailed]:
    """The best ``top`` plans, then the front's other plans (fastest first), then ``mine``; one entry per plan."""
    plans: list[tuple[str, Estimate]] = [(f"#{i}", e) for i, e in enumerate(result.plans[:top], 1)]
    if result.explored is not None:
        known = {e.plan: i for i, (_, e) in enumerate(plans)}
        for _, _, plan in result.explored.front:
            if plan in known:
                origin, est = plans[known[plan]]
                plans[known[plan]] = (f"{origin}, front", est)
            else:
                plans.append(("front", estimate(result.model, result.cluster, plan, result.space.stack)))
    if mine is not None:
        plans.append(("your config", mine))
    return [Detailed(i, origin, est) for i, (origin, est) in enumerate(plans)]


def with_front(plans: list[Detailed], others: Sequence[tuple[float, float, int]]) -> list[Detailed]:
    """Mark the plans on the Pareto front of (step time, memory per GPU, GPU count), among these plans that fit (the
    user's config aside) and the fronts found at the other GPU counts (``others``: time, memory, GPUs)."""
    held = [d.est.fits and d.origin != "your config" for d in plans]
    mine = [(d.est.step_time, d.est.peak_memory, d.est.cluster.num_gpus) for d in plans]
    beaten = dominated(mine, [p for p, ok in zip(mine, held, strict=True) if ok] + list(others))
    return [Detailed(d.id, d.origin, d.est, ok and not out) for d, ok, out in zip(plans, held, beaten, strict=True)]


def dominated(ps: Sequence[tuple[float, ...]], points: Sequence[tuple[float, ...]]) -> list[bool]:
    """Per point of ``ps``, whether a point of ``points`` is no worse in every coordinate and better in one: all
    pairs at once, on arrays (the plan space's hundreds of front points against each other took a tenth of a
    second as tuples); exact, a comparison of the same float64 values."""
    if not ps or not points:
        return [False] * len(ps)
    p, q = np.asarray(ps, dtype=np.float64)[:, None, :], np.asarray(points, dtype=np.float64)[None, :, :]
    return ((q <= p).all(axis=2) & (q != p).any(axis=2)).any(axis=1).tolist()


def _plan_fields(est: Estimate) -> dict[str, Any]:
    """The plan's fields as the page shows and compares them."""
    p = est.plan
    return {"dp": p.dp, "tp": f"{p.tp}×{p.tp2}" if p.tp2 > 1 else p.tp, "pp": p.pp, "cp": p.cp, "ep": p.ep,
            "etp": p.etp, "vpp": p.vpp, "micro-batch": p.micro_batch, "micro-batches": p.grad_accum, "ZeRO": p.zero,
            "recompute": p.recompute, "sp": "on" if p.sequence_parallel else "off",
            "schedule": p.schedule if p.pp > 1 else "-", "offload": _offloads(p),
            **dict(zip(tier_headers(est.cluster), tier_axes(est), strict=True)), "framework": est.stack.name}


def _offloads(plan: Any) -> str:
    return "+".join(k for k, on in (("optimizer", plan.offload_optimizer), ("activations", plan.offload_activations))
                    if on) or "none"


def page_data(plans: Sequence[Detailed], hbm: float, first: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Each plan as the page's script reads it: figures, breakdown and memory (seconds, GiB), fields, timeline; the
    plans ``first`` (ids: the pair the comparison opens on) are the first to get their timeline's every block."""
    budget, out = BLOCKS, []
    for d in sorted(plans, key=lambda d: (d.id not in first, d.id)):
        e = d.est
        timeline = _timeline(e, budget)
        budget -= 0 if timeline["merged"] else len(timeline["rows"])
        out.append({
            "id": d.id, "origin": d.origin, "label": f"{d.origin}: {short_label(e)}", "describe": e.plan.describe(),
            "time": e.step_time, "memory": e.peak_memory / GiB, "gpus": e.cluster.num_gpus, "front": d.on_front,
            "fits": e.fits, "reasons": list(e.reasons), "step": fmt_time(e.step_time), "mfu": e.mfu,
            "tokens": fmt_count(e.tokens_per_s), "peak": fmt_bytes(e.peak_memory), "band": e.error_band,
            "hbm": hbm / GiB, "fields": _plan_fields(e),
            "breakdown": {c: e.breakdown.get(c, 0.0) for c in COMPONENTS},
            "parts": {k: v / GiB for k, v in e.memory.items()}, "timeline": timeline})
    return out


def _timeline(est: Estimate, budget: int) -> dict[str, Any]:
    """The plan's timeline with every block when the actions alone fit ``budget`` and the gaps do not push it over,
    else merged; a merged one of a ``tables.build`` table is left to the page's script (``replay_inputs``)."""
    schedule, vpp, t_f, t_b = pipeline_times(est)
    p, m = est.plan.pp, est.plan.grad_accum
    if schedule_of(schedule).warmup and 2 * m * vpp * p > budget:  # build's table: one F and one B per (j, c)
        return replay_inputs(schedule, p, m, vpp, (t_f, t_b))
    run = pipeline_run(est)
    timeline = compact_timeline(run, merged=sum(map(len, run.table)) > budget)
    if not timeline["merged"] and len(timeline["rows"]) > budget:
        timeline = compact_timeline(run, merged=True)
    return timeline


def replay_inputs(schedule: str, pp: int, m: int, vpp: int, times: tuple[Sequence[float], Sequence[float]]
                  ) -> dict[str, Any]:
    """A merged timeline the page computes when it shows it (templates/timeline.js: ``tables.build``,
    ``simulator.simulate`` and ``compact_timeline(merged=True)`` in the same floating-point operations): its shape
    and per-rank forward and backward times per micro-batch and chunk; the page adds unit, step, bubble and rows.
    Simulating every long timeline here took most of ``meshplan report``'s time (issue 48: 1.5 M actions at 256
    GPUs). ``group`` and ``warmup``: the table's N and each rank's warm-up, its schedule's record's
    (tables.warm_ups), so that the page's script knows no schedule by name."""
    from meshplan.pipeline.tables import warm_ups
    n, warmup = warm_ups(schedule, pp, m, vpp)
    return {"pp": pp, "merged": True, "schedule": schedule, "micro_batches": m, "vpp": vpp,
            "replay": {"t_fwd": list(times[0]), "t_bwd": list(times[1]), "pixels": MERGED_PIXELS, "group": n,
                       "warmup": list(warmup)}}


def compact_timeline(run: PipelineRun, merged: bool) -> dict[str, Any]:
    """The simulated schedule as [rank, start, end, kind (0 forward, 1 backward, 2 idle, 3 busy), label] rows in
    the chart's unit, 4 significant digits; ``merged``: each rank's busy and idle intervals only."""
    tl = run.timeline
    unit, scale = time_unit(tl.step_time)
    rows: list[list[Any]] = []
    idle = run.idle()
    for r, (row, starts, ends) in enumerate(zip(run.table, tl.starts, tl.ends, strict=True)):
        gaps = idle[r]
        if merged:  # the idle intervals a 1000-pixel chart shows (2 pixels or more), busy time between them
            gaps = [(s, w) for s, w in gaps if w >= tl.step_time / MERGED_PIXELS]
            t = 0.0
            for s, w in gaps + [(tl.step_time, 0.0)]:
                if s > t:
                    rows.append([r, _g(t * scale), _g(s * scale), 3, ""])
                t = s + w
        else:
            for action, s, e in zip(row, starts, ends, strict=True):
                label = str(action.micro) if run.vpp == 1 else f"{action.micro}.{action.chunk}"
                rows.append([r, _g(s * scale), _g(e * scale), 0 if action.kind == "F" else 1, label])
        rows += [[r, _g(s * scale), _g((s + w) * scale), 2, ""] for s, w in gaps]
    return {"pp": run.pp, "unit": unit, "step": _g(tl.step_time * scale), "merged": merged, "rows": rows,
            "schedule": run.schedule, "bubble": tl.idle_fraction, "micro_batches": run.micro_batches,
            "vpp": run.vpp}


def _g(x: float) -> float:
    return float(f"{x:.4g}")
