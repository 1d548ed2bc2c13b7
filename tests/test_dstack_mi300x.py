"""dstack's vLLM runs on 8x MI300X (data/serving/dstack_mi300x.jsonl, data/serving/README.md): a second source for
vLLM's untuned ROCm build, priced with upstream's ROCm preset from v0.6.2 over PyTorch 2.4, whose untuned GEMMs are
rocBLAS's (presets/engines/vllm-v0.6.2-rocm-rocblas.toml), held out by source like every other run (issue 79)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.engine import load_engine
from meshplan.serve.engine_version import preset_for
from meshplan_validation import loso_serving
from meshplan_validation.fitted import UNTUNED_GEMM_SPEEDUP, by_name
from meshplan_validation.provenance import record_source
from meshplan_validation.serving_eval import predict, results
from meshplan_validation.serving_map import case_of

ROOT = Path(__file__).resolve().parents[1]
RUNS = [json.loads(line) for line in (ROOT / "data/serving/dstack_mi300x.jsonl").read_text().splitlines() if line]
COMMIT = "658b13909cbe0d1e6077bf00caf15cd07e4eda2b"


def test_the_runs_are_one_batch_each_of_80_token_prompts_with_their_locator():
    assert len(RUNS) == 9 and len({r["id"] for r in RUNS}) == 9
    for r in RUNS:
        w = r["workload"]
        assert w["batch_size"] == w["num_requests"] <= 256  # max_num_seqs: one batch
        assert 79 <= w["input_len"] <= 82
        assert COMMIT in r["source_url"] and COMMIT in r["source_locator"]
        assert record_source(r) == "dstack"
    tpots = [r["measured"]["tpot_ms"] for r in sorted(RUNS, key=lambda r: r["workload"]["batch_size"])]
    assert tpots == sorted(tpots)  # a larger batch never decodes faster


def test_an_upstream_rocm_build_keeps_the_untuned_presets_and_amds_images_do_not():
    # the engine strings name the build: upstream's (untuned GEMMs) or AMD's tuned images (the CUDA V0 preset)
    assert {preset_for(r["engine"], r["date"]) for r in RUNS} == {"vllm-v0.6.2-rocm-rocblas"}  # torch 2.4.1
    assert preset_for("vLLM 0.6.3 upstream, ROCm") == "vllm-v0.6.2-rocm"
    assert preset_for("vLLM 0.6.1 upstream, ROCm") == "vllm-v0.6-rocm"
    assert preset_for("vLLM 0.5.3 upstream, ROCm") == "vllm-v0.5-rocm"
    assert preset_for("vLLM 0.6.6 ROCm (AMD rocm/vllm image)") == "vllm-v0"
    assert preset_for("vLLM 0.9.2 upstream, ROCm") == "vllm"
    assert preset_for("vLLM v0.6.1 built for ROCm (git checkout v0.6.1, Dockerfile.rocm)") == "vllm-v0.6-rocm"


def test_from_v0_6_2_a_gqa_group_reads_its_kv_head_once():
    # v0.6.1 decodes with the hipified generic kernel (one thread block per query head); from v0.6.2 ROCm's own kernel
    # takes the whole group: the presets differ there alone, so a GQA model at long context decodes faster on the
    # later build, an MHA model (group of one) alike
    old, new = load_engine("vllm-v0.6-rocm"), load_engine("vllm-v0.6.2-rocm")
    assert old.kv_per_query_head and not new.kv_per_query_head
    same = ("skinny_gemm_rows", "skinny_gemm_rate", "kernel_gap", "engine_all_reduce", "iteration_latency",
            "tp_broadcast_poll", "graph_max_batch")
    assert all(getattr(old, f) == getattr(new, f) for f in same)
    record = json.loads(json.dumps(RUNS[-1]))  # 405B (GQA, 16 query heads a KV head), 256 sequences
    record["workload"] |= {"input_len": 4000, "output_len": 4000}
    record["measured"] = {"tpot_ms": 1.0}
    case = case_of(record)
    assert not isinstance(case, str)
    at_old, _ = predict(replace(case, engine=old), SERVE_DEFAULT)
    at_new, _ = predict(case, SERVE_DEFAULT)
    assert at_new["tpot_ms"] < at_old["tpot_ms"]


def test_the_rocm_constants_are_priced_out_of_source_on_these_runs():
    # the hipBLASLt rate and the gap are fitted on Argonne's runs alone, the rocBLAS rate chosen on dstack's: leaving
    # dstack out keeps the first two as shipped and puts the third at its prior, which it is; leaving Argonne out, the
    # first two fall to their priors and the third stays
    hip, roc, gap = "vLLM ROCm skinny_gemm_rate", "vLLM ROCm skinny_gemm_rate, rocBLAS", "vLLM ROCm kernel_gap"
    without_dstack, without_argonne = (loso_serving.single_without(s) for s in ("dstack", "argonne_bench"))
    assert set(without_dstack) == {roc} and {hip, gap} <= set(without_argonne) and roc not in without_argonne
    assert "vllm-v0.6.2-rocm" in loso_serving.ROCM and "vllm-v0.6.2-rocm-rocblas" in loso_serving.ROCBLAS
    shipped = results(RUNS[:2])
    out = loso_serving.priced(RUNS[:2], without_dstack)
    assert all(r.metric == "tpot_ms" and r.error is not None for r in shipped)
    assert [r.predicted for r in out] == [r.predicted for r in shipped]  # in sample = out of source
    # the hipBLASLt builds' rate reads these runs far too slow, the rocBLAS rate near
    hipblaslt = loso_serving.priced(RUNS[:2], {roc: by_name(hip).value()})
    assert all(a.error > 0.3 for a in hipblaslt)
    assert all(abs(b.error) < 0.2 for b in shipped)


@pytest.mark.parametrize("name", ["vllm-v0.5-rocm", "vllm-v0.6-rocm", "vllm-v0.6.2-rocm", "vllm-v0.6.2-rocm-rocblas"])
def test_every_untuned_rocm_build_carries_the_same_fitted_constants(name):
    # one rate per GEMM library (PyTorch's preferred backend), one gap for the ROCm 6.1 runtime
    ref = load_engine("vllm-v0.6-rocm")
    engine = load_engine(name)
    rate = by_name("vLLM ROCm skinny_gemm_rate, rocBLAS" if name in loso_serving.ROCBLAS else
                   "vLLM ROCm skinny_gemm_rate").value()
    assert (engine.skinny_gemm_rate, engine.kernel_gap) == (rate, ref.kernel_gap)


def test_the_builds_over_pytorch_2_4_differ_in_the_gemm_rate_alone_and_decode_faster():
    # PyTorch 2.4 prefers rocBLAS, 2.5 hipBLASLt (Context.h of the two wheels): the rocBLAS preset differs from
    # upstream's v0.6.2 preset in skinny_gemm_rate alone, so a decode step (at most 256 rows) is faster on it and
    # slows as its rate falls back to the hipBLASLt builds'
    hip, roc = load_engine("vllm-v0.6.2-rocm"), load_engine("vllm-v0.6.2-rocm-rocblas")
    differ = {f for f in hip.__dataclass_fields__ if getattr(hip, f) != getattr(roc, f)}
    assert differ <= {"name", "version", "source", "skinny_gemm_rate"} and "skinny_gemm_rate" in differ
    assert hip.skinny_gemm_rate < roc.skinny_gemm_rate <= 1 / UNTUNED_GEMM_SPEEDUP + 1e-4
    case = case_of(RUNS[0])
    assert not isinstance(case, str)
    tpots = [predict(replace(case, engine=replace(roc, skinny_gemm_rate=x)), SERVE_DEFAULT)[0]["tpot_ms"]
             for x in (roc.skinny_gemm_rate, (roc.skinny_gemm_rate + hip.skinny_gemm_rate) / 2, hip.skinny_gemm_rate)]
    assert tpots == sorted(tpots) and tpots[0] < tpots[-1]
