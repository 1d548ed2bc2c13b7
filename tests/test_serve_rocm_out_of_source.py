"""Where the out-of-source miss of LLM-Inference-Bench's MI300X runs is not (issue 79; data/measured/
2026-11-30-argonne-mi300x-out-of-source.md). Out of source (every constant refitted without Argonne's runs,
meshplan_validation/loso_serving.py) vLLM v0.6.1's ROCm build reads too fast in throughput, and the miss grows with
the batch. The two constants only Argonne's runs fit fall to their priors there (meshplan_validation/fitted.py): the
untuned decode GEMMs' rate to Nscale's 7.2x read with the model's own step, 0.1012 (untuned_bound.py; 1 / 7.2 = 0.1389
before it; shipped 0.0665), and the gap between kernels to Kog AI's 4.5 us (shipped 8.35 us). These tests show, with
the model's own arithmetic beside the measured runs, that the time each sequence adds to a step is missing from the
decode GEMMs and from nothing else the brief names: not the attention kernels by context, not RCCL's all-reduces by
TP, not the host per sequence."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.engine import Engine, load_engine
from meshplan.serve.estimate import plan_columns
from meshplan.serve.iteration import layouts, shaped_seconds, stage_ops
from meshplan.serve.metrics import Setting
from meshplan.serve.plan import ServePlan, Workload
from meshplan.serve.precision import Quant
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan_validation import loso_serving
from meshplan_validation.fitted import KERNEL_GAP_PRIOR, UNTUNED_GEMM_STEP_PRIOR, by_name

ROOT = Path(__file__).resolve().parents[1]
RUNS = {r["id"]: r for r in (json.loads(line) for line in
                             (ROOT / "data/serving/llm_inference_bench_dev.jsonl").read_text().splitlines() if line)}
FP16 = Quant(weights="fp16", activations="fp16", kv_cache="fp16")
OUT = {"vLLM ROCm skinny_gemm_rate": UNTUNED_GEMM_STEP_PRIOR, "vLLM ROCm kernel_gap": KERNEL_GAP_PRIOR}
SMALL, LARGE, LENGTH = 16, 256, 128  # the per-sequence cost from 16 to 256 sequences at 128 tokens in and out


def run_id(model: str, tp: int, batch: int) -> str:
    return f"llminfbench_vllm_mi300x_llama-2-{model}-hf_tp{tp}_bs{batch}_{LENGTH}x{LENGTH}"


def per_sequence(model: str, tp: int, values: dict[str, float]) -> tuple[float, float]:
    """(measured, predicted) ms each sequence adds to the time per output token (e2e / O), from 16 to 256."""
    records = [RUNS[run_id(model, tp, b)] for b in (SMALL, LARGE)]
    e2e = {r.id: r for r in loso_serving.priced(records, values) if r.metric == "e2e_latency_ms"}
    ends = [e2e[run_id(model, tp, b)] for b in (SMALL, LARGE)]
    measured = (ends[1].measured - ends[0].measured) / LENGTH / (LARGE - SMALL)
    predicted = ((ends[1].predicted or 0.0) - (ends[0].predicted or 0.0)) / LENGTH / (LARGE - SMALL)
    return measured, predicted


def step_split(model: str, tp: int, engine: Engine) -> tuple[float, float]:
    """(GEMMs, everything else) ms each sequence adds to a decode step at 128 tokens of context: the step's GEMMs
    (shaped_seconds, at the engine's untuned rate) and the rest of Setting.time (the decode attention over the cache,
    the memory-bound ops, the TP all-reduces, the host per sequence)."""
    work = Workload(input_len=LENGTH, output_len=LENGTH, static=True)
    gemms, steps = [], []
    for batch in (SMALL, LARGE):
        s = Setting(load_model(f"llama2-{model}"), load_system("mi300x").cluster(tp),
                    plan_columns(ServePlan(tp=tp, batch=batch, quant=FP16)), FP16, engine, work)
        sh = s.shape(float(batch), 0.0, 0.0, 0.0)
        gemms.append(sum(float(n * shaped_seconds(op, s.cluster, FP16, SERVE_DEFAULT, layouts(tp, 1, 1), sh))
                         for op, n in stage_ops(s.model, sh, 1) if op.kind == "gemm"))
        steps.append(float(s.time(float(batch))))
    gemm = 1e3 * (gemms[1] - gemms[0]) / (LARGE - SMALL)
    return gemm, 1e3 * (steps[1] - steps[0]) / (LARGE - SMALL) - gemm


def test_the_priors_are_the_single_source_constants_argonne_alone_fits():
    # what falls to a prior without Argonne's runs: the rate and the gap (the V0 iteration latency is refitted on the
    # other sources' runs, loso_serving.ALTERNATE; it is per iteration, so it cancels from a per-sequence cost)
    assert by_name("vLLM ROCm skinny_gemm_rate").sources == {"argonne_bench"}
    assert by_name("vLLM ROCm kernel_gap").sources == {"argonne_bench"}
    assert UNTUNED_GEMM_STEP_PRIOR == 0.1012 and abs(KERNEL_GAP_PRIOR - 4.5e-6) < 1e-12
    assert load_engine("vllm-v0.6-rocm").skinny_gemm_rate < 0.7 * UNTUNED_GEMM_STEP_PRIOR


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_llama_2_70bs_per_sequence_miss_out_of_source_is_in_the_decode_gemms(tp):
    """Llama 2 70B, vLLM v0.6.1 ROCm build, 128 tokens in and out, 16 -> 256 sequences. At tp 1 each sequence adds
    4.21 ms to the measured time per output token, 2.83 ms to the out-of-source prediction: 1.39 ms missing. The
    model's decode step at the priors spends 2.40 ms a sequence in its GEMMs and 0.20 ms in everything else (the
    attention over the cache 0.14 ms, the host's 58 us a sequence, the memory-bound ops; no all-reduce at tp 1): the
    miss is 6.8x all of the rest, so no rate of the attention kernels by context, of RCCL by TP or of the host per
    step could carry it, while the GEMMs at 0.1012 x 2.40 / (2.40 + 1.39) = 0.064 of the modelled rate do. At tp 8:
    0.71 - 0.44 = 0.27 ms missing, 2.7x the rest (0.10 ms, its all-reduces 0.019 ms among them); the GEMMs at 0.053;
    at tp 2 1.8x. The rate that closes the miss stays within 0.05-0.08 at tp 1-8, about the 0.0665 Argonne's runs fit
    (vllm-v0.6-rocm.toml): one rate of the untuned library, below the bound Nscale's 7.2x sets, which no other source
    measures. (Llama 2 7B at tp 1 and 2 reads within 0.01 ms a sequence at the prior.)"""
    measured, predicted = per_sequence("70b", tp, OUT)
    missing = measured - predicted
    gemm, rest = step_split("70b", tp, replace(load_engine("vllm-v0.6-rocm"), skinny_gemm_rate=UNTUNED_GEMM_STEP_PRIOR,
                                               kernel_gap=KERNEL_GAP_PRIOR))
    assert missing > 1.5 * rest  # not the attention, the collectives or the host: all of them together fall short
    needed = UNTUNED_GEMM_STEP_PRIOR * gemm / (gemm + missing)
    assert 0.05 < needed < 0.08
    assert abs(needed / load_engine("vllm-v0.6-rocm").skinny_gemm_rate - 1) < 0.25
    if tp == 1:
        assert measured == pytest.approx(4.21, abs=0.01) and predicted == pytest.approx(2.83, abs=0.01)
        assert gemm == pytest.approx(2.40, abs=0.01) and rest == pytest.approx(0.20, abs=0.01)


def test_the_miss_shrinks_with_tensor_parallelism_as_gpu_work_does():
    """The 70B's missing per-sequence cost falls 1.39 -> 0.27 ms from tp 1 to tp 8 (5.2x): GPU work split 8 ways.
    An all-reduce's cost per sequence grows with the group (RCCL's steps) and the host's per sequence does not
    change with it, so neither can be where it is; in sample (the fitted rate) the same runs read 4.09 and 0.60 ms."""
    miss = {tp: (lambda m, p: m - p)(*per_sequence("70b", tp, OUT)) for tp in (1, 8)}
    assert miss[1] > 4.5 * miss[8] > 0
    inside = {tp: per_sequence("70b", tp, {}) for tp in (1, 8)}
    for tp in (1, 8):
        assert abs(inside[tp][1] / inside[tp][0] - 1) < 0.2  # the fitted rate reads them within 20 %
