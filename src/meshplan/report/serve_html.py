"""The serving search as one self-contained HTML page (``meshplan serve ... --report serve.html``), on the training
report's page (html.page: the same skeleton, templates, stylesheet and inlined Vega runtime; it opens offline, from a
file), its lead, best table, rejected table and footer rendered from the one shape of a search's result as the
training report's are (ranked_serving.py, sections.py):

- the lead: the workload, the engine and the targets, the best configuration's figures as cards;
- the best configurations as the terminal lists them;
- throughput per GPU against TPOT and against TTFT over the decode batch for the best configurations' shapes, the
  targets drawn as lines (serve_sections.py);
- the configuration space: every configuration the search weighed, throughput per GPU against a latency, coloured
  by a chosen axis, the rejected ones marked by reason (serve_space.py, serve.js);
- memory per GPU and the KV cache, and the decode iteration by kind of op of the best configurations;
- under a load (``--rate`` / ``--concurrency``), the chosen configuration's latency against the load and its KV cache
  over the run (serve_load_section.py);
- the trust note: the serving model's error on published runs of the GPU generation (serve_trust.py);
- the rejected configurations by reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from meshplan.files import write_text
from meshplan.report import serve_sections as S
from meshplan.report.html import page
from meshplan.report.ranked_serving import from_serving
from meshplan.report.sections import Section, plans_section, rejected_section
from meshplan.report.serve_space import SERVE_SAMPLE, serving_space_section
from meshplan.report.serve_trust import serving_trust_section

if TYPE_CHECKING:
    from meshplan.serve.search import ServeSearchResult

_SCRIPTS = ("serve.js",)  # after report.js (templates/)


def render_serving(result: ServeSearchResult, price: float | None = None, sample: int = SERVE_SAMPLE,
                   extra: Sequence[Section] = ()) -> str:
    """The page of a serving search (module docstring); the configuration space needs ``search(..., keep=True)``.
    ``price``: per GPU-hour, for the cost of a million tokens; ``sample``: the most configurations drawn; ``extra``:
    sections after the curves (the load's)."""
    ranked = from_serving(result, price)
    sections = [plans_section(ranked)]
    if result.plans:
        sections.append(S.curves_section(result))
    sections += extra
    if result.weighed is not None and len(result.weighed):
        sections.append(serving_space_section(result, ranked, sample))
    if result.plans:
        sections += [S.serving_memory_section(result.plans), S.step_section(result.plans)]
    sections += [serving_trust_section(result), rejected_section(ranked)]
    return page(ranked, sections, _SCRIPTS)


def write_serving(path: str | Path, result: ServeSearchResult, price: float | None = None,
                  extra: Sequence[Section] = ()) -> Path:
    """Write the page of ``result`` (and the ``extra`` sections) to ``path`` (UTF-8); return the path."""
    return write_text(path, render_serving(result, price, extra=extra), "report")
