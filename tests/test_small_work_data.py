"""The small-work dev set of issue 46 (data/validation/small_work.jsonl and data/serving/small_work.jsonl, described in
the README beside each): every line parses as one record with the fields its schema requires, typed; each record
is pinned to a commit of its source; ids are new; the fit / check split is the documented rule; and every record maps
to a run meshplan prices (none skipped). The regime's report (benchmarks/measure/small_work.py) picks the published runs
on one node and at batch 1 without touching the accuracy summaries' run sets."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import zlib
from collections import defaultdict
from pathlib import Path

import pytest

from meshplan_validation.case import map_run
from meshplan_validation.records import clean_record, read_runs
from meshplan_validation.serving_map import case_of
from meshplan_validation.validate import run_validation
from test_serving_data import BLOCKS, ENUMS, TOP, _is

ROOT = Path(__file__).resolve().parents[1]
TRAINING = ROOT / "data" / "validation" / "small_work.jsonl"
SERVING = ROOT / "data" / "serving" / "small_work.jsonl"
PUBLISHED = ROOT / "data" / "validation" / "published_runs.jsonl"
PUBLISHED_SERVING = ROOT / "data" / "serving" / "published_serving.jsonl"
# the published-runs schema (data/validation/README.md) and the split this set adds
TRAINING_TOP = {"id": str, "group": str, "split": str, "source": str, "source_url": str, "source_locator": str,
                "framework": str, "task": str, "model": dict, "hardware": dict, "parallel": dict, "precision": str,
                "measured": dict, "notes": str, "uncertain": list}
TRAINING_BLOCKS = {"model": ("name", "arch", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
                             "ffn_hidden_size", "vocab_size", "seq_length"),
                   "hardware": ("gpu", "num_gpus", "gpus_per_node", "interconnect"),
                   "parallel": ("tp", "pp", "dp", "micro_batch_size", "global_batch_size", "activation_recompute",
                                "zero_or_fsdp")}
sys.path.insert(0, str(ROOT / "benchmarks" / "measure"))


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


TRAIN, SERVE = _lines(TRAINING), _lines(SERVING)


@pytest.mark.parametrize("path", [TRAINING, SERVING], ids=["training", "serving"])
def test_every_line_is_one_record_with_a_unique_new_id(path):
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    assert len(records) == len(lines) >= 5 and all(isinstance(r, dict) for r in records)
    ids = [r["id"] for r in records]
    assert len(set(ids)) == len(ids)
    published = {r["id"] for r in _lines(PUBLISHED) + _lines(PUBLISHED_SERVING)}
    assert not set(ids) & published  # new runs, not copies of the published ones


def test_training_records_have_the_published_schema():
    for rec in TRAIN:
        for key, kind in TRAINING_TOP.items():
            assert isinstance(rec.get(key), kind), (rec.get("id"), key)
        for block, keys in TRAINING_BLOCKS.items():
            assert all(k in rec[block] for k in keys), (rec["id"], block)
        assert rec["measured"] and all(v > 0 for v in rec["measured"].values()), rec["id"]
        p = rec["parallel"]
        assert p["tp"] * p["pp"] * p["dp"] == rec["hardware"]["num_gpus"], rec["id"]
        # tokens per step = global batch x sequence (the llm.c scripts' -d): 524,288 = 512 x 1024
        assert p["global_batch_size"] % (p["dp"] * p["micro_batch_size"]) == 0, rec["id"]


def test_serving_records_have_the_serving_schema():
    for rec in SERVE:
        for key, kind in TOP.items():
            assert isinstance(rec.get(key), kind), (rec.get("id"), key)
        for block, fields in BLOCKS.items():
            for key, kinds in fields.items():
                assert key in rec[block] and _is(rec[block][key], kinds), (rec["id"], block, key)
        for (block, key), allowed in ENUMS.items():
            assert rec[block][key] is None or rec[block][key] in allowed, (rec["id"], block, key)
        assert rec["workload"]["batch_size"] == 1 and re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])", rec["date"])
        assert any(isinstance(v, (int, float)) and v > 0 for v in rec["measured"].values()), rec["id"]


@pytest.mark.parametrize("rec", TRAIN + SERVE, ids=lambda r: r["id"])
def test_each_record_is_pinned_to_a_commit_of_its_source(rec):
    assert re.search(r"^https://github\.com/.+/blob/[0-9a-f]{40}/", rec["source_url"]), rec["id"]
    assert re.search(r"@[0-9a-f]{40} ", rec["source_locator"]), rec["id"]


def test_training_split_is_the_published_runs_rule():
    """CRC-32 of the id even → fit (selection.in_fit_set): e.g. crc32('llmc_gpt2_774m_8xa100') is odd → check."""
    assert {r["id"]: r["split"] for r in TRAIN} == {
        r["id"]: ("fit" if zlib.crc32(r["id"].encode()) % 2 == 0 else "check") for r in TRAIN}
    assert {r["split"] for r in TRAIN} == {"fit", "check"}


def test_serving_split_is_the_serving_rule():
    """Per group, ids ordered by SHA-256: even ranks fit, odd check (data/serving/README.md, "The split")."""
    groups = defaultdict(list)
    for rec in SERVE:
        groups[rec["group"]].append(rec)
    for recs in groups.values():
        ordered = sorted(recs, key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
        assert [r["split"] for r in ordered] == [("fit", "check")[i % 2] for i in range(len(ordered))]


@pytest.mark.parametrize("rec", TRAIN, ids=lambda r: r["id"])
def test_each_training_record_maps_to_a_run(rec):
    case = map_run(clean_record(rec))
    assert case.plan.dp == rec["parallel"]["dp"] and case.model.num_layers == rec["model"]["num_layers"]


def test_each_training_record_is_evaluated():
    results = run_validation(read_runs(TRAINING))
    assert [r.skipped for r in results] == [""] * len(TRAIN)
    by_id = {r["id"]: r for r in TRAIN}
    assert all(r.metric in by_id[r.id]["measured"] and r.predicted > 0 for r in results)


@pytest.mark.parametrize("rec", SERVE, ids=lambda r: r["id"])
def test_each_serving_record_maps_to_a_case(rec):
    case = case_of(rec)
    assert not isinstance(case, str), case
    assert case.mode == "static" and case.plan.batch == 1 and case.plan.tp == rec["parallel"]["tp"]


def test_the_regime_picks_one_node_runs_and_batch_one_runs():
    """One node: ≤ 8 GPUs (a 16-GPU run is out); batch 1: the stated batch only."""
    import small_work

    runs = [{"id": "a", "hardware": {"num_gpus": 8}}, {"id": "b", "hardware": {"num_gpus": 16}},
            {"id": "c", "hardware": {"num_gpus": None}}]
    assert small_work.one_node(runs) == {"a"}
    served = [{"id": "x", "workload": {"batch_size": 1}}, {"id": "y", "workload": {"batch_size": 2}},
              {"id": "z", "workload": {"batch_size": None}}]
    assert [r["id"] for r in small_work.batch_one(served)] == ["x"]


def test_the_regime_statistics_show_their_arithmetic():
    """|errors| 0.1, 0.2, 0.4 → median 0.2, mean 0.2333; a time read 10 % short and a throughput read 20 % high are
    both too fast, a time read 40 % long is not: 2 of 3."""
    import small_work

    s = small_work.stats([("iteration_time_s", -0.1), ("tokens_per_s_per_gpu", 0.2), ("ttft_ms", 0.4)])
    assert s["runs"] == 3 and s["median_abs_error"] == pytest.approx(0.2)
    assert s["mean_abs_error"] == pytest.approx(0.7 / 3) and s["too_fast_share"] == pytest.approx(2 / 3)
    assert small_work.stats([])["median_abs_error"] is None
