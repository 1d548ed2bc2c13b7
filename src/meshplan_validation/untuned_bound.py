"""The untuned GEMM library's rate that Nscale's "up to 7.2x" allows, read with the model's own decode step (issue 79).

Nscale's vLLM runs on MI300X gained "up to 7.2x" in throughput and latency from GEMM tuning (Nscale blog, "AMD MI300X
GPUs with GEMM tuning improves throughput and latency by up to 7.2x", 2024). Tuning changes the GEMMs' solutions and
nothing else in a step: the attention over the cache, the memory-bound ops, the gaps between kernels, the engine's host
time and its work beside the forward pass take as long tuned as untuned. So at a run's step of T(1) seconds with its
GEMMs at the modelled (tuned) rate, and T(r) with its decode GEMMs (at most ``skinny_gemm_rows`` rows) at r of it,

    7.2 >= T_c(r) / T_c(1)   for every configuration c Nscale ran, with equality at the one that gained the 7.2x;

T_c(r) / T_c(1) falls as r rises, so the 7.2x run's untuned rate r solves T(r) = 7.2 T(1) at its own configuration,
and is at most the largest such root over every configuration it could have been. The old bound 1 / 7.2 is that root
for a step that is all GEMM (T(r) = T(1) / r); every second the model prices outside the GEMMs lowers it. A whole run
(its prompts' prefill beside the decode steps, whose large GEMMs the untuned library serves at the tuned rate) gains
less than its most GEMM-bound decode step, so the decode step is the loosest reading.

The configurations: one MI300X (the most GEMM time beside the same host and gap time per step: tensor parallelism
splits the GEMMs and not the host), the fp16 Llama models it holds, V0's largest decode batch (max_num_seqs 256, vLLM's
default, presets/engines/vllm-v0.toml max_seqs; the untuned solutions serve at most 256 rows, vllm-v0.6-rocm.toml), one
token of context (the least attention), priced by each V0 build such a run may have used (the CUDA V0 presets, whose
kernels AMD's rocm/vllm images run, engine_versions.toml, and the ROCm build's own), every fitted constant of the step
at its prior (meshplan_validation/fitted.py: the V0 iteration latency's floor, the ROCm 6.1 runtime's 4.5 us gap
between kernels, itself a floor): the least time outside the GEMMs, so the loosest bound. No LLM-Inference-Bench run
enters it (tests/test_untuned_bound.py shows the arithmetic)."""

from __future__ import annotations

from dataclasses import replace

from meshplan.serve.engine import Engine, load_engine
from meshplan.serve.estimate import plan_columns
from meshplan.serve.metrics import Setting
from meshplan.serve.plan import ServePlan, Workload
from meshplan.serve.precision import Quant
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan_validation.fitted import ITERATION_LATENCY_PRIOR, KERNEL_GAP_PRIOR, UNTUNED_GEMM_SPEEDUP

FP16 = Quant(weights="fp16", activations="fp16", kv_cache="fp16")
PRESETS = ("vllm-v0.5", "vllm-v0", "vllm-v0.6-rocm")  # the V0 builds a 2024 vLLM run on MI300X may have used
MODELS = ("llama2-7b", "llama3-8b", "llama2-13b", "llama2-70b", "llama3-70b")  # fp16, one MI300X holds each
BATCH = 256  # vLLM V0's max_num_seqs (vllm-v0.toml max_seqs) and the untuned solutions' rows (skinny_gemm_rows)
CONTEXT = 1  # tokens in and out: one token of context, the least attention
ROWS = 256


def at_priors(preset: str) -> Engine:
    """``preset`` with its decode GEMMs of at most 256 rows on the untuned library, every fitted constant of its step
    at its prior: the V0 iteration latency's floor, the ROCm 6.1 runtime's gap between kernels."""
    return replace(load_engine(preset), skinny_gemm_rows=ROWS, kernel_gap=KERNEL_GAP_PRIOR,
                   iteration_latency=ITERATION_LATENCY_PRIOR)


def step(model: str, engine: Engine, rate: float, tp: int = 1, batch: int = BATCH) -> float:
    """Seconds of one decode step of ``batch`` sequences at ``CONTEXT`` tokens of context, its untuned GEMMs at
    ``rate`` of the modelled rate, on ``tp`` MI300X."""
    setting = Setting(load_model(model), load_system("mi300x").cluster(tp),
                      plan_columns(ServePlan(tp=tp, batch=batch, quant=FP16)), FP16,
                      replace(engine, skinny_gemm_rate=rate), Workload(input_len=CONTEXT, output_len=CONTEXT,
                                                                       static=True))
    return float(setting.time(float(batch)))


def rate_for(model: str, engine: Engine, speedup: float = UNTUNED_GEMM_SPEEDUP, tp: int = 1,
             batch: int = BATCH) -> float:
    """The untuned rate r at which the step takes ``speedup`` times its tuned time: T(r) = speedup x T(1), by
    bisection on log r (T falls as r rises)."""
    tuned = step(model, engine, 1.0, tp, batch)
    low, high = 1e-4, 1.0
    for _ in range(40):
        middle = (low * high) ** 0.5
        if step(model, engine, middle, tp, batch) > speedup * tuned:
            low = middle
        else:
            high = middle
    return high


def loosest(presets: tuple[str, ...] = PRESETS, models: tuple[str, ...] = MODELS) -> tuple[float, str, str]:
    """(rate, preset, model): the largest root over the configurations, the bound on the untuned rate."""
    return max((rate_for(model, at_priors(preset)), preset, model) for preset in presets for model in models)
