"""Pictures and the HTML report: the figures hold what they claim (bars per component, a roof above every
op, the simulated pipeline equal to the estimate), the report is self-contained, and a real browser renders
every chart of it without a console error."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import gpt
from meshplan.cli import main
from meshplan.errors import MissingDependency
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.units import GiB

pytest.importorskip("matplotlib")

pytest.importorskip("jinja2")
pytest.importorskip("vl_convert")

from meshplan.report import charts, plots, sweep_plots  # noqa: E402
from meshplan.report.html import render  # noqa: E402

PIPELINE = ("compute", "recompute", "tp", "cp", "ep", "pp", "host", "bubble")  # the host: its wait in each pass


@pytest.fixture(scope="module")
def cluster():
    return load_system("h100").cluster(16)


@pytest.fixture(scope="module")
def est_1f1b(cluster):
    # m = 16 / (2 x 1) = 8 micro-batches over pp = 4 ranks
    plan = Plan(dp=2, tp=2, pp=4, global_batch=16, sequence_parallel=True, recompute="selective", zero=1)
    return estimate(gpt(layers=8), cluster, plan)


@pytest.fixture(scope="module")
def est_interleaved(cluster):
    plan = Plan(dp=2, tp=2, pp=4, vpp=2, global_batch=16, sequence_parallel=True, zero=1, schedule="interleaved")
    return estimate(gpt(layers=8), cluster, plan)


@pytest.fixture(scope="module")
def result(cluster):
    return search(gpt(layers=8), cluster, Space(global_batch=32, all_placements=False), top_k=4)


def _rows() -> list[dict]:
    """Synthetic sweep rows: two systems x two NVLink sizes x three GPU counts, one infeasible point."""
    rows = []
    for system in ("a100", "h100"):
        for nvl in (4, 8):
            for gpus in (8, 16, 32):
                ok = not (system == "a100" and gpus == 8 and nvl == 4)
                rows.append({"model": "m", "system": system, "nvlink_domain": nvl, "gpus": gpus, "global_batch": 64,
                             "param": "none", "factor": 1.0, "value": None, "feasible": ok,
                             "tokens_per_s": gpus * nvl * 1e3 if ok else None, "mfu": 0.4 if ok else None,
                             "tokens_per_s_per_gpu": nvl * 1e3 if ok else None, "plan": f"dp={gpus}" if ok else None,
                             "step_time_s": 1.0 if ok else None, "peak_memory_bytes": 40 * GiB if ok else None})
    return rows


# ---- figures ---------------------------------------------------------------------------------------------------------
def test_breakdown_has_one_stacked_bar_per_plan_and_component(est_1f1b, est_interleaved):
    ests = [est_1f1b, est_interleaved]
    fig = plots.breakdown_figure(ests)
    ax = fig.axes[0]
    shown = [c for c in plots.COMPONENT_COLORS if any(e.breakdown[c] > 0 for e in ests)]
    assert [c.get_label() for c in ax.containers] == shown
    assert all(len(c.patches) == 2 for c in ax.containers)
    for i, e in enumerate(ests):  # the bars of a plan add up to its step time (in seconds or ms)
        total = sum(c.patches[i].get_width() for c in ax.containers)
        unit = 1e3 if max(x.step_time for x in ests) < 1 else 1.0
        assert math.isclose(total, e.step_time * unit, rel_tol=1e-9)


def test_memory_bars_and_the_hbm_line(est_1f1b):
    fig = plots.memory_figure([est_1f1b])
    ax = fig.axes[0]
    assert [c.get_label() for c in ax.containers] == [k for k, v in est_1f1b.memory.items() if v > 0]
    top = sum(c.patches[0].get_height() for c in ax.containers)
    assert math.isclose(top, est_1f1b.peak_memory / GiB, rel_tol=1e-9)
    (hbm,) = [line for line in ax.lines if line.get_label().startswith("HBM")]
    assert hbm.get_ydata()[0] == est_1f1b.cluster.accelerator.hbm_bytes / GiB


def test_timeline_equals_the_estimate_and_shows_the_bubble(est_1f1b):
    run = plots.pipeline_run(est_1f1b)
    p, m = 4, 8
    assert (run.schedule, run.pp, run.micro_batches) == ("1f1b", p, m)
    # the simulated step is the estimate's pipelined part; each rank simulated with its own times: the last
    # (LM head) is the busiest and never idles between its first forward and its last backward
    assert math.isclose(run.timeline.step_time, sum(est_1f1b.breakdown[k] for k in PIPELINE), rel_tol=1e-9)
    assert run.t_fwd[0] > run.t_fwd[1] == run.t_fwd[2] < run.t_fwd[3]
    assert math.isclose(run.timeline.busy[-1], max(run.timeline.busy), rel_tol=1e-12)
    idle = run.idle()
    assert all(len(gaps) > 0 for gaps in idle)
    for r in range(p):  # busy + idle = step on every rank
        busy = sum(e - s for s, e in zip(run.timeline.starts[r], run.timeline.ends[r], strict=True))
        assert math.isclose(busy + sum(w for _, w in idle[r]), run.timeline.step_time, rel_tol=1e-9)
    fig = plots.timeline_figure(est_1f1b)
    ax = fig.axes[0]
    labels = {c.get_label() for c in ax.collections}
    assert {"forward", "backward", "idle (bubble)"} <= labels
    blocks = sum(len(c.get_paths()) for c in ax.collections if not c.get_hatch())
    assert blocks == 2 * m * p  # one block per forward and backward per rank
    hatched = [c for c in ax.collections if c.get_hatch()]
    assert sum(len(c.get_paths()) for c in hatched) == sum(len(g) for g in idle)
    assert len(ax.texts) == 2 * m * p  # micro-batch numbers are written where they fit: here in every block


def test_interleaved_timeline(est_interleaved):
    run = plots.pipeline_run(est_interleaved)
    p, v, m = 4, 2, 8
    assert (run.schedule, run.vpp) == ("interleaved", v)
    assert math.isclose(run.timeline.step_time, sum(est_interleaved.breakdown[k] for k in PIPELINE), rel_tol=1e-9)
    # bubble: the other ranks' times once, over v (bubble.flow_bubble); below (p-1)/(v·m) of the ideal time
    # (Narayanan et al. 2021, equal ranks) because only the last rank carries the LM head
    assert math.isclose(run.timeline.bubble_time, est_interleaved.breakdown["bubble"], rel_tol=1e-9)
    assert run.timeline.bubble_fraction < (p - 1) / (v * m)
    labels = {c.get_label() for c in plots.timeline_figure(est_interleaved).axes[0].collections}
    assert {"forward chunk 0", "forward chunk 1", "backward chunk 1", "idle (bubble)"} <= labels


def test_roofline_points_sit_under_their_roof(est_1f1b):
    acc = est_1f1b.cluster.accelerator
    points = plots.roofline_points(est_1f1b)
    compute_ops = [o for o in est_1f1b.ops if o.kind != "collective" and o.flops > 0 and o.nbytes > 0]
    assert len(points) == len(compute_ops) > 10
    for p in points:
        peak = {"gemm": acc.flops("bf16"), "attention": acc.half_flops}.get(p.kind, acc.peak_flops["fp32"])
        assert p.achieved <= min(peak, p.intensity * acc.hbm_bandwidth) * (1 + 1e-9), p
    assert {p.kind for p in points} == {"gemm", "attention", "memory"}
    gemms = [p for p in points if p.kind == "gemm"]
    assert max(p.intensity for p in gemms) > acc.flops("bf16") / acc.hbm_bandwidth  # compute-bound GEMMs exist
    ax = plots.roofline_figure(est_1f1b).axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.lines[0].get_label().startswith("roof: bf16")
    roof = ax.lines[0].get_ydata()
    assert max(roof) == pytest.approx(acc.flops("bf16"))
    assert {c.get_label() for c in ax.collections} == {"gemm ops", "attention ops", "memory ops"}
    assert sum(len(c.get_offsets()) for c in ax.collections) == len(points)


def test_scaling_and_param_figures_from_rows():
    rows = _rows()
    fig = sweep_plots.scaling_figure(rows)
    left, right = fig.axes
    curves = [line for line in left.lines if line.get_label() != "linear"]
    assert sorted(line.get_label() for line in curves) == ["a100 NVL4", "a100 NVL8", "h100 NVL4", "h100 NVL8"]
    (a100_4,) = [line for line in curves if line.get_label() == "a100 NVL4"]
    assert list(a100_4.get_xdata()) == [16, 32]  # the infeasible point is left out
    assert len(right.lines) == 4 and left.get_xscale() == "log"
    param_rows = [dict(r, param="hbm_bandwidth", factor=f) for r in rows if r["nvlink_domain"] == 8
                  for f in (0.5, 1.0, 2.0)]
    pfig = sweep_plots.param_figure(param_rows, "hbm_bandwidth")
    assert len(pfig.axes) == 3  # one panel per GPU count
    assert all(len([ln for ln in ax.lines if ln.get_label() != "_child"]) >= 2 for ax in pfig.axes)
    assert set(sweep_plots.sweep_figures(rows + param_rows)) == {"scaling", "param-hbm_bandwidth"}


def test_save_png_and_svg(est_1f1b, tmp_path):
    fig = plots.breakdown_figure([est_1f1b])
    png = plots.save(fig, tmp_path / "b.png")
    svg = plots.save(fig, tmp_path / "b.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in svg.read_text()
    assert plots.svg_text(fig) == plots.svg_text(fig)  # stable output


def test_missing_matplotlib_names_the_extra(est_1f1b, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(MissingDependency, match=r"pip install 'meshplan\[plot\]'"):
        plots.breakdown_figure([est_1f1b])


# ---- HTML ----------------------------------------------------------------------------------------------------------
CHARTS = ("compare-breakdown", "compare-memory", "compare-timeline-a", "compare-timeline-b", "breakdown", "delta",
          "memory", "timeline", "roofline", "scaling-throughput", "scaling-mfu")


@pytest.fixture(scope="module")
def page(result) -> str:
    return render(result, _rows())


class _Links(HTMLParser):
    """Every src / href attribute of a page and every element id (script text is not parsed as HTML)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.links += [v or "" for k, v in attrs if k in ("src", "href")]
        self.ids += [v or "" for k, v in attrs if k == "id"]


def test_report_is_self_contained(page):
    assert page.startswith("<!DOCTYPE html>")
    parsed = _Links()
    parsed.feed(page)
    assert parsed.links and all(link.startswith("#") for link in parsed.links)  # in-page anchors only
    assert len(parsed.ids) == len(set(parsed.ids))
    assert not parsed.tags & {"link", "iframe", "img", "object", "embed", "frame"}
    style = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    assert not re.search(r"@import|@font-face|url\(", style)
    assert '"Segoe UI"' in style and "&#34;" not in style  # a stylesheet is raw text: escaped, a rule would drop
    assert 500_000 < len(page.encode()) < 3_000_000  # the charts' runtime (~0.9 MB) and the data
    for key in CHARTS:
        assert f'data-chart="{key}"' in page
    data = json.loads(re.search(r'<script type="application/json" id="meshplan-data">(.*?)</script>', page,
                                re.S).group(1))
    assert sorted(data["charts"]) == sorted(CHARTS)
    for spec in data["charts"].values():  # every chart labels its axes
        titles = [enc[a].get("title") for layer in spec.get("layer", [spec]) for enc in [layer.get("encoding", {})]
                  for a in ("x", "y") if a in enc and "field" in enc[a]]
        assert any(titles), spec.get("title")


def test_report_escapes_what_it_prints(result):
    """The templates autoescape: a model name with markup in it is printed as text."""
    evil = replace(result, model=replace(result.model, name="<script>alert(1)</script>"))
    text = render(evil)
    assert "<script>alert(1)" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_report_tables(page, result):
    assert page.count('<tr class="best">') == 1
    assert result.plans[0].plan.describe() in page
    assert "Rejected plans" in page and "Strong scaling" in page


def test_a_summa_plan_shows_no_context_parallel_time():
    """Issue 40: the report showed "cp 50.5 ms" for a 2D SUMMA plan with cp = 1 (its K/V exchange across tp2)."""
    plan = Plan(dp=8, tp=4, tp2=2, cp=1, tensor_layout="summa", global_batch=64, zero=1, recompute="none")
    est = estimate(load_model("llama3-70b"), load_system("h100").cluster(64), plan)
    rows = charts.breakdown_rows([est], ["#1"], 1.0)
    assert {r["component"] for r in rows} == {"compute", "tp", "dp", "optimizer"}
    assert "cp" not in {r["component"] for r in charts.delta_chart([est, est], ["#1", "#2"])["layer"][0]["data"]
                        ["values"]}


def test_scaling_picture_leaves_room_above_the_mfu_curve():
    """Issue 40: the MFU line sat on its frame's top edge."""
    right = sweep_plots.scaling_figure(_rows()).axes[1]
    assert right.get_ylim()[1] >= 1.15 * max(max(line.get_ydata()) for line in right.lines)


def test_delta_chart_shows_what_the_plans_differ_in(result):
    """Plan #2's bars in the difference chart add up to its step time minus plan #1's."""
    plans = list(result.plans[:4])
    spec = charts.delta_chart(plans, [f"#{i}" for i in range(1, 5)])
    rows = spec["layer"][0]["data"]["values"]
    unit = 1e3 if spec["layer"][0]["encoding"]["x"]["title"].endswith("(ms)") else 1.0
    for i, est in enumerate(plans[1:], 2):
        total = sum(r["value"] for r in rows if r["plan"].startswith(f"#{i} "))
        assert math.isclose(total, (est.step_time - plans[0].step_time) * unit, rel_tol=1e-6, abs_tol=1e-9)


def test_report_command(tmp_path, capsys):
    out = tmp_path / "r.html"
    code = main(["report", "--model", "gpt2", "--system", "h100", "--gpus", "16", "--global-batch", "64",
                 "--placements", "default", "--no-offload", "--workers", "1", "--scaling", "8,16,32", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    text = out.read_text()
    assert all(f'data-chart="{k}"' in text for k in CHARTS)
    assert "scaling over 8, 16, 32 GPUs" in capsys.readouterr().out


def test_report_command_with_your_config_and_the_plan_space(tmp_path, capsys):
    """--from reads the user's own Megatron-LM arguments (configs/), --compare opens the comparison on it and the best
    plan, --sample draws the plan space."""
    from meshplan.configs import emit
    from meshplan.specs.model_load import load_model
    from meshplan.specs.stack import load_stack

    config = tmp_path / "args.txt"
    config.write_text(emit("megatron", load_model("gpt2"), Plan(dp=8, tp=2, global_batch=64, zero=1), load_stack(
        "megatron-core")))
    out = tmp_path / "r.html"
    args = ["report", "--model", "gpt2", "--system", "h100", "--gpus", "16", "--global-batch", "64", "--placements",
            "default", "--no-offload", "--workers", "1", "--scaling", "none", "-o", str(out)]
    code = main([*args, "--from", str(config), "--compare", "mine,#1", "--sample", "400"])
    assert code == 0, capsys.readouterr().err
    text = out.read_text()
    assert "400 in the plan space" in capsys.readouterr().out
    assert 'data-chart="space"' in text and "your config: dp=8 tp=2" in text
    data = json.loads(re.search(r'id="meshplan-data">(.*?)</script>', text, re.S).group(1))
    mine = next(p for p in data["plans"] if p["origin"] == "your config")
    best = next(p for p in data["plans"] if p["origin"].startswith("#1"))
    assert data["compare"]["pair"] == [mine["id"], best["id"]]
    assert len(data["space"]["columns"]["time"]) == 400
    for bad, message in ((["--compare", "mine,#1"], "compare='mine,#1': 'mine' is the plan of --from, which is not"),
                         (["--compare", "#1,#99"], "compare='#1,#99' must name two of"),
                         (["--sample", "-1"], "sample=-1 must be from 0")):
        code = main([*args, *bad])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_report_command_without_the_report_extra(tmp_path, capsys, monkeypatch):
    """A missing Jinja2 or vl-convert-python: one line with the install command, before any search."""
    monkeypatch.setitem(sys.modules, "vl_convert", None)
    code = main(["report", "--model", "gpt2", "--system", "h100", "--gpus", "8", "--scaling", "none",
                 "-o", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'meshplan[report]'" in err and len(err.strip().splitlines()) == 1


def test_report_command_bad_input(tmp_path, capsys):
    code = main(["report", "--model", "gpt2", "--system", "h100", "--gpus", "16", "--scaling", "8,x",
                 "-o", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert code == 2 and "scaling='8,x' must be integers" in err and len(err.strip().splitlines()) == 1
    base = ["report", "--model", "gpt2", "--system", "h100", "--gpus", "8", "--scaling", "none"]
    for extra, message in ((["-o", str(tmp_path / "no" / "r.html")], "does not exist"),
                           (["-o", str(tmp_path / "r.html"), "--workers", "0"], "workers=0 must be a positive")):
        code = main([*base, *extra])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_help_stays_light():
    code = ("import sys; from meshplan.cli import main; main(['--help']); "
            "print(sorted(m for m in ('matplotlib', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_docs_pictures_exist():
    docs = Path(__file__).resolve().parents[1] / "docs"
    text = (docs / "REPORTS.md").read_text()
    for name in re.findall(r"\(img/([^)]+\.png)\)", text):
        assert (docs / "img" / name).is_file(), name
