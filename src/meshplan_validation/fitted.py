"""Every constant of meshplan that was fitted on, or chosen from, measured validation runs (issue 79): where it lives,
its value, the runs it was fitted on and the sources they come from (provenance.py), the script that fits it, and
what it would be with no data at all (``prior``: the value a leave-one-source-out refit falls back to when the source
it leaves out is the constant's only one).

``FITTED`` is the registry. benchmarks/docs/out_of_source.py refits each constant without each source in turn, predicts
that source's runs with the refitted values, and writes those out-of-source errors (docs/out_of_source.json), the
headline of docs/ACCURACY.md and docs/ACCURACY_INFERENCE.md; docs/ACCURACY.md lists this registry with each
constant's leave-one-source-out effect. The README's count of fitted constants is ``len(FITTED)``
(tests/test_fitted.py). A constant that is a measurement (a datasheet figure, a benchmark of ours or of a vendor's,
read off a profile) is not here: only what was set so that predictions of validation runs come out right.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Fitted:
    name: str
    where: str  # the file (and field) that holds it
    domain: str  # "training" or "serving": which runs it prices
    value: Callable[[], float]  # the shipped value, read where it lives
    data: str  # the runs it was fitted on or chosen from
    sources: frozenset[str]  # the sources (provenance.source_of) of those runs
    script: str  # what fits it
    prior: float  # its value without any data: the physical default the model would take
    unit: str = ""


def _efficiency(name: str) -> Callable[[], float]:
    def value() -> float:
        from meshplan.specs.efficiency import DEFAULT  # noqa: PLC0415

        return float(getattr(DEFAULT, name))
    return value


def _serving(name: str) -> Callable[[], float]:
    def value() -> float:
        from meshplan.serve.efficiency import SERVE_DEFAULT  # noqa: PLC0415

        return float(getattr(SERVE_DEFAULT, name))
    return value


def _engine(preset: str, name: str) -> Callable[[], float]:
    def value() -> float:
        from meshplan.serve.engine import load_engine  # noqa: PLC0415

        return float(getattr(load_engine(preset), name))
    return value


def _ci_microbatch() -> float:
    from meshplan_validation.sources import MEGATRON_LM_CI_MICROBATCH  # noqa: PLC0415

    return float(MEGATRON_LM_CI_MICROBATCH)


def _vtrain_drained() -> float:
    from meshplan_validation.source_vtrain import VTRAIN_STACK  # noqa: PLC0415

    return 1.0 if VTRAIN_STACK.drained_passes == "layers" else 0.0


def _tiny_work() -> float:
    from meshplan.specs.regime import TINY_WORK  # noqa: PLC0415

    return float(TINY_WORK)


def _headroom() -> float:
    from meshplan.fields import MEMORY_HEADROOM  # noqa: PLC0415

    return float(MEMORY_HEADROOM)


# vLLM ROCm skinny_gemm_rate and kernel_gap without Argonne's runs. The rate is that of PyTorch's preferred BLAS
# library at decode's rows, untuned: hipBLASLt from PyTorch 2.5, which vLLM's ROCm builds of v0.5.3-v0.6.2 install (the
# rate fitted on Argonne's runs), rocBLAS on 2.4 and before (presets/engines/vllm-v0.6.2-rocm-rocblas.toml has the
# sources). No other published run of the hipBLASLt build prices it: without Argonne's runs it falls to the bound
# Nscale's vLLM runs on MI300X set: they gain "up to 7.2x" from GEMM tuning (Nscale blog, "AMD MI300X GPUs with GEMM
# tuning improves throughput and latency by up to 7.2x", 2024), and a step's GEMMs gain at least what the whole step
# gains, so an untuned GEMM runs at most 1 / 7.2 = 0.1389 of the tuned rate; read with what the model prices outside
# the GEMMs, which tuning leaves as it is (the host, the gaps between kernels, the memory-bound ops), at most 0.1012:
# the untuned rate at which Llama 3 70B's decode step of 256 sequences on one MI300X, the most GEMM-bound step a V0
# run there takes, is 7.2x its tuned step, every fitted constant of it at its prior (meshplan_validation/
# untuned_bound.py; tests/test_untuned_bound.py: 91.0 ms tuned, 655 ms at 0.1012). rocBLAS's rate is 1 / 7.2, chosen
# with dstack's runs of upstream vLLM 0.6.3.dev on torch 2.4.1 in view (data/serving/dstack_mi300x.jsonl: 10.6 % median
# |error| of their time per output token with the shared gap, 55 % too slow at hipBLASLt's 0.0665; fitted freely 0.21,
# beyond either bound: rocBLAS's default solutions were not what Nscale's untuned runs ran, so the step's bound, which
# would read them slower still, is not taken for it; benchmarks/measure/dstack_mi300x.py). The gap is the ROCm 6.1
# runtime's with its HIP-graph patch, in both builds: without Argonne's runs it falls to the 4.5 us per kernel Kog AI
# measured launching kernels on 8x MI300X (Kog AI, "Building a single-kernel, latency-optimized LLM inference engine on
# AMD MI300X GPUs", blog.kog.ai, 2026-05-28, as quoted by news.creeta.com's report of it), a floor for the gap a 2024
# HIP graph leaves between its nodes (HIP graphs then replayed no faster than stream launches: HIP docs "currently in
# Beta", ROCm/clr#77, PyFR/PyFR#312); dstack's runs read 2.8 % at the two priors (the rate and gap fitted on them alone:
# 0.1357 and 4.54 us, 2.3 %)
UNTUNED_GEMM_SPEEDUP = 7.2
UNTUNED_GEMM_PRIOR = round(1 / UNTUNED_GEMM_SPEEDUP, 4)
UNTUNED_GEMM_STEP_PRIOR = 0.1012  # untuned_bound.loosest(): the 7.2x with the step's time outside its GEMMs
MI300X_LAUNCH_GAP_US = 4.5
KERNEL_GAP_PRIOR = MI300X_LAUNCH_GAP_US * 1e-6

# vLLM V0 iteration_latency without Argonne's runs: not 0 (nothing beside the forward pass and the measured host loop),
# but what the CPU measurement of that loop says it leaves out before any GPU run is seen: "about 20 of each
# iteration's dispatches (the input copies and the sampler's kernels) launch a kernel, some 5 us each more there than
# here (0.1 ms an iteration, left out)" (benchmarks/measure/vllm_v0_host_cpu.py, its docstring: the dispatches counted
# in vLLM's own code, about 5 us a CUDA kernel launch on an x86 host). The forward pass's own graph launch is not in
# it: the prior is a floor. Under tensor parallelism the driver's broadcast of the inputs to the other workers is priced
# apart, from vLLM's code (presets/engines/vllm-v0.toml tp_broadcast_tensors, not fitted).
# The latency fitted on Argonne's H100 runs, 1.115 ms, is above it, and so is the 0.99 ms the other sources' V0 runs
# (AMD's MI300X runs of vLLM 0.6.6 and 0.7.3, dstack's of 0.6.3: another GPU, host and version) read it at: out of
# source Argonne's runs take that value (loso_serving.ALTERNATE); the prior stays the floor where no run prices it
V0_LAUNCHED_DISPATCHES = 20
V0_LAUNCH_US = 5.0
ITERATION_LATENCY_PRIOR = V0_LAUNCHED_DISPATCHES * V0_LAUNCH_US * 1e-6

# A constant's ``sources`` are those of the fit runs that read it: leaving out a source none of whose runs moves the
# constant leaves its fit unchanged, and a refit without the others has nothing to place it by (issue 79;
# tests/test_fitted_sources.py perturbs each constant on each listed source's runs).
# the sources of the published training runs' fit half (data/validation/published_runs.jsonl; provenance.py): BLOOM's
# and OPT's one run each are in the test half (CRC-32 of the id odd), so they fit nothing
PUBLISHED = frozenset({"narayanan2021", "megatron_readme", "korthikanti2022", "megatron_core_readme",
                       "megatron_bridge", "nemo", "mosaicml", "torchtitan", "megatron_lm_examples"})
# flash attention's rate prices no run of Megatron-LM's 2020-2022 papers and README (before FlashAttention: their
# attention is priced as unfused matmuls), so those sources' fit runs do not move ``attention``
PUBLISHED_FLASH = PUBLISHED - {"narayanan2021", "megatron_readme", "korthikanti2022"}
PUBLISHED_MOE = frozenset({"megatron_bridge"})  # the fit half's MoE runs all come from its tables
# the sources of the published serving runs' fit half (data/serving/published_serving.jsonl, split "fit")
SERVING = frozenset({"trtllm_perf", "trtllm_blog_r1", "lmdeploy", "sglang_blogs"})
# LMDeploy's runs are all of dense models: they do not move the MoE path's rate
SERVING_MOE = SERVING - {"lmdeploy"}

FITTED: tuple[Fitted, ...] = (
    Fitted("gemm", "src/meshplan/specs/efficiency.py Efficiency.gemm", "training", _efficiency("gemm"),
           "the fit half (CRC-32 of the id even) of data/validation/published_runs.jsonl, dense runs, superseded "
           "records left out, every source group weighted equally", PUBLISHED, "benchmarks/measure/fit_efficiency.py",
           1.0, "x MAMF"),
    Fitted("attention", "src/meshplan/specs/efficiency.py Efficiency.attention", "training",
           _efficiency("attention"), "as gemm, jointly (the runs with flash attention)", PUBLISHED_FLASH,
           "benchmarks/measure/fit_efficiency.py",
           0.75 / 0.803, "x MAMF"),
    Fitted("Megatron-LM CI host per micro-batch", "src/meshplan_validation/sources.py MEGATRON_LM_CI_MICROBATCH",
           "training", _ci_microbatch, "the fit half of Megatron-LM's CI runs (its six pipelined runs), at the "
           "DGX A100's measured python_host",
           frozenset({"megatron_lm_ci"}), "tests/test_megatron_ci_loop.py", 0.0, "s"),
    Fitted("vTrain passes from an empty queue", "src/meshplan_validation/source_vtrain.py VTRAIN_STACK drained_passes",
           "training", _vtrain_drained, "chosen with vTrain's released half in view: its traced layers lie 0.2-0.65 "
           "of the way from max(host, GPU) to their sum (data/measured/2026-11-30-vtrain-failing-cells.md); its "
           "profiler's flushes at every module boundary are host work, not a stated synchronisation",
           frozenset({"vtrain"}), "benchmarks/measure/small_work_cell_parts.py", 0.0,
           "1: drained_passes 'layers'; 0: 'none'"),
    Fitted("tiny work", "src/meshplan/specs/regime.py TINY_WORK", "training", _tiny_work,
           "chosen with vTrain's released half in view: a round tenth of an eager host's 50 us launch gap, and only "
           "3.5-6.9 us make both halves of its small-work runs sharp (data/measured/2026-11-30-vtrain-tiny-work.md); "
           "a band regime's edge, no prediction's input; its tiny band is vTrain's alone, and Megatron-LM CI's 13 tiny "
           "runs hold 38 % inside it out of source", frozenset({"vtrain"}), "benchmarks/docs/error_bands.py", 0.0,
           "s (0: no tiny level)"),
    Fitted("memory headroom", "src/meshplan/fields.py MEMORY_HEADROOM", "training", _headroom,
           "chosen: the largest |error| of the measured peak memories (torchtitan's 18 runs)",
           frozenset({"torchtitan"}), "benchmarks/docs/accuracy.py (reports the errors)", 0.0, "of HBM"),
    Fitted("kv_read", "src/meshplan/serve/efficiency.py ServeEfficiency.kv_read", "serving", _serving("kv_read"),
           "the fit half of data/serving/published_serving.jsonl (split fit), throughput and ITL, every source "
           "group weighted equally", SERVING, "benchmarks/measure/fit_inference.py", 1.0),
    Fitted("experts", "src/meshplan/serve/efficiency.py ServeEfficiency.experts", "serving", _serving("experts"),
           "as kv_read, the MoE runs (held at this value since: fitted freely it runs to its bound)", SERVING_MOE,
           "benchmarks/measure/fit_inference.py", 1.0),
    Fitted("trtllm iteration_overhead", "src/meshplan/presets/engines/trtllm.toml iteration_overhead", "serving",
           _engine("trtllm", "iteration_overhead"), "the fit half's TensorRT-LLM (TensorRT engine) runs: "
           "TensorRT-LLM's performance pages only (the DeepSeek-R1 blog's runs are the PyTorch backend's, "
           "which this does not price: without the pages a refit finds nothing that moves it, and falls to the prior)",
           frozenset({"trtllm_perf"}), "benchmarks/measure/fit_inference.py", 0.0, "s"),
    Fitted("lmdeploy iteration_overhead", "src/meshplan/presets/engines/lmdeploy.toml iteration_overhead", "serving",
           _engine("lmdeploy", "iteration_overhead"), "the fit half's LMDeploy runs", frozenset({"lmdeploy"}),
           "benchmarks/measure/fit_inference.py", 0.0, "s"),
    Fitted("vLLM V0 iteration_latency",
           "src/meshplan/presets/engines/vllm-v0.toml iteration_latency (and vllm-v0.5, -rocm)", "serving",
           _engine("vllm-v0", "iteration_latency"), "the released half of Argonne's LLM-Inference-Bench, H100 Llama 2 "
           "7B at tp 1 (every batch); without them refitted on the other sources' V0 runs (loso_serving.ALTERNATE)",
           frozenset({"argonne_bench"}), "benchmarks/measure/fit_llm_inference_bench.py",
           ITERATION_LATENCY_PRIOR, "s"),
    Fitted("vLLM ROCm skinny_gemm_rate", "src/meshplan/presets/engines/vllm-v0.6-rocm.toml skinny_gemm_rate (and "
           "vllm-v0.5-rocm, vllm-v0.6.2-rocm: hipBLASLt, PyTorch >= 2.5)", "serving",
           _engine("vllm-v0.6-rocm", "skinny_gemm_rate"),
           "the released half of Argonne's LLM-Inference-Bench, MI300X runs (one model against the other)",
           frozenset({"argonne_bench"}),
           "benchmarks/measure/fit_llm_inference_bench.py", UNTUNED_GEMM_STEP_PRIOR),
    Fitted("vLLM ROCm skinny_gemm_rate, rocBLAS",
           "src/meshplan/presets/engines/vllm-v0.6.2-rocm-rocblas.toml skinny_gemm_rate (PyTorch 2.4)", "serving",
           _engine("vllm-v0.6.2-rocm-rocblas", "skinny_gemm_rate"),
           "chosen: Nscale's bound (the prior), with dstack's runs of vLLM 0.6.3.dev on torch 2.4.1 in view (fitted "
           "freely beyond the bound)", frozenset({"dstack"}), "benchmarks/measure/dstack_mi300x.py",
           UNTUNED_GEMM_PRIOR),
    Fitted("vLLM ROCm kernel_gap", "src/meshplan/presets/engines/vllm-v0.6-rocm.toml kernel_gap (and every "
           "vllm-*-rocm*)", "serving", _engine("vllm-v0.6-rocm", "kernel_gap"), "as skinny_gemm_rate, jointly",
           frozenset({"argonne_bench"}), "benchmarks/measure/fit_llm_inference_bench.py", KERNEL_GAP_PRIOR,
           "s per kernel"),
)


def by_name(name: str) -> Fitted:
    return next(f for f in FITTED if f.name == name)


# the registry's constants that move no prediction: a margin kept free of HBM, a band regime's edge (their
# leave-one-source-out effect is on what a plan may use or which band it quotes, not on an error)
NO_PREDICTION = frozenset({"memory headroom", "tiny work"})
