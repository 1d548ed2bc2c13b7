"""The serving report's section under a load (report/serve_load_section.py) in a real browser (headless Chromium, as
tests/test_serve_report_browser.py drives the rest of the page): its three charts are drawn, with marks, inside the
page at 1000 px, and the console stays clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan.report.serve_load_section import load_section
from meshplan.serve.engine import load_engine
from meshplan.serve.load import arrivals, lengths
from meshplan.serve.load.run import load_run
from meshplan.serve.load.sweep import load_sweep
from meshplan.serve.plan import ServePlan
from meshplan.serve.search import search
from meshplan.serve.space import ServeSpace
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

pytest.importorskip("jinja2")
pytest.importorskip("vl_convert")
pytest.importorskip("playwright")

from browser_helpers import CHARTS_JS, READY  # noqa: E402
from meshplan.report.browser import open_page  # noqa: E402
from meshplan.report.serve_html import write_serving  # noqa: E402

LOAD_CHARTS = {"load-ttft", "load-tpot", "load-kv"}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """Llama 3 8B on 2 H100s at 10 ShareGPT requests/s under a 500 ms TTFT target."""
    model, cluster, engine = load_model("llama3-8b"), load_system("h100").cluster(2), load_engine("vllm")
    plan = ServePlan(batch=256, replicas=2)
    reqs = arrivals.poisson(10, 300, lengths.Lengths("sharegpt"))
    result = load_run(model, cluster, plan, reqs, engine)
    section = load_section(plan.describe(), load_sweep(model, cluster, plan, reqs, engine), result.timeline,
                           (0.5, 0.0), False)
    space = ServeSpace(input_len=161, output_len=338, ttft_slo=0.5, engine=engine)
    return write_serving(tmp_path_factory.mktemp("load") / "load.html",
                         search(model, cluster, space, top_k=3, keep=True), extra=[section])


def test_the_load_charts_are_drawn(browser, report):
    page = open_page(browser, report, width=1000, ready=READY)
    charts = {c["key"]: c for c in page.evaluate(CHARTS_JS)}
    assert set(charts) >= LOAD_CHARTS
    for key in LOAD_CHARTS:
        c = charts[key]
        assert c["width"] > 300 and c["height"] > 80 and c["right"] <= 1000 and c["items"] > 7, c
    assert page.evaluate("window.meshplan.failed") == []
    assert page.meshplan_errors == []
    page.close()
