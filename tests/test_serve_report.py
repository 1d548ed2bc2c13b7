"""The serving report (report/serve_html.py) without a browser: one self-contained page on the training report's
templates, stylesheet and Vega runtime; what each section shows against serve/'s own numbers (the table as the
terminal prints it, the curves through each configuration's own figures, the configuration space's front, the
memory and decode step adding up, the trust note from the packaged errors and docs/ACCURACY_INFERENCE.md)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from meshplan.serve import check
from meshplan.serve.engine import load_engine
from meshplan.serve.search import search
from meshplan.serve.space import ServeSpace
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

pytest.importorskip("jinja2")
pytest.importorskip("vl_convert")

from meshplan.report import serve_charts, serve_space, serve_trust  # noqa: E402
from meshplan.report.page import asset  # noqa: E402
from meshplan.report.ranked_serving import serving_cells  # noqa: E402
from meshplan.report.serve_html import render_serving  # noqa: E402
from meshplan.report.vega import bundle  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ["plans", "curves", "space", "memory", "step", "trust", "rejected"]


def data_of(page: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="meshplan-data">(.*?)</script>', page,
                                re.S).group(1))


class Links(HTMLParser):
    """Every src / href attribute of a page (script text is not parsed as HTML)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found += [v or "" for k, v in attrs if k in ("src", "href")]


def options(page: str, select: str) -> list[str]:
    menu = re.search(rf'<select id="{select}">(.*?)</select>', page, re.S).group(1)
    return re.findall(r'<option value="([^"]+)"', menu)


@pytest.fixture(scope="module")
def result():
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(16)
    space = ServeSpace(input_len=1024, output_len=256, ttft_slo=1.0, tpot_slo=0.05)
    return search(model, cluster, space, top_k=6, keep=True)


@pytest.fixture(scope="module")
def page(result) -> str:
    return render_serving(result, price=2.5)


def test_one_self_contained_page_on_the_shared_skeleton(page):
    assert page.startswith("<!DOCTYPE html>") and page.count("<section ") == len(SECTIONS)
    assert re.findall(r'<section id="([a-z]+)"', page) == SECTIONS
    # the training report's stylesheet and the Vega runtime, inlined; nothing fetched
    assert asset("report.css") in page and bundle()[:2000] in page
    links = Links()
    links.feed(page)
    assert links.found and all(link.startswith("#") for link in links.found)  # in-page anchors only
    assert "meshplan serving report: llama3-70b on 16 × H100" in page
    assert 0.9e6 < len(page.encode()) < 3e6  # the runtime (about 0.9 MB) and the data; a page that can be mailed


def test_the_table_is_the_terminals(result, page):
    for e in result.plans:
        for value in serving_cells(e, 2.5).values():
            assert f">{value}<" in page, value
    assert 'title="time to first token"' in page  # each column explained in its header's tooltip


def test_the_curves_pass_through_each_configurations_own_figures(result, page):
    charts = data_of(page)["charts"]
    rows = charts["curve-tpot"]["data"]["values"]
    own = [r for r in rows if r["own"]]
    assert own and len({r["config"] for r in rows}) == len(own) <= 4
    for r in own:  # the configuration the curve was drawn for, at its own batch: the estimate's figures
        e = next(e for e in result.plans if e.plan.with_(batch=1).describe().replace(" batch=1", "") == r["config"])
        assert r["batch"] == e.plan.batch and r["fits"] == "fits"
        assert r["tpot"] == pytest.approx(e.metrics.tpot * 1e3, rel=1e-9)
        assert r["per_gpu"] == pytest.approx(e.tokens_per_s_per_gpu, rel=1e-9)
    # the targets as dashed rules, in ms: 50 ms and 1 s
    rules = [layer["data"]["values"][0]["x"] for key in ("curve-tpot", "curve-ttft")
             for layer in charts[key]["layer"] if layer["mark"].get("type") == "rule"]
    assert rules == [50.0, 1000.0]
    # over the batches that fit, tokens/s per GPU rises with the batch (the weights read once for more sequences)
    for config in {r["config"] for r in rows}:
        rates = [r["per_gpu"] for r in sorted(rows, key=lambda r: r["batch"]) if r["config"] == config
                 and r["fits"] == "fits"]
        assert rates[-1] > 10 * rates[0]


def test_the_configuration_space_holds_every_priced_configuration_and_its_front(result, page):
    space = data_of(page)["serve_space"]
    cols, vocab = space["columns"], space["columns"]["vocab"]
    w = result.weighed
    priced = serve_space.drawable(w)
    assert len(cols["tp"]) == len(priced)  # below the sample size: all of them
    verdicts = [vocab["verdict"][v] for v in cols["verdict"]]
    assert verdicts.count("fits") == result.feasible
    assert set(verdicts) <= {"fits", *serve_space.REJECTED.values()}
    assert len(w) - len(priced) == sum(n for r, n in result.rejected.items()
                                       if r not in (check.MEMORY, check.TTFT, check.TPOT))
    # the TPOT front: fitting, and no fitting configuration is at least as fast with more tokens/s per GPU
    fits = np.array(verdicts) == "fits"
    tpot, rate = np.array(cols["tpot"]), np.array(cols["per_gpu"])
    on = (np.array(cols["front"]) & 1) > 0
    assert on.any() and np.all(fits[on])
    for i in np.flatnonzero(on):
        assert not np.any(fits & (tpot <= tpot[i]) & (rate > rate[i]))
    assert max(rate[fits]) == pytest.approx(rate[on].max())
    assert options(page, "serve-colour") == ["tp", "pp", "pools", "quant", "batch"]  # a dense model: no dpa, ep
    assert options(page, "serve-x") == ["tpot", "ttft", "e2e"]


def test_a_sample_keeps_every_front(result):
    rows, bits = serve_space.pick(result.weighed, 300)
    full_rows, full_bits = serve_space.pick(result.weighed, 10**9)
    assert len(rows) == 300 and len(full_rows) > 300
    assert set(rows[bits > 0]) == set(full_rows[full_bits > 0])
    assert np.all(np.diff(rows) > 0) and np.array_equal(rows, serve_space.pick(result.weighed, 300)[0])  # seeded


def test_memory_and_the_decode_step_add_up(result):
    for e in result.plans:
        parts = serve_charts.memory_parts(e)
        # vLLM takes 90 % of the total HBM: weights + activations + workspace + the KV pool fill that share
        assert sum(parts.values()) == pytest.approx(float(e.memory.capacity), rel=1e-9)
        assert parts["KV cache of the batch"] + parts["KV pool left free"] == pytest.approx(float(e.memory.kv_pool))
        # every op of the step has its kind; at the full batch (no admission limit) the step is the model's own
        assert sum(serve_charts.step_kinds(e).values()) == pytest.approx(sum(e.breakdown.values()), rel=1e-12)
        if e.metrics.running == e.plan.batch:
            assert sum(e.breakdown.values()) == pytest.approx(e.metrics.decode_step, rel=1e-9)
        assert serve_charts.step_kinds(e)["gemm"] > 0 and serve_charts.step_kinds(e)["attention"] > 0


def test_the_trust_note_quotes_the_generations_errors(result, page):
    """Hopper's row of docs/ACCURACY_INFERENCE.md ("Per GPU generation") is what the note says."""
    doc = (ROOT / "docs" / "ACCURACY_INFERENCE.md").read_text()
    runs, median, p90 = re.search(r"^\| Hopper \| (\d+) \| ([\d.]+) % \| ([\d.]+) % \|$", doc, re.M).groups()
    assert f"predicted the throughput of {runs} published runs with a median |error| of {median} % and a p90 of " \
           f"{p90} %" in page.replace("&#39;", "'")
    entry = serve_trust.errors()["architectures"]["hopper"]
    p = result.plans[0].metrics.tokens_per_s  # measured = predicted / (1 + e), |e| ≤ p90
    text = serve_trust.likely(result.plans[0], entry)
    assert f"between {serve_charts.fmt_count(p / (1 + entry['p90']))} and " \
           f"{serve_charts.fmt_count(p / (1 - entry['p90']))}" in text


def test_a_generation_without_runs_falls_back_to_every_run():
    text, entry = serve_trust.headline("volta")
    every = serve_trust.errors()["overall"]
    assert entry is None and "No published serving run on volta GPUs" in text and f"{every['runs']:,} runs" in text


def test_a_moe_search_offers_its_axes_and_the_ep_column():
    model, cluster = load_model("mixtral-8x7b"), load_system("a100").cluster(8)
    space = ServeSpace(input_len=512, output_len=128, tpot_slo=0.1, engine=load_engine("trtllm"))
    page = render_serving(search(model, cluster, space, top_k=3, keep=True))
    assert options(page, "serve-colour") == ["tp", "pp", "dpa", "ep", "pools", "quant", "batch"]
    assert '<th class="" title="expert-parallel size' in page and "tokens routed uniformly" in page


def test_no_feasible_configuration_is_a_page_with_the_reasons():
    model, cluster = load_model("llama3-70b"), load_system("a100").cluster(2)
    result = search(model, cluster, ServeSpace(input_len=1024, output_len=256, tpot_slo=0.001), keep=True)
    page = render_serving(result)
    assert not result.plans and "No configuration fits and meets the targets" in page
    assert re.findall(r'<section id="([a-z]+)"', page) == ["plans", "space", "trust", "rejected"]
    assert "TPOT above its target" in page
