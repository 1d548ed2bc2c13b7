"""vLLM's untuned ROCm build of 2024 on MI300X, from a source other than LLM-Inference-Bench: dstack's published runs of
upstream vLLM on 8x MI300X, priced with the ROCm build's preset (presets/engines/vllm-v0.6-rocm.toml) at the values
its two fitted constants (``skinny_gemm_rate``, ``kernel_gap``) fall to without Argonne's runs, at the values fitted
on Argonne's runs, and fitted on these runs themselves (issue 79: a published basis for what an untuned GEMM of
decode's rows achieves on MI300X, and for the time per kernel of a HIP-graphed decode step).

Source: dstack, "Benchmarking Llama 3.1 405B on 8x AMD MI300X GPUs" (dstack blog, 2024-10-09, dstackai/dstack
docs/blog/posts/amd-mi300x-inference-benchmark.md) and its raw output, dstackai/benchmarks@9ece943
amd/inference/vllm/data/serving_benchmarks_vllm_80.txt: vLLM 0.6.3.dev116+g151ef4ef built from upstream main on
ROCm 6.1 with PyTorch 2.4.1+rocm6.1 (the blog's collect_env; amd/inference/vllm/benchmark-task.dstack.yml: `vllm
serve` with --tensor-parallel-size=8 and no other option, "the default backend configuration": no tuned GEMMs, HIP
graphs on), Llama 3.1 405B Instruct in BF16, tp 8 on one node of 8x MI300X (Hot Aisle, 2x Xeon 8470). vLLM's
benchmark_serving.py sent N prompts of 80 tokens at once (--num-prompts N, no request rate: all at time 0), so each
run is one batch of N requests; its mean time per output token (TPOT, first token excluded) is a decode step at
that batch. The runs up to N = 256 (max_num_seqs) are used; beyond it requests queue. Generated tokens per request
are the run's total over N (the requests stop at different lengths: the batch thins, so TPOT reads a batch a little
under N).

Differences from Argonne's runs (vLLM v0.6.1, FP16, Llama 2 7B / 70B) kept in view: v0.6.2 brought ROCm's own
paged-attention kernel (engine_versions.toml), immaterial at these 80 + ~60 tokens of context; BF16 GEMMs, not FP16;
PyTorch 2.4.1, where v0.6.1's ROCm build installed a 2.5 nightly (vLLM's setup.py: torch==2.5.0.dev20240726), whose
release line prefers hipBLASLt on MI300X (aten/src/ATen/Context.h, TORCH_BLAS_PREFER_HIPBLASLT != false;
ROCm/pytorch#2173: "hipblaslt is enabled for mi200 and mi300 in rel/2.5"). iteration_latency, fitted on Argonne's
runs only, is at its prior here (meshplan_validation/fitted.py ITERATION_LATENCY_PRIOR).

Run: python benchmarks/measure/dstack_mi300x.py   (about a minute)
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any

from fit_inference import golden_rounds
from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.engine import load_engine
from meshplan_validation.fitted import ITERATION_LATENCY_PRIOR, KERNEL_GAP_PRIOR, UNTUNED_GEMM_PRIOR, by_name
from meshplan_validation.serving_eval import predict
from meshplan_validation.serving_map import case_of

SOURCE = "dstackai/benchmarks@9ece943 amd/inference/vllm/data/serving_benchmarks_vllm_80.txt (vLLM 0.6.3.dev, ROCm 6.1)"
PRESET = "vllm-v0.6-rocm"
INPUT = 80
# N prompts at once -> (total generated tokens, mean TPOT in ms), as printed
RUNS = {1: (85, 50.19), 2: (127, 51.59), 4: (288, 54.18), 8: (484, 55.48), 16: (936, 63.38), 32: (1857, 87.10),
        64: (3842, 230.16), 128: (7588, 298.29), 256: (15376, 389.49)}
BOUNDS = {"skinny_gemm_rate": (0.02, 0.5), "kernel_gap": (0.0, 40e-6)}


def record(n: int) -> dict[str, Any]:
    """One run as a serving record: a static batch of n requests of the run's mean lengths."""
    generated, tpot = RUNS[n]
    return {"id": f"dstack_mi300x_vllm_405b_tp8_n{n}", "group": "dstack_mi300x_vllm", "engine": "vLLM 0.6.3",
            "date": "2024-10", "model": {"preset": "llama3.1-405b"},
            "hardware": {"preset": "mi300x", "num_gpus": 8, "gpu": "MI300X-192GB", "generation": "CDNA 3"},
            "parallel": {"tp": 8, "pp": 1}, "precision": {"weights": "bf16", "activations": "bf16", "kv_cache": "bf16"},
            "workload": {"input_len": INPUT, "output_len": round(generated / n), "batch_size": n, "num_requests": n,
                         "scenario": "latency"},
            "measured": {"tpot_ms": tpot}}


def tpot_errors(values: dict[str, float]) -> list[float]:
    """Each run's predicted / measured TPOT - 1, the ROCm build's preset with ``values`` in place of its fields."""
    engine = load_engine(PRESET).with_(**values)
    out = []
    for n, (_, tpot) in RUNS.items():
        case = case_of(record(n))
        assert not isinstance(case, str), case
        predicted, _ = predict(replace(case, engine=engine), SERVE_DEFAULT)
        out.append(predicted["tpot_ms"] / tpot - 1)
    return out


def objective(values: dict[str, float]) -> float:
    return statistics.median(abs(math.log1p(e)) for e in tpot_errors(values))


def fit(start: dict[str, float]) -> dict[str, float]:
    """Coordinate descent, golden-section search on each constant, three rounds (fit_llm_inference_bench.py's)."""
    values = dict(start)
    for _ in range(3):
        for name in BOUNDS:
            values = values | {name: golden_rounds(lambda x, v=values, n=name: objective(v | {n: x}),
                                                   *BOUNDS[name], 10)}
    return values


def line(label: str, values: dict[str, float]) -> str:
    e = tpot_errors(values)
    cells = " ".join(f"{n}:{100 * x:+.0f}%" for n, x in zip(RUNS, e, strict=True))
    return (f"  {label}: skinny_gemm_rate {values['skinny_gemm_rate']:.4f}, kernel_gap "
            f"{1e6 * values['kernel_gap']:.2f} us -> median |error| {100 * statistics.median(map(abs, e)):.1f} % "
            f"(signed {100 * statistics.median(e):+.1f} %); by N: {cells}")


def main() -> None:
    base = {"iteration_latency": ITERATION_LATENCY_PRIOR}
    priors = base | {"skinny_gemm_rate": UNTUNED_GEMM_PRIOR, "kernel_gap": KERNEL_GAP_PRIOR}
    fitted = base | {"skinny_gemm_rate": by_name("vLLM ROCm skinny_gemm_rate").value(),
                     "kernel_gap": by_name("vLLM ROCm kernel_gap").value()}
    print(f"dstack's vLLM runs on 8x MI300X (Llama 3.1 405B BF16, tp 8; {SOURCE}), mean TPOT, {PRESET}:")
    print(line("at the priors (without Argonne's runs)", priors))
    print(line("at the values fitted on Argonne's MI300X runs", fitted))
    print(line("fitted on these runs", fit(priors)))


if __name__ == "__main__":
    main()
