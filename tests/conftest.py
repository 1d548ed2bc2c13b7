"""Shared small specs (a GPT-3-style model in the Korthikanti et al. 2022 layout, clusters built from presets) and
the no-skips rule of CI (MESHPLAN_NO_SKIPS=1)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# One thread per library in each test process, set before NumPy loads: pytest-xdist runs a process per core, and a
# library's own pool in each (OpenMP: PyTorch, scikit-learn's trees; OpenBLAS) would oversubscribe the cores, its
# threads spinning while they wait for one (a third of the CPU time of docs/MEASURED.md's check, for the same document).
# A test that times a kernel sets its own threads (check-step, calibrate); an environment that sets these keeps them.
for _threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")

# The planner's traces of presets are not kept between tests (autoshard/trace_cache.py): each test traces what it
# plans, as a monkeypatched tracer expects; tests/test_autoshard_trace_cache.py turns it on in a folder of its own.
os.environ.setdefault("MESHPLAN_CACHE", "off")

import pytest  # noqa: E402

from meshplan import files as _files  # noqa: E402
from meshplan.cli.codecache import Parsed as _Parsed  # noqa: E402
from meshplan.specs.hardware import load_system  # noqa: E402
from meshplan.specs.model import ModelSpec  # noqa: E402

# The built-in presets' TOML parsed once per test process. A program that imports meshplan parses a preset each time it
# loads it (meshplan.files.PARSED None), and a validation loads a system, a model and a stack preset for each record
# it maps: test_validate_records.py parsed 2,572 preset texts (1.6 of its 19 s of CPU), test_out_of_source.py 1,499
# (0.9 of 19 s), test_docs.py's accuracy documents 2,308. The console script's store (cli/codecache.Parsed, here
# without a file) keeps each text's document and gives every reader a fresh copy (marshal), as a parse does: the text
# is the key, so a preset changed or written by a test is parsed afresh, and one that does not parse raises as before
# (nothing is kept). The plain parse stays covered where a program imports meshplan in a process of its own
# (tests/test_codecache.py, the CLI's subprocess tests) and by tests/test_presets_resolved.py's parse_toml calls.
if _files.PARSED is None:
    _files.PARSED = _Parsed()


def gpt(layers: int = 4, hidden: int = 1024, heads: int = 16, seq: int = 2048, vocab: int = 51200,
        **extra: object) -> ModelSpec:
    """Megatron GPT: MHA, GeLU MLP 4h, LayerNorm, dropout, learned positions, tied embeddings."""
    return ModelSpec(name="gpt-test", num_layers=layers, hidden_size=hidden, num_heads=heads,
                     ffn_hidden_size=4 * hidden, vocab_size=vocab, seq_length=seq, dropout=True,
                     position_embedding="learned", tied_embeddings=True, qkv_bias=True, linear_bias=True,
                     **extra)


def plain_roofline():
    """The shipped efficiency with the plain roofline (an op takes the larger of its math and traffic times:
    ``ridge`` = inf, roofline.work_time; the ridge is tested in test_fit_ridge.py), for tests of the rates alone."""
    import math  # noqa: PLC0415

    from meshplan.specs.efficiency import DEFAULT  # noqa: PLC0415

    return DEFAULT.with_(ridge=math.inf)


def rates_only(system: str):
    """A preset's accelerator without its per-kernel fixed time (``gemm_overhead``, ``kernel_overhead``:
    roofline.overhead, tested in test_calibrate_mesh.py and test_host_dispatch.py), for tests of the rates alone."""
    from dataclasses import replace  # noqa: PLC0415

    return replace(load_system(system).accelerator, gemm_overhead=0.0, kernel_overhead=0.0)


@pytest.fixture(autouse=True)
def _terminal_width_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without ``COLUMNS``, as in a pipe: the CLI then prints at its file width (150 columns,
    report/console.terminal_console) whatever terminal runs the suite; pytest-xdist's workers inherit COLUMNS=80. A test
    of a width sets its own."""
    monkeypatch.delenv("COLUMNS", raising=False)
    # the plain progress notes of long work (cli/common.working: "meshplan: WHAT ..." once NOTE_AFTER seconds pass)
    # depend on how loaded the machine is: in process, none unless a test asks (tests/test_new_user.py sets its own)
    common = sys.modules.get("meshplan.cli.common")
    if common is not None:
        monkeypatch.setattr(common, "NOTE_AFTER", 3600.0)


@pytest.fixture
def small_gpt() -> ModelSpec:
    return gpt()


@pytest.fixture
def h100_64():
    return load_system("h100").cluster(64)


# ---- subprocesses run this checkout's code ---------------------------------------------------------------------------
# pyproject's ``pythonpath = ["src"]`` puts the checkout's src first on this process's sys.path, ahead of an editable
# install's .pth (a worktree sharing another checkout's .venv imports that checkout's src by it); a test that starts
# ``python -m meshplan.cli``, the console script or a benchmarks/ script inherits only the environment. So the
# checkout's src and root (benchmarks, meshplan_validation) go first on PYTHONPATH, which the subprocesses inherit.
def pytest_configure(config: pytest.Config) -> None:
    root = Path(__file__).resolve().parents[1]
    ours = [str(root / "src"), str(root)]
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in ours]
    os.environ["PYTHONPATH"] = os.pathsep.join(ours + rest)


# ---- no silent skips -----------------------------------------------------------------------------------------------
# With MESHPLAN_NO_SKIPS=1 (.ci/run sets it) a skip is a failure unless the test is marked ``@pytest.mark.gpu``: a CPU
# machine cannot have a GPU, but it can have every extra, data file and system package the other tests ask for.
NO_SKIPS = os.environ.get("MESHPLAN_NO_SKIPS") == "1"


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium for the reports' browser tests (one per test module)."""
    from meshplan.report.browser import chromium, find_chromium

    if find_chromium() is None:
        pytest.skip("headless Chromium not installed (apt-get install chromium; .ci/install-extras.sh does it)")
    with chromium() as b:
        yield b


@pytest.fixture(scope="session")
def megatron():
    """Megatron-LM's own parse_args / validate_args in one child for the whole test process (tests/framework_parsers.py
    ``megatron_lm``, tests/megatron_lm_check.py): its imports, ~10 s of CPU, paid once per process, not once per file
    (test_configs_megatron_lm.py and test_configs_param_gather.py share a worker: SHARED_WORKER below). Each case
    still goes through parse_args and validate_args from the child's starting state (megatron_lm_check.py puts back
    what a case changes), so a case's verdict does not depend on which file's cases went before it."""
    from framework_parsers import megatron_lm  # noqa: PLC0415  (tests/, on sys.path as the test modules are)

    with megatron_lm() as verdicts:
        yield verdicts


def _no_skip(report: pytest.TestReport | pytest.CollectReport, what: str) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"{what} skipped ({reason}) and MESHPLAN_NO_SKIPS=1: install what it needs "
                       "(bash .ci/install-extras.sh), or mark it @pytest.mark.gpu if only a GPU can run it")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if (NO_SKIPS and report.skipped and not hasattr(report, "wasxfail")
            and item.get_closest_marker("gpu") is None):
        _no_skip(report, item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A module that skips as it imports (``pytest.importorskip`` at its top) has no test to mark: it fails."""
    outcome = yield
    report = outcome.get_result()
    if NO_SKIPS and report.skipped:
        _no_skip(report, collector.nodeid)


# ---- the cyclic collector in a long worker --------------------------------------------------------------------------
# A pytest-xdist worker that has imported torch and transformers holds about a million tracked objects (their modules,
# classes and functions, alive to the end), and every full collection walks them all: 11 % of a mixed selection's wall
# time (the suite3 note, 28.5 of 261 s). After collection, and again whenever a test has brought in many new modules,
# the worker collects once and freezes what is left alive (gc.freeze: the permanent generation, skipped by later
# collections, docs.python.org/3/library/gc.html#gc.freeze); garbage pending at that moment is freed first. A test
# never sees it: collections only reclaim cycles, and none of the product's answers depends on when. The permanent
# generation goes back to the collector at exit, so extensions' leak checks at interpreter shutdown (nanobind) find
# nothing held.
_FROZEN_AT = [0]
_NEW_MODULES = 200  # modules imported since the last freeze that make another worth its one full collection


def _collect_and_freeze() -> None:
    import gc  # noqa: PLC0415
    import sys  # noqa: PLC0415

    gc.collect()
    gc.freeze()
    _FROZEN_AT[0] = len(sys.modules)


def pytest_collection_finish(session: pytest.Session) -> None:
    _collect_and_freeze()


def pytest_runtest_teardown(item: pytest.Item) -> None:
    import sys  # noqa: PLC0415

    if len(sys.modules) - _FROZEN_AT[0] >= _NEW_MODULES:
        _collect_and_freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    import gc  # noqa: PLC0415

    gc.unfreeze()


# ---- files that share a worker's memo -------------------------------------------------------------------------------
# pytest-xdist's ``--dist loadfile`` (pyproject's addopts) hands each file to one worker; the files of a group below go
# to one worker together, as one unit in collection order, because the later ones reuse what the first computed in that
# process. Each test still computes and asserts what it did: only where it runs changes.
# - test_docs.py's inference_out (benchmarks/docs/accuracy_inference.py) prices every published serving run, and
#   test_validate_serving.py's whole_file prices them again; with serving_eval's per-process memo of ``predict`` warm,
#   the second costs 4.0 s of CPU instead of 13.9 (the suite5 note). test_fitted_sources.py, test_loso_alternate.py,
#   test_serve_transient.py and test_serving_eval.py price some of the same runs at the shipped constants too: after
#   test_docs.py they cost 9.1, 28.3, 1.2 and 1.6 s of CPU instead of 13.7, 43.6, 10.0 and 4.7 (the suite7 note).
#   test_out_of_source.py prices every fourth serving run at the shipped constants: 0.6 s of CPU after test_docs.py
#   instead of 7.2 (its training half 4.3 s either way; the suite15 note).
# - test_published.py, test_ranges.py and test_validate_records.py validate the published and the independent runs
#   whole (published_helpers.validated: once per process; 3.5 s of CPU for the published file, 1.3 s for the
#   independent one), as do test_docs.py's accuracy.py, accuracy_doc.py and independent.py (validation_of): one group.
# - test_bands.py's leave-one-source-out coverage and test_docs.py's accuracy documents and packaged bands read the
#   same reading of docs/out_of_source.json (benchmarks/docs/error_bands.held_out: once per process, 1.6 s of CPU).
# - test_hf_registry.py's sweep builds every causal-LM type of transformers on the meta device, importing each one's
#   modelling module; test_model_extras.py's registry types build 14 of them again: 7.6 s of CPU in a fresh worker,
#   2.5 s where the modules are already imported (the outcomes equal).
# - test_configs_megatron_lm.py and test_configs_param_gather.py hand their scripts to Megatron-LM's parser in a child
#   that imported it (the ``megatron`` fixture above: about 10 s of CPU to start, 0.2 s a case): one child for both.
#   test_configs_param_gather.py and six more files import Megatron-Core itself in the test process (its config
#   classes, GPTModel, the layer layout), 5.3 s of CPU in a worker that has torch and transformers: once on one worker.
SHARED_WORKER = (("test_bands.py", "test_docs.py", "test_fitted_sources.py", "test_loso_alternate.py",
                  "test_out_of_source.py", "test_published.py", "test_ranges.py", "test_serve_transient.py",
                  "test_serving_eval.py", "test_validate_records.py", "test_validate_serving.py"),
                 ("test_hf_registry.py", "test_model_extras.py"),
                 ("test_configs_build_megatron.py", "test_configs_framework_loaders.py",
                  "test_configs_megatron_bridge.py", "test_configs_megatron_lm.py", "test_configs_param_gather.py",
                  "test_framework_refusals.py", "test_optimizer.py", "test_stage_dp.py"))
_GROUP_OF = {name: " + ".join(group) for group in SHARED_WORKER for name in group}

# ---- the longest units first ----------------------------------------------------------------------------------------
# pytest-xdist hands out units (a file, or a group above) in order of their test count, most first
# (--loadscope-reorder), so a file of a few long tests started last and left the other worker idle at the end. The
# units below start first, longest first (longest-processing-time-first list scheduling: Graham 1969, "Bounds on
# multiprocessing timing anomalies", SIAM J. Appl. Math. 17(2), within 4/3 of the best order); the rest follow in
# xdist's order. Seconds: each unit's summed test durations (setup, call and teardown) in the full suite on this 2-core
# machine under load (the suite8 note), only to order them: a stale figure changes which unit starts first, never what a
# test checks.
UNIT_SECONDS: dict[str, float] = {  # 2026-11-30, 65 min of wall at load 7-16 (14 min unloaded)
    "test_docs.py": 1611.0, "test_search.py": 1016.0, "test_properties.py": 444.0, "test_fuzz.py": 302.0,
    "test_hf_registry.py": 260.0, "test_loso_alternate.py": 211.0, "test_serve_properties.py": 174.0,
    "test_sweep.py": 169.0, "test_autoshard_highs.py": 144.0, "test_validate_records.py": 138.0,
    "test_rl_properties.py": 133.0, "test_serve_launch.py": 128.0, "test_plain_console.py": 112.0,
    "test_autoshard_shrink.py": 110.0, "test_check_step.py": 105.0,
    "test_autoshard_cli.py": 73.0, "test_async_pipeline.py": 70.0, "test_supports.py": 68.0,
    "test_fitted_sources.py": 68.0, "test_serve_load_laws.py": 66.0, "test_calibrate.py": 66.0,
    "test_select.py": 63.0, "test_emit_fallback.py": 54.0, "test_autoshard_run.py": 53.0,
    "test_goodput_ranking.py": 51.0, "test_pipeline_registry.py": 47.0, "test_rl_cli.py": 45.0,
    "test_golden.py": 44.0, "test_hf_config.py": 44.0, "test_report_text.py": 41.0, "test_validate_serving.py": 41.0,
    "test_mixed.py": 41.0,
    # test_moe_lora.py was missing: its two search-equals-estimate cases (2,040 candidates each, estimated one by one)
    # 37 s and 36 s in the full suite of 2026-11-30 (--durations=60, 68 min of wall at load 10-15; the rest under 1 s)
    "test_moe_lora.py": 74.0,
    # the Megatron group (SHARED_WORKER's third: one unit, its files' figures summed, 161 s), measured as a group alone
    # with --durations=0 on one worker, 2026-11-30 at load 11-12 (before, test_optimizer.py's 76 s from the full suite
    # stood for the whole group)
    "test_configs_megatron_lm.py": 57.0, "test_configs_build_megatron.py": 41.0,
    "test_configs_framework_loaders.py": 27.0, "test_stage_dp.py": 14.0, "test_framework_refusals.py": 13.0,
    "test_optimizer.py": 6.0, "test_configs_param_gather.py": 2.0, "test_configs_megatron_bridge.py": 0.2,
}


def _unit_seconds(unit: str) -> float:
    return sum(UNIT_SECONDS.get(name, 0.0) for name in unit.rsplit("/", 1)[-1].split(" + "))


def longest_first(units: list[str]) -> list[str]:
    """``units`` with the measured ones first, longest first; the others after them in their given order."""
    return sorted(units, key=lambda unit: -_unit_seconds(unit))  # sorted is stable: ties keep their order


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # noqa: PLC0415

    class SharedFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return _GROUP_OF.get(file.rsplit("/", 1)[-1], file)

        def _assign_work_unit(self, node) -> None:
            if not getattr(self, "_longest_first", False):  # once, on the first unit handed out
                order = longest_first(list(self.workqueue))
                self.workqueue = type(self.workqueue)((unit, self.workqueue[unit]) for unit in order)
                self._longest_first = True
            super()._assign_work_unit(node)

    return SharedFiles(config, log)
