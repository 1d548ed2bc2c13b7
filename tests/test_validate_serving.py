"""``meshplan validate`` on published serving runs (data/serving/published_serving.jsonl, its README the schema):
told from training records by their blocks, priced by the one serving evaluation the accuracy benchmark uses
(serving_eval.results), and shown in the same per-run table, summaries and JSON; a mixed file keeps its order; a bad
serving record is a skip with its reason, never raised."""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from meshplan.cli import main
from meshplan_validation.records import read_runs
from meshplan_validation.serving_eval import results
from meshplan_validation.serving_map import VARIED
from meshplan_validation.serving_runs import is_serving, serving_run
from meshplan_validation.summary import summaries
from meshplan_validation.validate import run_validation, validate_command

ROOT = Path(__file__).parents[1]
SERVING = ROOT / "data/serving/published_serving.jsonl"
TRAINING = ROOT / "data/validation/published_runs.jsonl"
RECORDS = read_runs(SERVING)
BY_ID = {r["id"]: r for r in RECORDS}
RATE_RUN = "trtllm014srv_llama3.1-8b_h100_tp1_467x256_qps4"


@pytest.fixture(scope="module")
def whole_file():
    """Every serving record through validate (about 5 s) and through the accuracy benchmark's evaluation."""
    return run_validation(RECORDS), results(RECORDS)


def test_every_serving_record_is_evaluated_or_skipped_with_the_accuracy_docs_reason(whole_file):
    """921 records: 907 evaluated (each record the benchmark prices); the 14 skipped are the exclusions of
    docs/ACCURACY_INFERENCE.md ("Runs not evaluated"), reason for reason: MI300X throughput unlabelled 8, QPS = INF
    bursts of varied lengths 4, MTP 2: 8 + 4 + 2 = 14. The 132 TensorRT-LLM 1.0 multi-GPU MoE runs, once skipped for
    their unstated EP size, are priced with the attention DP the page sets and the experts over its ranks, and
    SGLang's two prefill runs at prompts printed "1K" / "2K" at 1,024 / 2,048; each says so (its ``assumed`` readings,
    shown as the run's unstated settings)."""
    runs, rows = whole_file
    assert [r.id for r in runs] == [r["id"] for r in RECORDS] and all(r.kind == "serving" for r in runs)
    for r in runs:
        assert (r.error is not None) != bool(r.skipped), r.id
    skipped = Counter(r.skipped for r in runs if r.skipped)
    assert skipped == Counter(r.skipped for r in rows if r.skipped)  # the benchmark's reasons, one per record
    assert skipped[VARIED] == 4 and not [k for k in skipped if "layout" in k]
    assert not [k for k in skipped if "no meshplan hardware preset" in k]
    assert sum(skipped.values()) == 14 and not [k for k in skipped if "length not stated" in k]
    evaluated = sum(r.error is not None for r in runs)
    assert evaluated == len({r.id for r in rows if r.error is not None}) == 921 - 14
    assert summaries(runs)["overall"]["evaluated"] == evaluated
    moe = [r for r in runs if r.group == "trtllm_perf_v1.0"
           and any("enable_attention_dp: true" in a for a in r.unstated)]
    assert len(moe) == 132 and all(r.error is not None for r in moe)


def test_validate_evaluates_nine_in_ten_serving_records(whole_file):
    """Issue 46: at least 90 % of the serving records evaluated (829 of 921); 907 are (98.5 %)."""
    runs, _ = whole_file
    assert sum(r.error is not None for r in runs) >= 0.9 * len(RECORDS)


def test_figures_equal_the_accuracy_benchmarks(whole_file):
    """Same code path: each evaluated run's metric, predicted, measured and error are the benchmark's row for that
    run and metric (serving_eval.results), its other metrics the benchmark's other rows; the headline runs are the
    benchmark's headline rows, so their median |error| is docs/ACCURACY_INFERENCE.md's."""
    runs, rows = whole_file
    bench = {(r.id, r.metric): r for r in rows if not r.skipped}
    for run in (r for r in runs if r.error is not None):
        row = bench[(run.id, run.metric)]
        assert (run.predicted, run.measured, run.error, run.batch) == (row.predicted, row.measured, row.error,
                                                                        row.batch)
        assert {m: (p, v, e) for m, p, v, e in run.other_metrics} == {
            m: (r.predicted, r.measured, r.error) for (i, m), r in bench.items() if i == run.id and m != run.metric}
    head = {(r.id, r.metric) for r in rows if r.headline and r.error is not None}
    assert head == {(r.id, r.metric) for r in runs if (r.id, r.metric) in head}
    assert head  # 751 at this commit: the accuracy doc's "all | 751"


def test_a_run_at_an_offered_rate_is_judged_by_its_inter_token_latency():
    """TensorRT-LLM 0.14 at QPS 4: the predicted requests/s is the offered rate itself, so the run's metric is its
    mean ITL (the time per token at the batch that rate holds); TTFT and the throughputs go beside it."""
    run = serving_run(BY_ID[RATE_RUN])
    assert run.metric == "itl_ms" and run.serving_mode == "rate"
    assert run.error == pytest.approx(run.predicted / run.measured - 1)
    assert {m for m, *_ in run.other_metrics} == {"ttft_ms", "requests_per_s", "total_tokens_per_s",
                                                 "output_tokens_per_s"}


def test_a_mixed_file_keeps_its_order_and_filters_both_kinds(tmp_path):
    """Two training runs and three serving runs interleaved: each priced by its own kind, in file order; --group
    picks either kind; the JSON marks serving runs and gives their other metrics."""
    training = read_runs(TRAINING)[:2]
    serving = [BY_ID[i] for i in ("trtllm017_llama3.1-8b_h100_tp1_128x128", RATE_RUN,
                                  "trtllm_dsr1_blog_b200_minlat_mtp3")]
    mixed = [serving[0], training[0], serving[1], training[1], serving[2]]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in mixed))
    out = json.loads(validate_command(str(path), None, True))
    assert [r["id"] for r in out["runs"]] == [r["id"] for r in mixed]
    assert [r.get("kind") for r in out["runs"]] == ["serving", None, "serving", None, "serving"]
    assert out["runs"][4]["skipped"] == "speculative decoding (MTP) is not modelled"
    first = out["runs"][0]
    assert first["metric"] == "output_tokens_per_s" and first["mode"] == "offline" and first["batch"] > 0
    assert first["error"] == pytest.approx(first["predicted"] / first["measured"] - 1)
    assert set(out["runs"][2]["other_metrics"]["ttft_ms"]) == {"predicted", "measured", "error"}
    assert out["summary"]["evaluated"] + out["summary"]["skipped"] == 5 and out["summary"]["skipped"] >= 1
    assert set(out["groups"]) == {r["group"] for r in mixed}
    only = json.loads(validate_command(str(path), "trtllm_serving_v0.14", True))
    assert [r["id"] for r in only["runs"]] == [RATE_RUN]
    text = validate_command(str(path), None, False)
    assert "output tokens/s" in text and "ITL" in text and "serving, rate" in text and "|error| by group" in text


def test_validate_command_line_on_a_serving_file(tmp_path, capsys):
    path = tmp_path / "serving.jsonl"
    path.write_text(json.dumps(BY_ID[RATE_RUN]) + "\n")
    assert main(["validate", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)["summary"]["evaluated"] == 1


@pytest.mark.parametrize(("change", "reason"), [
    (lambda r: r.pop("workload"), "serving record lacks the object(s) workload"),
    (lambda r: r.update(measured=[1, 2]), "serving record lacks the object(s) measured"),
    (lambda r: r["hardware"].update(preset="no-such-gpu"), "invalid input"),
    (lambda r: r.update(engine="FasterServe 9"), "no engine preset for 'FasterServe 9'"),
    (lambda r: r["workload"].update(input_len=None), "input or output length not stated"),
    (lambda r: r["model"].update(preset=None, num_layers="many"), "invalid input: num_layers='many' must be an"),
])
def test_a_bad_serving_record_is_a_skip_with_its_reason(change, reason):
    record = copy.deepcopy(BY_ID["trtllm017_llama3.1-8b_h100_tp1_128x128"])
    change(record)
    (run,) = run_validation([record])
    assert run.kind == "serving" and reason in run.skipped, run.skipped


def test_no_mutated_serving_record_raises():
    """Serving records with fields nulled, dropped or replaced by junk: skipped with a reason or evaluated, never
    raised (a seeded fuzz)."""
    rng = random.Random(11)
    junk = ["", "n/a", 0, -1, 3.5, "8", True, [1], {"a": 1}, None]
    for trial in range(60):
        rec = copy.deepcopy(rng.choice(RECORDS)) | {"id": f"fuzz{trial}"}
        for section in ("parallel", "model", "hardware", "workload", "measured", "precision"):
            fields = rec.get(section) or {}
            for key in list(fields):
                u = rng.random()
                if u < 0.05:
                    del fields[key]
                elif u < 0.12:
                    fields[key] = rng.choice(junk)
        (run,) = run_validation([rec])
        assert is_serving(rec) and (run.skipped or run.error is not None)


def test_a_serving_record_without_an_id_is_one_line_and_exit_2(tmp_path, capsys):
    from bad_input_helpers import fails

    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps({k: v for k, v in BY_ID[RATE_RUN].items() if k != "id"}) + "\n")
    assert "a record must be an object with a non-empty string 'id'" in fails(["validate", str(path)], capsys)
