"""vLLM's untuned ROCm build of 2024 on MI300X, from a source other than LLM-Inference-Bench: dstack's published runs of
upstream vLLM on 8x MI300X (data/serving/dstack_mi300x.jsonl, its provenance in data/serving/README.md), priced with
the preset their engine string maps to (presets/engines/vllm-v0.6.2-rocm-rocblas.toml: upstream's build from v0.6.2
over PyTorch 2.4, whose untuned GEMMs are rocBLAS's where the builds over PyTorch 2.5, Argonne's, run hipBLASLt's) at
the shipped values, at the priors (``skinny_gemm_rate``, ``kernel_gap``: meshplan_validation/fitted.py
UNTUNED_GEMM_PRIOR, KERNEL_GAP_PRIOR), at the hipBLASLt rate fitted on Argonne's runs, and fitted on these runs
themselves: the rate alone with the shipped gap, and the two together.

The runs: vLLM 0.6.3.dev116+g151ef4ef built from upstream main on ROCm 6.1 with PyTorch 2.4.1+rocm6.1, `vllm serve`
with --tensor-parallel-size=8 and no other engine option, Llama 3.1 405B Instruct in BF16 on one node of 8x MI300X;
vLLM's benchmark_serving.py sent N prompts of 80 tokens at once, so each run up to N = 256 (max_num_seqs) is one
batch, and its mean time per output token (TPOT, first token excluded) a decode step at that batch.

What differs from Argonne's MI300X runs (vLLM v0.6.1 from its Dockerfile.rocm, FP16, Llama 2 7B / 70B), each from the
two builds' published scripts and vLLM's source: the decode attention kernel (v0.6.1's hipified generic kernel, one
thread block per query head; ROCm's GQA-aware kernel here, immaterial at these 80 + ~60 tokens of context); BF16 GEMMs,
not FP16; PyTorch 2.4.1, which runs F.linear on rocBLAS, where v0.6.1 asks for a 2.5 pre-release on ROCm
(CMakeLists.txt:39@v0.6.1 TORCH_SUPPORTED_VERSION_ROCM "2.5.0"), whose line prefers hipBLASLt (Context.h of the 2.4.1
and 2.5.0 wheels: `== true` and `!= false` of TORCH_BLAS_PREFER_HIPBLASLT; pytorch/pytorch#127944); greedy sampling
(benchmark_serving's temperature 0) where Argonne's script samples at temperature 1; Llama 3.1's 128K context, which
turns chunked prefill on by default (vllm/engine/arg_utils.py:872-889@v0.6.1, max_num_batched_tokens 512: the prompts of
the runs at N >= 64 share their first decode steps, which a static batch does not price). iteration_latency is the
shipped value (fitted on Argonne's H100 runs) but on the lines of the priors (meshplan_validation/fitted.py
ITERATION_LATENCY_PRIOR).

Run: python benchmarks/measure/dstack_mi300x.py   (about a minute)
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from fit_inference import golden_rounds
from meshplan_validation.fitted import ITERATION_LATENCY_PRIOR, KERNEL_GAP_PRIOR, UNTUNED_GEMM_PRIOR, by_name
from meshplan_validation.loso_serving import ROCBLAS, ROCM
from meshplan_validation.serving_eval import results

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "serving" / "dstack_mi300x.jsonl"
BOUNDS = {"skinny_gemm_rate": (0.02, 0.5), "kernel_gap": (0.0, 40e-6)}


def runs() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


def tpot_errors(values: dict[str, float], records: list[dict] | None = None) -> list[float]:
    """Each run's predicted / measured TPOT - 1, the ROCm builds' presets with ``values`` in place of their fields."""
    out = results(records or runs(), engines={name: values for name in (*ROCM, *ROCBLAS)})
    return [r.error for r in out if r.metric == "tpot_ms" and r.error is not None]


def objective(values: dict[str, float], records: list[dict]) -> float:
    return statistics.median(abs(math.log1p(e)) for e in tpot_errors(values, records))


def fit(start: dict[str, float], names: tuple[str, ...] = tuple(BOUNDS)) -> dict[str, float]:
    """Coordinate descent over ``names``, golden-section search on each, three rounds (fit_llm_inference_bench.py's)."""
    values, records = dict(start), runs()
    for _ in range(3):
        for name in names:
            values = values | {name: golden_rounds(lambda x, v=values, n=name: objective(v | {n: x}, records),
                                                   *BOUNDS[name], 10)}
    return values


def line(label: str, values: dict[str, float]) -> str:
    e = tpot_errors(values)
    cells = " ".join(f"{r['workload']['batch_size']}:{100 * x:+.0f}%" for r, x in zip(runs(), e, strict=True))
    return (f"  {label}: skinny_gemm_rate {values['skinny_gemm_rate']:.4f}, kernel_gap "
            f"{1e6 * values['kernel_gap']:.2f} us -> median |error| {100 * statistics.median(map(abs, e)):.1f} % "
            f"(signed {100 * statistics.median(e):+.1f} %); by N: {cells}")


def main() -> None:
    rate, gap = by_name("vLLM ROCm skinny_gemm_rate, rocBLAS"), by_name("vLLM ROCm kernel_gap")
    shipped = {"iteration_latency": by_name("vLLM V0 iteration_latency").value(), "skinny_gemm_rate": rate.value(),
               "kernel_gap": gap.value()}
    priors = {"iteration_latency": ITERATION_LATENCY_PRIOR, "skinny_gemm_rate": UNTUNED_GEMM_PRIOR,
              "kernel_gap": KERNEL_GAP_PRIOR}
    hipblaslt = shipped | {"skinny_gemm_rate": by_name("vLLM ROCm skinny_gemm_rate").value()}
    print(f"dstack's vLLM runs on 8x MI300X ({DATA.relative_to(ROOT)}: Llama 3.1 405B BF16, tp 8), mean TPOT:")
    print(line("shipped (rocBLAS rate, shared gap and latency)", shipped))
    print(line("at the priors", priors))
    print(line("at the hipBLASLt rate fitted on Argonne's MI300X runs", hipblaslt))
    print(line("the rate fitted on these runs, the shipped gap", fit(shipped, ("skinny_gemm_rate",))))
    print(line("rate and gap fitted on these runs, latency at its prior", fit(priors)))


if __name__ == "__main__":
    main()
