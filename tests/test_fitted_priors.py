"""What a fitted constant falls to without its only source (meshplan_validation/fitted.py ``prior``), and which
runs of the other sources judge it (benchmarks/docs/out_of_source.py ``serving_priors``; issue 79: "a fitted constant
must earn its place out of source")."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

from meshplan_validation import loso_serving
from meshplan_validation.fitted import (
    ITERATION_LATENCY_PRIOR,
    KERNEL_GAP_PRIOR,
    MI300X_LAUNCH_GAP_US,
    UNTUNED_GEMM_PRIOR,
    UNTUNED_GEMM_SPEEDUP,
    UNTUNED_GEMM_STEP_PRIOR,
    V0_LAUNCH_US,
    V0_LAUNCHED_DISPATCHES,
    by_name,
)
from meshplan_validation.records import read_runs

ROOT = Path(__file__).resolve().parents[1]


def test_the_rocm_gemm_rates_fall_to_the_published_tuning_gains_bound():
    # no other published run of the hipBLASLt builds (PyTorch >= 2.5): without Argonne's runs the rate falls to
    # Nscale's bound: GEMM tuning speeds vLLM on MI300X up "by up to 7.2x", and the GEMMs gain at least what the whole
    # step gains, so untuned they run at most 1 / 7.2 of the tuned rate; with the time the model prices outside the
    # GEMMs of the most GEMM-bound V0 step on MI300X, at most 0.1012 of it (tests/test_untuned_bound.py)
    f = by_name("vLLM ROCm skinny_gemm_rate")
    assert abs(UNTUNED_GEMM_PRIOR - 1 / UNTUNED_GEMM_SPEEDUP) < 1e-4
    assert f.prior == UNTUNED_GEMM_STEP_PRIOR
    assert abs(UNTUNED_GEMM_STEP_PRIOR - 0.1012) < 1e-12 and UNTUNED_GEMM_STEP_PRIOR < UNTUNED_GEMM_PRIOR
    # the rate fitted on Argonne's MI300X runs is within that bound (its steps' GEMMs gain more than 7.2x)
    assert 0 < f.value() < f.prior < 1
    # leaving Argonne out (its only source) prices its runs at the prior; leaving another source out keeps it
    assert loso_serving.single_without("argonne_bench")["vLLM ROCm skinny_gemm_rate"] == f.prior
    assert "vLLM ROCm skinny_gemm_rate" not in loso_serving.single_without("amd_vllm")
    # rocBLAS's (PyTorch 2.4) is the bound itself, chosen with dstack's runs in view: out of source as in sample
    r = by_name("vLLM ROCm skinny_gemm_rate, rocBLAS")
    assert r.sources == {"dstack"} and r.prior == r.value() == UNTUNED_GEMM_PRIOR
    assert loso_serving.single_without("dstack") == {r.name: r.prior}


def test_the_rocm_kernel_gap_falls_to_the_mi300x_launch_cost():
    # the launch-plus-cleanup overhead of about 4.5 us per kernel Kog AI measured on 8x MI300X (blog.kog.ai, 2026)
    f = by_name("vLLM ROCm kernel_gap")
    assert MI300X_LAUNCH_GAP_US == 4.5
    assert f.prior == KERNEL_GAP_PRIOR == pytest.approx(4.5e-6, rel=1e-12)
    assert f.unit == "s per kernel"
    # the gap fitted on Argonne's MI300X runs (8.35 us, the TP input broadcast and the workers' look priced) lies
    # above it
    assert 0 < f.prior < f.value() == pytest.approx(8.351e-6)
    # leaving Argonne out (its only source) prices its runs at the prior; leaving another source out keeps it
    assert loso_serving.single_without("argonne_bench")["vLLM ROCm kernel_gap"] == f.prior
    assert "vLLM ROCm kernel_gap" not in loso_serving.single_without("amd_vllm")


def test_dstacks_runs_read_near_at_the_rocblas_rate_and_far_at_the_hipblaslt_rate():
    # dstack's upstream vLLM over torch 2.4.1 on 8x MI300X (Llama 3.1 405B BF16, tp 8, 1-256 prompts at once): at the
    # priors their time per output token reads within a few per cent (median), with the shipped gap and latency within
    # 15 %, at the hipBLASLt rate fitted on Argonne's runs about 50 % too slow
    sys.path.insert(0, str(ROOT / "benchmarks" / "measure"))
    import dstack_mi300x  # noqa: PLC0415

    priors = dstack_mi300x.tpot_errors({"iteration_latency": ITERATION_LATENCY_PRIOR,
                                        "skinny_gemm_rate": UNTUNED_GEMM_PRIOR, "kernel_gap": KERNEL_GAP_PRIOR})
    shipped = dstack_mi300x.tpot_errors({})
    hipblaslt = dstack_mi300x.tpot_errors({"skinny_gemm_rate": by_name("vLLM ROCm skinny_gemm_rate").value()})
    assert statistics.median(abs(e) for e in priors) < 0.05
    assert statistics.median(abs(e) for e in shipped) < 0.15
    assert statistics.median(hipblaslt) > 0.3


def test_the_kernel_gap_prior_moves_an_mi300x_step_by_the_launch_cost_of_its_kernels():
    # priced at the prior, an MI300X run of Argonne's released half is slower than at 0 and faster than as shipped
    record = next(r for r in read_runs(ROOT / "data/serving/llm_inference_bench_dev.jsonl")
                  if r["id"] == "llminfbench_vllm_mi300x_llama-2-70b-hf_tp2_bs1_128x128")
    priced = [loso_serving.priced([record], {"vLLM ROCm kernel_gap": v})[0]
              for v in (0.0, KERNEL_GAP_PRIOR, by_name("vLLM ROCm kernel_gap").value())]
    assert {r.gpu for r in priced} == {"MI300X-192GB"} and all(r.headline for r in priced)
    zero, prior, shipped = (r.predicted for r in priced)
    assert zero > prior > shipped  # a throughput: more idle per kernel, fewer tokens per second

def test_the_v0_iteration_latency_falls_to_the_launches_its_cpu_measurement_leaves_out():
    # benchmarks/measure/vllm_v0_host_cpu.py: about 20 of an iteration's dispatches launch a kernel on a GPU host, some
    # 5 us each more than on the CPU it measured: 20 x 5 us = 0.1 ms an iteration, not 0
    f = by_name("vLLM V0 iteration_latency")
    assert (V0_LAUNCHED_DISPATCHES, V0_LAUNCH_US) == (20, 5.0)
    assert f.prior == ITERATION_LATENCY_PRIOR == pytest.approx(1.0e-4, rel=1e-12)
    # the script's docstring states the figure the prior is built from
    assert "(0.1 ms an" in (ROOT / "benchmarks/measure/vllm_v0_host_cpu.py").read_text()
    # the latency fitted on Argonne's H100 runs lies above that floor; out of Argonne the prior prices its runs
    assert 0 < f.prior < f.value() == pytest.approx(1.115e-3)
    assert loso_serving.single_without("argonne_bench")["vLLM V0 iteration_latency"] == f.prior
    assert "vLLM V0 iteration_latency" not in loso_serving.single_without("amd_vllm")


def test_the_iteration_latency_prior_moves_an_h100_step_by_its_launches():
    # a tp-1 H100 run of Argonne's released half: slower at the prior than at 0, faster than as shipped, and by about
    # 0.1 ms a step over its 128 decode steps (the throughput counts 2 x 128 tokens of one sequence)
    record = next(r for r in read_runs(ROOT / "data/serving/llm_inference_bench_dev.jsonl")
                  if r["id"] == "llminfbench_vllm_h100_llama-2-7b-hf_tp1_bs1_128x128")
    priced = [loso_serving.priced([record], {"vLLM V0 iteration_latency": v})[0]
              for v in (0.0, ITERATION_LATENCY_PRIOR, by_name("vLLM V0 iteration_latency").value())]
    assert {r.gpu for r in priced} == {"H100-SXM-80GB"} and all(r.headline for r in priced)
    zero, prior, shipped = (r.predicted for r in priced)
    assert zero > prior > shipped
    added = 256 / prior - 256 / zero  # seconds of the run's latency the prior adds
    assert added == pytest.approx(128 * ITERATION_LATENCY_PRIOR, rel=0.1)


def _out_of_source():
    sys.path.insert(0, str(ROOT / "benchmarks" / "docs"))
    import out_of_source  # noqa: PLC0415

    return out_of_source


def test_a_fixed_batch_latency_run_judges_the_constants_that_move_it():
    # AMD's MI300X tables time a fixed batch end to end (no throughput): each run is judged by that latency, once
    records = [r for r in read_runs(ROOT / "data/serving/published_serving.jsonl")
               if r["group"] == "amd_mi300x_vllm_0.6.6_latency"][:4]
    results = loso_serving.priced(records)
    judged = _out_of_source()._judged(results)
    assert not any(r.headline for r in results)
    assert sorted({results[i].id for i in judged}) == sorted(r["id"] for r in records)
    assert {results[i].metric for i in judged} == {"e2e_latency_ms"}


def test_a_run_with_a_throughput_is_judged_by_it_alone():
    records = [r for r in read_runs(ROOT / "data/serving/llm_inference_bench_dev.jsonl")][:3]
    results = loso_serving.priced(records)
    judged = _out_of_source()._judged(results)
    assert judged == {i for i, r in enumerate(results) if r.headline} and len(judged) == 3
