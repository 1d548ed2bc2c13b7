"""How a published serving run was driven, priced (meshplan_validation/serving_eval.py): an offline run of N identical
requests in waves, a burst of requests offered at once, and the runs whose EP size the source leaves unstated."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from meshplan.cost.kv_cache import token_bytes
from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.metrics import instance, static_capacity
from meshplan_validation.serving_eval import batch_of, predict, results, setting
from meshplan_validation.serving_map import case_of

PATH = Path(__file__).resolve().parent.parent / "data" / "serving" / "published_serving.jsonl"
RECORDS = {r["id"]: r for r in map(json.loads, PATH.read_text().splitlines())}


def test_an_offline_run_of_n_requests_ends_with_a_partial_wave():
    """N = 1,500 requests of Llama 3.1 70B on 8 A100s at 128/4096 with B in flight: ⌈N/B⌉ waves, the last holding
    N − (W − 1)·B for as many token steps as a full one: time = (W − 1)·B·O/X(B) + r·O/X(r), throughput = N·O/time."""
    case = case_of(RECORDS["trtllm017_llama3.1-70b_a100_tp8_128x4096"])
    b, n = batch_of(case, SERVE_DEFAULT), 1500
    waves, last = math.ceil(n / b), n - (math.ceil(n / b) - 1) * b
    x_full, x_last = (float(instance(setting(case, v, SERVE_DEFAULT)).tokens_per_s) for v in (b, last))
    expected = n / ((waves - 1) * b / x_full + last / x_last)  # tokens/s (O cancels)
    assert predict(case)[0]["output_tokens_per_s"] == pytest.approx(expected)
    assert expected < x_full  # the partial wave costs throughput


def test_a_burst_queues_its_prompts_through_prefill_iterations():
    """500 requests of 467/16 offered at once to TensorRT-LLM 0.14 (whole prompts, 8,192 tokens per iteration):
    ⌊8192/467⌋ = 17 prompts per iteration, k = ⌈500/17⌉ = 30 iterations; mean TTFT (k + 1)/2 iterations, and the mean
    prompt decodes its 15 gaps through min((k − 1)/2, 15) = 14.5 of the remaining prefill iterations."""
    case = case_of(RECORDS["trtllm014srv_llama3.1-8b_h100_tp1_467x16_qpsinf"])
    out, batch = predict(case)
    step = float(setting(case, 500, SERVE_DEFAULT).time(0.0, 17 * 467, 17, 0.0))
    decode = float(setting(case, batch, SERVE_DEFAULT).time(batch))
    assert out["ttft_ms"] == pytest.approx(1e3 * 31 / 2 * step)  # (30 + 1) / 2 iterations, one wave
    assert out["itl_ms"] == pytest.approx(1e3 * (14.5 * step + 0.5 * decode) / 15)


def test_a_multi_gpu_moe_run_of_the_v1_page_runs_attention_dp_and_says_its_ep_size_is_unstated():
    """Every MoE run of TensorRT-LLM's v1.0 page on a GPU with a preset is priced: 132 span several GPUs (Scout 18 + 15
    on the RTX PRO 6000, Maverick 25 + 9, Qwen3-235B 27 + 9, Qwen3-30B 29 on the RTX), 50 run on one (40 + Qwen3-30B's
    10 on one RTX PRO 6000). The page runs them with enable_attention_dp: true and '--ep $ep_size' without its value,
    so the 132 carry ``attention_dp`` and are read as data-parallel attention over the printed tp ranks with the
    experts spread over them: (tp, pp, ep, dpa) = (1, pp, tp, tp). The EP size stays unstated, and each record says
    so in ``assumed`` (its layout is not counted as stated). trtllm-bench was given --tp = tp, so its max batch size
    heuristic sees tp GPUs' memory (trtllm_bench.max_batch_size at tp · dpa), and that max batch is each rank's.
    On 8 PCIe RTX PRO 6000s (no NVLink), Qwen3-30B-A3B at 128 / 128: the page measured 39,490 tokens/s, 1.41x its
    one-GPU 28,011; read with tensor-parallel attention it would be priced below one GPU (two all-reduces a layer
    over PCIe), read as written it is priced above."""
    from meshplan_validation.serving_eval import LAYOUT_UNSTATED
    from meshplan_validation.trtllm_bench import max_batch_size

    moe = [r for r in RECORDS.values() if r["group"] == "trtllm_perf_v1.0" and r["model"].get("num_experts")
           and r["hardware"].get("preset")]
    many = [r for r in moe if r["hardware"]["num_gpus"] > 1]
    assert len(many) == 132
    for r in many:
        case = case_of(r)
        assert not isinstance(case, str), (r["id"], case)
        tp, pp = r["parallel"]["tp"], r["parallel"]["pp"]
        assert (case.plan.tp, case.plan.pp, case.plan.ep, case.plan.dpa) == (1, pp, tp, tp)
        assert r["parallel"]["ep"] is None and r["parallel"]["attention_dp"] is True
        assert any(a.startswith(LAYOUT_UNSTATED) and "enable_attention_dp: true" in a for a in r["assumed"]), r["id"]
        assert np.isfinite(predict(case)[0]["output_tokens_per_s"])
    one = [case_of(r) for r in moe if r["hardware"]["num_gpus"] == 1]
    assert len(one) == 50 and all(np.isfinite(predict(c)[0]["output_tokens_per_s"]) for c in one)
    rtx = RECORDS["trtllm10_qwen3-30b-a3b_rtx_8gpu_tp8pp1_fp4_128x128"]
    adp = case_of(rtx)
    assert not isinstance(adp, str)
    w = rtx["workload"]
    assert adp.engine.max_seqs == max_batch_size(adp.model, adp.plan.quant, 8, 1, adp.cluster.accelerator.hbm_bytes,
                                                 adp.engine.memory_utilization, w["input_len"], w["output_len"])
    tp_read = json.loads(json.dumps(rtx))
    tp_read["parallel"]["attention_dp"] = False
    attn_tp = case_of(tp_read)
    solo = case_of(RECORDS["trtllm10_qwen3-30b-a3b_rtx_1gpu_tp1pp1_fp4_128x128"])
    assert not isinstance(attn_tp, str) and not isinstance(solo, str) and attn_tp.plan.tp == 8
    fast = {k: predict(c)[0]["output_tokens_per_s"] for k, c in (("adp", adp), ("tp", attn_tp), ("one", solo))}
    assert rtx["measured"]["output_tokens_per_s"] / 28_011 == pytest.approx(1.41, abs=0.005)
    assert fast["tp"] < fast["one"] < fast["adp"]


def test_a_burst_that_outlives_its_mean_request_has_varied_lengths():
    """TensorRT-LLM 0.14's QPS = INF rows: 500 requests of 202 / 214 on one H100 took 500 / 39 = 12.8 s where a request
    with the printed lengths lives 1.657 + 213 · 0.021 = 6.13 s (2.09x): not priced. Its 467 / 256 row: 500 / 37 =
    13.5 s against 3.335 + 255 · 0.039 = 13.28 s (1.02x): priced."""
    from meshplan_validation.serving_map import VARIED

    flagged = sorted(i for i, r in RECORDS.items() if case_of(r) == VARIED)
    assert flagged == sorted(f"trtllm014srv_llama3.1-{m}_{g}_tp{t}_202x214_qpsinf"
                             for m, t in (("8b", 1), ("70b", 4)) for g in ("h100", "h200"))
    m = RECORDS["trtllm014srv_llama3.1-8b_h100_tp1_202x214_qpsinf"]["measured"]
    ratio = 500 / m["requests_per_s"] / ((m["ttft_ms"] + 213 * m["itl_ms"]) / 1e3)
    assert ratio == pytest.approx(2.09, abs=0.01)
    assert not isinstance(case_of(RECORDS["trtllm014srv_llama3.1-8b_h100_tp1_467x256_qpsinf"]), str)


def test_an_fp4_or_fp8_checkpoint_of_unstated_kv_cache_runs_an_fp8_kv_cache():
    """TensorRT-LLM's v1.0 page states no KV-cache precision; its ModelOpt FP8 / FP4 checkpoints carry an FP8 one, which
    the engine's "auto" takes (serving_map.quant_of cites both): 1 byte a KV element, not the 2 of bf16. Llama 3.3 70B
    (80 layers, 8 KV heads of 128): 2 × 80 × 8 × 128 × 1 B = 163,840 B of KV a token, half the bf16 327,680. A stated
    precision stands (the DeepSeek-R1 blog's B200 run: FP16 KV beside FP4 weights), and 16-bit weights keep theirs."""
    rtx = case_of(RECORDS["trtllm10_llama3.3-70b_rtx_1gpu_tp1pp1_fp4_128x2048"])
    assert (rtx.plan.quant.weights, rtx.plan.quant.kv_cache) == ("fp4", "fp8")
    assert token_bytes(rtx.model, rtx.plan.quant.kv_bytes) == 2 * 80 * 8 * 128 * 1
    stated = [r for r in RECORDS.values() if r["precision"].get("weights") == "fp4" and r["precision"].get("kv_cache")]
    assert stated and all(case_of(r).plan.quant.kv_cache == r["precision"]["kv_cache"] for r in stated)
    bf16 = next(r for r in RECORDS.values() if r["precision"].get("weights") == "bf16"
                and not r["precision"].get("kv_cache"))
    assert case_of(bf16).plan.quant.kv_cache == "bf16"


def test_vllm_and_sglang_keep_a_16_bit_kv_cache_beside_fp8_weights_unless_told():
    """vLLM's and SGLang's ``--kv-cache-dtype auto`` is the model's dtype (serving_map.quant_of cites both), so AMD's
    MI300X latency runs, whose command passes no --kv-cache-dtype, keep 2 bytes a KV element beside FP8 weights:
    Llama 3.1 70B, 2 × 80 × 8 × 128 × 2 B = 327,680 B of KV a token, twice a TensorRT-LLM FP8 run's."""
    amd = RECORDS["amd_mi300x_vllm_llama3.1-70b_tp8_latency_bs128_128x2048"]
    assert amd["precision"]["weights"] == "fp8" and not amd["precision"].get("kv_cache")
    case = case_of(amd)
    assert (case.plan.quant.weights, case.plan.quant.kv_cache) == ("fp8", "bf16")
    assert token_bytes(case.model, case.plan.quant.kv_bytes) == 2 * 80 * 8 * 128 * 2 == 327_680
    sglang = [r for r in RECORDS.values() if r["engine"].startswith("SGLang")
              and r["precision"].get("weights") == "fp8" and not r["precision"].get("kv_cache")]
    assert sglang and all(case_of(r).plan.quant.kv_cache == "bf16" for r in sglang)


def test_amds_latency_runs_find_their_prompts_in_the_prefix_cache():
    """benchmark_latency.py (v0.8.5's) runs the same dummy prompts in its warm-up and measured iterations, and vLLM
    V1 caches prefixes by default (the records' prefix_hit 1.0): in 16-token pages a 128-token prompt finds 112 of
    its tokens and a 2,048-token one 2,032, so each prefill computes its last 16."""
    for run, cached in (("amd_mi300x_vllm_llama3.1-70b_tp8_latency_bs8_128x2048", 112),
                        ("amd_mi300x_vllm_llama3.1-405b_tp8_latency_bs128_2048x2048", 2032)):
        case = case_of(RECORDS[run])
        assert RECORDS[run]["workload"]["prefix_hit"] == 1.0
        assert (case.workload.cached_len, case.workload.fresh_len) == (cached, 16)
    cases = [case_of(r) for r in RECORDS.values() if not r["workload"].get("prefix_hit")]
    mapped = [c for c in cases if not isinstance(c, str)]
    assert mapped and all(c.workload.cached_len == 0 for c in mapped)


def test_a_result_carries_the_architecture_and_engine_it_was_priced_with():
    """serving_errors.json groups runs by (architecture, engine) read from the results (benchmarks/measure/
    serving_errors.py), which must be case_of's: the system preset's architecture ("unstated" where it names none)
    and the engine preset's name, on every row of a mapped record; a skipped record's rows carry neither."""
    runs = [RECORDS["trtllm017_llama3.1-70b_a100_tp8_128x4096"],
            RECORDS["trtllm014srv_llama3.1-8b_h100_tp1_467x16_qpsinf"]]
    rows = results(runs + [{**runs[0], "id": "no-gpu", "hardware": {**runs[0]["hardware"], "preset": None}}])
    for r in runs:
        case = case_of(r)
        priced = {(x.architecture, x.engine) for x in rows if x.id == r["id"]}
        assert priced == {(case.cluster.accelerator.architecture or "unstated", case.engine.name)}, r["id"]
    assert [(x.skipped != "", x.architecture, x.engine) for x in rows if x.id == "no-gpu"] == [(True, "", "")]


def test_a_static_batch_that_overflows_its_kv_cache_reads_its_latency_as_the_whole_batch():
    """LLM-Inference-Bench times vLLM's benchmark_latency.py: one llm.generate of all B prompts
    (serving_eval._predict). Llama 2 70B on one MI300X, B = 256 at 512 tokens in and out: the KV cache holds
    C = 133 sequences to their last token, so the batch runs as a wave of 133 and one of 123 (serve/metrics.py
    _static), and its latency is the two waves', B / (requests/s) = 661 s, where the mean request's TTFT + 511 TPOT
    is 499 s (measured: 845 s). At 256 tokens in and out C = 267 >= B: one wave, and the two are the same 283 s."""
    path = Path(__file__).resolve().parent.parent / "data" / "serving" / "llm_inference_bench_dev.jsonl"
    runs = {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}
    for length, waves in ((512, 2), (256, 1)):
        case = case_of(runs[f"llminfbench_vllm_mi300x_llama-2-70b-hf_tp1_bs256_{length}x{length}"])
        out, batch = predict(case)
        mean_request = out["ttft_ms"] + (length - 1) * out["tpot_ms"]
        assert out["e2e_latency_ms"] == pytest.approx(1e3 * batch / out["requests_per_s"])
        assert math.ceil(batch / math.floor(float(static_capacity(setting(case, batch, SERVE_DEFAULT))))) == waves
        if waves == 1:
            assert out["e2e_latency_ms"] == pytest.approx(mean_request)
        else:
            assert out["e2e_latency_ms"] > 1.2 * mean_request
