"""The RL report in a real browser (headless Chromium driven by Playwright, as tests/test_report_browser.py drives the
training report): the timeline by phase and GPU pool shows the best colocated and split plans side by side on one
time axis, the rollout's tail and the memory per phase are drawn, every chart within the page with its legend inside
it, nothing outside the file is requested, the console stays clean, and hovering a phase's bar shows its time."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan.rl import RLJob, RLSpace, rl_search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

pytest.importorskip("jinja2")
pytest.importorskip("vl_convert")
pytest.importorskip("playwright")

from browser_helpers import CHARTS_JS, READY, tooltip_text  # noqa: E402
from meshplan.report.browser import open_page  # noqa: E402
from meshplan.report.rl_html import write_rl  # noqa: E402

CHARTS = {"rl-timeline", "rl-tail", "rl-memory"}


@pytest.fixture(scope="module")
def result():
    job = RLJob(prompts=32, samples_per_prompt=4, input_len=256, output_len=512, lengths="lognormal",
                mean_output=200.0, mini_batches=2)
    return rl_search(load_model("llama3-8b"), load_system("h100"), 8, job,
                     RLSpace(setups=("colocated", "split"), offloads=("all",)), top_k=4)


@pytest.fixture(scope="module")
def report(result, tmp_path_factory) -> Path:
    return write_rl(tmp_path_factory.mktemp("rl") / "rl.html", result)


@pytest.mark.parametrize("width", [800, 1400])
def test_every_chart_is_drawn_and_the_page_fits(browser, report, width):
    page = open_page(browser, report, width=width, ready=READY)
    charts = page.evaluate(CHARTS_JS)
    assert {c["key"] for c in charts} == CHARTS
    for chart in charts:
        assert chart["width"] > 300 and chart["height"] > 80 and chart["right"] <= width, chart
        assert chart["items"] > 10, chart
        assert chart["legendRight"] <= chart["width"], chart
    assert page.evaluate("window.meshplan.failed") == []
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert page.meshplan_errors == []  # no console error, no request but the file itself
    page.close()


def test_colocated_and_split_side_by_side(browser, report, result):
    """The timeline's rows are the colocated plan's GPUs and the split plan's two pools, on one time axis: the split
    plan's rollout and trainer bars start together, the colocated plan's phases follow each other."""
    page = open_page(browser, report, width=1280, ready=READY)
    lanes = page.evaluate("window.meshplan.views['rl-timeline'].scale('y').domain()")
    assert [lane.split(" ")[0] for lane in lanes] == ["colocated", "split", "split"]
    assert [lane.rsplit("· ", 1)[1] for lane in lanes] == ["all GPUs", "rollout pool", "training pool"]
    rows = page.evaluate("window.meshplan.views['rl-timeline'].data('data_0')")
    split_starts = sorted(r["start"] for r in rows if r["lane"] != lanes[0] and r["phase"] != "weight transfer")
    assert split_starts[0] == 0 and split_starts[1] == 0  # rollout and trainer start together
    colocated = sorted((r for r in rows if r["lane"] == lanes[0]), key=lambda r: r["start"])
    assert all(a["end"] == pytest.approx(b["start"]) for a, b in zip(colocated, colocated[1:], strict=False))
    top = max(r["end"] for r in rows)
    assert top == pytest.approx(max(e.iteration_time for e in result.best.values()), rel=1e-6)
    page.close()


def test_hovering_a_phase_shows_its_time(browser, report, result):
    page = open_page(browser, report, width=1280, ready=READY)
    page.locator("[data-chart=rl-timeline]").scroll_into_view_if_needed()
    best = result.best["colocated"]
    rollout = next(s for s in best.segments if s.phase == "rollout")
    lane = page.evaluate("window.meshplan.views['rl-timeline'].scale('y').domain()[0]")
    x, y = page.evaluate("""([mid, lane]) => {
      const v = window.meshplan.views['rl-timeline'], r = v.container().querySelector('svg, canvas')
        .getBoundingClientRect(), o = v.origin(), pad = v.padding(), band = v.scale('y');
      return [r.left + pad.left + o[0] + v.scale('x')(mid), r.top + pad.top + o[1] + band(lane) + band.bandwidth() / 2];
    }""", [(rollout.start + rollout.end) / 2, lane])
    page.mouse.move(x - 3, y - 3)
    page.mouse.move(x, y)
    text = tooltip_text(page)
    assert "rollout" in text and "all GPUs" in text
    page.close()
