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
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshplan.files import write_text
from meshplan.report import sections as S
from meshplan.report.compare import compare_section, pair_of, trust_section
from meshplan.report.detail import detailed_plans, dominated, with_front
from meshplan.report.page import render_page
from meshplan.report.ranked_training import from_training
from meshplan.report.space import space_section
from meshplan.units import GiB

if TYPE_CHECKING:
    from meshplan.estimate import Estimate
    from meshplan.report.ranked import Ranked
    from meshplan.search.run import SearchResult

SCRIPTS = ("space.js", "timeline.js", "compare.js")  # the page's own scripts after report.js, in order (templates/)


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
    points += [(x["time"], x["memory"] * GiB, x["gpus"]) for x in others]
    beaten = dominated([(o["time"], o["memory"] * GiB, o["gpus"]) for o in others], points)
    others = [o | {"front3d": not out} for o, out in zip(others, beaten, strict=True)]
    ranked = from_training(replace(result, plans=tuple(plans)))  # the ``top`` best
    sections = [S.plans_section(ranked)]
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
    sections.append(S.rejected_section(ranked))
    return page(ranked, sections)


def _other_fronts(result: SearchResult, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Pareto fronts the scaling searches found at the other GPU counts, as the plan space shows them."""
    n = result.cluster.num_gpus
    return [{"time": t, "memory": m / GiB, "gpus": r["gpus"], "plan": plan.describe()}
            for r in rows if r.get("gpus") != n for t, m, plan in r.get("front", ())]


def page(ranked: Ranked, sections: Sequence[S.Section], scripts: Sequence[str] = SCRIPTS) -> str:
    """The page of ``sections`` about a search's result (its title, lead and footer: ranked.Ranked) on the shared
    skeleton (page.render_page), with the page's own ``scripts``."""
    return render_page(ranked.page_title, ranked.lead, sections, ranked.footer, tuple(scripts))


def write(path: str | Path, result: SearchResult, scaling_rows: Sequence[dict[str, Any]] | None = None,
          top: int = 5, mine: Estimate | None = None, compare: str | None = None) -> Path:
    """Write the report of ``result`` (``render``'s arguments) to ``path`` (UTF-8); return the path."""
    return write_text(path, render(result, scaling_rows, top, mine, compare), "output")
