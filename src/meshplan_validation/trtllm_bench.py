"""The CUDA graphs trtllm-bench captures for a run of TensorRT-LLM's PyTorch backend: a serving record of that engine
states no max batch size, so trtllm-bench chose one by its heuristic and captured decode graphs up to it, padded.

Read from NVIDIA/TensorRT-LLM as the code index holds it around the 1.0 release of the perf-overview page (the exact
1.0 commits are not in it; later releases changed the capture rule: ceil for floor, then steps of 64 above 128):
- ``tensorrt_llm/bench/benchmark/utils/general.py`` ``get_settings`` (@0171265e): with no max batch size given, it
  takes ``get_benchmark_engine_settings``' max batch size and max num tokens (``bench/build/build.py``: the heuristic
  for NVFP4, FP8 and 16-bit checkpoints), sets ``cuda_graph_config = {"padding_enabled": True, "max_batch_size": it}``
  and, chunked prefill off, raises max num tokens to at least the longest prompt plus the max batch size.
- ``tensorrt_llm/bench/build/tuning.py`` ``calc_engine_setting``: KV bytes a token = 2 · attention layers ·
  max(tp, K) · head size · (1 for an FP8 KV cache, else 2); the engine's size = the checkpoint's parameter count ·
  (0.5 NVFP4, 1 FP8, else 2) bytes; requests = (memory of the tp · pp GPUs − engine) · the free-memory fraction /
  (bytes a token · (ISL + OSL)); ``finetune_setting``: min(requests, 4096) / pp, rounded up to a multiple of 32
  (at least 64) below 256, of 128 below 1,024, else of 256; max num tokens min(that request estimate · (1 + ISL /
  OSL), 32,768), rounded up to a multiple of 256 (at least 2,048) below 4,096, of 512 below 8,192, else of 1,024:
  the tokens of one iteration of the estimated batch in the steady state, in place of the LLM API's 8,192.
- ``tensorrt_llm/bench/build/dataclasses.py`` ``ModelConfig.get_param_count``: the sum of the safetensors header's
  element counts. An NVFP4 checkpoint stores two 4-bit weights a byte and an 8-bit scale per 16: a quantised linear's
  n weights count n/2 + n/16 elements, so the heuristic's engine size is about half the weights' bytes.
- ``tensorrt_llm/llmapi/llm_args.py`` ``CudaGraphConfig._generate_cuda_graph_batch_sizes`` with padding: 1, 2, 4,
  8 … 128 in steps of 8, the powers of two from 256 below 2^floor(log2 max), and the max itself.

A decode batch between two captured sizes runs the larger one (serve/engine.py ``graph_padding``).
"""

from __future__ import annotations

import math
from typing import Any

from meshplan.serve.memory import weight_bytes
from meshplan.serve.precision import Quant
from meshplan.specs.model import ModelSpec

GIB = 2**30
ENGINE_BYTES = {"fp4": 0.5, "fp8": 1.0}  # tuning.BYTES_PER_ELEM: NVFP4, FP8; anything else 2
REQUEST_CAP = 4096  # finetune_setting: "Cap total batch size to avoid decoder buffer size becoming too large"
TOKEN_CAP = 32768  # finetune_setting: "Cap num tokens to avoid TRT activation buffer becoming too large"


def checkpoint_params(model: ModelSpec, quant: Quant) -> float:
    """The safetensors element count of the checkpoint: 16-bit tensors one element a parameter, an FP8 linear one, an
    NVFP4 linear 1/2 + 1/16 (its packed bytes and scales: Quant.weight_bytes elements of one byte)."""
    sixteen = float(weight_bytes(model, 1, 1, 1, Quant()))  # 2 (L + O): every parameter in 16 bits
    w = quant.weight_bytes
    if w >= 2.0:
        return sixteen / 2
    linear = (sixteen - float(weight_bytes(model, 1, 1, 1, quant))) / (2.0 - w)  # L
    return linear * w + (sixteen / 2 - linear)


def raw_batch(model: ModelSpec, quant: Quant, tp: int, pp: int, hbm_bytes: float, fraction: float,
              input_len: int, output_len: int) -> float:
    """trtllm-bench's KV-cache request estimate per pipeline stage, before its rounding (module docstring)."""
    per_token = 2 * model.num_attention_layers * max(tp, model.num_kv_heads) * model.head_dim * (
        1.0 if quant.kv_cache == "fp8" else 2.0) / GIB
    engine = checkpoint_params(model, quant) * ENGINE_BYTES.get(quant.weights, 2.0) / GIB
    cache = (hbm_bytes / GIB * tp * pp - engine) * fraction
    return min(cache / (per_token * (input_len + output_len)), REQUEST_CAP) / pp


def max_batch_size(model: ModelSpec, quant: Quant, tp: int, pp: int, hbm_bytes: float, fraction: float,
                   input_len: int, output_len: int) -> int:
    """trtllm-bench's max batch size (module docstring): its KV-cache request estimate, rounded up."""
    raw = raw_batch(model, quant, tp, pp, hbm_bytes, fraction, input_len, output_len)
    if raw < 256:
        return max(64, 32 * math.ceil(raw / 32))
    step = 128 if raw < 1024 else 256
    return step * math.ceil(raw / step)


def max_num_tokens(raw: float, input_len: int, output_len: int) -> int:
    """trtllm-bench's max num tokens (``finetune_setting``): the raw batch's tokens of one iteration in the steady
    state, raw · (1 + ISL / OSL), at most TOKEN_CAP, rounded up: to a multiple of 256 (at least 2,048) below 4,096,
    of 512 below 8,192, else of 1,024."""
    tokens = min(raw * (1 + input_len / output_len), TOKEN_CAP)
    if tokens < 4096:
        return max(2048, 256 * math.ceil(tokens / 256))
    step = 512 if tokens < 8192 else 1024
    return step * math.ceil(tokens / step)


def graph_sizes(max_bs: int) -> tuple[int, ...]:
    """The decode batch sizes captured with padding up to ``max_bs`` (module docstring), ``max_bs`` last."""
    sizes = [1, 2, 4] + [8 * i for i in range(1, 17)] + [2**i for i in range(8, math.floor(math.log2(max_bs)))]
    return tuple(sorted({s for s in sizes if s < max_bs} | {max_bs}))


def bench_graphs(model: ModelSpec, quant: Quant, tp: int, pp: int, hbm_bytes: float, fraction: float,
                 input_len: int, output_len: int) -> dict[str, Any]:
    """The engine fields trtllm-bench set for the run: its max batch size (per pipeline micro-batch, the heuristic
    divides by pp) and the CUDA graphs up to it."""
    raw = raw_batch(model, quant, tp, pp, hbm_bytes, fraction, input_len, output_len)
    top = max_batch_size(model, quant, tp, pp, hbm_bytes, fraction, input_len, output_len)
    return {"max_seqs": top * pp, "graph_max_batch": top, "graph_sizes": graph_sizes(top),
            "max_batched_tokens": max_num_tokens(raw, input_len, output_len)}
