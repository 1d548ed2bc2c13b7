"""A published serving record (data/serving/published_serving.jsonl, its README the schema) as what meshplan's
serving model prices: the model, the cluster, the serving plan, the workload, the engine, and how the run was driven
(``mode``), or the reason it cannot be priced.

Modes: ``offline`` (every request queued at once: the engine runs the largest batch its KV cache, its max_seqs and the
request count allow, in steady state), ``closed`` (an online run offered all its requests at once, QPS = INF: the same
batch, and the requests beyond it wait), ``rate`` (requests offered at a stated rate: the batch in flight is the one
at which the instance serves that rate), ``static`` (a fixed batch timed end to end), ``prefill`` / ``decode`` (one
phase of a disaggregated deployment, held saturated).

What the records leave unstated is read as the README says the sources ran: pp = 1 where only TP is printed; an FP8
checkpoint's KV cache in FP8 (TensorRT-LLM's FP8 quantization sets it), an FP4 checkpoint's in 16 bits (TensorRT-LLM's
DeepSeek-R1 blog runs its FP4 model with an FP16 KV cache unless it turns FP8 on, and prints the two apart), a 16-bit
engine's in 16 bits. A multi-GPU MoE run of TensorRT-LLM's v1.0 page, which passes '--ep $ep_size' without printing
the value and sets enable_attention_dp, is priced with data-parallel attention over its tp ranks and the experts
spread over them (its ``attention_dp``; the EP size is the unstated part, and each such record says so in its
``assumed`` readings, data/serving/README.md). A v1.0 run's max batch size and CUDA graphs
are trtllm-bench's own choice (trtllm_bench.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from meshplan.kept import Kept
from meshplan.serve.engine import Engine, load_engine
from meshplan.serve.engine_version import preset_for
from meshplan.serve.plan import ServePlan, Workload, cached_tokens
from meshplan.serve.precision import Quant
from meshplan.specs.hardware import Cluster, load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model
from meshplan_validation.trtllm_bench import bench_graphs

TRTLLM_BENCH = "TensorRT-LLM (PyTorch backend"  # v1.0's trtllm-bench runs: its own CUDA graphs (trtllm_bench.py)
TUNER_TABLE = ((144, 128), (336, 256), (672, 512), (832, 768), (1280, 1024), (1664, 1536))
# what a source's runs changed from their engine's defaults, by the prefix of the record's engine string (the preset
# itself is the version's: serve/engine_version.py, presets/engine_versions.toml)
ENGINES: tuple[tuple[str, dict[str, Any]], ...] = (
    # trtllm-bench throughput: kv_cache_free_gpu_mem_fraction 0.95 "in majority of cases" (perf-overview.md), and the
    # executor's runtime batch-size tuning on (tensorrt_llm/bench/dataclasses/configuration.py ExecutorSettingsConfig
    # dynamic_max_batch_size = True) with its default table (DynamicBatchConfig::kDefaultBatchSizeTable); chunked
    # context on: ExecutorSettingsConfig.chunking = True, which the throughput command of that release leaves as it is
    # (its --enable_chunked_context flag came later; trtllm-bench keeps it on for a TensorRT engine,
    # NVIDIA/TensorRT-LLM#6956), so the 20,000-token prompts run in chunks of max_num_tokens
    ("TensorRT-LLM 0.17", {"memory_utilization": 0.95, "batch_table": TUNER_TABLE, "prefill": "chunked"}),
    (TRTLLM_BENCH, {"memory_utilization": 0.95}),
    # the Triton tensorrtllm_backend of 0.14: enable_chunked_context false unless set (inflight_batcher_llm/src/
    # model_instance_state.cc), so in-flight batching puts whole prompts beside the decodes in one iteration while
    # they fit max_num_tokens (NVIDIA/TensorRT-LLM cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp; 0.14 ships
    # it as a binary, its source opened later), GUARANTEED_NO_EVICT by default: presets/schedulers/trtllm.toml
    ("TensorRT-LLM 0.14", {"prefill": "whole"}),
    # the large-EP blog's H100 runs overlap two micro-batches (its "Two-batch Overlap" section; the engine string says
    # so); its GB200 sequel turns it off ("This allows two-batch overlap to be disabled"). They run DeepEP (the engine
    # string says so): its normal kernels where prompts are prefilled, its low-latency ones in the decode steps
    ("SGLang (May 2025)", {"two_batch_overlap": True, "moe_comm": "deepep"}),
)
SIXTEEN = ("bf16", "fp16")


@dataclass(frozen=True)
class ServingCase:
    record: dict[str, Any]
    model: ModelSpec
    cluster: Cluster
    plan: ServePlan
    workload: Workload
    engine: Engine
    mode: str
    notes: tuple[str, ...] = ()


def engine_of(record: dict[str, Any]) -> Engine | None:
    """The preset of the record's engine and version, with what its source changed; None for an engine without one."""
    text = record.get("engine") or ""
    preset = preset_for(text, record.get("date"))  # an engine string without a version: its record's date's
    if preset is None:
        return None
    changes = next((c for prefix, c in ENGINES if text.startswith(prefix)), {})
    return load_engine(preset).with_(**changes) if changes else load_engine(preset)


def model_of(record: dict[str, Any]) -> ModelSpec:
    """The record's preset, else a ModelSpec of its config.json sizes (Llama 4: its MoE interleave, shared expert
    and chunked attention, read as a sliding window on three layers of four)."""
    m = record["model"]
    if m.get("preset"):
        return load_model(m["preset"])
    extra = m.get("extra") or {}
    fields: dict[str, Any] = {
        "name": m["name"], "num_layers": m["num_layers"], "hidden_size": m["hidden_size"],
        "num_heads": m["num_heads"], "num_kv_heads": m["num_kv_heads"], "head_dim": m["head_dim"],
        "ffn_hidden_size": m["ffn_hidden_size"], "vocab_size": m["vocab_size"], "mlp": "swiglu", "norm": "rmsnorm",
        "qk_norm": bool(extra.get("qk_norm"))}
    if m.get("num_experts"):
        fields |= {"num_experts": m["num_experts"], "moe_topk": m["moe_topk"],
                   "moe_ffn_hidden_size": m["moe_ffn_hidden_size"],
                   "shared_expert_ffn_size": extra.get("shared_expert_ffn", 0),
                   "moe_layer_freq": extra.get("interleave_moe_layer_step", 1)}
        step = fields["moe_layer_freq"]
        if step > 1:  # Llama 4 Maverick: the MoE layers are the odd ones; the count is the same from layer 0
            fields["first_k_dense_layers"] = 0
    if extra.get("attention_chunk_size"):
        fields |= {"sliding_window": extra["attention_chunk_size"], "window_layers": 3 * m["num_layers"] // 4}
    return ModelSpec(**fields)


def quant_of(record: dict[str, Any], model: ModelSpec) -> Quant:
    """The record's precisions. A KV cache of unstated precision is the engine's default. vLLM's and SGLang's
    ``kv_cache_dtype = "auto"`` is the model's dtype, whatever the checkpoint carries ("If 'auto', will use model data
    type", vLLM CacheConfig.cache_dtype and --kv-cache-dtype; '"auto" will use model data type', SGLang's
    --kv-cache-dtype, python/sglang/srt/server_args.py), so 16 bits there. TensorRT-LLM's is FP8 beside FP8 or FP4
    weights: the FP8 / FP4 records run NVIDIA's ModelOpt checkpoints, which carry an FP8 KV cache
    (hf_quant_config.json kv_cache_quant_algo), and TensorRT-LLM's KV dtype "auto" takes the checkpoint's ("Default:
    auto (uses the data type specified in the model checkpoint)", NVIDIA/TensorRT-LLM docs/source/deployment-guide/
    quick-start-recipe-for-llama3.3-70b-on-trtllm.md, whose recipe for these FP8 / FP4 checkpoints sets fp8);
    trtllm-bench maps an FP8 or NVFP4 checkpoint without one to fp8 too (tensorrt_llm/bench/benchmark/utils/
    general.py ``_KV_CACHE_MAP``), and its engine build forces it ("If the quantization is NVFP4 or FP8, force the
    KV cache dtype to FP8", tensorrt_llm/bench/build/build.py). Read so, the v1.0 page's RTX PRO 6000 FP4 runs of
    dense models come within a few percent, and its B200 / GB200 FP4 columns read fast (docs/SERVING.md)."""
    p = record["precision"]
    w = p.get("weights") or "bf16"
    a = p.get("activations") or (w if w in ("fp8", "fp4") else "bf16")
    trtllm = (preset_for(record.get("engine") or "", record.get("date")) or "").startswith("trtllm")  # its rows
    kv = p.get("kv_cache") or ("fp8" if trtllm and w in ("fp8", "fp4") else "bf16")
    return Quant(weights=w, activations=a, kv_cache=kv)


def plan_of(record: dict[str, Any], model: ModelSpec, quant: Quant, batch: int) -> ServePlan:
    """TP as printed (pp as printed, else 1); data-parallel attention with experts over all GPUs where the record
    says attention DP or runs EP without TP (SGLang); otherwise experts over the TP GPUs where the record states
    ep = tp, else split tp ways (ep = 1: TensorRT-LLM's Mapping default, moe_tp_size = tp_size, when no EP is given;
    the records that read their layout so say it in ``assumed``)."""
    par, hw = record["parallel"], record["hardware"]
    tp, pp, ep = par.get("tp") or 1, par.get("pp") or 1, par.get("ep")
    dis = par.get("disaggregated") or {}
    gpus = hw.get("num_gpus") or tp * pp
    if record["workload"].get("phase") in ("prefill", "decode"):  # one pool of a disaggregated deployment
        gpus = dis.get(f"{record['workload']['phase']}_gpus") or gpus
    attention_dp = par.get("attention_dp") or (model.is_moe and par.get("tp") is None and bool(ep or dis))
    if attention_dp:
        dpa = gpus // pp if par.get("tp") is None else tp
        return ServePlan(tp=1, pp=pp, dpa=dpa, ep=dpa, batch=batch, quant=quant)
    expert = ep if model.is_moe and ep == tp else 1
    return ServePlan(tp=tp, pp=pp, ep=expert, batch=batch, quant=quant)


def cluster_of(record: dict[str, Any]) -> Cluster:
    hw = record["hardware"]
    return _cluster(hw["preset"], hw["num_gpus"])


@lru_cache(maxsize=256)
def _cluster(preset: str, gpus: int) -> Cluster:
    """A system preset's cluster of ``gpus`` (frozen): read once per validation run, not once per record."""
    return load_system(preset).cluster(gpus)


def mode_of(record: dict[str, Any]) -> str:
    w = record["workload"]
    if w.get("phase") in ("prefill", "decode"):
        return w["phase"]
    if w.get("scenario") == "latency":
        return "static"
    if w.get("scenario") == "offline":
        return "offline"
    if w.get("request_rate") is not None:
        return "rate"
    return "closed"


def skip_reason(record: dict[str, Any]) -> str:
    """Why a record cannot be priced, or ""."""
    w, m, hw = record["workload"], record["measured"], record["hardware"]
    if w.get("speculative_decoding"):
        return "speculative decoding (MTP) is not modelled"
    if not hw.get("preset"):
        return f"no meshplan hardware preset for {hw.get('gpu')}"
    if engine_of(record) is None:
        return f"no engine preset for {record.get('engine')!r}"
    if not w.get("input_len") or (not w.get("output_len") and w.get("phase") != "prefill"
                                  and w.get("phase") != "decode"):
        return "input or output length not stated"
    if not any(isinstance(v, (int, float)) and k in METRICS for k, v in m.items()):
        return "no measured metric meshplan predicts (tokens/s not labelled output or total)"
    return varied_lengths(record)


def varied_lengths(record: dict[str, Any]) -> str:
    """A burst of N requests offered at once (QPS = INF) lasts about as long as one request's life when every request
    has the printed lengths: TTFT + (O − 1)·ITL, all of them in flight together. A run whose N / requests-per-second
    is half as long again has requests that outlive the mean: its lengths are the mean of a distribution the source
    does not give, and a run's length is set by its longest requests, which meshplan cannot price."""
    w, m = record["workload"], record["measured"]
    if w.get("request_rate_label") != "INF" or not all(
            isinstance(v, (int, float)) for v in (m.get("ttft_ms"), m.get("itl_ms"), m.get("requests_per_s"),
                                                  w.get("num_requests"), w.get("output_len"))):
        return ""
    life = (m["ttft_ms"] + (w["output_len"] - 1) * m["itl_ms"]) / 1e3
    run = w["num_requests"] / m["requests_per_s"]
    if run <= 1.5 * life:
        return ""
    return VARIED


VARIED = ("lengths vary: the QPS = INF burst lasted over 1.5x a mean request's TTFT + (O - 1) ITL (2.0-2.1x), so its "
          "lengths are means of a distribution the source does not state")


METRICS = ("output_tokens_per_s", "output_tokens_per_s_per_gpu", "total_tokens_per_s", "requests_per_s",
           "input_tokens_per_s_per_gpu", "ttft_ms", "itl_ms", "tpot_ms", "e2e_latency_ms")


# case_of's answers by the record's JSON text: the accuracy benchmarks and the leave-one-source-out fits map the same
# records again for each trial (the inference document: 1,596 mappings of about 800 records). A pure function of the
# record: the presets it reads are read once per process (load_engine, load_model, version_table, _cluster).
_CASES: Kept[ServingCase | str] = Kept(4096)


def case_of(record: dict[str, Any]) -> ServingCase | str:
    """The record as a ServingCase, or why it is skipped. Memoised (``_CASES``): a record of the same text gets a case
    of the same specs that holds the record itself; one JSON cannot write is mapped each time, an error raised each
    time."""
    try:
        key = json.dumps(record, sort_keys=True)
    except (TypeError, ValueError):
        return _case_of(record)
    found = _CASES.answer(key, None, _case_of, record)
    return found if isinstance(found, str) or found.record is record else replace(found, record=record)


def _case_of(record: dict[str, Any]) -> ServingCase | str:
    reason = skip_reason(record)
    if reason:
        return reason
    model, w = model_of(record), record["workload"]
    quant = quant_of(record, model)
    mode = mode_of(record)
    output = w.get("output_len") or 1
    engine = engine_of(record)
    assert engine is not None  # skip_reason returned the record without one
    cached = cached_tokens(w["input_len"], w.get("prefix_hit") or 0.0, engine.block_size)  # README: prefix_hit
    workload = Workload(input_len=w["input_len"], output_len=output, static=mode == "static", cached_len=cached)
    batch = w.get("batch_size") or 1
    plan = plan_of(record, model, quant, batch)
    if mode == "decode" and w.get("batch_size"):  # SGLang states the batch per device
        plan = plan.with_(batch=w["batch_size"] * plan.dpa)
    cluster = cluster_of(record)
    if (record.get("engine") or "").startswith(TRTLLM_BENCH):  # the CUDA graphs trtllm-bench captured for it
        # its --tp: the tp ranks of an attention-DP run are the attention groups (the heuristic's KV memory is theirs
        # together, and its max batch size each rank's: serving_map.plan_of)
        bench = bench_graphs(model, quant, plan.tp * plan.dpa, plan.pp, cluster.accelerator.hbm_bytes,
                             engine.memory_utilization, w["input_len"], output)
        if not engine.mode("prefill").chunked:  # get_settings: the heuristic's, at least the longest prompt + max batch
            bench["max_batched_tokens"] = max(bench["max_batched_tokens"], w["input_len"] + bench["graph_max_batch"])
        engine = engine.with_(**bench)
    return ServingCase(record, model, cluster, plan, workload, engine, mode)


def with_batch(case: ServingCase, batch: int) -> ServingCase:
    return replace(case, plan=case.plan.with_(batch=batch))
