"""One self-contained HTML report of a search: it opens offline, from a file, with nothing else.

The page is assembled from Jinja2 templates (report/templates: ``report.html.j2``, one template per section under
``sections/``, autoescaped) and draws its charts with Vega-Lite: the specs travel in the page as JSON, the runtime
(Vega, Vega-Lite and vega-embed, about 0.9 MB) is inlined as a script (vega.py), and the page's own script
(templates/*.js) embeds them. No ``src`` or ``href`` points outside the file, no web font is used: a report weighs
about 1–3 MB and can be mailed.

Sections, one template each: summary, best plans (sections.py), the plan space (space.py), the comparison of two
plans and the trust panel (compare.py, trust.py), step-time breakdown and the difference from the best plan, memory
per GPU vs HBM, pipeline timeline, per-op roofline, strong scaling (from sweep rows), rejected plans (sections.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshplan.files import write_text
from meshplan.report import sections as S
from meshplan.report.compare import compare_section, pair_of, trust_section
from meshplan.report.detail import detailed_plans, dominated, with_front
from meshplan.report.page import Lead, render_page
from meshplan.report.space import space_section
from meshplan.report.text import mesh_text
from meshplan.units import GiB, fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from meshplan.estimate import Estimate
    from meshplan.search.run import SearchResult

SCRIPTS = ("space.js", "compare.js")  # the page's own scripts after report.js, in order (templates/)


def render(result: SearchResult, scaling_rows: Sequence[dict[str, Any]] | None = None, top: int = 5,
           mine: Estimate | None = None, compare: str | None = None) -> str:
    """The report of one search (and, optionally, strong-scaling sweep rows, whose ``front`` the plan space shows):
    with ``result.explored`` the plan space; with the user's own plan ``mine`` (``--from``) that plan beside the
    search's; ``compare``: the pair the comparison opens on (compare.pair_of)."""
    plans = list(result.plans[:top])
    held = detailed_plans(result, top, mine) if plans or mine else []
    others = _other_fronts(result, scaling_rows or [])
    held = with_front(held, [(o["time"], o["memory"] * GiB, o["gpus"]) for o in others])
    points = [(d.est.step_time, d.est.peak_memory, d.est.cluster.num_gpus) for d in held if d.on_front]
    others = [o | {"front3d": not dominated((o["time"], o["memory"] * GiB, o["gpus"]), points
                                            + [(x["time"], x["memory"] * GiB, x["gpus"]) for x in others])}
              for o in others]
    sections = [S.plans_section(plans)]
    if result.explored is not None and len(result.explored):
        sections.append(space_section(result, held, others))
    if held:
        pair = pair_of(held, compare)
        sections.append(compare_section(held, pair, result.cluster.accelerator.hbm_bytes))
        sections.append(trust_section(held, result.space.headroom, pair[0]))
    if plans:
        sections += [S.time_section(plans), S.memory_section(plans, result.space.headroom),
                     S.pipeline_section(plans[0]), S.roofline_section(plans[0])]
    if scaling_rows:
        sections.append(S.scaling_section(scaling_rows))
    sections.append(S.rejected_section(result))
    return page(result, sections)


def _other_fronts(result: SearchResult, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Pareto fronts the scaling searches found at the other GPU counts, as the plan space shows them."""
    n = result.cluster.num_gpus
    return [{"time": t, "memory": m / GiB, "gpus": r["gpus"], "plan": plan.describe()}
            for r in rows if r.get("gpus") != n for t, m, plan in r.get("front", ())]


def page(result: SearchResult, sections: Sequence[S.Section]) -> str:
    """The page of ``sections`` about ``result``'s search (page.render_page: the shared skeleton)."""
    from meshplan import __version__

    model, cluster = result.model, result.cluster
    footer = (f"meshplan {__version__}: analytic estimate (roofline per op, α-β collectives, pipeline schedule "
              f"simulation); search took {result.seconds:.2f} s.")
    return render_page(f"{model.name} on {cluster.num_gpus} × {cluster.accelerator.name}",
                       _lead(result, list(result.plans[:1])), sections, footer, SCRIPTS)


def _lead(result: SearchResult, plans: list[Estimate]) -> Lead:
    """One line on the model and the search, and the best plan's figures as cards."""
    model, cluster = result.model, result.cluster
    acc, mesh = cluster.accelerator, mesh_text(cluster, " × ")
    text = (f"{fmt_count(model.params())} parameters, sequence {model.seq_length}, global batch "
            f"{result.space.global_batch} sequences ({fmt_count(result.space.global_batch * model.seq_length)} "
            f"tokens); mesh {mesh} (NVLink domain {cluster.nvlink_domain}); {result.evaluated:,} plans evaluated, "
            f"{result.feasible:,} fit in {fmt_bytes(acc.hbm_bytes)} HBM.")
    heading = f"meshplan report: {model.name} on {cluster.num_gpus} × {acc.name}"
    if not plans:
        return Lead(heading=heading, text=text)
    best = plans[0]
    cards = [("step time", f"{fmt_time(best.step_time)} ± {best.error_band:.0%}"),
             ("tokens/s", fmt_count(best.tokens_per_s)), ("MFU", f"{best.mfu:.1%}"),
             ("model TFLOP/s per GPU", f"{best.tflops_per_gpu:.0f}"),
             ("memory per GPU", f"{fmt_bytes(best.peak_memory)} / {fmt_bytes(acc.hbm_bytes)}")]
    return Lead(heading=heading, text=text, cards=cards, best=best.plan.describe(),
                best_note=f"schedule {best.plan.schedule}, precision {best.plan.precision}")


def write(path: str | Path, result: SearchResult, scaling_rows: Sequence[dict[str, Any]] | None = None,
          top: int = 5, mine: Estimate | None = None, compare: str | None = None) -> Path:
    """Write the report of ``result`` (``render``'s arguments) to ``path`` (UTF-8); return the path."""
    return write_text(path, render(result, scaling_rows, top, mine, compare), "output")
