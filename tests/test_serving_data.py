"""The published serving measurements (data/serving/published_serving.jsonl, described in data/serving/README.md):
every line is one JSON record with the fixed schema, typed and in range; ids are unique; there are at least 60
records from at least three sources on at least three GPU generations; the fit / check / holdout split is the
documented deterministic rule; and the numbers of the tables that can be checked against themselves agree."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent.parent / "data" / "serving"
PATH = DATA / "published_serving.jsonl"
HOLDOUT_SOURCES = {"AMD ROCm vLLM MI300X performance README (ROCm/vllm docs/dev-docker/README.md)"}

TOP = {"id": str, "group": str, "source": str, "source_url": str, "source_locator": str, "engine": str, "date": str,
       "split": str, "model": dict, "hardware": dict, "parallel": dict, "precision": dict, "workload": dict,
       "measured": dict, "notes": str, "assumed": list, "derived": dict}
INT, FLOAT, STR = (int,), (int, float), (str,)
MODEL = {"name": STR, "hf_id": STR, "arch": STR, "num_layers": INT, "hidden_size": INT, "num_heads": INT,
         "num_kv_heads": INT, "head_dim": INT, "ffn_hidden_size": INT, "vocab_size": INT, "num_experts": INT,
         "moe_topk": INT, "moe_ffn_hidden_size": INT, "attention": STR}
HARDWARE = {"gpu": STR, "num_gpus": INT, "system": STR, "interconnect": STR, "generation": STR}
PARALLEL = {"tp": INT, "pp": INT, "ep": INT, "dp": INT, "disaggregated": (dict,)}
PRECISION = {"weights": STR, "activations": STR, "kv_cache": STR}
WORKLOAD = {"input_len": INT, "output_len": INT, "batch_size": INT, "concurrency": INT, "request_rate": FLOAT,
            "num_requests": INT, "scenario": STR}
METRICS = ("output_tokens_per_s", "total_tokens_per_s", "output_tokens_per_s_per_gpu", "requests_per_s", "ttft_ms",
           "tpot_ms", "itl_ms", "e2e_latency_ms")
MEASURED = {name: FLOAT for name in METRICS} | {"percentile": STR}
BLOCKS = {"model": MODEL, "hardware": HARDWARE, "parallel": PARALLEL, "precision": PRECISION, "workload": WORKLOAD,
          "measured": MEASURED}
ENUMS = {("model", "arch"): {"dense", "moe"}, ("model", "attention"): {"mha", "gqa", "mla"},
         ("workload", "scenario"): {"offline", "server", "latency", "throughput"},
         ("measured", "percentile"): {"mean", "median", "p90", "p99"}}
SPLITS = {"fit", "check", "holdout"}


def _records() -> list[dict]:
    lines = PATH.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


RECORDS = _records()


def _is(value, kinds) -> bool:
    """None is 'not stated'; bool is not a number."""
    return value is None or (isinstance(value, kinds) and not isinstance(value, bool))


def test_every_line_parses_as_one_object():
    lines = [line for line in PATH.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) == len(RECORDS)
    assert all(isinstance(json.loads(line), dict) for line in lines)


def test_required_fields_are_present_and_typed():
    for rec in RECORDS:
        for key, kind in TOP.items():
            assert isinstance(rec.get(key), kind), (rec.get("id"), key)
        for block, fields in BLOCKS.items():
            for key, kinds in fields.items():
                assert key in rec[block], (rec["id"], block, key)
                assert _is(rec[block][key], kinds), (rec["id"], block, key, rec[block][key])
        for (block, key), allowed in ENUMS.items():
            assert rec[block][key] is None or rec[block][key] in allowed, (rec["id"], block, key)


def test_values_are_in_range():
    for rec in RECORDS:
        m, w, p, h = rec["model"], rec["workload"], rec["parallel"], rec["hardware"]
        assert re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])", rec["date"]), rec["id"]
        assert rec["source_url"].startswith("https://"), rec["id"]
        assert m["num_layers"] > 0 and m["hidden_size"] > 0 and m["vocab_size"] > 0, rec["id"]
        assert m["num_heads"] % m["num_kv_heads"] == 0, rec["id"]  # GQA groups are whole: 64 heads / 8 kv = 8
        assert (m["arch"] == "moe") == (m["num_experts"] is not None), rec["id"]
        if m["arch"] == "moe":
            assert 1 <= m["moe_topk"] <= m["num_experts"] and m["moe_ffn_hidden_size"] > 0, rec["id"]
        assert 1 <= h["num_gpus"] <= 4096, rec["id"]
        for key in ("tp", "pp", "ep", "dp"):
            assert p[key] is None or 1 <= p[key] <= h["num_gpus"], (rec["id"], key)
        if p["tp"] and p["pp"]:
            assert p["tp"] * p["pp"] <= h["num_gpus"], rec["id"]  # a replica fits the GPUs counted
        for key in ("input_len", "output_len", "batch_size", "concurrency", "num_requests"):
            assert w[key] is None or w[key] >= 1, (rec["id"], key)
        assert w["request_rate"] is None or w["request_rate"] > 0, rec["id"]
        for key in METRICS:
            assert rec["measured"][key] is None or rec["measured"][key] > 0, (rec["id"], key)
        assert rec["split"] in SPLITS, rec["id"]


def test_each_record_measured_something_and_says_which_statistic_its_latencies_are():
    """Latencies carry a percentile unless the source leaves the statistic unstated (then notes say so)."""
    for rec in RECORDS:
        measured = rec["measured"]
        numbers = [v for k, v in measured.items() if k not in ("percentile", "percentile_by_field")
                   and isinstance(v, (int, float))]
        assert numbers, rec["id"]
        latencies = [k for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms") if measured[k] is not None]
        if latencies and measured["percentile"] is None:
            assert "percentile null" in rec["notes"], rec["id"]


def test_ids_are_unique():
    counts = Counter(rec["id"] for rec in RECORDS)
    assert [key for key, n in counts.items() if n > 1] == []


def test_enough_records_sources_and_gpu_generations():
    assert len(RECORDS) >= 60
    assert len({rec["source"] for rec in RECORDS}) >= 3
    assert len({rec["hardware"]["generation"] for rec in RECORDS}) >= 3
    evaluable = [rec for rec in RECORDS if rec["split"] != "holdout"]
    assert len({rec["hardware"]["generation"] for rec in evaluable}) >= 3  # Ampere, Ada, Hopper, Blackwell


def test_github_locators_are_pinned_to_a_commit():
    for rec in RECORDS:
        if rec["source_url"].startswith("https://github.com/"):
            assert re.search(r"/blob/[0-9a-f]{40}/", rec["source_url"]), rec["id"]
            assert re.search(r"@[0-9a-f]{40} ", rec["source_locator"]), rec["id"]


def _expected_splits() -> dict[str, str]:
    """The README's rule: per group, order ids by sha256(id); even rank fit, odd rank check; a held-back source is
    holdout whole."""
    groups = defaultdict(list)
    for rec in RECORDS:
        groups[rec["group"]].append(rec)
    expected = {}
    for recs in groups.values():
        ordered = sorted(recs, key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
        for rank, rec in enumerate(ordered):
            expected[rec["id"]] = ("holdout" if rec["source"] in HOLDOUT_SOURCES
                                   else ("fit", "check")[rank % 2])
    return expected


def test_split_follows_the_documented_rule():
    expected = _expected_splits()
    assert {rec["id"]: rec["split"] for rec in RECORDS} == expected
    by_group = defaultdict(Counter)
    for rec in RECORDS:
        by_group[rec["group"]][rec["split"]] += 1
    for group, counts in by_group.items():
        if "holdout" not in counts:
            assert counts["fit"] - counts["check"] in (0, 1), group  # halves: 164 / 164, 2 / 2, 1 / 0
    holdout_sources = {rec["source"] for rec in RECORDS if rec["split"] == "holdout"}
    assert holdout_sources == HOLDOUT_SOURCES
    assert {rec["split"] for rec in RECORDS if rec["source"] in HOLDOUT_SOURCES} == {"holdout"}


def test_a_group_belongs_to_one_source():
    sources = defaultdict(set)
    for rec in RECORDS:
        sources[rec["group"]].add(rec["source"])
    assert all(len(s) == 1 for s in sources.values())


def test_online_serving_rows_agree_with_themselves():
    """TensorRT-LLM 0.14 serving table: total tokens/s ~ req/s x (ISL + OSL) and output tokens/s ~ req/s x OSL.
    The table rounds req/s to integers (2 req/s x 256 = 512 vs 498 printed), hence the loose band; a mistyped
    digit moves a value far outside it."""
    rows = [rec for rec in RECORDS if rec["group"] == "trtllm_serving_v0.14"]
    assert len(rows) == 72  # 2 GPUs x 2 models x 3 ISL/OSL x 6 rates
    for rec in rows:
        m, w = rec["measured"], rec["workload"]
        total = m["requests_per_s"] * (w["input_len"] + w["output_len"])
        output = m["requests_per_s"] * w["output_len"]
        assert total == pytest.approx(m["total_tokens_per_s"], rel=0.3), rec["id"]
        assert output == pytest.approx(m["output_tokens_per_s"], rel=0.3), rec["id"]


def test_fixed_batch_latencies_grow_with_the_batch():
    """vLLM latency on MI300X, three releases of AMD's page (0.6.6, 0.7.3, 0.10.0): end-to-end latency of one batch is
    monotone in the batch size at fixed lengths (1 .. 128 sequences; 0.10.0's 70B 128/2048: 17,236 ms at batch 1 to
    46,484 ms at batch 128)."""
    series = defaultdict(list)
    for rec in RECORDS:
        if rec["group"].startswith("amd_mi300x_vllm_") and rec["group"].endswith("_latency"):
            w = rec["workload"]
            series[(rec["group"], rec["model"]["name"], w["input_len"], w["output_len"])].append(
                (w["batch_size"], rec["measured"]["e2e_latency_ms"]))
    assert len(series) == 3 * 4 and all(len(points) == 8 for points in series.values())
    for points in series.values():
        latencies = [ms for _, ms in sorted(points)]
        assert latencies == sorted(set(latencies))  # strictly rising: 405B 2048/2048 48,362 < 49,121 < ...
