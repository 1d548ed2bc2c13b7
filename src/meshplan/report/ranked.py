"""One shape for what a search found, whichever engine searched: the training search (search/run.py's SearchResult,
turned into it by ranked_training.py) and the serving search (serve/search.py's ServeSearchResult, ranked_serving.py)
are both rendered from a ``Ranked`` - the terminal's tables (fold.listing_tables), the HTML page's lead, best table,
rejected table and footer (html.py, sections.py), the serving space's best markers (serve_space.py) - so that the two
reports cannot drift apart in how they show a ranking. What only one engine has (the training plan space, comparison
and pipeline, the serving curves, KV cache and decode step) stays in its own sections, which read the engine's own
result and share the charts' and sections' builders (charts.stacked_bars, sections.share_rows, the memory template).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from meshplan.report.fold import Col, Listing


@dataclass(frozen=True, kw_only=True)
class Lead:
    """The top of a page: ``heading`` (h1), one line of ``text``, figures as ``cards`` ((name, value) pairs), and the
    best plan or configuration (``best``, in code type) with a ``best_note`` after it."""

    heading: str
    text: str
    cards: list[tuple[str, str]] = field(default_factory=list)
    best: str = ""
    best_note: str = ""
    best_label: str = "best plan"


@dataclass(frozen=True)
class Ranked:
    """A search's result as report/ shows it.

    ``table``: the ranked rows, best first, one cell per column (as the terminal prints them; each header's meaning
    is its legend entry and its tooltip); ``labels``: per row, the plan or configuration in words (``describe()``);
    ``metrics``: per row, the numbers behind its cells (seconds, tokens/s, bytes); ``rejected``: the rejected
    candidates by reason with a count and an example each; ``band``: the relative error band within which the model
    cannot tell two rows apart (None: the engine states none); ``ranking``: one sentence on how the rows are ranked;
    ``empty``: what the page says when no row is left; ``lead`` and ``footer``: the top and the foot of the HTML
    page."""

    noun: str  # "plans", "configurations"
    page_title: str  # "llama3-8b on 16 × H100 SXM5 80GB"
    table: Listing
    rejected: Listing
    rejected_total: int
    evaluated: int
    feasible: int
    seconds: float
    lead: Lead
    footer: str
    ranking: str = ""
    empty: str = ""
    band: float | None = None
    labels: tuple[str, ...] = ()
    metrics: tuple[Mapping[str, float], ...] = field(default_factory=tuple)


def rejected_listing(rejected: Mapping[str, int], examples: Mapping[str, str], noun: str, count: str,
                     meanings: Mapping[str, str], notes: Sequence[tuple[str, str]] = ()) -> Listing:
    """The rejected candidates tallied by reason, the most frequent first, with one example each: ``noun`` in the
    title, ``count`` the count column's header; ``meanings``: the headers' meanings (reason, ``count``, for
    example)."""
    ranked = sorted(rejected.items(), key=lambda kv: -kv[1])
    key = Col("reason", [r for r, _ in ranked], "left", wrap=True, meaning=meanings.get("reason", ""))
    cols = (Col(count, [f"{n:,}" for _, n in ranked], meaning=meanings.get(count, "")),
            Col("for example", [examples.get(r, "") for r, _ in ranked], "left", wrap=True,
                meaning=meanings.get("for example", "")))
    return Listing(f"rejected: {sum(rejected.values()):,} {noun}", key, cols, notes=tuple(notes))
