"""The serving report in a real browser (headless Chromium driven by Playwright, as tests/test_report_browser.py
drives the training report): every chart is drawn with its legends inside it, nothing outside the file is requested,
the console stays clean, the page fits 1000 and 1400 px without horizontal scrolling, and the interactions work:
hovering a configuration shows it, the latency and colour axes of the configuration space switch."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan.serve.search import search
from meshplan.serve.space import QUANTS, ServeSpace
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

pytest.importorskip("jinja2")
pytest.importorskip("vl_convert")
pytest.importorskip("playwright")

from browser_helpers import CHARTS_JS, READY, hover, tooltip_text  # noqa: E402
from meshplan.report.browser import open_page  # noqa: E402
from meshplan.report.serve_html import write_serving  # noqa: E402

CHARTS = {"curve-tpot", "curve-ttft", "serve-space", "serve-memory", "serve-step"}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """A small search (8 GPUs: about 3,000 configurations) with both targets, so that some break each."""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(8)
    space = ServeSpace(input_len=1024, output_len=256, ttft_slo=0.5, tpot_slo=0.02, quants=QUANTS)  # every format
    return write_serving(tmp_path_factory.mktemp("serve") / "serve.html",
                         search(model, cluster, space, top_k=6, keep=True), price=2.0)


@pytest.mark.parametrize("width", [800, 1000, 1400])
def test_every_chart_is_drawn_and_the_page_fits(browser, report, width):
    page = open_page(browser, report, width=width, ready=READY)
    charts = page.evaluate(CHARTS_JS)
    assert {c["key"] for c in charts} == CHARTS
    for chart in charts:  # laid out within the page, with marks in it, every legend inside the chart
        assert chart["width"] > 300 and chart["height"] > 80 and chart["right"] <= width, chart
        assert chart["items"] > 20 and chart["legends"] >= 1, chart
        assert chart["legendRight"] <= chart["width"], chart
    assert page.evaluate("window.meshplan.failed") == []
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    # a table wider than the window scrolls inside its own box (div.table), never the page (issue 48: 800 px)
    tables = page.evaluate("Array.from(document.querySelectorAll('table'))"
                           ".map(t => (t.closest('div.table') || t).getBoundingClientRect().right)")
    assert len(tables) >= 5 and max(tables) <= width
    assert page.evaluate("getComputedStyle(document.body).fontFamily").startswith("system-ui")  # the stylesheet holds
    assert page.meshplan_errors == []  # no console error, no request but the file itself
    page.close()


def test_hovering_the_best_configuration_in_the_space_shows_it(browser, report):
    page = open_page(browser, report, width=1280, ready=READY)
    page.locator("[data-chart=serve-space] canvas").scroll_into_view_if_needed()
    best = page.evaluate("window.meshplan.serve.best[0]")
    hover(page, "serve-space", best["x"], best["per_gpu"])
    text = tooltip_text(page)
    assert best["plan"] in text and "#1" in text and best["tpot_text"] in text
    assert page.meshplan_errors == []
    page.close()


def test_switching_the_colour_and_the_latency_axes(browser, report):
    page = open_page(browser, report, width=1280, ready=READY)
    domain = "window.meshplan.views['serve-space'].scale('color').domain()"
    for axis in ("tp", "quant", "pools", "batch"):
        if axis != "tp":
            page.select_option("#serve-colour", axis)
            page.wait_for_function(f"window.meshplan.serve.drawn === 'tpot/{axis}'")
        vocab = page.evaluate(f"window.meshplan.data.serve_space.columns.vocab['{axis}']")
        assert page.evaluate(domain) == vocab and len(vocab) > 1
    tpot_axis = page.evaluate("window.meshplan.views['serve-space'].scale('x').domain()")
    # TTFT: the x values are the configurations' TTFT (ms), the 500 ms target is drawn and shaded beyond
    page.select_option("#serve-x", "ttft")
    page.wait_for_function("window.meshplan.serve.drawn === 'ttft/batch'")
    view = "window.meshplan.views['serve-space']"
    ttft_axis = page.evaluate(f"{view}.scale('x').domain()")
    assert ttft_axis != tpot_axis and ttft_axis[0] < 500 < ttft_axis[1]
    assert page.evaluate(f"{view}.data('slo').map(d => d.x)") == [500]
    best = page.evaluate("window.meshplan.serve.best[0]")
    assert best["x"] == pytest.approx(best["ttft"] * 1e3)
    front = page.evaluate("window.meshplan.serve.points.filter(p => p.onFront).map(p => [p.x, p.per_gpu])")
    assert front and all(x <= 500 for x, _ in front)  # the front fits the targets
    # end-to-end: no target of its own, nothing shaded
    page.select_option("#serve-x", "e2e")
    page.wait_for_function("window.meshplan.serve.drawn === 'e2e/batch'")
    assert page.evaluate(f"{view}.data('slo')") == []
    assert page.evaluate("window.meshplan.failed") == [] and page.meshplan_errors == []
    page.close()


def test_hovering_a_point_of_a_curve_shows_its_batch(browser, report):
    page = open_page(browser, report, width=1280, ready=READY)
    page.locator("[data-chart=curve-tpot] svg").scroll_into_view_if_needed()
    # the last curve's own batch (a diamond): its points are drawn over the others'
    own = page.evaluate("window.meshplan.data.charts['curve-tpot'].data.values.filter(r => r.own).pop()")
    hover(page, "curve-tpot", own["tpot"], own["per_gpu"])
    text = tooltip_text(page)
    assert own["config"] in text and str(own["batch"]) in text and own["tpot_text"] in text
    assert page.meshplan_errors == []
    page.close()
