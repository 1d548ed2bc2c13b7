"""Every measured run says which source it comes from (meshplan_validation/provenance.py): the unit a fitted constant is
judged out of (issue 79). A new data file's groups must be named there, so that its runs are held out by source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan_validation.provenance import SOURCES, matched, record_source, source_of

ROOT = Path(__file__).resolve().parents[1]
FILES = ("data/validation/published_runs.jsonl", "data/validation/small_work.jsonl",
         "data/validation/vtrain_single_node_dev.jsonl", "benchmarks/data/independent_runs.jsonl",
         "data/serving/published_serving.jsonl", "data/serving/small_work.jsonl", "data/serving/load_tests.jsonl",
         "data/serving/llm_inference_bench_dev.jsonl", "data/serving/dstack_mi300x.jsonl")


@pytest.mark.parametrize("path", FILES)
def test_every_group_of_every_file_names_its_source(path):
    records = [json.loads(line) for line in (ROOT / path).read_text().splitlines() if line.strip()]
    unnamed = sorted({str(r.get("group") or r["id"]) for r in records if not matched(str(r.get("group") or r["id"]))})
    assert not unnamed, f"{path}: groups with no source in provenance.SOURCES: {unnamed[:5]}"


def test_the_releases_of_one_table_are_one_source():
    # Megatron-Bridge's performance summary at 25.09 and 26.08, and its Blackwell Ultra rows: one framework's table
    assert source_of("megatron_bridge_25.09") == source_of("megatron_bridge_26.08") == source_of(
        "megatron_bridge_26.02_blackwell_ultra") == "megatron_bridge"
    assert source_of("trtllm_perf_v0.17") == source_of("trtllm_perf_v1.0") == source_of("trtllm_serving_v0.14")
    assert source_of("nemo_24.07") == source_of("nemo_long_context") == source_of("nemo_2504_gb200_perf_summary")
    assert source_of("nemo_automodel_perf_summary_h100") != "nemo"  # another table, another framework
    assert record_source({"id": "sglang030_vs_vllm060_vllm_llama3-8b_a100_tp1_rps4"}) == "sglang_vs_vllm_readme"
    assert source_of("a_group_nobody_named") == "a_group_nobody_named"  # unmatched: a source of its own


def test_source_keys_are_unique():
    keys = [s.key for s in SOURCES]
    assert len(keys) == len(set(keys))
