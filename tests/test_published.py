"""The accuracy regression guard on the published runs: the figures benchmarks/docs/accuracy.py and
benchmarks/docs/independent.py recorded in docs/accuracy_summary.json and docs/independent_summary.json, which a change
must not make worse; every run evaluated or skipped with a reason, never raised (a seeded fuzz of the records); the JSON
output's keys; and the summaries and doc tables built from the results (runs predicted not to fit, recompute HFU, the
release floor)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from meshplan_validation.records import read_runs
from meshplan_validation.render import fit_check_markdown
from meshplan_validation.result import RunResult
from meshplan_validation.summary import summaries
from meshplan_validation.validate import run_validation, validate_command
from published_helpers import validated

DATA = Path(__file__).parents[1] / "data/validation/published_runs.jsonl"
RECORDED = Path(__file__).parents[1] / "docs/accuracy_summary.json"
needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} not checked out beside the repository")


@pytest.fixture(scope="module")
def validation():
    results = list(validated(DATA))
    return results, summaries(results)


@needs_data
def test_accuracy_is_no_worse_than_recorded(validation):
    results, summary = validation
    recorded = json.loads(RECORDED.read_text())
    now, then = summary["overall"], recorded["overall"]
    assert now["evaluated"] >= then["evaluated"]
    for key, slack in (("median_abs_error", 0.002), ("p90_abs_error", 0.005), ("max_abs_error", 0.01),
                       ("mean_abs_error", 0.003)):
        assert now[key] <= then[key] + slack, f"{key}: {now[key]:.4f} > recorded {then[key]:.4f}"
    for half in ("in_sample", "out_of_sample"):
        assert summary[half]["median_abs_error"] <= recorded[half]["median_abs_error"] + 0.002
    now, then = summary["complete"], recorded["complete"]  # the runs issue 4's median and p90 targets are set on
    assert now["evaluated"] >= then["evaluated"]
    for key, slack in (("median_abs_error", 0.002), ("p90_abs_error", 0.005), ("max_abs_error", 0.01)):
        assert now[key] <= then[key] + slack, f"complete {key}: {now[key]:.4f} > recorded {then[key]:.4f}"


def test_accuracy_on_the_independent_runs_is_no_worse_than_recorded():
    """benchmarks/data/independent_runs.jsonl (other sources, other stacks; docs/INDEPENDENT.md): every run still
    evaluated and the figures benchmarks/docs/independent.py recorded no worse."""
    root = Path(__file__).parents[1]
    results = list(validated(root / "benchmarks/data/independent_runs.jsonl"))
    now = summaries(results)["overall"]
    then = json.loads((root / "docs/independent_summary.json").read_text())
    assert now["evaluated"] >= then["evaluated"] and now["skipped"] <= then["skipped"]
    for key, slack in (("median_abs_error", 0.002), ("p90_abs_error", 0.005), ("mean_abs_error", 0.003)):
        assert now[key] <= then[key] + slack, f"{key}: {now[key]:.4f} > recorded {then[key]:.4f}"
    assert now["not_fitting"] <= then["not_fitting"]


@needs_data
def test_korthikanti_and_memory_are_no_worse_than_recorded(validation):
    results, _ = validation
    recorded = json.loads(RECORDED.read_text())
    times = [abs(r.error) for r in results if r.group == "korthikanti2022" and r.metric == "iteration_time_s"]
    assert len(times) == 8
    assert sum(times) / len(times) <= recorded["korthikanti"]["mean_abs_error"] + 0.002
    assert max(times) <= recorded["korthikanti"]["max_abs_error"] + 0.005
    memory = [abs(r.memory_error) for r in results if r.memory_error is not None]
    assert len(memory) == recorded["memory"]["evaluated"]
    assert statistics.median(memory) <= recorded["memory"]["median_abs_error"] + 0.005
    assert max(memory) <= recorded["memory"]["max_abs_error"] + 0.01


@needs_data
def test_runs_predicted_not_to_fit_are_no_more_than_recorded(validation):
    """Every measured run fitted in memory: meshplan's wrong "does not fit" verdicts must not grow."""
    results, summary = validation
    recorded = json.loads(RECORDED.read_text())["overall"]["not_fitting"]
    assert summary["overall"]["not_fitting"] == sum(1 for r in results if r.error is not None and not r.fits)
    assert summary["overall"]["not_fitting"] <= recorded


def test_not_fitting_counts_evaluated_runs_over_memory_only():
    over = RunResult(id="a", group="g", error=0.1, fits=False, memory_predicted=90 * 2**30,
                     memory_capacity=80 * 2**30)
    under = RunResult(id="b", group="g", error=-0.1, fits=True)
    skipped = RunResult(id="c", group="g", skipped="no sizes", fits=False)
    summary = summaries([over, under, skipped])["overall"]
    assert (summary["evaluated"], summary["skipped"], summary["not_fitting"]) == (2, 1, 1)
    section = "\n".join(fit_check_markdown([over, under, skipped]))
    assert "on 1 of 2" in section and "| a | 90.0 GiB | 80.0 GiB | - |" in section


@needs_data
def test_every_run_is_evaluated_or_skipped_with_a_reason(validation):
    results, _ = validation
    assert len(results) == len(read_runs(DATA))
    for r in results:
        assert (r.error is not None) != bool(r.skipped), r.id
    assert any("hybrid Mamba" in r.skipped for r in results)
    superseded = {r["id"] for r in read_runs(DATA) if r.get("superseded")}
    assert superseded and all(r.error is not None for r in results if r.id in superseded)  # evaluated by default


@needs_data
def test_superseded_runs_can_be_left_out():
    results = run_validation(read_runs(DATA), "megatron_readme_jan2021", exclude_superseded=True)
    assert results and all(r.skipped.startswith("superseded") for r in results)


@needs_data
def test_json_output_has_the_documented_keys():
    out = json.loads(validate_command(str(DATA), "korthikanti2022", True, False))
    assert {"median_abs_error", "mean_abs_error", "p90_abs_error", "max_abs_error", "evaluated",
            "skipped"} <= set(out["summary"])
    run = out["runs"][0]
    assert {"id", "predicted", "measured", "error", "complete_configuration"} <= set(run)
    # Table 5's eight runs state micro and global batch, recompute and precision; the 2,240-GPU pair does not
    assert out["complete"]["evaluated"] == 8 and out["summary"]["evaluated"] == 10
    assert run["error"] == pytest.approx(run["predicted"] / run["measured"] - 1)
    # Korthikanti 2022 ran A100-SXM4-80GB parts: the a100 preset's 81920 MiB is what the memory must fit in
    assert run["memory_capacity_bytes"] == 81920 * 2**20
    assert run["fits"] == (run["memory_predicted_bytes"] <= run["memory_capacity_bytes"])


@needs_data
def test_no_mutated_record_raises():
    """Records from other files: fields nulled, dropped or replaced by junk are skipped with a reason or
    evaluated, never raised (a seeded fuzz of the published records)."""
    import copy
    import random

    rng = random.Random(7)
    records = read_runs(DATA)
    junk = ["", "n/a", "unknown", 0, -1, 3.5, "8", True, [1], {"a": 1}, "nan"]
    for trial in range(300):
        rec = copy.deepcopy(rng.choice(records)) | {"id": f"fuzz{trial}"}
        for section in ("parallel", "model", "hardware", "measured"):
            fields = rec.get(section) or {}
            for key in list(fields):
                u = rng.random()
                if u < 0.12:
                    fields[key] = None
                elif u < 0.17:
                    del fields[key]
                elif u < 0.22:
                    fields[key] = rng.choice(junk)
        (result,) = run_validation([rec])
        assert result.skipped or result.error is not None


def _accuracy_script():
    """benchmarks/measure/accuracy_analysis.py, the analyses of docs/ACCURACY.md."""
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "measure" / "accuracy_analysis.py"
    spec = importlib.util.spec_from_file_location("accuracy_analysis_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recompute_hfu_table_compares_like_with_like():
    """Two runs of one model: HFU 60 % with recompute (mb 10 × 2048 tokens), 40 % without (mb 2): measured ratio
    60 / 40 = 1.50; meshplan reads the first 10 % slow and the second 25 % fast, so its ratio is
    1.5 · 0.9 / 1.25 = 1.08. A long-sequence run (attention-bound) stays out of the table."""
    acc = _accuracy_script()

    def rec(rid, mode, hfu, mb, seq=2048):
        return {"id": rid, "group": "mosaicml_llm_foundry", "precision": "amp_bf16",
                "hardware": {"gpu": "H100 80GB"}, "model": {"name": "MPT-13b", "seq_length": seq},
                "parallel": {"activation_recompute": mode, "micro_batch_size": mb}, "measured": {"hfu_pct": hfu}}

    records = [rec("a", "full", 60.0, 10), rec("b", "none", 40.0, 2), rec("c", "full", 90.0, 1, seq=32768)]
    results = [RunResult(id="a", group="m", error=-0.1), RunResult(id="b", group="m", error=0.25),
               RunResult(id="c", group="m", error=0.0)]
    lines = acc.recompute_hfu(results, records)
    assert lines[-1] == "| H100 80GB | MPT-13b | 60.0% (20,480) | 40.0% (4,096) | 1.50 | 1.08 |"


def test_release_floor_counts_what_one_prediction_per_configuration_must_miss():
    """One configuration measured at 100, 110 and 130 tokens/s/GPU in three releases: a prediction p is within
    ±12 % of x when x·0.88 ≤ p ≤ x·1.12, windows [88, 112], [96.8, 123.2], [114.4, 145.6]; at most two overlap, so
    one run must miss. Within ±25 % the windows [75, 125], [82.5, 137.5], [97.5, 162.5] share [97.5, 125]: none
    must. The same configuration twice in one group is a stack variant, not a release, and is left out."""
    acc = _accuracy_script()
    assert acc.most_within([100.0, 110.0, 130.0], 0.12) == 2
    assert acc.most_within([100.0, 110.0, 130.0], 0.25) == 3

    def rec(rid, value):
        return {"id": rid, "model": {"name": "m", "seq_length": 8192}, "hardware": {"gpu": "H100", "num_gpus": 8},
                "precision": "fp8", "task": "pretrain", "parallel": {"tp": 1},
                "measured": {"tokens_per_s_per_gpu": value}}

    by_id = {r["id"]: r for r in (rec("a", 100.0), rec("b", 110.0), rec("c", 130.0), rec("d", 100.0), rec("e", 90.0))}
    results = [RunResult(id=i, group=g, error=0.0) for i, g in
               (("a", "bridge_1"), ("b", "bridge_2"), ("c", "bridge_3"))]
    assert [[r.id for r, _ in g] for g in acc.repeated_configurations(results, by_id)] == [["a", "b", "c"]]
    variants = [RunResult(id="d", group="titan", error=0.0), RunResult(id="e", group="titan", error=0.0)]
    assert acc.repeated_configurations(variants, by_id) == []
    # the doc section: one configuration, three runs, meshplan's errors 0, 0 and 0 (none outside any tolerance)
    lines = acc.release_floor(results, by_id)
    assert "| within ±12 % | 1 | 0 |" in lines and "| within ±25 % | 0 | 0 |" in lines
    assert acc.release_groups(results) == "3 bridge"
    assert acc.release_groups([RunResult(id="x", group="megatron_bridge_26.04.01")]) == "1 megatron_bridge"


def test_memory_share_is_the_predicted_peak_over_the_gpus_memory():
    assert RunResult(id="a", group="g", memory_predicted=60e9, memory_capacity=80e9).memory_share == 0.75
    assert RunResult(id="b", group="g").memory_share == 0.0
