"""Every constraint a serving configuration can violate, as (reason, mask) pairs over scalars or arrays, so that
one plan is checked and a million are tallied alike. A configuration that breaks one is a result with its reason,
not an error (DESIGN.md example 10)."""

from __future__ import annotations

import numpy as np

from meshplan.errors import SpecError
from meshplan.serve.engine import Engine
from meshplan.serve.plan import PlanColumns, Workload
from meshplan.serve.precision import Quant, unsupported
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.xp import Num

HEADS = "tp does not divide the attention heads"
KV_HEADS = "tp and the KV heads do not divide one another"
LAYERS = "more pipeline stages than layers"
EXPERTS = "ep does not divide the experts"
GPUS = "more GPUs than the cluster has"
LANES = "batch not a multiple of pp·dpa (a sequence per micro-batch lane)"
SEQS = "batch above the engine's max_seqs (per attention group)"
FORMAT = "the GPU has no tensor cores for the activations' format"  # or a 16-bit format it lacks (precision.py)
MEMORY = "memory: the KV cache of the batch does not fit"
# a prompt the engine refuses before it runs (Engine.prefill "whole", Prefill.bounded): TensorRT-LLM with chunked
# context off takes maxInputLen = min(maxSequenceLen - 1, maxNumTokens) (NVIDIA/TensorRT-LLM
# cpp/tensorrt_llm/batch_manager/trtGptModel.h @c8c6df08) and LlmRequest::validate throws "Prompt length (%d) exceeds
# maximum input length (%d)" (cpp/tensorrt_llm/batch_manager/llmRequest.cpp @119c6e60); the PyTorch backend's LLM
# API raises "The sum of prompt length ..., query length ... should not exceed max_num_tokens" (tensorrt_llm/llmapi/
# llm.py _check_arguments; TensorRT-LLM/tests/unittest/llmapi/test_llm.py test_max_num_token_check)
PROMPT = "prompt longer than the engine's max_batched_tokens with chunked prefill off: the engine refuses it"
TTFT = "TTFT above its target"
TPOT = "TPOT above its target"


HYBRID_SERVED = ("mamba", "attention", "mlp", "moe")  # a hybrid pattern's blocks serve/ops.py prices (Mamba-2)


def servable(model: ModelSpec) -> None:
    """Refuse what the serving model does not price: hybrid blocks other than Mamba-2, attention, MLP and MoE, latent
    MoE, and a model without causal
    attention (an encoder: no tokens to decode; its prefill would be priced causal)."""
    if not model.causal:
        raise SpecError(f"model {model.name}: a non-causal (encoder) model has no tokens to decode (causal = false)")
    other = sorted(set(model.block_counts) - set(HYBRID_SERVED)) if model.is_hybrid else []
    if other:
        raise SpecError(f"model {model.name}: hybrid blocks of kind {', '.join(other)} are not modelled for serving "
                        f"(layer_pattern; served: {', '.join(HYBRID_SERVED)})")
    if model.diff_attention:
        raise SpecError(f"model {model.name}: differential attention (diff_attention) is not modelled for serving")
    if model.index_topk:
        raise SpecError(f"model {model.name}: DeepSeek Sparse Attention (index_topk) is not modelled for serving")
    if model.moe_latent_size:
        raise SpecError(f"model {model.name}: latent MoE (moe_latent_size) is not modelled for serving")


def structural(model: ModelSpec, cluster: Cluster, cols: PlanColumns, quant: Quant, engine: Engine
               ) -> list[tuple[str, Num]]:
    """(reason, violated) for everything but memory and the latency targets."""
    tp, pp, ep, dpa, batch = (np.asarray(cols[k]) for k in ("tp", "pp", "ep", "dpa", "batch"))
    gpus = tp * pp * dpa * (np.asarray(cols["replicas"]) + np.asarray(cols["prefill_replicas"]))
    out = [(HEADS, model.num_heads % tp != 0)]
    if not model.is_mla:
        k = model.num_kv_heads
        out.append((KV_HEADS, (k % tp != 0) & (tp % k != 0)))
    out += [(LAYERS, pp > model.num_layers), (GPUS, gpus > cluster.num_gpus), (LANES, batch % (pp * dpa) != 0),
            (SEQS, batch > engine.max_seqs * dpa)]
    if model.is_moe:
        out.append((EXPERTS, model.num_experts % ep != 0))
    out.append((FORMAT, np.full(np.shape(tp), bool(unsupported(cluster.accelerator, quant)))))
    return out


def refused_prompt(engine: Engine, workload: Workload) -> str:
    """The reason the engine refuses the workload's prompts (PROMPT, with the numbers), or "" (a static batch is not
    the in-flight scheduler's)."""
    if engine.mode("prefill").bounded and not workload.static and workload.input_len > engine.max_batched_tokens:
        return f"{PROMPT} ({workload.input_len:,} > {engine.max_batched_tokens:,} tokens)"
    return ""


def first_problem(checks: list[tuple[str, Num]]) -> str:
    """The first reason a scalar configuration breaks, or ""."""
    return next((reason for reason, bad in checks if bool(np.any(bad))), "")


def targets(ttft: float, tpot: float, fits: bool, ttft_slo: float = 0.0, tpot_slo: float = 0.0
            ) -> list[dict[str, object]]:
    """Whether one configuration meets each target given (0: none): the metric, its target and value in seconds
    (None where the configuration does not fit: it is not priced) and met or not."""
    out: list[dict[str, object]] = []
    for name, slo, value in (("ttft", ttft_slo, ttft), ("tpot", tpot_slo, tpot)):
        if slo:
            out.append({"metric": name, "target_s": slo, "value_s": float(value) if fits else None,
                        "met": bool(fits and value <= slo)})
    return out
