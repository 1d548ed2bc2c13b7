"""The RL search as one self-contained HTML page (``meshplan rl ... --report rl.html``), on the training report's page
(html.page: the same skeleton, templates, stylesheet and inlined Vega runtime; it opens offline, from a file): the
lead, the best plans as the terminal lists them, the iteration's timeline by phase and GPU pool with the best plan of
each set-up side by side (colocated vs split vs async) and the rollout's tail, memory per phase, the rejected layouts
and pairings (rl_sections.py, ranked_rl.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from meshplan.files import write_text
from meshplan.report.html import page
from meshplan.report.ranked_rl import from_rl
from meshplan.report.rl_sections import rl_memory_section, rl_timeline_section
from meshplan.report.sections import plans_section, rejected_section

if TYPE_CHECKING:
    from meshplan.rl.search import RLSearchResult


def render_rl(result: RLSearchResult) -> str:
    """The page of an RL search (module docstring)."""
    ranked = from_rl(result)
    sections = [plans_section(ranked)]
    if result.best:
        sections += [rl_timeline_section(result.best), rl_memory_section(result.best)]
    sections.append(rejected_section(ranked))
    return page(ranked, sections, ())


def write_rl(path: str | Path, result: RLSearchResult) -> Path:
    """Write the page of ``result`` to ``path`` (UTF-8); return the path."""
    return write_text(path, render_rl(result), "report")
