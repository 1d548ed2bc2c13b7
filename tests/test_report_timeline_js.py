"""The merged timelines the HTML report leaves to its page (report/detail.py ``replay_inputs``, templates/timeline.js)
are, in headless Chromium, the numbers Python writes for them (tables.build, simulator.simulate,
detail.compact_timeline(merged=True)): every schedule ``build`` has, one rank to eight, unequal first and last ranks,
seconds and milliseconds, and a value whose 4 significant digits are a tie (Python rounds it to even)."""

from __future__ import annotations

import random

import pytest

from meshplan.pipeline.simulator import simulate
from meshplan.pipeline.tables import build

pytest.importorskip("jinja2")
pytest.importorskip("playwright")

from meshplan.report.browser import open_page  # noqa: E402
from meshplan.report.detail import compact_timeline, replay_inputs  # noqa: E402
from meshplan.report.page import asset  # noqa: E402
from meshplan.report.split_runs import PipelineRun  # noqa: E402

SHAPES = [("1f1b", 1, 8, 1), ("gpipe", 4, 8, 1), ("1f1b", 4, 16, 1), ("1f1b", 8, 4, 1), ("interleaved", 4, 8, 2),
          ("interleaved", 8, 64, 5), ("interleaved", 2, 6, 3), ("pipedream", 4, 8, 1), ("pipedream-2bw", 4, 8, 1)]


def _times(pp: int, seed: int, scale: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-rank forward and backward times: the middle ranks equal, the first (embedding) and last (LM head, loss)
    longer, as plots.pipeline_times gives them; arbitrary low bits (random draws)."""
    rng = random.Random(seed)
    f, b = rng.uniform(1, 2) * scale, rng.uniform(2, 4) * scale
    first, last = rng.uniform(0, 0.3) * scale, rng.uniform(0, 0.6) * scale
    t_f = tuple(f + (first if r == 0 else 0.0) + (last if r == pp - 1 else 0.0) for r in range(pp))
    t_b = tuple(b + (2 * first if r == 0 else 0.0) + (2 * last if r == pp - 1 else 0.0) for r in range(pp))
    return t_f, t_b


def _python(schedule: str, pp: int, m: int, vpp: int, t_f: tuple[float, ...], t_b: tuple[float, ...]) -> dict:
    table = build(schedule, pp, m, vpp)
    run = PipelineRun(schedule=schedule, pp=pp, vpp=vpp, micro_batches=m, t_fwd=t_f, t_bwd=t_b, table=table,
                      timeline=simulate(table, t_f, t_b, built=True))
    return compact_timeline(run, merged=True)


@pytest.fixture(scope="module")
def page(browser, tmp_path_factory):
    path = tmp_path_factory.mktemp("timeline") / "timeline.html"
    path.write_text(f"<html><body><script>window.meshplan = {{}};</script><script>{asset('timeline.js')}</script>"
                    "</body></html>", encoding="utf-8")
    page = open_page(browser, path)
    yield page
    assert page.meshplan_errors == []
    page.close()


def _page(page, inputs: dict) -> dict:
    out = page.evaluate("t => window.meshplan.timeline({timeline: t})", inputs)
    assert out.pop("replay") == inputs["replay"]
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("scale", [1e-4, 0.2])  # blocks of 0.1 ms (every step here under 1 s: in ms) and of 0.2 s
def test_the_page_simulates_the_numbers_python_writes(page, shape, scale):
    schedule, pp, m, vpp = shape
    t_f, t_b = _times(pp, SHAPES.index(shape), scale)
    python = _python(schedule, pp, m, vpp, t_f, t_b)
    assert python["unit"] == ("ms" if scale < 1e-2 else "s")
    assert _page(page, replay_inputs(schedule, pp, m, vpp, (t_f, t_b))) == python
    if pp > 1:  # the pipeline's fill and drain are idle rows (kind 2), between busy ones (kind 3)
        assert {r[3] for r in python["rows"]} == {2, 3} and python["bubble"] > 0


def test_a_tie_is_rounded_to_even_as_python_does(page):
    """One rank, one micro-batch: forward 0.5625 s + backward 1 s = a step of 1.5625 s (exact in binary), whose 4
    significant digits are 1.562 in Python (half to even), 1.563 by JavaScript's toPrecision (half away from zero)."""
    python = _python("1f1b", 1, 1, 1, (0.5625,), (1.0,))
    assert python["step"] == 1.562 and python["rows"] == [[0, 0.0, 1.562, 3, ""]] and python["bubble"] == 0.0
    assert _page(page, replay_inputs("1f1b", 1, 1, 1, ((0.5625,), (1.0,)))) == python
    assert page.evaluate("(1.5625).toPrecision(4)") == "1.563"  # what a plain toPrecision would have written


def test_a_report_draws_the_timelines_it_left_to_its_page(browser, tmp_path, monkeypatch):
    """With no block budget every timeline of the report is left to its page: the comparison still draws both, each
    with its ranks, and their rows are Python's (detail.compact_timeline of plots.pipeline_run, merged)."""
    from browser_helpers import READY
    from conftest import gpt
    from meshplan.report import detail
    from meshplan.report.html import write
    from meshplan.report.plots import pipeline_run
    from meshplan.search import Space, search
    from meshplan.search.explore import Explore
    from meshplan.specs.hardware import load_system
    from meshplan.specs.stack import load_stack

    monkeypatch.setattr(detail, "BLOCKS", 0)
    model, cluster = gpt(layers=16, hidden=4096, heads=32, seq=4096), load_system("h100").cluster(16)
    space = Space(global_batch=32, headroom=0.09, stack=load_stack("megatron-core"), prefer_simple=True)
    result = search(model, cluster, space, top_k=3, explore=Explore(sample=300))
    held = detail.detailed_plans(result, 3)  # the report's plans, ids in the same order
    page = open_page(browser, write(tmp_path / "report.html", result, top=3), ready=READY)
    left = page.evaluate("window.meshplan.data.plans.filter(p => p.timeline.replay).map(p => p.id)")
    pair = page.evaluate("window.meshplan.compared")
    assert len(left) == len(held) and set(pair) <= set(left)
    for key, plan in zip(("compare-timeline-a", "compare-timeline-b"), pair, strict=True):
        t = page.evaluate("id => window.meshplan.data.plans.find(p => p.id === id).timeline", plan)
        assert len(page.evaluate(f"window.meshplan.views['{key}'].scale('y').domain()")) == t["pp"]
        t.pop("replay")
        assert t == compact_timeline(pipeline_run(held[plan].est), merged=True)
    # (a plan space without other GPU counts' fronts has Vega warn of an empty layer's extent: not the timelines')
    assert [e for e in page.meshplan_errors if "Infinite extent" not in e] == []
    page.close()
