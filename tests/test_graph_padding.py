"""Decode CUDA graphs pad a batch to the next captured size (serve/engine.py ``graph_padding``): the padding rows run
every GEMM and per-token op and attend to no cache. And the graphs trtllm-bench captured for a TensorRT-LLM 1.0 run
(meshplan_validation/trtllm_bench.py), from its max-batch heuristic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshplan.errors import SpecError
from meshplan.serve.engine import engine_from_dict, load_engine
from meshplan.serve.estimate import plan_columns, serve_estimate
from meshplan.serve.launch import launch_text
from meshplan.serve.metrics import Setting
from meshplan.serve.plan import ServePlan, Workload
from meshplan.serve.precision import Quant, parse_quant
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan_validation.serving_map import case_of
from meshplan_validation.trtllm_bench import checkpoint_params, graph_sizes, max_batch_size, max_num_tokens, raw_batch

WORK = Workload(input_len=1000, output_len=1000)


def _setting(engine, model="llama3-8b", system="h100"):
    plan = ServePlan(batch=1)
    return Setting(load_model(model), load_system(system).cluster(1), plan_columns(plan), plan.quant, engine, WORK)


@pytest.mark.parametrize(("name", "decode", "pad"), [
    ("vllm", 1, 0), ("vllm", 3, 1), ("vllm", 9, 7), ("vllm", 16, 0), ("vllm", 505, 7), ("vllm", 513, 0),
    ("vllm-v0", 250, 6), ("vllm-v0", 257, 0), ("sglang", 150, 2), ("sglang", 161, 0),
    ("trtllm-pytorch", 100, 4), ("trtllm-pytorch", 129, 0),
])
def test_each_engine_pads_to_its_next_captured_size(name, decode, pad):
    """vLLM: 1, 2, 4 and multiples of 8 to 512 (V1) or 256 (V0); SGLang to 160; TensorRT-LLM's padded graphs to 128.
    Beyond the largest the iteration is eager, unpadded; so is one with prompt tokens."""
    engine = load_engine(name)
    assert float(engine.graph_padding(decode, 0)) == pad
    assert float(engine.graph_padding(decode, 1)) == 0.0


def test_no_capture_list_no_padding():
    engine = load_engine("vllm").with_(graph_sizes=())
    assert float(engine.graph_padding(9, 0)) == 0.0
    assert load_engine("trtllm").graph_max_batch == 0 and float(load_engine("trtllm").graph_padding(9, 0)) == 0.0


def test_padding_rows_run_the_gemms_but_not_the_cache():
    """TensorRT-LLM with trtllm-bench's graphs to 512 (…, 128, 256, 512): 257 sequences run the 512-row graph. Its
    GEMMs are those of 512 rows, its decode attention that of 257 sequences: dearer than 257 unpadded, cheaper than
    512 real sequences."""
    padded = load_engine("trtllm-pytorch").with_(graph_max_batch=512, graph_sizes=graph_sizes(512))
    s, bare = _setting(padded), _setting(padded.with_(graph_sizes=()))
    assert float(padded.graph_padding(257, 0)) == 255
    t257, t512 = float(s.gpu_time(257.0, 0.0, 0.0, 0.0)), float(s.gpu_time(512.0, 0.0, 0.0, 0.0))
    assert float(bare.gpu_time(257.0, 0.0, 0.0, 0.0)) < t257 < t512
    assert float(bare.gpu_time(512.0, 0.0, 0.0, 0.0)) == pytest.approx(t512)
    # the difference to 512 real sequences is their cached keys and values, nothing else
    sh257, sh512 = s.shape(257.0, 0.0, 0.0, 0.0), s.shape(512.0, 0.0, 0.0, 0.0)
    assert float(sh257.rows) == float(sh512.rows) == 512.0
    assert float(sh257.decode) == 257.0


def test_a_padded_step_lies_between_its_own_batch_and_its_graph_s():
    """For every batch D to 1,024: the unpadded step of D ≤ the padded step of D ≤ the step of the captured size it
    runs (whose sequences all attend to their caches)."""
    engine = load_engine("trtllm-pytorch").with_(graph_max_batch=1024, graph_sizes=graph_sizes(1024))
    s, bare = _setting(engine), _setting(engine.with_(graph_sizes=()))
    d = np.arange(1.0, 1025.0)
    graph = d + np.asarray(engine.graph_padding(d, 0.0), dtype=float)
    t = np.asarray(s.time(d), dtype=float)
    assert np.all(np.asarray(bare.time(d), dtype=float) <= t * (1 + 1e-12))
    assert np.all(t <= np.asarray(bare.time(graph), dtype=float) * (1 + 1e-12))
    assert set(graph) == set(float(v) for v in graph_sizes(1024))


def test_the_breakdown_prices_the_padded_graph():
    """serve_estimate's per-op breakdown runs the step's own shape: at 250 sequences on vLLM V1 the graph of 256, its
    per-token ops on 256 rows (its GEMMs' 128-row tiles hold 250 and 256 alike), its attention on 250 caches."""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(1)
    plan = ServePlan(batch=250)
    est = serve_estimate(model, cluster, plan, Workload(input_len=128, output_len=128), load_engine("vllm"))
    bare = serve_estimate(model, cluster, plan, Workload(input_len=128, output_len=128),
                          load_engine("vllm").with_(graph_sizes=()))
    assert float(est.metrics.running) == 250
    assert bare.breakdown["attn/norm"] < est.breakdown["attn/norm"] < bare.breakdown["attn/norm"] * 256 / 250
    assert est.breakdown["mlp/fc1"] >= bare.breakdown["mlp/fc1"]
    assert est.breakdown["attn/decode"] == pytest.approx(bare.breakdown["attn/decode"])


def test_trtllm_launch_turns_padding_on_as_priced():
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(1)
    est = serve_estimate(model, cluster, ServePlan(batch=64), WORK, load_engine("trtllm-pytorch"))
    text = launch_text("trtllm", est, 2048)
    assert "cuda_graph_config:\n  max_batch_size: 128\n  enable_padding: true\n" in text


# ---- trtllm-bench's own settings -----------------------------------------------------------------------------------


def test_capture_sizes_follow_tensorrt_llm_s_rule():
    """1, 2, 4, 8 … 128, then 2^i for 8 ≤ i < floor(log2 max), then the max: 384 skips 256 (floor(log2 384) = 8)."""
    small = (1, 2, 4, *range(8, 129, 8))
    assert graph_sizes(384) == (*small, 384)
    assert graph_sizes(512) == (*small, 256, 512)
    assert graph_sizes(4096) == (*small, 256, 512, 1024, 2048, 4096)
    assert graph_sizes(64) == (1, 2, 4, *range(8, 65, 8))


def test_the_checkpoint_counts_an_nvfp4_linear_at_9_16_of_its_weights():
    """Llama 3 70B: L linear weights in its blocks, O = the rest (embedding, LM head, norms). The safetensors header
    of an NVFP4 checkpoint counts L/2 packed bytes + L/16 scales + O; an FP8 one L + O; bf16 L + O."""
    model = load_model("llama3-70b")
    full = checkpoint_params(model, Quant())
    fp8 = checkpoint_params(model, parse_quant("fp8"))
    fp4 = checkpoint_params(model, parse_quant("fp4"))
    assert fp8 == pytest.approx(full)
    other = 2 * 128256 * 8192 + (2 * 80 + 1) * 8192  # embedding + LM head + norms
    linear = full - other
    assert fp4 == pytest.approx(linear * (0.5 + 1 / 16) + other, rel=1e-6)
    assert 70.0e9 < full < 71.0e9


def test_max_batch_size_as_trtllm_bench_estimates_it():
    """Llama 3.3 70B NVFP4 with an FP8 KV cache on one B200 (180 GB), 500 + 2,000 tokens, fraction 0.95:
    KV a token 2·80·8·128·1 B = 163,840 B; the engine (checkpoint count x 0.5 B) ≈ 18.9 GiB; requests =
    (179.1 − 18.9) GiB x 0.95 / (163,840 B x 2,500) ≈ 399; rounded up to a multiple of 128: 512."""
    model = load_model("llama3-70b")
    quant = Quant(weights="fp4", activations="fp4", kv_cache="fp8")
    hbm = load_system("b200").accelerator.hbm_bytes
    engine_gib = checkpoint_params(model, quant) * 0.5 / 2**30
    requests = (hbm / 2**30 - engine_gib) * 0.95 / (163840 / 2**30 * 2500)
    expected = 128 * int(np.ceil(requests / 128)) if requests >= 256 else max(64, 32 * int(np.ceil(requests / 32)))
    assert 398 < requests < 400
    assert max_batch_size(model, quant, 1, 1, hbm, 0.95, 500, 2000) == expected == 512
    # rounding: below 256 to 32s (at least 64), below 1,024 to 128s, else 256s; capped at 4,096 requests over pp
    assert max_batch_size(model, quant, 1, 1, hbm, 0.95, 500, 200000) == 64
    assert max_batch_size(load_model("llama3-8b"), quant, 1, 1, hbm, 0.95, 64, 64) == 4096
    assert max_batch_size(load_model("llama3-8b"), quant, 1, 4, hbm, 0.95, 64, 64) == 1024


def test_max_num_tokens_as_trtllm_bench_estimates_it_and_a_whole_prompt_run_raises_it():
    """finetune_setting's max num tokens: the request estimate's tokens of one steady-state iteration, raw ·
    (1 + ISL/OSL), capped at 32,768, rounded up (256s from 2,048 below 4,096, 512s below 8,192, else 1,024s); and
    get_settings, chunked prefill off (the PyTorch backend's default), keeps at least the longest prompt + the max
    batch size. Llama 3.3 70B as above (399.3 requests) at 500 / 2,000: 399.3 x 1.25 = 499 -> 2,048; at 128 / 128
    Llama 3 8B's 4,096: 8,192; at 2,048 / 128: 4,096 x 17 capped at 32,768. A run's engine takes it (serving_map):
    Qwen3-30B-A3B 1000/1000 on one B200, 1,773.7 requests (max batch 1,792): x 2 = 3,547 -> 3,584, above the
    prompt + max batch's 2,792, in place of the LLM API's 8,192."""
    model = load_model("llama3-70b")
    quant = Quant(weights="fp4", activations="fp4", kv_cache="fp8")
    hbm = load_system("b200").accelerator.hbm_bytes
    raw = raw_batch(model, quant, 1, 1, hbm, 0.95, 500, 2000)
    assert 398 < raw < 400 and max_num_tokens(raw, 500, 2000) == 2048
    assert max_num_tokens(4096, 128, 128) == 8192 and max_num_tokens(4096, 2048, 128) == 32768
    assert max_num_tokens(3000, 1000, 1000) == 6144 and max_num_tokens(1000, 1000, 1000) == 2048
    records = Path(__file__).resolve().parents[1] / "data" / "serving" / "published_serving.jsonl"
    record = next(r for r in map(json.loads, records.read_text().splitlines())
                  if r["id"] == "trtllm10_qwen3-30b-a3b_b200_1gpu_tp1pp1_fp4_1000x1000")
    case = case_of(record)
    assert not isinstance(case, str)
    qwen = raw_batch(case.model, case.plan.quant, 1, 1, hbm, 0.95, 1000, 1000)
    assert 1536 < qwen < 1792 and case.engine.graph_max_batch == 1792
    assert case.engine.max_batched_tokens == max_num_tokens(qwen, 1000, 1000) == 3584


@pytest.mark.parametrize("bad", [[0], "abc", [1.5], [True]])
def test_a_bad_capture_list_is_one_line_naming_the_field(bad):
    with pytest.raises(SpecError, match=r"graph_sizes=.* must be captured batch sizes: integers from 1 to"):
        engine_from_dict({"name": "x", "graph_max_batch": 64, "graph_sizes": bad}, "engine")
