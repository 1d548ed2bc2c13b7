"""TensorRT-LLM's prefill is one engine field (Engine.prefill) that the steady state and the load simulator both read,
set as each release runs it: chunked context off by default ("whole": the LLM API, trtllm-serve, the Triton backend,
trtllm-bench 1.0 on the PyTorch backend), on for trtllm-bench 0.17's throughput runs on a TensorRT engine
("chunked"); with it off, a prompt longer than max_num_tokens is refused, not priced (LlmRequest::validate)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshplan import load_model, load_system
from meshplan.cli.main import main
from meshplan.serve.check import PROMPT, refused_prompt
from meshplan.serve.engine import load_engine
from meshplan.serve.estimate import serve_estimate
from meshplan.serve.load.policy import policy_for
from meshplan.serve.plan import ServePlan, Workload
from meshplan_validation.serving_map import case_of

RECORDS = Path(__file__).resolve().parents[1] / "data" / "serving" / "published_serving.jsonl"


@pytest.mark.parametrize("name", ["trtllm", "trtllm-pytorch"])
def test_the_simulator_runs_the_scheduler_of_the_engines_own_prefill(name):
    engine = load_engine(name)
    assert engine.prefill == "whole"
    for prefill in ("whole", "chunked"):
        policy = policy_for(engine.with_(prefill=prefill))
        flags = engine.with_(prefill=prefill).mode("prefill")
        assert (policy.mixed, policy.chunked) == (flags.mixed, flags.chunked), (prefill, policy.name)
    # the other engines keep the scheduler their presets name
    assert {n: policy_for(load_engine(n)).name for n in ("vllm", "vllm-v0", "sglang", "lmdeploy")} == {
        "vllm": "vllm-v1", "vllm-v0": "vllm-v0", "sglang": "sglang", "lmdeploy": "turbomind"}


def test_a_prompt_past_max_num_tokens_is_refused_with_chunking_off_and_run_with_it_on():
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(1)
    plan = ServePlan(tp=1, batch=8)
    whole = load_engine("trtllm")
    long = Workload(input_len=whole.max_batched_tokens + 1, output_len=64)
    refused = serve_estimate(model, cluster, plan, long, whole)
    assert any(r.startswith(PROMPT) for r in refused.reasons)
    assert np.isnan(refused.metrics.ttft) and refused.metrics.tokens_per_s == 0.0
    chunked = serve_estimate(model, cluster, plan, long, whole.with_(prefill="chunked"))
    assert not chunked.reasons and chunked.metrics.tokens_per_s > 0
    # at the budget it runs; a static batch is not the in-flight scheduler's; "separate" engines are not bounded
    assert not refused_prompt(whole, Workload(input_len=whole.max_batched_tokens, output_len=64))
    assert not refused_prompt(whole, Workload(input_len=long.input_len, output_len=64, static=True))
    assert not refused_prompt(load_engine("vllm-v0"), long)


def test_serve_refuses_the_search_in_one_line(capsys):
    code = main(["serve", "--model", "llama3-8b", "--seq", "32768", "--system", "h100", "--gpus", "1", "--engine",
                 "trtllm", "--input-len", "20000", "--output-len", "100"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and not out and len(lines) == 1 and PROMPT in lines[0] and "20,000 > 8,192" in lines[0]


def test_each_trtllm_source_is_read_with_its_release_s_prefill():
    seen: dict[str, set] = {}
    for line in RECORDS.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        text = record.get("engine") or ""
        if "TensorRT-LLM" not in text:
            continue
        case = case_of(record)
        if isinstance(case, str):
            continue
        seen.setdefault(text.split(" (")[0] + (" pytorch" if "PyTorch" in text else ""), set()).add(
            case.engine.prefill)
        # nothing a source ran is refused: trtllm-bench 1.0 raised max_num_tokens past its longest prompt
        assert not refused_prompt(case.engine, case.workload), record["id"]
        if case.engine.prefill == "whole" and "PyTorch" in text and case.workload.input_len > 8192:
            assert case.engine.max_batched_tokens >= case.workload.input_len + case.engine.graph_max_batch
    assert seen["TensorRT-LLM 0.17"] == {"chunked"}
    assert seen["TensorRT-LLM 0.14.0"] == {"whole"}
    assert seen["TensorRT-LLM pytorch"] == {"whole"}
