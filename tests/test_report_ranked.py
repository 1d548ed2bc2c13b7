"""One shape for a search's result (report/ranked.py): the training and the serving search both turn into a Ranked
(ranked_training.py, ranked_serving.py), and the terminal's tables and the HTML page's best and rejected sections are
rendered from it alike: the same headers in both, each with its meaning, each row's figures those of its estimate."""

from __future__ import annotations

import pytest

from meshplan.report.fold import Col, Listing, headers, listing_tables
from meshplan.report.ranked import Ranked
from meshplan.report.ranked_serving import from_serving
from meshplan.report.ranked_training import from_training
from meshplan.report.sections import plans_section, rejected_section
from meshplan.search import Space, search
from meshplan.serve.search import search as serve_search
from meshplan.serve.space import ServeSpace
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model


@pytest.fixture(scope="module")
def training():
    return search(load_model("llama3-8b"), load_system("h100").cluster(16), Space(global_batch=64), top_k=4)


@pytest.fixture(scope="module")
def serving():
    space = ServeSpace(input_len=1024, output_len=256, ttft_slo=1.0, tpot_slo=0.05)
    return serve_search(load_model("llama3-8b"), load_system("h100").cluster(8), space, top_k=4)


@pytest.fixture(scope="module", params=["training", "serving"])
def both(request, training, serving) -> tuple[object, Ranked]:
    if request.param == "training":
        return training, from_training(training, tokens=1e12, price=2.0)
    return serving, from_serving(serving, price=2.0)


def test_one_row_per_ranked_candidate_with_its_figures(both):
    result, ranked = both
    n = len(result.plans)
    assert n and len(ranked.table.key.cells) == n == len(ranked.metrics)
    assert all(len(c.cells) == n for c in ranked.table.columns)
    assert ranked.table.key.cells[0] == "1"
    assert ranked.labels == tuple(e.plan.describe() for e in result.plans) and ranked.lead.best == ranked.labels[0]
    for est, m in zip(result.plans, ranked.metrics, strict=True):  # the numbers behind the cells: the estimate's
        if ranked.noun == "plans":
            assert (m["step_time_s"], m["tokens_per_s"], m["peak_memory_bytes"]) == (est.step_time, est.tokens_per_s,
                                                                                     est.peak_memory)
        else:
            assert (m["tokens_per_s"], m["tpot_s"], m["memory_bytes"]) == (est.metrics.tokens_per_s, est.metrics.tpot,
                                                                           float(est.memory.total))
    # both rank within an error band: training's step-time band, serving's throughput band (serve/search.py)
    assert ranked.band == (result.plans[0].ranking_band if ranked.noun == "plans" else result.band) > 0


def test_every_header_says_what_it_means(both):
    _, ranked = both
    for listing in (ranked.table, ranked.rejected):
        for col in (listing.key, *listing.columns):
            assert col.meaning, col.header


def test_the_rejected_add_up(both):
    result, ranked = both
    counts = [int(c.replace(",", "")) for c in ranked.rejected.columns[0].cells]
    assert sum(counts) == ranked.rejected_total == result.rejected_total
    assert counts == sorted(counts, reverse=True)  # the most frequent reason first
    assert ranked.rejected.key.cells == [r for r, _ in sorted(result.rejected.items(), key=lambda kv: -kv[1])]


def test_the_page_and_the_terminal_show_the_same_columns(both):
    """One renderer per medium for both engines: the HTML table's headers are the terminal's, unfolded."""
    _, ranked = both
    terminal = headers(listing_tables(ranked.table, 10_000)[:-1])
    section = plans_section(ranked)
    assert section.context["header"] == terminal
    assert section.context["titles"] == [c.meaning for c in (ranked.table.key, *ranked.table.columns)]
    assert section.title == f"Best {ranked.noun}"
    rejected = rejected_section(ranked)
    assert rejected.context["header"] == headers(listing_tables(ranked.rejected, 10_000)[:-1])
    assert rejected.context["total"] == f"{ranked.rejected_total:,}"


def test_a_legend_names_the_headers_shown_then_the_notes():
    listing = Listing("t", Col("#", ["1"], meaning="rank"), (Col("a", ["x"], meaning="first"), Col("b", ["y"])),
                      notes=(("units", "s"),))
    # b has no meaning: left out; the notes follow the headers
    assert listing.entries(["#", "a", "b"]) == [("#", "rank"), ("a", "first"), ("units", "s")]
    assert listing_tables(listing, 80)[-1].plain == "legend: #: rank; a: first; units: s"


def test_the_page_lists_the_top_it_was_asked_for(training):
    """render(top=2) of a search that kept 4 plans: the best-plans table has 2 rows, the first marked best."""
    pytest.importorskip("jinja2")
    pytest.importorskip("vl_convert")
    from meshplan.report.html import render

    assert len(training.plans) == 4
    table = render(training, top=2).split('<table class="plans">')[1].split("</table>")[0]
    assert table.count("<tr") == 1 + 2 and table.count('<tr class="best">') == 1
