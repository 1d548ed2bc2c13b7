"""Serving launch configs: the engine's own launch arguments for a priced serving configuration (``meshplan serve
--emit vllm|sglang|trtllm``).

Each instance shape (ServePlan) becomes one command per instance of each pool, placed on its node's GPUs with its
port, and a router in front (serve/launch_script.py), with the engine's argument names at a cited version, checked
by tests/test_serve_launch.py with the engine's own parser (vLLM 0.33.0 ``vllm serve``'s ``make_arg_parser``, SGLang
0.5.23 ``ServerArgs.add_cli_args``: their PyPI wheels' Python files, which .ci/parsers.py unpacks, and the option
lists they wrote into tests/data/engine_args/; TensorRT-LLM's ``trtllm-serve`` click options are listed there from
its source: PyPI holds only a 10 kB placeholder of tensorrt-llm, its wheels are on NVIDIA's index):

- vLLM 0.33.0 (``vllm serve``, vllm/engine/arg_utils.py): ``--tensor-parallel-size``, ``--pipeline-parallel-size``,
  ``--data-parallel-size`` (attention groups of a MoE instance, its experts over tp·dp with
  ``--enable-expert-parallel``; a dense model's replicas), ``--max-num-seqs`` (per data-parallel rank),
  ``--max-num-batched-tokens``, ``--enable-chunked-prefill`` / ``--disable-chunked-prefill``, ``--kv-cache-dtype``
  (auto / fp8), ``--gpu-memory-utilization`` (of the GPU's total memory), ``--max-cudagraph-capture-size`` (or
  ``--enforce-eager``), ``--quantization fp8`` (online fp8 weights), ``--max-model-len``; disaggregated pools with
  ``--kv-transfer-config`` (NixlConnector, kv_role kv_both) behind vLLM's disaggregation proxy.
- SGLang 0.5.23 (``python -m sglang.launch_server``, sglang/srt/server_args.py): ``--tp-size`` (the TP group: tp·dpa
  with attention data parallelism), ``--attn-dp-size``, ``--ep-size``, ``--pp-size``, ``--dp-size`` (replicas),
  ``--max-running-requests``, ``--chunked-prefill-size`` (-1: none), ``--kv-cache-dtype`` (auto / fp8_e4m3),
  ``--mem-fraction-static``, ``--cuda-graph-max-bs-decode`` (or ``--disable-decode-cuda-graph``), ``--quantization``,
  ``--context-length``; ``--disaggregation-mode prefill|decode`` with ``--disaggregation-transfer-backend``.
- TensorRT-LLM (``trtllm-serve``, tensorrt_llm/commands/serve.py at NVIDIA/TensorRT-LLM commit 00209af1):
  ``--backend``, ``--tp_size`` (tp·dpa under attention DP), ``--pp_size``, ``--ep_size``, ``--max_batch_size``,
  ``--max_num_tokens``, ``--max_seq_len``, ``--kv_cache_free_gpu_memory_fraction`` (of free memory),
  ``--enable_chunked_prefill``, and ``--extra_llm_api_options`` YAML keys of tensorrt_llm/llmapi/llm_args.py
  (``enable_attention_dp``, ``kv_cache_config.dtype``, ``cuda_graph_config.max_batch_size``,
  ``cache_transceiver_config`` for disaggregated pools).

The engine that priced the configuration must be the one written (its memory share, batch and chunk limits are the
priced ones): ``vllm`` for vLLM, ``sglang`` for SGLang, ``trtllm`` (TensorRT backend) or ``trtllm-pytorch`` for
TensorRT-LLM. What an engine has no argument for is refused, or said in a comment line where the checkpoint carries
it (pre-quantized int4 / fp4 weights).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from meshplan.errors import SpecError
from meshplan.serve.estimate import ServeEstimate
from meshplan.serve.launch_script import PER_NODE, command_lines, node_count, place_instances, router_lines

# trtllm-serve's --backend for each engine preset that prices a TensorRT-LLM launch
_TRT_BACKENDS = {"trtllm": "tensorrt", "trtllm-pytorch": "pytorch"}
LAUNCH_FORMATS = {"vllm": ("vllm",), "sglang": ("sglang",), "trtllm": tuple(_TRT_BACKENDS)}
VERSIONS = {"vllm": "vLLM 0.33.0", "sglang": "SGLang 0.5.23", "trtllm": "TensorRT-LLM trtllm-serve (commit 00209af1)"}
_VLLM_KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8"}
_SGLANG_KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8_e4m3", "fp4": "nvfp4"}
_TRT_KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8"}
_SGLANG_WEIGHTS = {"fp8": "fp8", "mxfp4": "mxfp4", "fp4": "modelopt_fp4", "int8": "w8a8_int8"}
_FLAGGED = {"vllm": ("bf16", "fp16", "fp8"), "sglang": ("bf16", "fp16", *_SGLANG_WEIGHTS), "trtllm": ("bf16", "fp16")}
_CHECKPOINT = "the checkpoint carries them (a pre-quantized checkpoint: AWQ / GPTQ for int4, ModelOpt for fp4)"


@dataclass(frozen=True)
class Pool:
    """One pool of a launch: ``count`` copies of ``argv`` (the engine's command line), its ``role`` and YAML text
    (TensorRT-LLM's --extra_llm_api_options file) where it has one."""

    role: str
    count: int
    argv: tuple[str, ...]
    gpus: int  # per command
    extra_yaml: str = ""


def launch_pools(fmt: str, est: ServeEstimate, context: int) -> list[Pool]:
    """The pools that launch ``est`` (a ServeEstimate) with the engine of ``fmt``; ``context``: the longest request
    served (prompt + output tokens)."""
    if fmt not in LAUNCH_FORMATS:
        raise SpecError(f"emit={fmt!r} must be one of {', '.join(LAUNCH_FORMATS)}")
    engine = est.engine
    if engine.name not in LAUNCH_FORMATS[fmt]:
        raise SpecError(f"--emit {fmt}: the configuration was priced with engine {engine.name}; price it with "
                        f"--engine {' or --engine '.join(LAUNCH_FORMATS[fmt])} (its memory share and limits are "
                        "the ones written)")
    writer = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm}[fmt]
    plan = est.plan
    roles = [("prefill", plan.prefill_replicas), ("decode", plan.replicas)] if plan.disaggregated else \
        [("serve", plan.replicas)]
    return [writer(est, context, role, count) for role, count in roles]


def _kv(table: dict[str, str], fmt: str, kv: str) -> str:
    if kv not in table:
        raise SpecError(f"{fmt} cannot express kv_cache={kv}: its KV-cache dtypes are {', '.join(sorted(table))}")
    return table[kv]


def _per_group(batch: int, groups: int) -> int:
    """Sequences per attention group (the engine's per-scheduler limit): the instance's batch over its groups."""
    return -(-batch // groups)


def _vllm(est: ServeEstimate, context: int, role: str, count: int) -> Pool:
    plan, engine, model = est.plan, est.engine, est.model
    kv = _kv(_VLLM_KV, "vllm", plan.quant.kv_cache)
    fold = not model.is_moe and role == "serve"  # a dense model's replicas: vLLM's own data parallelism
    dp = plan.replicas if fold else plan.dpa
    chunked = engine.mode("prefill").chunked
    argv = ["vllm", "serve", "$MODEL", "--tensor-parallel-size", str(plan.tp), "--pipeline-parallel-size",
            str(plan.pp), "--data-parallel-size", str(dp)]
    argv += ["--enable-expert-parallel"] if plan.ep > 1 else []
    argv += ["--max-num-seqs", str(_per_group(plan.batch, plan.dpa)),
             "--max-num-batched-tokens", str(engine.max_batched_tokens if chunked else
                                             max(engine.max_batched_tokens, context)),
             "--enable-chunked-prefill" if chunked else "--disable-chunked-prefill",
             "--kv-cache-dtype", kv, "--gpu-memory-utilization", f"{engine.memory_utilization:g}",
             "--max-model-len", str(context)]
    argv += ["--max-cudagraph-capture-size", str(engine.graph_max_batch)] if engine.graph_max_batch else \
        ["--enforce-eager"]
    argv += ["--quantization", "fp8"] if plan.quant.weights == "fp8" else []
    if role != "serve":
        argv += ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                                                    separators=(",", ":"))]
    return Pool(role, 1 if fold else count, tuple(argv), plan.instance_gpus * (count if fold else 1))


def _sglang(est: ServeEstimate, context: int, role: str, count: int) -> Pool:
    plan, engine = est.plan, est.engine
    kv = _kv(_SGLANG_KV, "sglang", plan.quant.kv_cache)
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "$MODEL", "--tp-size", str(plan.tp * plan.dpa),
            "--pp-size", str(plan.pp), "--dp-size", str(count if role == "serve" else 1)]
    argv += ["--attn-dp-size", str(plan.dpa)] if plan.dpa > 1 else []
    argv += ["--ep-size", str(plan.ep)] if plan.ep > 1 else []
    argv += ["--max-running-requests", str(plan.batch),
             "--chunked-prefill-size", str(engine.max_batched_tokens if engine.mode("prefill").chunked else -1),
             "--kv-cache-dtype", kv, "--mem-fraction-static", f"{engine.memory_utilization:g}",
             "--context-length", str(context)]
    argv += ["--cuda-graph-max-bs-decode", str(engine.graph_max_batch)] if engine.graph_max_batch else \
        ["--disable-decode-cuda-graph"]
    weights = plan.quant.weights
    argv += ["--quantization", _SGLANG_WEIGHTS[weights]] if weights in _SGLANG_WEIGHTS else []
    if role != "serve":
        argv += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "mooncake"]
    folded = role == "serve"  # --dp-size: the replicas in one launch
    return Pool(role, 1 if folded else count, tuple(argv), plan.instance_gpus * (count if folded else 1))


def _trtllm(est: ServeEstimate, context: int, role: str, count: int) -> Pool:
    plan, engine = est.plan, est.engine
    kv = _kv(_TRT_KV, "trtllm", plan.quant.kv_cache)
    backend = _TRT_BACKENDS[engine.name]  # launch_pools: one of them
    argv = ["trtllm-serve", "$MODEL", "--backend", backend, "--tp_size", str(plan.tp * plan.dpa),
            "--pp_size", str(plan.pp)]
    argv += ["--ep_size", str(plan.ep)] if plan.ep > 1 else []
    argv += ["--max_batch_size", str(_per_group(plan.batch, plan.dpa)), "--max_num_tokens",
             str(engine.max_batched_tokens), "--max_seq_len", str(context),
             "--kv_cache_free_gpu_memory_fraction", f"{engine.memory_utilization:g}"]
    argv += ["--enable_chunked_prefill"] if engine.mode("prefill").chunked else []
    extra = ["enable_attention_dp: true"] if plan.dpa > 1 else []
    extra += ["kv_cache_config:", f"  dtype: {kv}"]
    extra += ["cuda_graph_config:", f"  max_batch_size: {engine.graph_max_batch}"] if engine.graph_max_batch else []
    extra += ["  enable_padding: true"] if engine.graph_max_batch and engine.graph_sizes else []  # as priced
    extra += ["cache_transceiver_config:", "  backend: DEFAULT"] if role != "serve" else []
    argv += ["--extra_llm_api_options", f"extra-{role}.yaml"]
    return Pool(role, count, tuple(argv), plan.instance_gpus, "\n".join(extra) + "\n")


def launch_text(fmt: str, est: ServeEstimate, context: int) -> str:
    """The launch script of ``est`` for ``fmt``: a header saying what was priced, TensorRT-LLM's YAML files as
    here-documents, then each node's instances (its GPUs, its port) and the router (serve/launch_script.py)."""
    pools = launch_pools(fmt, est, context)
    plan, model = est.plan, est.model
    placed = place_instances(pools)
    nodes = node_count(placed)
    lines = ["#!/bin/sh", f"# {VERSIONS[fmt]} launch of {model.name}: {plan.describe()}, written by meshplan serve",
             f"# {plan.num_gpus} GPUs on {nodes} node{'s' * (nodes > 1)} of {PER_NODE}; quantisation "
             f"{plan.quant.label} (weights/activations/KV cache)",
             f"MODEL=${{MODEL:?set MODEL to the checkpoint of {model.name}}}",
             "NODE=${NODE:-0}  # run this script on every node, NODE its index" + (
                 f" (0 to {nodes - 1}); NODE0_ADDR ... NODE{nodes - 1}_ADDR their addresses" if nodes > 1 else "")]
    if plan.quant.weights not in _FLAGGED[fmt]:
        lines.append(f"# weights in {plan.quant.weights}: {_CHECKPOINT}")
    for pool in pools:
        lines.append(f"# {pool.role} pool: {pool.count} instance{'s' * (pool.count != 1)} of {pool.gpus} "
                     f"GPU{'s' * (pool.gpus != 1)} (priced instances of {plan.instance_gpus})")
        if pool.extra_yaml:
            lines += [f"cat > extra-{pool.role}.yaml <<'EOF'", pool.extra_yaml.rstrip("\n"), "EOF"]
    files, router = router_lines(fmt, placed, plan.disaggregated)
    lines += files
    by_role = {pool.role: pool for pool in pools}
    kv_moves = plan.disaggregated and fmt == "vllm"
    for node in range(nodes):
        here = [p for p in placed if p.node == node]
        if not here and node:
            continue
        lines.append(f'if [ "$NODE" = {node} ]; then')
        for k, p in enumerate(here):
            lines += command_lines(fmt, by_role[p.role], p, nodes, _NIXL_BASE + k if kv_moves else None)
        if node == 0:
            lines += [f"  {line}" for line in router]
        lines.append("fi")
    return "\n".join([*lines, "wait"]) + "\n"


_NIXL_BASE = 5600  # vLLM's NIXL side channel, one port per instance on a node (serve/launch_script.py)
