"""The search tables read at any terminal width: at 80, 100 and 140 columns every step time, MFU and memory is
printed whole, no line is wider than the terminal, nothing is cut to "…", and the legend under each table names
every column header it shows. Error bands and equivalent plans show only when the estimates carry them."""

from __future__ import annotations

import re

import pytest

from meshplan.report.fold import Col, fold, headers, table_width
from meshplan.report.text import plans_tables, rejected_tables, scaling_tables
from meshplan.search import Space, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.stack import load_stack
from meshplan.units import fmt_bytes, fmt_time

WIDTHS = (80, 100, 140)


def _search(model: str, gpus: int, batch: int, stack: str = "megatron-core", top: int = 10):
    cluster = load_system("h100").cluster(gpus)
    space = Space(global_batch=batch, stack=load_stack(stack), headroom=0.09)
    return search(load_model(model), cluster, space, top_k=top)


@pytest.fixture(scope="module")
def dense():  # the quick start: llama3-70b on 1024 H100, Megatron-Core
    return _search("llama3-70b", 1024, 512)


@pytest.fixture(scope="module")
def summa():  # any framework: 2D SUMMA plans lead
    return _search("llama3-70b", 1024, 512, stack="any")


@pytest.fixture(scope="module")
def moe():  # experts: the ep/etp column
    return _search("mixtral-8x22b", 256, 256, top=5)


def render(renderables, width: int) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    for r in renderables:
        console.print(r)
    return console.export_text()


def _legend(renderables) -> str:
    return renderables[-1].plain


def _check_fits(text: str, width: int) -> None:
    assert "…" not in text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width


def _check_whole(text: str, ests) -> None:
    for est in ests:  # each a whole cell: the value between its cell's rules (the step time with its band)
        band = f" ±{est.error_band:.0%}" if getattr(est, "error_band", None) else ""
        for value in (fmt_time(est.step_time) + band, f"{est.mfu:.1%}", fmt_bytes(est.peak_memory)):
            assert f" {value} │" in text, value


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("which", ["dense", "summa", "moe"])
def test_plans_table_fits_and_prints_every_number_whole(which, width, request):
    result = request.getfixturevalue(which)
    assert result.plans
    for tokens, price in ((None, None), (15e12, 2.5)):
        out = plans_tables(result, tokens, price, width)
        text = render(out, width)
        _check_fits(text, width)
        _check_whole(text, result.plans)
        for i in range(1, len(result.plans) + 1):  # every rank once in each folded table (≈: an equivalent)
            assert len(re.findall(rf"^│ +{i}≈? │", text, re.M)) == len(out) - 1
        legend = _legend(out)
        assert legend.startswith("legend: ")
        for header in headers(out[:-1]):
            assert f"{header}: " in legend, header
        assert "GiB" in legend and "2^30" in legend  # byte units explained


def test_wide_terminals_keep_one_table_and_narrow_ones_fold(dense):
    assert len(plans_tables(dense, None, None, 140)) == 2  # one table and its legend
    folded = plans_tables(dense, None, None, 80)
    assert len(folded) >= 3
    first = [c.header for c in folded[0].columns]
    assert first[:2] == ["#", "dp·tp·pp·cp"] and {"step", "MFU", "memory"} <= set(first)  # the numbers first


def test_the_legend_explains_the_notations_shown(summa, moe, dense):
    legend = _legend(plans_tables(summa, None, None, 100))
    assert any(e.plan.tensor_layout == "summa" for e in summa.plans) and "SUMMA" in legend
    assert "ep/etp: " in _legend(plans_tables(moe, None, None, 100))
    dense_legend = _legend(plans_tables(dense, None, None, 100))
    assert "ep/etp" not in dense_legend and "SUMMA" not in dense_legend
    assert "in NVLink: " in dense_legend and "8 GPUs" in dense_legend
    assert "±" in dense_legend and "≈" in dense_legend  # the error band and the equivalents


@pytest.mark.parametrize("width", WIDTHS)
def test_error_bands_and_equivalents_show(dense, width):
    """Each step time with its band (hopper, dense: about 8 %); the plans within the best one's band marked ≈
    (SearchResult.equivalent), the best itself not."""
    out = plans_tables(dense, None, None, width)
    text = render(out, width)
    _check_fits(text, width)
    for est in dense.plans:
        assert f" {fmt_time(est.step_time)} ±{est.error_band:.0%} │" in text
    for rank, same in enumerate(dense.equivalent, 1):
        if rank > 1:
            assert (re.search(rf"^│ +{rank}≈ │", text, re.M) is not None) == same
    assert not re.search(r"^│ +1≈ │", text, re.M)
    legend = _legend(out)
    assert f"±{dense.plans[0].error_band:.0%}: " in legend and "≈: " in legend  # the rows' band (was a literal ±7%)


@pytest.mark.parametrize("width", WIDTHS)
def test_scaling_table_fits(width):
    results = [_search("llama3-8b", n, 512, top=1) for n in (8, 64, 512)]
    for tokens, price in ((None, None), (15e12, 2.5)):
        out = scaling_tables(results, tokens, price, width)
        text = render(out, width)
        _check_fits(text, width)
        _check_whole(text, [r.plans[0] for r in results])
        for header in headers(out[:-1]):
            assert f"{header}: " in _legend(out)


@pytest.mark.parametrize("width", WIDTHS)
def test_rejected_table_fits_and_explains_its_reasons(dense, width):
    out = rejected_tables(dense, width)
    text = render(out, width)
    _check_fits(text, width)
    for count in dense.rejected.values():
        assert f" {count:,} │" in text
    legend = _legend(out)
    for header in ("reason", "plans", "for example"):
        assert f"{header}: " in legend
    assert "headroom: " in legend  # "memory within the 9% headroom" is one of the reasons


def test_gpipe_plans_counted_as_dominated_are_explained():
    cluster = load_system("h100").cluster(64)
    result = search(load_model("llama3-8b"), cluster, Space(global_batch=64, stack=load_stack("any")), top_k=1)
    assert any("dominated: GPipe" in r for r in result.rejected)
    assert "dominated: GPipe: " in _legend(rejected_tables(result, 80))


def test_fold_packs_the_first_columns_first_and_keeps_their_order():
    key = Col("#", ["1"])
    cols = [Col(h, ["x" * 20]) for h in ("a", "b", "c", "d")]
    # each column 20 + 3 (a space either side, the rule after it), the key 1 + 3, the first rule 1: 4 + 92 + 1 = 97
    assert table_width([key, *cols]) == 97
    assert fold(key, cols, 97) == [[key, *cols]]
    groups = fold(key, cols, 60, first=("d", "b"))
    assert [[c.header for c in g] for g in groups] == [["#", "b", "d"], ["#", "a", "c"]]


def test_the_command_line_honours_columns(monkeypatch, capsys):
    from meshplan.cli import main

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", "--model", "llama3-70b", "--system", "h100", "--gpus", "1024", "--global-batch", "512"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if not ln.startswith("re-run it: ")]  # a command line, kept whole to copy
    assert "…" not in out and max(len(ln.rstrip()) for ln in lines) <= 80
    assert "legend: " in out
    # the legend says how the rows are ordered (the fastest first, then its band's plans, simplest first); #1 here
    # (dp=64 tp=4 pp=4 vpp=20, 4.23 s) is as simple as any plan of its band (3 of the parallel axes, offloads and
    # recompute), so no line names a simpler one
    flat = " ".join(out.split())
    assert "#: rank: the fastest plan first, then the others within its ranking band, the simplest first" in flat
    assert "#: rank, fastest first" not in flat and "fastest plan found" not in flat
    assert "is the simplest plan within" not in flat
    assert "64 --tp 4 --pp 4 --vpp 20" in flat  # #1's re-run line (wrapped after --dp)
    # on 1024 H200s a line names the simplest of the band, which is not #1 there (#1 4 of the axes, offloads and
    # recompute; #2 3, 6.7 % slower), in the same width
    assert main(["plan", "--model", "llama3-70b", "--system", "h200", "--gpus", "1024", "--global-batch", "512"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if not ln.startswith("re-run it: ")]
    assert "…" not in out and max(len(ln.rstrip()) for ln in lines) <= 80
    assert "#2 is the simplest plan within #1's ranking band (3 of the parallel axes, offloads and recompute " \
           "against 4), 6.7% slower" in " ".join(out.split())


def test_counts_move_to_the_next_unit_when_they_round_up_to_it():
    from meshplan.units import fmt_count

    # 999,600 rounds to 1.00e6 at three digits: "1 M", never "1e+03 k"
    assert (fmt_count(999_600), fmt_count(999.6), fmt_count(1234), fmt_count(8.03e9)) == ("1 M", "1 k", "1.23 k",
                                                                                           "8.03 B")


def test_a_three_tier_mesh_shows_where_each_axis_lands():
    """On Meta's Llama 3 cluster (4,096 GPUs are 8 x 256 x 2: NVLink, 3,072-GPU pods, the 1:7 aggregation layer),
    tp=8 stays in NVLink, dp=256 (8 x 256 = 2,048 GPUs) inside a pod, pp=2 crosses the aggregation layer: one column
    per tier but the outermost, in the terminal and in the HTML report, and the legend gives each block's size."""
    from meshplan.estimate import estimate
    from meshplan.report.sections import plans_section
    from meshplan.report.text import estimate_tables
    from meshplan.report.tiers import mesh_text, tier_axes, tier_blocks, tier_headers
    from meshplan.specs.plan import Plan

    cluster = load_system("h100-meta-24k").cluster(4096)
    model = load_model("llama3-70b")
    est = estimate(model, cluster, Plan(tp=8, dp=256, pp=2, global_batch=512, sequence_parallel=True))
    assert tier_headers(cluster) == ["in NVLink", "in pod"] and tier_axes(est) == ["tp=8", "dp=256"]
    assert tier_blocks(cluster) == {"in NVLink": 8, "in pod": 2048}
    assert mesh_text(cluster, " x ") == "8 x 256 x 2 (nvlink, pod, aggregation)"
    assert mesh_text(load_system("h100").cluster(4096), " x ") == "8 x 512"  # two tiers: as before
    result = search(model, cluster, Space(global_batch=512, stack=load_stack("megatron-core")), top_k=3)
    legend = _legend(plans_tables(result, None, None, 140))
    assert "in NVLink: parallel groups inside one NVLink domain of 8 GPUs" in legend
    assert "in pod: parallel groups inside one pod block of 2,048 GPUs, not inside one of the tier below" in legend
    assert "in pod" in render(plans_tables(result, None, None, 80), 80)  # folded, still there
    from meshplan.report.ranked_training import from_training

    section = plans_section(from_training(result))  # the HTML report's table: the terminal's columns
    header = section.context["header"]
    assert header == headers(plans_tables(result, None, None, 1000)[:-1])
    tiers = [header.index("in NVLink"), header.index("in pod")]
    assert tiers[1] == tiers[0] + 1 and set(tiers) <= set(section.context["left"])
    assert section.context["titles"][tiers[1]].startswith("parallel groups inside one pod block of 2,048 GPUs")
    from rich.console import Console

    console = Console(width=160, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    estimate_tables(est, console)
    assert "mesh 8 x 256 x 2 (nvlink, pod, aggregation)" in console.export_text()


def test_a_plan_with_a_lighter_last_stage_shows_it(monkeypatch, capsys):
    """Two rows that differ only in last_stage_layers would look identical: a 'last' column appears when a plan
    sets it (llama3-8b on 16 H100: 4 stages of 32 layers, the last holding 5 and the others 9, 3 x 9 + 5 = 32)."""
    from meshplan.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "16", "--top", "5"]) == 0
    out = capsys.readouterr().out
    header = next(ln for ln in out.splitlines() if "dp·tp·pp·cp" in ln)
    assert "last" in header
    rows = [ln for ln in out.splitlines() if "·4·1 " in ln and "│" in ln]  # pp = 4 rows
    assert rows and all(" 5 " in ln.split("│")[4] for ln in rows)
