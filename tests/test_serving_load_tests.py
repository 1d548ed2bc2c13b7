"""data/serving/load_tests.jsonl: published load tests recorded as printed, each pinned to its source, with a workload
the simulator can rebuild (benchmarks/measure/load_tests_percentiles.py). The printed figures of one benchmark run must
agree with each other as the tool computes them (vLLM benchmarks/serve.py: request throughput = completed / duration,
output throughput = generated tokens / duration), which catches a value copied into the wrong run."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from meshplan.serve.engine import load_engine
from meshplan.serve.engine_version import preset_for
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

ROOT = Path(__file__).resolve().parents[1]
RECORDS = [json.loads(line) for line in (ROOT / "data/serving/load_tests.jsonl").read_text().splitlines()
           if line.strip()]
PRINTED = [r for r in RECORDS if "percentiles" in r["measured"]]
ids = [r["id"] for r in RECORDS]


def test_ids_are_unique_and_the_sources_pinned():
    assert len(ids) == len(set(ids)) == len(RECORDS) >= 78
    for r in RECORDS:
        assert re.search(r"/blob/[0-9a-f]{40}/", r["source_url"]), r["id"]
        assert re.search(r"@[0-9a-f]{40} ", r["source_locator"]), r["id"]


@pytest.mark.parametrize("record", RECORDS, ids=ids)
def test_engine_model_and_hardware_resolve(record):
    preset = preset_for(record["engine"])
    assert preset is not None, record["engine"]
    load_engine(preset)
    load_model(record["model"]["preset"])
    load_system(record["hardware"]["preset"]).cluster(record["hardware"]["num_gpus"])


def test_versions_pick_their_engines():
    engines = {r["engine"]: preset_for(r["engine"]) for r in PRINTED}
    assert engines["vLLM 0.11.0"] == engines["vLLM 0.10.2"] == "vllm"  # V1 from 0.8
    assert engines["SGLang 0.5.3"] == "sglang"
    assert engines["TensorRT-LLM 1.0.0 (PyTorch backend)"] == "trtllm-pytorch"


@pytest.mark.parametrize("record", PRINTED, ids=[r["id"] for r in PRINTED])
def test_printed_figures_agree_with_each_other(record):
    m, w = record["measured"], record["workload"]
    n, duration = m["successful_requests"], m["duration_s"]
    # request throughput printed to 2 decimals: at 100 requests in 100-300 s one unit in the last place is 3-4 %
    assert m["requests_per_s"] * duration == pytest.approx(n, rel=0.04, abs=0.6)
    assert m["output_tokens_per_s"] * duration == pytest.approx(m["total_output_tokens"], rel=0.005)
    assert (m["total_input_tokens"] + m["total_output_tokens"]) / duration == pytest.approx(
        m["total_tokens_per_s"], rel=0.005)
    assert w["mean_output_len"] == pytest.approx(m["total_output_tokens"] / n, abs=0.01)
    if w["dataset"] == "random":  # the random prompts re-tokenised: within 1 % of the length asked for
        assert m["total_input_tokens"] / n == pytest.approx(w["input_len"], rel=0.01)
        assert m["total_output_tokens"] / n <= w["output_len"]  # no --ignore-eos: an output may end early
    for metric, stats in m["percentiles"].items():
        assert 0 <= stats["p50"] <= stats["p99"], (metric, stats)


def test_the_benchmark_rebuilds_what_the_tool_sent():
    sys.path.insert(0, str(ROOT / "benchmarks" / "measure"))
    from load_tests_percentiles import printed, requests

    burst = next(r for r in PRINTED if r["id"] == "gpustack_gpt-oss-20b_h100_vllm_random-4k-input")
    reqs = requests(burst, 0)
    # 500 prompts of 4,000 tokens at once, each output the printed total of generated tokens over the 500, rounded
    assert len(reqs) == 500 and reqs.concurrency == 0 and not reqs.arrival.any()
    assert set(reqs.input_len) == {4000}
    assert set(reqs.output_len) == {round(burst["measured"]["total_output_tokens"] / 500)}
    closed = next(r for r in PRINTED if r["workload"]["concurrency"] == 4)
    assert requests(closed, 0).concurrency == 4
    share = next(r for r in PRINTED if r["workload"]["dataset"] == "sharegpt" and not r["workload"]["concurrency"])
    drawn = requests(share, 0)
    assert drawn.output_len.mean() == pytest.approx(share["workload"]["mean_output_len"], rel=0.01)
    assert printed(share)[("ttft_ms", "p50")] == share["measured"]["percentiles"]["ttft_ms"]["p50"]
