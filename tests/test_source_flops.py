"""The sources' FLOP accounting (flops.py): Narayanan et al.'s Eq. 3, Megatron's model FLOPs (Korthikanti's 72 for a
GPT, NeMo's Llama formula), PaLM's 6N, the basis read from a record's text, and the TFLOP/s, MFU and HFU predicted
on that basis."""

from __future__ import annotations

import pytest

from meshplan.specs.model_load import load_model
from meshplan_validation.case import map_run
from meshplan_validation.evaluate import predicted_metric
from meshplan_validation.flops import eq3_flops, flops_basis, megatron_model_flops, palm_flops
from published_helpers import record


def test_narayanan_eq3_for_gpt_1t():
    model = load_model("megatron-1t")
    # 96·B·s·l·h²·(1 + s/6h + V/16lh) with B 3072, s 2048, l 128, h 25600, V 51200:
    # 96·3072·2048·128·25600² = 5.0665e19; s/6h = 2048/153600 = 0.013333, V/16lh = 51200/52428800 = 0.000977
    expected = 96 * 3072 * 2048 * 128 * 25600**2 * (1 + 2048 / 153600 + 51200 / (16 * 128 * 25600))
    assert eq3_flops(model, 3072) == pytest.approx(expected)
    assert expected == pytest.approx(5.0665e19 * 1.014310, rel=1e-4)
    # the published 163 TFLOP/s per GPU on 3072 GPUs is then an iteration of 5.139e19 / (163e12 · 3072) = 102.6 s
    assert expected / (163e12 * 3072) == pytest.approx(102.6, rel=1e-3)


def test_megatron_model_flops_is_korthikanti_72_for_a_gpt():
    model = load_model("megatron-22b")  # l 48, h 6144, V 51200, s 2048, F = 4h, MHA
    b, s, n_l, h, v = 4, 2048, 48, 6144, 51200
    korthikanti = 72 * b * s * n_l * h * h * (1 + s / (6 * h) + v / (12 * n_l * h))
    assert megatron_model_flops(model, b) == pytest.approx(korthikanti)


def test_megatron_model_flops_for_llama_with_gqa_and_swiglu():
    model = load_model("llama3-8b")  # l 32, h 4096, A 32, K 8, F 14336, s 8192
    b, s, n_l, h, v = 1, 8192, 32, 4096, model.vocab_size
    # 12·b·s·l·h²·[(1 + K/A + s/h)·1 + (F/h)·3/2 + V/(2lh)] = NeMo's llama formula
    # l·h²·(12 + 12K/A + 18F/h + 12s/h + 6V/(lh)) per token
    nemo = b * s * n_l * h * h * (12 + 12 * 8 / 32 + 18 * 14336 / h + 12 * s / h + 6 * v / (n_l * h))
    assert megatron_model_flops(model, b) == pytest.approx(nemo)


def test_flops_basis_is_read_from_the_source_text():
    assert flops_basis({"flops_accounting": "Paper Eq.(3): FLOPs per iteration counted WITH recompute"}) == "eq3"
    assert flops_basis({"flops_accounting": "Model TFLOP/sec/GPU (NeMo formula)"}) == "model"
    assert flops_basis({"flops_accounting": "basis not specified"}) == "unknown"
    # Llama 3's Table 4: "BF16 Model FLOPs Utilization (MFU; Chowdhery et al.)" counts as PaLM does (6N + 12·l·h·s)
    assert flops_basis({"flops_accounting": "BF16 Model FLOPs Utilization (MFU; Chowdhery et al. (2023))"}) == "palm"


def test_an_mfu_of_unstated_formula_is_compared_as_model_flops_and_says_so():
    case = map_run(record(measured={"tokens_per_s_per_gpu": None, "model_tflops_per_gpu": None, "mfu_pct": 41},
                          flops_accounting=None))
    assert (case.metric, case.measured, case.basis) == ("mfu_pct", 41.0, "model")
    assert any("FLOP formula of the measured TFLOP/s or MFU not stated" in a for a in case.assumptions)


def test_tflops_prediction_uses_the_source_formula():
    rec = record(measured={"tokens_per_s_per_gpu": None})  # no tokens/s: compare on TFLOP/s
    case = map_run(rec)
    assert case.metric == "model_tflops_per_gpu" and case.basis == "model"
    # a 10 s step: Megatron model FLOPs of 256 sequences / (10 s · 64 GPUs)
    expected = megatron_model_flops(case.model, 256) / 10.0 / 64 / 1e12
    assert predicted_metric(case, 10.0) == pytest.approx(expected)
    # and tokens/s/GPU, had it been measured: 256 · 8192 / 10 / 64 = 3276.8
    assert predicted_metric(map_run(record()), 10.0) == pytest.approx(3276.8)


def test_palm_flops_basis_for_sources_that_count_6n():
    model = load_model("llama3-8b")
    assert flops_basis({"flops_accounting": "MFU with 6*N + 12*l*h*s FLOPs per token (PaLM)"}) == "palm"
    # 6·N (matmul parameters: no input embedding, the untied LM head counts) + 12·l·h·s, per token
    n = model.params() - model.vocab_size * model.hidden_size
    per_token = 6 * n + 12 * model.num_layers * model.hidden_size * model.seq_length
    assert palm_flops(model, 2) == pytest.approx(2 * model.seq_length * per_token)


def test_hfu_adds_the_recomputed_forward_to_model_flops():
    from meshplan.cost.flops import recompute_flops_per_token

    rec = record(measured={"tokens_per_s_per_gpu": None, "model_tflops_per_gpu": None, "hfu_pct": 40.0},
                 parallel={"activation_recompute": "full"})
    case = map_run(rec)
    assert case.metric == "hfu_pct" and case.basis == "model"
    tokens = case.plan.global_batch * case.model.seq_length
    hardware = (megatron_model_flops(case.model, case.plan.global_batch)
                + recompute_flops_per_token(case.model, case.plan, case.stack) * tokens)
    peak = case.cluster.accelerator.half_flops * case.cluster.num_gpus
    assert predicted_metric(case, 10.0) == pytest.approx(100 * hardware / 10.0 / peak)
