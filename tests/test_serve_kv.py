"""The KV cache's closed forms (cost/kv_cache.py) and the memory-fit arithmetic (serve/memory.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from meshplan.cost.kv_cache import kv_heads_per_gpu, paged, sequence_bytes, token_bytes
from meshplan.serve.engine import Engine, load_engine
from meshplan.serve.memory import activation_bytes, attention_width, memory, weight_bytes
from meshplan.serve.precision import BYTES, Quant
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

GIB = 2**30


def test_kv_bytes_per_token_is_two_layers_kv_heads_head_dim_bytes():
    llama = load_model("llama3-70b")
    # 2 · 80 layers · 8 KV heads · 128 · 2 bytes = 327,680 bytes (320 KiB) per token
    assert token_bytes(llama, 2.0) == 2 * 80 * 8 * 128 * 2 == 327_680
    # fp8 halves it: 163,840
    assert token_bytes(llama, BYTES["fp8"]) == 163_840
    mistral = load_model("mistral-7b")  # 32 layers, 8 KV heads of 128: 2 · 32 · 8 · 128 · 2 = 131,072
    assert token_bytes(mistral, 2.0) == 131_072


def test_mha_gqa_and_mqa_shrink_by_the_query_heads_per_kv_head():
    llama = load_model("llama3-70b")
    mha, mqa = replace(llama, num_kv_heads=64), replace(llama, num_kv_heads=1)
    assert token_bytes(mha, 2.0) == 8 * token_bytes(llama, 2.0)  # 64 / 8
    assert token_bytes(mqa, 2.0) == token_bytes(llama, 2.0) / 8  # 1 / 8


def test_mla_caches_the_latent_and_the_rope_key_on_every_rank():
    ds = load_model("deepseek-v3")
    # 61 layers · (512 + 64) · 2 bytes = 70,272 bytes per token (DeepSeek-V2 Table 1: (d_c + d_R)·l)
    assert token_bytes(ds, 2.0) == 61 * 576 * 2 == 70_272
    assert token_bytes(ds, 2.0, tp=8) == token_bytes(ds, 2.0, tp=1)  # not split by tensor parallelism
    # against MHA with its 128 heads of 192 + 128: 61 · 128 · 320 · 2 = 4,997,120, 71x more
    assert 61 * 128 * (192 + 128) * 2 / token_bytes(ds, 2.0) == pytest.approx(71.1, abs=0.1)


def test_tensor_parallelism_splits_the_kv_heads_and_replicates_past_them():
    llama = load_model("llama3-70b")  # 8 KV heads
    assert kv_heads_per_gpu(llama, 4) == 2 and kv_heads_per_gpu(llama, 8) == 1 and kv_heads_per_gpu(llama, 16) == 1
    assert token_bytes(llama, 2.0, tp=4) == token_bytes(llama, 2.0) / 4
    assert token_bytes(llama, 2.0, tp=16) == token_bytes(llama, 2.0, tp=8)  # one head each: copies


def test_pages_round_each_sequence_up_to_whole_blocks():
    assert paged(1000, 16) == 1008  # ⌈1000 / 16⌉ = 63 blocks of 16
    assert paged(1024, 16) == 1024 and paged(1, 32) == 32 and paged(7, 1) == 7
    llama = load_model("llama3-8b")  # 32 layers, 8 KV heads of 128: 131,072 bytes per token
    assert sequence_bytes(llama, 1000, 2.0, 1, 16) == 1008 * 131_072


def test_a_sliding_window_caps_the_windowed_layers():
    mistral = load_model("mistral-7b")
    windowed = replace(mistral, sliding_window=4096)  # Mistral 7B v0.1: every layer windowed at 4096
    assert sequence_bytes(windowed, 32768, 2.0, 1, 16) == 4096 * 131_072
    half = replace(mistral, sliding_window=4096, window_layers=16)  # half the layers: (32768 + 4096) / 2 tokens
    assert sequence_bytes(half, 32768, 2.0, 1, 16) == (32768 + 4096) / 2 * 131_072


def test_weights_per_gpu_split_by_tp_and_pp_and_shrink_with_the_format():
    llama = load_model("llama3-8b")
    full = weight_bytes(llama, 1, 1, 1, Quant())
    assert full == pytest.approx(2 * llama.params(), rel=1e-12)  # every parameter in 16 bits once
    blocks = 2 * (llama.params() - 2 * llama.vocab_size * llama.hidden_size)  # embedding and head stay 16-bit
    fp8 = weight_bytes(llama, 1, 1, 1, Quant(weights="fp8", activations="fp8"))
    assert full - fp8 == pytest.approx(blocks / 2, rel=1e-3)  # the block linears halve; norms stay (1e-3)
    assert weight_bytes(llama, 2, 1, 1, Quant()) < full / 2 * 1.0001


def test_moe_experts_split_over_ep_and_the_rest_over_tp():
    ds = load_model("deepseek-v3")
    ep8, tp8 = weight_bytes(ds, 8, 1, 8, Quant(weights="fp8")), weight_bytes(ds, 8, 1, 1, Quant(weights="fp8"))
    assert ep8 == pytest.approx(tp8, rel=1e-12)  # E/8 whole experts or every expert / 8: the same bytes
    # DeepSeek-V3 in fp8 on 8 GPUs: 671 B parameters, ~ 84 GB each (the 16-bit embedding and head add a little)
    assert 80e9 < ep8 < 90e9


def test_max_concurrent_sequences_is_the_pool_over_one_sequence():
    llama = load_model("llama3-70b")
    h100 = load_system("h100").accelerator
    engine = load_engine("vllm")
    cols = {"tp": 8, "pp": 1, "ep": 1, "dpa": 1, "batch": 1}
    mem = memory(llama, h100.hbm_bytes, cols, Quant(), engine, 2048)
    usable = 0.9 * h100.hbm_bytes
    assert mem.kv_pool == pytest.approx(usable - mem.weights - mem.activations - engine.workspace)
    one = 2048 * 80 * 1 * 128 * 2 * 2  # 2048 tokens (128 pages of 16) · 80 layers · 1 KV head per GPU · 128 · 2 · 2
    assert mem.sequence == one == 83_886_080
    assert mem.max_sequences() == math.floor(mem.kv_pool / one)
    # (0.9 · 85.52 GB - 17.64 weights - 0.64 activations - 0.81 workspace) / 0.0839 GB = 57.88 / 0.0839 = 689.9
    assert mem.weights == pytest.approx(17.64e9, rel=1e-3) and mem.activations == pytest.approx(0.644e9, rel=1e-3)
    assert mem.max_sequences() == 689


def test_the_free_memory_basis_gives_the_kv_cache_a_share_of_what_is_left():
    llama = load_model("llama3-8b")
    hbm = load_system("h100").accelerator.hbm_bytes
    cols = {"tp": 1, "pp": 1, "ep": 1, "dpa": 1, "batch": 1}
    trt = load_engine("trtllm")
    mem = memory(llama, hbm, cols, Quant(), trt, 1000)
    assert mem.kv_pool == pytest.approx(0.9 * (hbm - mem.weights - mem.activations - trt.workspace))


def test_a_batch_that_does_not_fit_is_a_result():
    llama = load_model("llama3-70b")
    hbm = load_system("h100").accelerator.hbm_bytes
    mem = memory(llama, hbm, {"tp": 8, "pp": 1, "ep": 1, "dpa": 1, "batch": 4096}, Quant(), Engine(), 2048)
    assert not mem.fits and mem.kv_used == 4096 * mem.sequence


def test_the_profiled_activations_take_the_attention_width_of_the_op_records():
    # DeepSeek-V3 (MLA): q_up 128·(128 + 64) = 24,576, kv_up 128·(128 + 128) = 32,768, kv_down 512 + 64 = 576; the
    # widest is kv_up's, where the old q_dim + 2·K·d counted 24,576 + 2·128·192 = 73,728
    assert attention_width(load_model("deepseek-v3")) == 32_768
    # Qwen3-Next's gated attention: 16 queries + 16 gates of 256, 2 KV heads of 256 for keys and values → 9,216
    assert attention_width(load_model("qwen3-next-80b-a3b")) == 4096 + 4096 + 512 + 512


def test_the_profiled_activations_are_the_widest_ops_rows_beside_the_stream_and_logits():
    llama, engine = load_model("llama3-8b"), load_engine("vllm")
    rows, h = engine.max_batched_tokens, 4096
    # SwiGLU: fc1 2·14,336 wide beside the activation's 14,336 (43,008) is wider than QKV's 6,144
    widest = 3 * 14_336
    logits = engine.max_seqs * 128_256 * 4
    assert activation_bytes(llama, 1, engine) == 2 * rows * h * 2 + rows * (h + widest) * 2 + logits
