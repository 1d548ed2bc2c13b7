"""Where the serving model's errors sit, as step times rather than ratios (issue 79: "use them to find mechanisms"),
in sample (the shipped constants) and out of source (each constant refitted without the runs' source,
meshplan_validation/loso_serving.py), for the three leads of serve14's brief:

- LLM-Inference-Bench's released half (data/serving/llm_inference_bench_dev.jsonl, static batches of vLLM 0.5-0.6):
  per GPU, model and tp, the time per output token at batch 1 (e2e / O: the floor of a decode step, its fixed costs)
  and the time each sequence adds to it from batch 16 to the largest measured at 128 tokens in and out (256 on MI300X,
  64 on the others; the per-sequence cost: on
  MI300X the untuned decode GEMMs, presets/engines/vllm-v0.6-rocm.toml skinny_gemm_rate; it shrinks with tp where it
  is GPU work), measured and predicted;
- H100 at batch 1 (captured decode graphs, vLLM V0 under tensor parallelism): the time per token left out beyond tp
  1's, spread over the step's tensor-parallel all-reduces, beside the price of one (issue 79's per-token cost that
  grows with TP; collectives/allreduce.py);
- TensorRT-LLM 0.14's online serving runs (data/serving/published_serving.jsonl, trtllm014srv_*) at 2 requests/s, all
  but idle: the inter-token latency and the time to first token that the model leaves out, in milliseconds, with the
  engine's fitted iteration_overhead and at its prior (0), the value it takes out of source;
- LLM-Inference-Bench's MI300X runs (vLLM v0.6.1's ROCm build) with each constant only Argonne's runs fit at its
  out-of-source value in turn, the others shipped (``attribution_rows``): which of them carries the out-of-source
  miss (data/measured/2026-11-30-argonne-mi300x-out-of-source.md; tests/test_serve_rocm_out_of_source.py).

Nothing is fitted here; the figures are for reading (docs/ACCURACY_INFERENCE.md has the errors themselves).
Run: PYTHONPATH=src:. python benchmarks/measure/serving_residuals.py  (a few minutes: the out-of-source refit of
vLLM V0's iteration_latency)
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from meshplan.collectives.comm import Collective
from meshplan.collectives.price import SERVING as ENGINE_KERNELS
from meshplan.collectives.price import collective_seconds
from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan_validation import loso_serving
from meshplan_validation.records import read_runs

ROOT = Path(__file__).resolve().parents[2]
ARGONNE = ROOT / "data" / "serving" / "llm_inference_bench_dev.jsonl"
PUBLISHED = ROOT / "data" / "serving" / "published_serving.jsonl"
SERVING = ("published_serving.jsonl", "small_work.jsonl", "llm_inference_bench_dev.jsonl", "dstack_mi300x.jsonl")
RUN = re.compile(r"llminfbench_vllm_(\w+?)_(llama-2-\w+?)-hf_tp(\d)_bs(\d+)_(\d+)x(\d+)")
SMALL, INPUT = 16, 128  # the per-sequence cost from this batch to the largest measured, at this many tokens in and out


def per_token(records: list[dict[str, Any]], values: dict[str, float]) -> dict[tuple[Any, ...], tuple[float, float]]:
    """(gpu, model, tp, batch, I) -> (measured, predicted) milliseconds per output token of each Argonne run."""
    out = {}
    for r in loso_serving.priced(records, values):
        m = RUN.match(r.id)
        if m and r.metric == "e2e_latency_ms" and r.predicted:
            gpu, model, tp, batch, inp, outp = m.groups()
            out[(gpu, model, int(tp), int(batch), int(inp))] = (r.measured / int(outp), r.predicted / int(outp))
    return out


def argonne_rows(inside: dict, outside: dict) -> list[str]:
    rows = ["| GPU / model / tp | batch 1: measured | in sample | out of source | per sequence (16 -> largest):"
            " measured | in sample | out of source |", "|---|---:|---:|---:|---:|---:|---:|"]
    for gpu, model, tp in sorted({k[:3] for k in inside}):
        ones = [k for k in inside if k[:3] == (gpu, model, tp) and k[3] == 1]
        floor = [statistics.median(d[k][i] for k in ones) for d, i in ((inside, 0), (inside, 1), (outside, 1))]
        hi = max(k[3] for k in inside if k[:3] == (gpu, model, tp) and k[4] == INPUT)
        a, b = (gpu, model, tp, SMALL, INPUT), (gpu, model, tp, hi, INPUT)
        slope = [(d[b][i] - d[a][i]) / (hi - SMALL) for d, i in ((inside, 0), (inside, 1), (outside, 1))]
        rows.append(f"| {gpu} / {model} / {tp} | " + " | ".join(f"{v:.2f} ms" for v in floor) + " | "
                    + " | ".join(f"{v:.3f} ms" for v in slope) + " |")
    return rows


def all_reduce_rows(inside: dict) -> list[str]:
    """H100 at batch 1 (captured decode graphs): the ms per token left out (measured - in sample, the median over
    the lengths) beyond tp 1's, and what it would be per tensor-parallel all-reduce of the step (2 a layer and the
    embedding's), beside the price of one such all-reduce (collectives/price.py: the engines' kernel or NCCL's LL,
    whichever is slower, at B·h·2 bytes). Per call the miss is the same order as the price, but the 70B's 161 calls
    leave out what the 7B's 65 do: the miss goes with the iteration, not with the all-reduce."""
    cluster = load_system("h100").cluster(8)
    miss = {k[:3]: statistics.median(m - p for kk, (m, p) in inside.items() if kk[:4] == (*k[:3], 1))
            for k in inside if k[0] == "h100" and k[3] == 1}
    base = miss.get(("h100", "llama-2-7b", 1), 0.0)
    rows = ["| model / tp | left out per token | beyond tp 1's | all-reduces a step | per all-reduce | priced per"
            " all-reduce |", "|---|---:|---:|---:|---:|---:|"]
    for (_, model, tp), left in sorted(miss.items()):
        if tp == 1:
            continue
        spec = load_model(model.replace("llama-2-", "llama2-"))
        calls = 2 * spec.num_layers + 1
        price = collective_seconds(Collective("all_reduce", 2.0 * spec.hidden_size, "tp", tp), 1, cluster,
                                   SERVE_DEFAULT, ENGINE_KERNELS)
        rows.append(f"| {model} / {tp} | {left:+.2f} ms | {left - base:+.2f} ms | {calls} | "
                    f"{1e3 * (left - base) / calls:+.1f} us | {1e6 * float(price):.1f} us |")
    return rows


def trtllm_rows(records: list[dict[str, Any]]) -> list[str]:
    """The idle runs' (2 requests/s) ITL and TTFT left out, ms: measured - predicted, shipped and at the prior."""
    idle = [r for r in records if r["id"].startswith("trtllm014srv") and r["id"].endswith("_qps2")]
    shipped = {(r.id, r.metric): r for r in loso_serving.priced(idle)}
    prior = {(r.id, r.metric): r for r in loso_serving.priced(idle, {"trtllm": 0.0})}
    rows = ["| run | ITL measured | left out: shipped | at the prior | TTFT measured | left out: shipped"
            " | at the prior |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in idle:
        cells = []
        for metric in ("itl_ms", "ttft_ms"):
            s, p = shipped[(r["id"], metric)], prior[(r["id"], metric)]
            cells += [f"{s.measured:.0f}", f"{s.measured - (s.predicted or 0):+.2f}",
                      f"{p.measured - (p.predicted or 0):+.2f}"]
        rows.append(f"| {r['id'].removeprefix('trtllm014srv_')} | " + " | ".join(cells) + " |")
    return rows


def attribution_rows(records: list[dict[str, Any]], oos: dict[str, float]) -> list[str]:
    """The MI300X runs' median and p90 |error| of throughput and e2e latency, and the signed median throughput error
    by batch, with the out-of-source values ``oos`` of the ROCm constants applied one at a time and together."""
    mi300x = [r for r in records if "_mi300x_" in r["id"]]
    rocm = {k: v for k, v in oos.items() if "ROCm" in k}
    variants = {"shipped": {}, **{f"{k} only": {k: v} for k, v in rocm.items()}, "out of source": oos}
    batches = sorted({int(m.group(4)) for r in mi300x if (m := RUN.match(r["id"]))})
    rows = ["| constants | total tok/s: median / p90 | e2e: median / p90 | "
            + " | ".join(f"bs {b}" for b in batches) + " |", "|---|---:|---:|" + "---:|" * len(batches)]
    for name, values in variants.items():
        errors: dict[tuple[str, int], list[float]] = defaultdict(list)
        for r in loso_serving.priced(mi300x, values):
            m = RUN.match(r.id)
            if m and r.error is not None:
                errors[(r.metric, 0)].append(r.error)
                errors[(r.metric, int(m.group(4)))].append(r.error)
        cells = []
        for metric in ("total_tokens_per_s", "e2e_latency_ms"):
            size = sorted(abs(e) for e in errors[(metric, 0)])
            cells.append(f"{100 * statistics.median(size):.1f} / {100 * size[int(0.9 * len(size))]:.1f} %")
        cells += [f"{100 * statistics.median(errors[('total_tokens_per_s', b)]):+.0f} %" for b in batches]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    every = [r for name in SERVING for r in read_runs(ROOT / "data" / "serving" / name)]
    argonne = read_runs(ARGONNE)
    oos = loso_serving.single_without("argonne_bench", every)
    print("LLM-Inference-Bench's released half: ms per output token; out of source: "
          + ", ".join(f"{k} = {v:.4g}" for k, v in sorted(oos.items())) + "\n")
    inside = per_token(argonne, {})
    print("\n".join(argonne_rows(inside, per_token(argonne, oos))))
    print("\nMI300X: the out-of-source value of each ROCm constant alone (median |error|, signed by batch)\n")
    print("\n".join(attribution_rows(argonne, oos)))
    print("\nH100 at batch 1, in sample: the time per token left out under tensor parallelism\n")
    print("\n".join(all_reduce_rows(inside)))
    print("\nTensorRT-LLM 0.14 online serving at 2 requests/s: ms the model leaves out (measured - predicted)\n")
    print("\n".join(trtllm_rows(read_runs(PUBLISHED))))
    spread: dict[str, list[float]] = defaultdict(list)
    for k, v in inside.items():
        spread[k[0]].append(v[1] / v[0] - 1)
    print("\nin sample, median error per output token by GPU: "
          + ", ".join(f"{g} {100 * statistics.median(e):+.1f} %" for g, e in sorted(spread.items())))


if __name__ == "__main__":
    main()
