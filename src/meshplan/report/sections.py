"""The report's sections: each a ``Section`` (its anchor, its name in the navigation, its template under
report/templates/sections and the values the template reads) with the charts it draws. html.py puts them in order;
another page (a serving report) adds its own by writing a template and a function that returns a Section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from meshplan.estimate import op_totals
from meshplan.report import charts
from meshplan.report.plots import pipeline_run, short_label
from meshplan.units import fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from meshplan.estimate import Estimate
    from meshplan.report.fold import Listing
    from meshplan.report.ranked import Ranked


@dataclass(frozen=True)
class Section:
    """One section of the page: ``template`` (under report/templates) reads ``context`` as ``ctx``; ``charts``:
    the Vega-Lite specs it draws by key (a ``chart(key)`` in the template), ``renderers`` any that draw on a canvas."""

    key: str
    title: str
    template: str
    context: dict[str, Any] = field(default_factory=dict)
    charts: dict[str, dict[str, Any]] = field(default_factory=dict)
    renderers: dict[str, str] = field(default_factory=dict)


def ranks(names: Sequence[str]) -> list[str]:
    """``#1 name``: each of the best rows' names after its rank, as the charts of both reports label their bars."""
    return [f"#{i} {n}" for i, n in enumerate(names, 1)]


def labels(plans: Sequence[Estimate]) -> list[str]:
    """``#1 dp4 tp2 pp8 cp4 · mb1 z1``: the rank and the short label of each plan."""
    return ranks([short_label(e) for e in plans])


def listing_context(listing: Listing) -> dict[str, Any]:
    """A listing (fold.Listing) as a table's template reads it: the header, each header's meaning (its tooltip),
    the rows and which columns align left or wrap."""
    cols = (listing.key, *listing.columns)
    return {"header": [c.header for c in cols], "titles": [c.meaning for c in cols],
            "rows": [list(row) for row in zip(*(c.cells for c in cols), strict=True)],
            "left": [i for i, c in enumerate(cols) if c.justify == "left"], "wrap": [i for i, c in enumerate(cols)
                                                                                 if c.wrap]}


def plans_section(ranked: Ranked) -> Section:
    """The best plans or configurations as the terminal lists them (ranked.Ranked), each header explained in its
    tooltip, and how they are ranked."""
    return Section("plans", f"Best {ranked.noun}", "sections/plans.html.j2", listing_context(ranked.table) | {
        "noun": ranked.noun, "note": ranked.ranking, "empty": ranked.empty})


def time_section(plans: Sequence[Estimate]) -> Section:
    best, names = plans[0], labels(plans)
    table = [[k, fmt_time(v), f"{v / best.step_time:.1%}"] for k, v in best.breakdown.items() if v > 0]
    table.append(["step", fmt_time(best.step_time), "100%"])
    found = {"breakdown": charts.breakdown_chart(plans, names)}
    delta = charts.delta_chart(plans, names)
    if delta:
        found["delta"] = delta
    return Section("time", "Step time", "sections/time.html.j2",
                   {"n": len(plans), "table": table, "delta": delta is not None}, found)


def share_rows(parts: Mapping[str, float], cap: float) -> list[list[str]]:
    """(part, bytes, share of ``cap``) of each part: the memory tables of both reports."""
    return [[k, fmt_bytes(v), f"{v / cap:.1%}"] for k, v in parts.items()]


def memory_section(plans: Sequence[Estimate], headroom: float) -> Section:
    best = plans[0]
    cap = best.cluster.accelerator.hbm_bytes
    table = share_rows({k: v for k, v in best.memory.items() if v > 0} | {"peak": best.peak_memory}, cap)
    caption = f"Memory per GPU of the {len(plans)} best plans against {fmt_bytes(cap)} of HBM"
    return Section("memory", "Memory", "sections/memory.html.j2", {"chart": "memory", "caption": caption, "note": "",
                                                                    "table": table},
                   {"memory": charts.memory_chart(plans, labels(plans), headroom)})


def pipeline_section(best: Estimate) -> Section:
    run = pipeline_run(best)
    caption = (f"{run.schedule} schedule of plan #1 simulated per rank: pp={run.pp}, vpp={run.vpp}, "
               f"{run.micro_batches} micro-batches, bubble {run.timeline.idle_fraction:.1%}")
    note = (f"Per micro-batch and model chunk: forward {per_rank(run.t_fwd)}, backward {per_rank(run.t_bwd)} (exposed "
            "communication included), from the estimate; the schedule simulator places them under the pipeline's "
            "dependencies.")
    title = f"Pipeline timeline of plan #1 ({run.schedule}, bubble {run.timeline.idle_fraction:.1%})"
    return Section("pipeline", "Pipeline", "sections/pipeline.html.j2",
                   {"caption": caption, "note": note, "flat": best.plan.pp == 1},
                   {"timeline": charts.timeline_chart(run, title)})


def roofline_section(best: Estimate, top: int = 12) -> Section:
    tagged = charts.tagged_ops(best)
    header = ["#", "op", "FLOP", "bytes (HBM or sent)", "FLOP/byte", "time per step", "share", "bound"]
    rows = [[tagged.index(o.name) + 1 if o.name in tagged else "", o.name, _fmt_flop(o.flops), fmt_bytes(o.nbytes),
             f"{o.flops / o.nbytes:.1f}" if o.nbytes and o.flops else "-", fmt_time(o.seconds), f"{o.share:.1%}",
             o.bound] for o in op_totals(best)[:top]]
    return Section("roofline", "Roofline", "sections/roofline.html.j2", {"header": header, "rows": rows},
                   {"roofline": charts.roofline_chart(best)})


def scaling_section(scaling_rows: Sequence[dict[str, Any]]) -> Section:
    """Strong scaling: throughput and MFU against the GPU count (with more than one count) and the table."""
    rows = [r for r in scaling_rows if (r.get("param") or "none") == "none"]
    found = {}
    if len({r["gpus"] for r in rows if r.get("feasible")}) > 1:
        found["scaling-throughput"], found["scaling-mfu"] = charts.scaling_charts(rows)
    table = []
    for r in sorted(rows, key=lambda r: (str(r["system"]), r["nvlink_domain"], r["gpus"])):
        head = [r["system"], r["nvlink_domain"], r["gpus"]]
        table.append(head + (["no feasible plan", "", "", "", ""] if not r.get("feasible") else [
            r["plan"], fmt_time(r["step_time_s"]), fmt_count(r["tokens_per_s"]), f"{r['mfu']:.1%}",
            fmt_bytes(r["peak_memory_bytes"])]))
    return Section("scaling", "Scaling", "sections/scaling.html.j2", {"rows": table, "charts": bool(found)}, found)


def rejected_section(ranked: Ranked) -> Section:
    """What the search rejected, by reason, with an example of each."""
    return Section("rejected", "Rejected", "sections/rejected.html.j2", listing_context(ranked.rejected) | {
        "total": f"{ranked.rejected_total:,}", "noun": ranked.noun})


def per_rank(times: tuple[float, ...]) -> str:
    """One time, or the first, middle and last ranks' when they differ (embedding, LM head)."""
    if len(set(times)) == 1:
        return fmt_time(times[0])
    middle = f"{fmt_time(times[1])} middle ranks, " if len(times) > 2 else ""
    return f"{fmt_time(times[0])} first rank, {middle}{fmt_time(times[-1])} last rank"


def _fmt_flop(n: float) -> str:
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g}" if n else "-"
