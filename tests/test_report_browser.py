"""The HTML report in a real browser (headless Chromium driven by Playwright): every chart is drawn, nothing outside
the file is requested, the console stays clean (no error, no warning), the page fits 800, 1000 and 1400 px without
horizontal scrolling (a wide table scrolls in its own box), and the interactions work: hovering a point shows its
tooltip, the colour axis of the plan space switches, two plans picked in the plan space are compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import gpt
from meshplan.configs import emit, read
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.search.explore import Explore
from meshplan.specs.hardware import load_system
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

pytest.importorskip("jinja2")
pytest.importorskip("vl_convert")
pytest.importorskip("playwright")

from browser_helpers import CHARTS_JS, READY, hover, tooltip_text  # noqa: E402
from meshplan.report.browser import open_page  # noqa: E402
from meshplan.report.html import write  # noqa: E402


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """A search with its plan space, the user's own plan read back from a Megatron-LM config (as --from does), and
    scaling rows whose fronts join the plan space."""
    model, cluster = gpt(layers=16, hidden=4096, heads=32, seq=4096), load_system("h100").cluster(16)
    space = Space(global_batch=32, headroom=0.09, stack=load_stack("megatron-core"), prefer_simple=True)
    result = search(model, cluster, space, top_k=4, explore=Explore(sample=3000))
    config = emit("megatron", model, Plan(dp=2, tp=4, pp=2, global_batch=32, zero=1, sequence_parallel=True),
                  space.stack)
    plan, stack = read("megatron", model, 16, text=config)
    mine = estimate(model, cluster, plan, stack)
    small = search(model, load_system("h100").cluster(8), space, top_k=1, explore=Explore(sample=0))
    rows = [{"system": "h100", "nvlink_domain": 8, "gpus": n, "param": "none", "feasible": True, "plan": f"dp={n}",
             "tokens_per_s": 1e5 * n ** 0.9, "mfu": 0.5 - 0.02 * i, "step_time_s": 1.0, "peak_memory_bytes": 4e10,
             "front": small.explored.front if n == 8 else []} for i, n in enumerate((8, 16, 32))]
    return write(tmp_path_factory.mktemp("report") / "report.html", result, rows, top=4, mine=mine)


def _hover(page, plan_id: int) -> tuple[float, float]:
    """Move the mouse onto a held plan's mark in the plan space (browser_helpers.hover)."""
    time, memory = page.evaluate("id => { const p = window.meshplan.space.plans.find(q => q.id === id); "
                                 "return [p.time, p.memory]; }", plan_id)
    return hover(page, "space", time, memory)


def _front_ids(page) -> list[int]:
    return page.evaluate("window.meshplan.space.plans.filter(p => p.on2d).map(p => p.id)")


@pytest.mark.parametrize("width", [800, 1000, 1400])
def test_every_chart_is_drawn_and_the_page_fits(browser, report, width):
    page = open_page(browser, report, width=width, ready=READY)
    charts = page.evaluate(CHARTS_JS)
    assert {c["key"] for c in charts} == {"space", "compare-breakdown", "compare-memory", "compare-timeline-a",
                                          "compare-timeline-b", "breakdown", "delta", "memory", "timeline", "roofline",
                                          "scaling-throughput", "scaling-mfu"}
    for chart in charts:  # laid out within the page, with marks in it
        assert chart["width"] > 300 and chart["height"] > 80 and chart["right"] <= width, chart
        assert chart["items"] > 20, chart
    assert page.evaluate("window.meshplan.failed") == []
    # no horizontal scrolling: neither the page nor any table is wider than the window
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    # a table wider than the window scrolls inside its own box (div.table), never the page (issue 48: 800 px)
    tables = page.evaluate("Array.from(document.querySelectorAll('table'))"
                           ".map(t => (t.closest('div.table') || t).getBoundingClientRect().right)")
    assert len(tables) >= 6 and max(tables) <= width
    assert page.meshplan_errors == []  # no console error, no request but the file itself
    page.close()


def test_hovering_a_bar_shows_its_tooltip(browser, report):
    page = open_page(browser, report, width=1280, ready=READY)
    bar = page.locator('[data-chart="breakdown"] svg path[aria-roledescription="bar"]').first
    bar.hover()
    text = tooltip_text(page)
    assert "component" in text and "#1" in text
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


def test_hovering_a_point_of_the_plan_space_shows_its_plan(browser, report):
    page = open_page(browser, report, width=1280, ready=READY)
    page.locator("[data-chart=space] canvas").scroll_into_view_if_needed()
    first = _front_ids(page)[-1]
    _hover(page, first)
    text = tooltip_text(page)
    plan = page.evaluate("id => window.meshplan.space.plans.find(p => p.id === id).plan", first)
    assert plan in text and "click to compare" in text
    assert page.meshplan_errors == []
    page.close()


def test_switching_the_colour_axis(browser, report):
    page = open_page(browser, report, width=1280, ready=READY)
    domain = "window.meshplan.views.space.scale('color').domain()"
    for axis in ("tp", "zero", "recompute", "framework"):
        if axis != "tp":
            page.select_option("#colour-axis", axis)
            page.wait_for_function(f"window.meshplan.space.drawn === '{axis}'")
        # the colours: the sample's values of the axis (in order), then any only a held plan has
        vocab = page.evaluate(f"window.meshplan.data.space.columns.vocab.{axis}")
        assert page.evaluate(domain)[: len(vocab)] == vocab and len(vocab) > 1
    assert any("megatron-core" in v for v in page.evaluate(domain))  # the search ran megatron-core's plans
    assert page.evaluate("window.meshplan.failed") == [] and page.meshplan_errors == []
    page.close()


def test_picking_two_plans_in_the_plan_space_compares_them(browser, report):
    page = open_page(browser, report, width=1280, ready=READY)
    page.locator("[data-chart=space] canvas").scroll_into_view_if_needed()
    front = _front_ids(page)
    a, b = front[0], front[-1]
    page.mouse.click(*_hover(page, a))
    page.wait_for_function(f"window.meshplan.compared && window.meshplan.compared[0] === {a}")
    page.mouse.click(*_hover(page, b))
    page.wait_for_function(f"JSON.stringify(window.meshplan.compared) === '{[a, b]}'".replace(" ", ""))
    assert page.input_value("#pick-a") == str(a) and page.input_value("#pick-b") == str(b)
    labels = page.evaluate("ids => ids.map(id => window.meshplan.data.plans.find(p => p.id === id).label)", [a, b])
    cards = page.inner_text("#compare-cards")
    assert labels[0].upper() in cards.upper() and labels[1].upper() in cards.upper()
    rows = page.locator("#compare-why tbody tr")
    assert rows.count() >= 5 and "→" in page.inner_text("#compare-why")  # some field differs, and says how
    # the trust panel follows plan A: its band, its nearest runs, its assumptions
    panel = page.locator(f'.trust[data-plan="{a}"]')
    assert panel.is_visible() and page.locator(".trust:not(.hidden)").count() == 1
    assert "Error band" in panel.inner_text() and panel.locator("tbody tr").count() == 5
    # the timelines of both plans are drawn with their ranks
    for key, plan in (("compare-timeline-a", a), ("compare-timeline-b", b)):
        pp = page.evaluate("id => window.meshplan.data.plans.find(p => p.id === id).timeline.pp", plan)
        ranks = page.evaluate(f"window.meshplan.views['{key}'].scale('y').domain()")
        assert len(ranks) == pp
    # the menus pick too: B becomes the user's own config
    mine = page.evaluate("window.meshplan.data.plans.find(p => p.origin === 'your config').id")
    page.select_option("#pick-b", str(mine))
    page.wait_for_function(f"JSON.stringify(window.meshplan.compared) === '{[a, mine]}'".replace(" ", ""))
    assert "your config" in page.inner_text("#compare-cards").lower()
    assert page.meshplan_errors == []
    page.close()
