"""The page every HTML report of meshplan shares: one self-contained file from the Jinja2 templates of
report/templates (``report.html.j2``: the lead, the navigation, each section's own template, the footer), the one
stylesheet (``report.css``), the charts' runtime inlined (vega.py) and the page's scripts (templates/*.js).

A report is a list of ``Section``s (sections.py: an anchor, a title, a template and the values it reads, the
Vega-Lite specs it draws) and a lead (ranked.Lead: heading, one line, cards). The training report (html.py) and the
serving report (serve_html.py) are two such lists; ``report.js`` draws every chart of either, the other scripts add the
interactions of the sections that are there (each returns at once when its data is absent).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshplan.report.vega import bundle, environment, versions

if TYPE_CHECKING:
    from meshplan.report.ranked import Lead
    from meshplan.report.sections import Section

CORE_SCRIPT = "report.js"  # draws the charts and says when they are drawn (window.meshplan.ready); always first


def asset(name: str) -> str:
    """A file of report/templates (a stylesheet or a script) as text (beside this module, where the templates' loader
    finds them too: vega.environment)."""
    return (Path(__file__).parent / "templates" / name).read_text(encoding="utf-8")


def safe(text: str, element: str = "script") -> Any:
    """A script's or a stylesheet's text written into the page as it is, not escaped (the inside of a ``<script>``
    or ``<style>`` element is raw text: an escaped quote would stay ``&#34;`` there); it holds no ``</script`` or
    ``</style`` that would end the element early (checked)."""
    from markupsafe import Markup

    if re.search(f"</{element}", text, re.IGNORECASE | re.ASCII):  # the HTML parser's own (ASCII) case-insensitivity
        raise ValueError(f"a {element} holds '</{element}': it cannot be inlined")
    return Markup(text)


def render_page(title: str, lead: Lead, sections: Sequence[Section], footer: str,
                scripts: Sequence[str] = ()) -> str:
    """The HTML of one report: ``title`` (the browser's), ``lead``, ``sections`` in order, ``footer`` (the charts'
    versions are added to it), the data of every section (its charts' specs and ``context["data"]``) as one JSON
    block and ``scripts`` (templates/*.js, after report.js) that act on it."""
    v = versions()
    footer = f"{footer} Charts: Vega {v['vega']}, Vega-Lite {v['vega-lite']}, embedded in this file."
    charts = {k: c for s in sections for k, c in s.charts.items()}
    renderers = {k: r for s in sections for k, r in s.renderers.items()}
    data = {"charts": charts, "renderers": renderers} | {k: d for s in sections
                                                           for k, d in s.context.get("data", {}).items()}
    return environment().get_template("report.html.j2").render(
        title=title, lead=lead, sections=sections, footer=footer, data=data, css=safe(asset("report.css"), "style"),
        runtime=safe(bundle()), script=safe("\n".join(asset(s) for s in (CORE_SCRIPT, *scripts))))
