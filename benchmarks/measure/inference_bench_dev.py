"""LLM-Inference-Bench's released half (data/serving/llm_inference_bench_dev.jsonl) in docs/ACCURACY_INFERENCE.md:
each run's throughput predicted out of source first, then in sample (issue 79: "add it to what
benchmarks/docs/accuracy_inference.py evaluates and reports, out of source first").

Out of source: a run is priced with constants fitted without it. Three of the shipped constants were fitted on these
runs (benchmarks/measure/fit_llm_inference_bench.py): vLLM V0's ``iteration_latency`` on the H100 runs of Llama 2 7B at
tp 1, the ROCm build's ``skinny_gemm_rate`` and ``kernel_gap`` on the MI300X runs. Those subsets are priced with the
same constants fitted elsewhere (data/serving/llm_inference_bench_refits.json, written by the fit script: the H100 runs
with the ``iteration_latency`` fitted on GH200's, each MI300X model's runs with the ROCm constants fitted on the other
model's); every other run is out of every fit already. In sample: the shipped constants.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshplan_validation.serving_eval import ServingResult, results

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "data" / "serving" / "llm_inference_bench_dev.jsonl"
REFITS = ROOT / "data" / "serving" / "llm_inference_bench_refits.json"
V0 = ("vllm-v0.5", "vllm-v0", "vllm-v0.5-rocm", "vllm-v0.6-rocm")
ROCM = ("vllm-v0.5-rocm", "vllm-v0.6-rocm")


def subset(record: dict[str, Any]) -> tuple[str, str, str]:
    """The record's (system, model, tp) as the refits key them."""
    return record["hardware"]["preset"], record["model"]["preset"], str(record["parallel"].get("tp") or 1)


def engines(refit: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Engine preset -> the refit's fields: ``iteration_latency`` in every V0 preset, the rest in the ROCm ones."""
    values = {k: v for k, v in refit.items() if isinstance(v, (int, float))}
    out = {name: {k: v for k, v in values.items() if k == "iteration_latency"} for name in V0}
    for name in ROCM:
        out[name] |= {k: v for k, v in values.items() if k != "iteration_latency"}
    return out


def refit_for(record: dict[str, Any], refits: dict[str, dict[str, Any]]) -> str:
    """The refits' key that covers the record ("system/model" or "system/model/tp"), or ""."""
    system, model, tp = subset(record)
    return next((k for k in (f"{system}/{model}/{tp}", f"{system}/{model}") if k in refits), "")


def priced(records: list[dict[str, Any]]) -> tuple[list[ServingResult], list[ServingResult]]:
    """(out of source, in sample): each run's headline result."""
    refits = json.loads(REFITS.read_text())["without"]
    shipped = {id(r): results([r]) for r in records}  # each record's rows alone: results maps record by record
    inside = [x for r in records for x in shipped[id(r)] if x.headline and x.error is not None]
    out: list[ServingResult] = []
    for key in sorted({refit_for(r, refits) for r in records}):
        mine = [r for r in records if refit_for(r, refits) == key]
        # no refit covers them: out of source is the shipped constants' pricing, done above
        rows = results(mine, engines=engines(refits[key])) if key else [x for r in mine for x in shipped[id(r)]]
        out += [r for r in rows if r.headline and r.error is not None]
    return out, inside


def stats(errors: Sequence[float]) -> tuple[int, float, float, float]:
    e = np.asarray(errors, dtype=float)
    if not e.size:
        return 0, math.nan, math.nan, math.nan
    return int(e.size), float(np.median(np.abs(e))), float(np.percentile(np.abs(e), 90)), float(np.median(e))


def pct(x: float, sign: bool = False) -> str:
    return "-" if math.isnan(x) else (f"{100 * x:+.1f} %" if sign else f"{100 * x:.1f} %")


def table(res: list[ServingResult], by: dict[str, tuple[str, str, str]]) -> list[str]:
    lines = ["| GPU / model / tp | runs | median \\|error\\| | p90 \\|error\\| | median error |",
             "|---|---:|---:|---:|---:|"]
    n, med, p90, signed = stats([r.error for r in res])
    lines.append(f"| **all** | {n} | {pct(med)} | {pct(p90)} | {pct(signed, True)} |")
    for key in sorted({by[r.id] for r in res}):
        n, med, p90, signed = stats([r.error for r in res if by[r.id] == key])
        lines.append(f"| {key[0]} / {key[1]} / tp {key[2]} | {n} | {pct(med)} | {pct(p90)} | {pct(signed, True)} |")
    return lines


def markdown_section(records: list[dict[str, Any]] | None = None) -> list[str]:
    """The section of docs/ACCURACY_INFERENCE.md (module docstring)."""
    records = records if records is not None else [json.loads(x) for x in DEV.read_text().splitlines() if x.strip()]
    by = {r["id"]: subset(r) for r in records}
    out, inside = priced(records)
    refits = json.loads(REFITS.read_text())["without"]
    fitted = ", ".join(f"{k} (with {v['fitted on']}'s)" for k, v in sorted(refits.items()))
    return ["", "## LLM-Inference-Bench's released half: vLLM 0.5-0.6 static batches (dev)", "",
            f"{len(records)} runs of Llama 2 7B and 70B with vLLM on H100 (0.6, read from the record's date), GH200 "
            "(0.5.3) and MI300X (v0.6.1's ROCm build), tp 1-8, batch 1-256, 128-2,048 tokens in and out "
            "(data/serving/README.md); error in total tokens/s. Out of source: each run priced with constants fitted "
            f"without it; the subsets a shipped constant was fitted on are priced with its refit elsewhere: {fitted} "
            "(benchmarks/measure/fit_llm_inference_bench.py). The other half of the source is held back.", "",
            "Out of source:", "", *table(out, by), "", "In sample (the shipped constants):", "", *table(inside, by)]


if __name__ == "__main__":
    print("\n".join(markdown_section()))
