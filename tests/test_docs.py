"""Generated documents cannot go stale: each is made again here and compared with the committed file.

Text documents (Markdown, JSON, CSV) must be byte-identical to what their script writes now; a failure names the
command that regenerates them. Pictures are not compared pixel by pixel, as matplotlib and Chromium draw a little
differently from version to version: each PNG records instead the SHA-256 of what it was drawn from (a PNG text
chunk, 'meshplan-inputs'), and the tests compare that with the committed data it was drawn from or with a fresh
run's. That catches a picture drawn from other numbers than the current ones (a stale picture, or a merge that kept
one side's picture and the other side's data); it does not catch a change in how a picture is drawn (styling,
labels, the drawing code), nor look at its pixels.

The two sweeps behind docs/*.csv take longer than this file should (tens of seconds each): their quick check re-runs
a subset of their points (QUICK: every system at the smallest GPU count, with NVLink 4 and 64 for the scaling sweep
and one factor of both parameters for the what-if sweep) and compares those rows and the header byte for byte. Each
row is an independent search, so a subset's rows are the full run's rows; a change that moved only the other rows
would pass here.
MESHPLAN_DOCS_FULL=1 re-runs every point. docs/REPORTS.md is written by hand; the figures it quotes from
benchmarks/docs/screenshots.py's output are checked here too (docs/USAGE.md and HISTORY.md, also written by hand, by
tests/test_readme.py). Every file under docs/ is either checked here or listed as written by hand
(test_every_document_is_covered).
"""

from __future__ import annotations

import copy
import csv
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from published_helpers import validation_of

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FULL = os.environ.get("MESHPLAN_DOCS_FULL") == "1"
# USAGE.md and HISTORY.md: checked by tests/test_readme.py; SERVING.md's figures by test_serving_quotes_...
HANDWRITTEN = {"REPORTS.md", "USAGE.md", "HISTORY.md", "SERVING.md", "MEASURE.md"}
SCREENSHOTS = "python benchmarks/docs/screenshots.py  (about a minute; writes docs/img/*.png and both CSVs)"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_{name}", next(ROOT.glob(f"benchmarks/*/{name}.py")))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass of the script looks its module up there
    spec.loader.exec_module(module)
    return module


shots = _script("screenshots")
accuracy = _script("accuracy")
QUICK = {  # the subset of each sweep's points the quick check re-runs (every system; both parameters)
    shots.SCALING_CSV: (shots.SCALING, {"--nvlink": "4,64", "--gpus": "1024"}),
    shots.WHATIF_CSV: (shots.PARAMS, {"--gpus": "512", "--factors": "0.25"}),
}
POINT = ("system", "nvlink_domain", "gpus", "param", "factor")  # what tells a sweep's rows apart
GENERATED = {"ACCURACY.md", "accuracy_summary.json", "accuracy.png", "out_of_source.json", "INDEPENDENT.md",
             "independent_summary.json", "ACCURACY_INFERENCE.md", "ACCURACY_RL.md", "AUTOSHARD.md",
             "STRATEGIES.md", *QUICK, "img/report.png", "img/plan-space.png", "img/compare.png", "img/trust.png",
             "img/serve.png", "img/serve-space.png", "img/breakdown.png", "img/memory.png", "img/roofline.png",
             "img/timeline.png", "img/scaling.png", "img/param-hbm_bandwidth.png", "img/param-nic_bandwidth.png",
             "MEASURED.md", "MEASURED_GPU.md", "SMALL_WORK_GPU.md", "DECODE_GPU.md", "GEMM_GPU.md",
             "SPEED.md", "ARCHITECTURE.md"}


def _first_difference(old: bytes, new: bytes) -> str:
    a, b = old.decode(errors="replace").splitlines(), new.decode(errors="replace").splitlines()
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            at = next((j for j, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
            start = max(0, at - 40)
            return f"line {i + 1}, column {at + 1}: committed {x[start:at + 80]!r}, now {y[start:at + 80]!r}"
    return f"committed {len(a)} lines, now {len(b)}"


def _reports() -> str:
    """docs/REPORTS.md with its line breaks as spaces."""
    return " ".join((DOCS / "REPORTS.md").read_text().split())


def _same(fresh: Path, name: str, command: str) -> None:
    committed = DOCS / name
    if fresh.read_bytes() != committed.read_bytes():
        pytest.fail(f"docs/{name} is stale: regenerate it with `{command}` and commit it "
                    f"({_first_difference(committed.read_bytes(), fresh.read_bytes())})", pytrace=False)


def _same_picture(recorded: str | None, name: str, command: str, drawn_from: str) -> None:
    committed = shots.recorded_inputs(DOCS / name)
    if committed != recorded:
        pytest.fail(f"docs/{name} was not drawn from {drawn_from} (its recorded inputs {committed} are not "
                    f"{recorded}): regenerate it with `{command}` and commit it", pytrace=False)


# ---- the documents of benchmarks/docs/accuracy.py, independent.py and strategies.py ---------------------------------
def _validation_of(records, **options) -> list:
    """The scripts' ``run_validation``, once per process (published_helpers.validation_of; test_published.py and
    test_ranges.py validate the same runs, on this worker): a copy of the results, which a script may change."""
    return copy.deepcopy(list(validation_of(records, **options)))


@pytest.fixture(scope="module")
def accuracy_out(tmp_path_factory):
    pytest.importorskip("matplotlib")
    out, argv, doc = tmp_path_factory.mktemp("accuracy"), sys.argv, sys.modules["accuracy_doc"]
    sys.argv = ["accuracy.py", "--out", str(out)]  # the script reads its command line (records.runs_from_command_line)
    saved, accuracy.run_validation, doc.run_validation = accuracy.run_validation, _validation_of, _validation_of
    try:
        accuracy.main()
    finally:
        sys.argv, accuracy.run_validation, doc.run_validation = argv, saved, saved
    return out


@pytest.mark.parametrize("name", ["ACCURACY.md", "accuracy_summary.json"])
def test_accuracy_documents_are_current(accuracy_out, name):
    _same(accuracy_out / name, name, "python benchmarks/docs/accuracy.py")


def test_the_packaged_error_bands_are_current(tmp_path, monkeypatch):
    """src/meshplan/presets/error_bands.json, which every estimate reads its band from (specs/bands.py), is what
    benchmarks/docs/error_bands.py builds from the committed docs/out_of_source.json (whose own staleness
    tests/test_out_of_source.py checks). Imported by its own name, as out_of_source_doc does: held_out is made once."""
    import error_bands  # noqa: PLC0415  (benchmarks/docs, on sys.path since accuracy.py loaded)
    monkeypatch.setattr(sys, "argv", ["error_bands.py", "--out", str(tmp_path)])
    error_bands.main()
    for packaged in (error_bands.OUT, error_bands.CORE):
        if (tmp_path / packaged.name).read_bytes() != packaged.read_bytes():
            pytest.fail(f"src/meshplan/presets/{packaged.name} is stale: regenerate it with `python "
                        "benchmarks/docs/error_bands.py` and commit it", pytrace=False)


def test_the_packaged_validation_runs_are_current(accuracy_out):
    """src/meshplan/presets/validation_runs.json, the runs the report's trust panel compares a plan with
    (report/trust.py)."""
    if (accuracy_out / accuracy.RUNS.name).read_bytes() != accuracy.RUNS.read_bytes():
        pytest.fail("src/meshplan/presets/validation_runs.json is stale: regenerate it with `python "
                    "benchmarks/docs/accuracy.py` and commit it", pytrace=False)


def test_accuracy_picture_plots_the_current_points(accuracy_out):
    _same_picture(shots.recorded_inputs(accuracy_out / "accuracy.png"), "accuracy.png",
                  "python benchmarks/docs/accuracy.py", "the runs' current predictions")


@pytest.fixture(scope="module")
def independent_out(tmp_path_factory):
    """benchmarks/docs/independent.py's documents written once to a folder (both tests below compare one each)."""
    out, script = tmp_path_factory.mktemp("independent"), _script("independent")
    script.run_validation = _validation_of  # a module of this fixture's own
    script.main(["--out", str(out)])
    return out


@pytest.mark.parametrize("name", ["INDEPENDENT.md", "independent_summary.json"])
def test_independent_documents_are_current(independent_out, name):
    _same(independent_out / name, name, "python benchmarks/docs/independent.py")


@pytest.fixture(scope="module")
def inference_out(tmp_path_factory):
    """Every published serving run predicted again (about 5 s), its documents written to a folder."""
    out = tmp_path_factory.mktemp("accuracy_inference")
    _script("accuracy_inference").main(["--out", str(out)])
    return out


def test_inference_accuracy_document_is_current(inference_out):
    _same(inference_out / "ACCURACY_INFERENCE.md", "ACCURACY_INFERENCE.md", "python "
                                                                            "benchmarks/docs/accuracy_inference.py")


def test_the_packaged_serving_errors_are_current(inference_out):
    """src/meshplan/presets/serving_errors.json, the figures the serving report's trust note quotes
    (report/serve_trust.py)."""
    packaged = ROOT / "src" / "meshplan" / "presets" / "serving_errors.json"
    if (inference_out / packaged.name).read_bytes() != packaged.read_bytes():
        pytest.fail("src/meshplan/presets/serving_errors.json is stale: regenerate it with `python "
                    "benchmarks/docs/accuracy_inference.py` and commit it", pytrace=False)


def test_rl_accuracy_document_is_current(tmp_path):
    """Every published RL run priced again (about a minute: each rollout simulated)."""
    _script("accuracy_rl").main(["--out", str(tmp_path)])
    _same(tmp_path / "ACCURACY_RL.md", "ACCURACY_RL.md", "python benchmarks/docs/accuracy_rl.py")


def test_serving_quotes_the_inference_accuracy():
    """docs/SERVING.md quotes the headline of docs/ACCURACY_INFERENCE.md (all runs and the check half)."""
    generated = (DOCS / "ACCURACY_INFERENCE.md").read_text()
    (runs, median, p90), = re_rows(generated, "all")
    (_, check_median, check_p90), = re_rows(generated, "check half")
    quoted = f"{runs} runs over"
    serving = " ".join((DOCS / "SERVING.md").read_text().split())
    for text in (quoted, f"median |error| {median}, p90 {p90} (check half: {check_median} and {check_p90})"):
        assert text in serving, f"docs/SERVING.md should quote {text!r} (as docs/ACCURACY_INFERENCE.md has it)"


def re_rows(text: str, label: str) -> list[tuple[str, str, str]]:
    return re.findall(rf"^\| {re.escape(label)} \| (\d+) \| ([\d.]+ %) \| ([\d.]+ %) \|$", text, re.M)[:1]


def test_strategies_document_is_current(tmp_path):
    """The 144 searches of the 1D / 2D comparison (about 5 s on 2 cores), the comparison with the paper included;
    run as a command, as its process pool may start its workers afresh (spawn) and import the script by name."""
    subprocess.run([sys.executable, str(ROOT / "benchmarks/docs/strategies.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    _same(tmp_path / "STRATEGIES.md", "STRATEGIES.md", "python benchmarks/docs/strategies.py")


def test_measured_document_is_what_the_committed_data_renders(tmp_path):
    """docs/MEASURED.md from the committed zoo run (data/measured/*.jsonl.gz), rendered again without measuring: the
    zoo table and the leave-one-model-out evaluation of the learned model (about 15 s of CPU: 30 tree fits)."""
    pytest.importorskip("sklearn")
    measured = _script("measured")
    (data,) = sorted((ROOT / "data" / "measured").glob("*.jsonl.gz"))[-1:]
    measured.main(["--render", str(data.relative_to(ROOT)), "--doc", str(tmp_path / "MEASURED.md")])
    _same(tmp_path / "MEASURED.md", "MEASURED.md", f"python benchmarks/docs/measured.py --render "
                                                   f"{data.relative_to(ROOT)}")


def test_decode_gpu_document_is_current(tmp_path):
    """docs/DECODE_GPU.md: the decode steps measured on a lent GPU against meshplan's serving estimate, rendered again
    without a GPU (the estimate moves with the physics: regenerate it then)."""
    doc = _script("decode_gpu_doc")
    doc.main(["--doc", str(tmp_path / "DECODE_GPU.md")])
    _same(tmp_path / "DECODE_GPU.md", "DECODE_GPU.md", "python benchmarks/docs/decode_gpu_doc.py")


def test_gemm_gpu_document_is_current(tmp_path):
    """docs/GEMM_GPU.md: single GEMMs measured on a lent GPU against meshplan's price for each, rendered again without
    a GPU (the prices move with the physics: regenerate it then)."""
    doc = _script("gemm_rows_doc")
    doc.main(["--doc", str(tmp_path / "GEMM_GPU.md")])
    _same(tmp_path / "GEMM_GPU.md", "GEMM_GPU.md", "python benchmarks/docs/gemm_rows_doc.py")


def test_small_work_gpu_document_is_current(tmp_path):
    """docs/SMALL_WORK_GPU.md: the GPU runs of data/measured/gpu/ against meshplan's estimate, rendered again without
    a GPU (the estimate moves with the physics: regenerate it then)."""
    doc = _script("small_work_gpu_doc")
    doc.main(["--doc", str(tmp_path / "SMALL_WORK_GPU.md")])
    _same(tmp_path / "SMALL_WORK_GPU.md", "SMALL_WORK_GPU.md", "python benchmarks/docs/small_work_gpu_doc.py")


def test_measured_gpu_document_is_what_the_committed_gpu_data_renders(tmp_path):
    """docs/MEASURED_GPU.md from the committed GPU zoo run (data/measured/gpu/*-zoo.jsonl.gz), rendered again from its
    records alone (the peak's workspace term recomputed from the op records): no GPU needed."""
    doc = _script("measured_gpu_doc")
    (data,) = sorted((ROOT / "data" / "measured" / "gpu").glob("*-zoo.jsonl.gz"))[-1:]
    doc.main(["--data", str(data.relative_to(ROOT)), "--doc", str(tmp_path / "MEASURED_GPU.md")])
    _same(tmp_path / "MEASURED_GPU.md", "MEASURED_GPU.md", "python benchmarks/docs/measured_gpu_doc.py")


def test_speed_document_is_what_the_committed_measurement_renders(tmp_path):
    """docs/SPEED.md from the newest data/measured/*-search-speed.json (benchmarks/measure/search_speed.py --out)."""
    doc = _script("speed_doc")
    doc.main(["--doc", str(tmp_path / "SPEED.md")])
    _same(tmp_path / "SPEED.md", "SPEED.md", "python benchmarks/docs/speed_doc.py")


def test_the_speed_measurements_counts_are_the_searchs_now():
    """The timings are the measuring machine's, but what each search evaluated, found feasible and ranked first is
    the search's own: each case is searched again as search_speed.py searched it (one process, about 8 s here)."""
    import json

    from meshplan.search import search
    from meshplan.specs.model_load import load_model

    doc, bench = _script("speed_doc"), _script("search_speed")
    path = doc.newest()
    for c in json.loads(path.read_text())["cases"]:
        result = search(load_model(c["model"]), bench.case_cluster(c["system"], c["gpus"], c["nvlink_domain"]),
                        bench.whole_space(c["global_batch"]), top_k=1, workers=1)
        now = (result.evaluated, result.feasible, bench.best_plan(result))
        assert now == (c["evaluated"], c["feasible"], c["best"]), (
            f"{path.name} is stale for {c['model']} on {c['gpus']} {c['system']}: now {now}; measure again: python "
            "benchmarks/measure/search_speed.py --repeat 8 --out data/measured/DATE-search-speed.json && python "
            "benchmarks/docs/speed_doc.py")


@pytest.fixture(scope="module")
def architecture():
    """benchmarks/docs/architecture_doc.py, loaded once for both tests below: it reads the import test's graph once."""
    return _script("architecture_doc")


def test_architecture_document_is_current(tmp_path, architecture):
    """docs/ARCHITECTURE.md from the import-order test's own LAYERS and import graph (tests/test_imports.py), its
    hand-written section kept from the committed file."""
    doc = architecture
    doc.main(["--doc", str(tmp_path / "ARCHITECTURE.md")])
    _same(tmp_path / "ARCHITECTURE.md", "ARCHITECTURE.md", "python benchmarks/docs/architecture_doc.py")


def test_architecture_picture_keeps_only_the_shortest_edges(architecture):
    """The graph's transitive reduction: 2 -> 0 goes (2 reaches 0 through 1), 3 -> 1 stays (its only way), and a
    layer moved or a new import between layers shows in the document (its stack line lists every layer it imports)."""
    doc = architecture
    assert doc.reduce({(2, 1), (1, 0), (2, 0), (3, 1)}) == {(2, 1), (1, 0), (3, 1)}
    test = doc.import_test()
    edges = doc.layer_edges(test)
    assert (test.layer("meshplan.estimate"), test.layer("meshplan.specs.plan")) in edges
    assert all(a > b for a, b in edges)  # imports go down the layers only: the test's own rule, seen by the script
    text = (DOCS / "ARCHITECTURE.md").read_text()
    assert doc.BEGIN in text and doc.END in text and "`specs/hf/`" in text


def test_autoshard_document_is_current(tmp_path):
    """The sharding planner's agreement with the estimate, the plans it finds, the non-transformers' plans and the
    program's size (about 20 s on 2 cores: traces on fake tensors and a few dozen integer programs). In this process,
    as the other scripts here: a command of its own imported PyTorch and transformers again (about a third of its
    CPU), which the suite's worker has already imported for other files."""
    _script("autoshard").main(["--out", str(tmp_path)])
    _same(tmp_path / "AUTOSHARD.md", "AUTOSHARD.md", "python benchmarks/docs/autoshard.py")


# ---- the sweeps' CSVs and the pictures drawn from them ----------------------------------------------------------
def _rows(text: str) -> tuple[str, dict[tuple[str, ...], str]]:
    lines = text.splitlines()  # one line per row: no cell holds a line break
    rows = csv.DictReader(lines)
    return lines[0], {tuple(row[k] for k in POINT): line for line, row in zip(lines[1:], rows, strict=True)}


@pytest.mark.parametrize("name", list(QUICK))
def test_sweep_rows_are_current(tmp_path, name):
    args, subset = QUICK[name]
    for option, value in ({} if FULL else subset).items():
        args = shots.with_option(args, option, value)
    shots.run(args + ["--format", "none", "-o", str(tmp_path)])  # the rows only: the pictures are checked below
    if FULL:
        return _same(tmp_path / "sweep.csv", name, SCREENSHOTS)
    head, fresh = _rows((tmp_path / "sweep.csv").read_text())
    committed_head, committed = _rows((DOCS / name).read_text())
    stale = [key for key, line in fresh.items() if committed.get(key) != line]
    if head != committed_head or stale:
        pytest.fail(f"docs/{name} is stale ({'its header, ' if head != committed_head else ''}{len(stale)} of the "
                    f"{len(fresh)} rows re-run, e.g. {stale[:1]}): regenerate it with `{SCREENSHOTS}` and commit it",
                    pytrace=False)


@pytest.mark.parametrize(("name", "csv_name"), [("img/scaling.png", shots.SCALING_CSV),
                                                ("img/param-hbm_bandwidth.png", shots.WHATIF_CSV),
                                                ("img/param-nic_bandwidth.png", shots.WHATIF_CSV)])
def test_sweep_pictures_are_drawn_from_the_committed_rows(name, csv_name):
    _same_picture(shots.digest((DOCS / csv_name).read_bytes()), name, SCREENSHOTS, f"docs/{csv_name}")


def test_reports_quotes_the_nvlink_gain_of_the_committed_sweep():
    """docs/REPORTS.md: 'the gap ... widens with the GPU count (a–b MFU points at 1024 GPUs, c–d at 8192 ...)'."""
    gaps = shots.nvlink_gaps(DOCS / shots.SCALING_CSV)
    low, high = min(gaps), max(gaps)
    quoted = (f"{gaps[low][0]:.1f}–{gaps[low][1]:.1f} MFU points at {low} GPUs, "
              f"{gaps[high][0]:.1f}–{gaps[high][1]:.1f} at {high}")
    assert quoted in _reports(), f"docs/REPORTS.md should quote '{quoted}' (as benchmarks/docs/screenshots.py prints)"


# ---- the pictures of one search, one estimate and the report ----------------------------------------------------
def test_plan_pictures_show_the_current_best_plans(tmp_path):
    pytest.importorskip("matplotlib")
    shots.plan_pictures(tmp_path)
    for name in ("breakdown.png", "memory.png", "roofline.png"):
        _same_picture(shots.recorded_inputs(tmp_path / name), f"img/{name}", SCREENSHOTS, "the current best plans")


def test_timeline_picture_and_the_bubble_reports_quotes_are_current(tmp_path):
    pytest.importorskip("matplotlib")
    idle = shots.timeline_picture(tmp_path)
    _same_picture(shots.recorded_inputs(tmp_path / "timeline.png"), "img/timeline.png", SCREENSHOTS,
                  "the current estimate")
    quoted = f"{idle:.1%} of the pipelined time"
    assert quoted in _reports(), f"docs/REPORTS.md should quote '{quoted}' (as the picture's title prints)"


def test_report_screenshot_shows_the_current_report(tmp_path):
    """The report's HTML without the charts' runtime (tables, numbers, text, the charts' data; a few seconds) against
    what report.png and the section screenshots recorded; the screenshots themselves are not taken here."""
    html = tmp_path / "report.html"
    shots.run(shots.REPORT + ["-o", str(html)])
    for name in ("report.png", *(name for name, _ in shots.REPORT_SHOTS)):
        _same_picture(shots.html_inputs(html.read_text()), f"img/{name}", SCREENSHOTS, "the current report")


def test_serve_screenshot_shows_the_current_serving_report(tmp_path):
    """The serving report of docs/SERVING.md's first command (without the charts' runtime; under a second) against
    what serve.png and serve-space.png recorded."""
    html = tmp_path / "serve.html"
    shots.run(shots.SERVE + [str(html)])
    for name in ("serve.png", *(name for name, _ in shots.SERVE_SHOTS)):
        _same_picture(shots.html_inputs(html.read_text()), f"img/{name}", SCREENSHOTS, "the current serving report")


def test_every_document_is_covered():
    """A new file under docs/ is either generated (and checked above) or listed as written by hand."""
    present = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*") if p.is_file()}
    assert present == GENERATED | HANDWRITTEN, (
        f"unchecked: {sorted(present - GENERATED - HANDWRITTEN)}, missing: {sorted(GENERATED - present)}")
