"""The worst fifth of LLM-Inference-Bench's released half out of source, by the mechanism its runs share (issue 79;
data/measured/2026-11-30-argonne-worst-fifth.md).

Reads docs/out_of_source.json (benchmarks/docs/out_of_source.py: each run's error with every constant refitted
without Argonne's runs) and data/serving/llm_inference_bench_dev.jsonl, and prints:

- per GPU, the median / p90 |error| of each run's headline (total tokens/s) out of source and in sample;
- the fifth of the 341 runs with the largest out-of-source |error|, ranked, each with its group:
  A  a static batch that the KV cache holds (the decode GEMMs' cost per sequence, presets/engines/vllm-v0.6-rocm.toml
     skinny_gemm_rate), A/kv one it does not (``static_capacity`` C < B: waves, serve/metrics.py _static), B batch 1
     (the step's fixed costs, vllm-v0.6-rocm.toml kernel_gap);
- the time per output token (e2e / O) at batch 1 by length, MI300X beside H100: the fixed cost of group B is in the
  measured runs' shortest lengths, not in their steps;
- the runs whose batch overflows the KV cache: the measured and predicted time per token across the overflow.

Nothing is fitted or priced here. Run (seconds):
    PYTHONPATH=src:. python benchmarks/measure/argonne_worst_fifth.py --oos docs/out_of_source.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.metrics import static_capacity
from meshplan_validation.serving_eval import setting
from meshplan_validation.serving_map import case_of

ROOT = Path(__file__).resolve().parents[2]
RUN = re.compile(r"llminfbench_vllm_(\w+?)_llama-2-(\w+)-hf_tp(\d+)_bs(\d+)_(\d+)x(\d+)")
LENGTHS = (128, 256, 512, 1024, 2048)


def parts(run_id: str) -> tuple[str, ...]:
    """(gpu, model, tp, batch, input, output) of a run's id."""
    m = RUN.match(run_id)
    if m is None:
        raise ValueError(f"not an LLM-Inference-Bench vLLM run: {run_id}")
    return m.groups()


def records() -> dict[str, dict[str, Any]]:
    lines = (ROOT / "data/serving/llm_inference_bench_dev.jsonl").read_text().splitlines()
    return {r["id"]: r for r in (json.loads(line) for line in lines if line)}


def argonne_rows(oos: Path) -> list[dict[str, Any]]:
    runs = json.loads(oos.read_text())["runs"]
    return [r for r in runs if r["kind"] == "serving" and r["source"] == "argonne_bench"]


def capacity(record: dict[str, Any]) -> float:
    """The model's static capacity C: sequences whose KV cache holds to their last token (serve/metrics.py)."""
    case = case_of(record)
    if isinstance(case, str):
        return float("inf")
    return float(static_capacity(setting(case, case.plan.batch, SERVE_DEFAULT)))


def group(record: dict[str, Any]) -> str:
    batch = int(parts(record["id"])[3])
    if batch == 1:
        return "B"
    return "A/kv" if capacity(record) < batch else "A"


def pct(xs: list[float], q: float) -> float:
    """The q-th quantile of |error|, in per cent."""
    return 100 * float(np.quantile(np.abs(np.asarray(xs)), q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--oos", type=Path, required=True,
                        help="an out_of_source.json (benchmarks/docs/out_of_source.py)")
    recs, rows = records(), argonne_rows(parser.parse_args().oos)
    head = [r for r in rows if r.get("headline")]
    print("per GPU (total tokens/s): out of source median / p90, in sample median / p90")
    for gpu in ("h100", "gh200", "mi300x"):
        sel = [r for r in head if parts(r["id"])[0] == gpu]
        oos, ins = [r["oos_error"] for r in sel], [r["error"] for r in sel]
        print(f"  {gpu:7s} {len(sel):3d} runs  {pct(oos, .5):5.1f} / {pct(oos, .9):5.1f} %   "
              f"{pct(ins, .5):5.1f} / {pct(ins, .9):5.1f} %  ({sel[0]['regime']['engine']})")
    head.sort(key=lambda r: -abs(r["oos_error"]))
    worst = head[: len(head) // 5]
    print(f"\nworst fifth: {len(worst)} runs, |error| out of source >= {100 * abs(worst[-1]['oos_error']):.1f} %")
    counts: dict[str, int] = {}
    for i, r in enumerate(worst, 1):
        gpu, model, tp, batch, inp, out = parts(r["id"])
        g = group(recs[r["id"]])
        counts[g] = counts.get(g, 0) + 1
        print(f"  {i:2d} {gpu} {r['regime']['engine']} Llama 2 {model.upper():3s} tp {tp} batch {batch:>3s} "
              f"{inp}/{out} {r['metric']}: out of source {100 * r['oos_error']:+6.1f} %, "
              f"in sample {100 * r['error']:+6.1f} %  [{g}]")
    print("  groups:", counts)
    e2e = {r["id"]: r for r in rows if r["metric"] == "e2e_latency_ms"}
    print("\nbatch 1, ms per output token (e2e / O) at", LENGTHS, "measured | out of source")
    for floor in ("mi300x 7b 1", "mi300x 7b 4", "mi300x 70b 1", "mi300x 70b 8", "h100 7b 1", "h100 7b 4", "h100 70b 4"):
        gpu, model, tp = floor.split()
        ids = [f"llminfbench_vllm_{gpu}_llama-2-{model}-hf_tp{tp}_bs1_{n}x{n}" for n in LENGTHS]
        meas = [e2e[i]["measured"] / n for i, n in zip(ids, LENGTHS, strict=True)]
        oos = [e2e[i]["oos_predicted"] / n for i, n in zip(ids, LENGTHS, strict=True)]
        print(f"  {gpu:6s} {model:3s} tp {tp}: " + " ".join(f"{m:6.2f}" for m in meas) + "  | "
              + " ".join(f"{p:6.2f}" for p in oos))
    print("\nKV overflow (C < B): ms per output token at the length before and at the overflow, measured / in sample")
    for rid in sorted(e2e):
        gpu, model, tp, batch, inp, _ = parts(rid)
        if gpu != "mi300x" or int(batch) == 1:
            continue
        c = capacity(recs[rid])
        if c >= int(batch) or int(inp) == LENGTHS[0]:
            continue
        prev = rid.replace(f"_{inp}x{inp}", f"_{int(inp) // 2}x{int(inp) // 2}")
        a, b = e2e[prev], e2e[rid]
        m0, m1 = a["measured"] / (int(inp) // 2), b["measured"] / int(inp)
        p0, p1 = a["predicted"] / (int(inp) // 2), b["predicted"] / int(inp)
        print(f"  {model:3s} tp {tp} batch {batch:>3s} {inp}/{inp}: C {c:5.1f}; measured {m0:7.1f} -> {m1:7.1f} "
              f"(x{m1 / m0:.2f}), in sample {p0:7.1f} -> {p1:7.1f} (x{p1 / p0:.2f})")


if __name__ == "__main__":
    main()
