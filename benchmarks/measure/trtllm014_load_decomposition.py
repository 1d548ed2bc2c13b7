"""TensorRT-LLM 0.14's online serving runs (data/serving/published_serving.jsonl, group ``trtllm_serving_v0.14``: 500
requests at QPS 2-32, Poisson arrivals assumed) simulated as the validation prices them (serving_eval._transient:
serve/load/run.repeated on the run's instance), under two diagnostic knobs that the shipped model does not have, to
see which kind of missing cost the measured latencies ask for (issue 79; data/measured/2026-12-01-trtllm014-serving-
load.md reads the output):

- ``--overheads``: the trtllm preset's iteration_overhead in ms (shipped 2.016, fitted on these pages; out of source
  it falls to its prior, 0): a fixed host cost on every iteration;
- ``--factors``: every iteration that carries prompt tokens costs its prompts' share k times (price(d, p) +
  (k − 1)·(price(d, p) − price(d, 0))): a dearer context phase, the only knob that grows with the arrivals.

Neither is a proposal: k is not sourced (TensorRT-LLM 0.14's batch manager ships as a binary), and the printout shows
it cannot hold across rates. Only the series of one prompt length (467 tokens) are read: the 202/214 ones are a
distribution of lengths (serving_map.VARIED).

Run: python benchmarks/measure/trtllm014_load_decomposition.py [--overheads 0,2.016] [--factors 1,1.3] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from meshplan.serve.load.lengths import Lengths
from meshplan.serve.load.run import load_instance, repeated
from meshplan_validation.serving_eval import largest_batch
from meshplan_validation.serving_map import case_of

DATA = Path(__file__).resolve().parents[2] / "data" / "serving" / "published_serving.jsonl"
RATES = ("2", "4", "8", "16", "32")
SERIES = tuple(f"{m}_{g}_tp{t}_{w}" for m, t in (("llama3.1-8b", 1), ("llama3.1-70b", 4)) for g in ("h100", "h200")
               for w in ("467x256", "467x16"))


class DearerPrompts:
    """An instance's iteration prices with each iteration's prompt share times ``k`` (module docstring)."""

    def __init__(self, price, k: float) -> None:
        self.price, self.k = price, k

    def knots(self, decode: float):
        return self.price.knots(decode)  # pure decode runs: unchanged

    def __call__(self, decode: float, prefill: float, context: float, prefix: float = 0.0) -> float:
        base = self.price(decode, prefill, context, prefix)
        if not prefill:
            return base
        return base + (self.k - 1) * (base - (self.price(decode, 0, context) if decode else 0.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--overheads", default="0,2.016", help="iteration_overhead values, ms")
    ap.add_argument("--factors", default="1,1.3", help="prompt-share factors k")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    rows = map(json.loads, DATA.read_text().splitlines())
    records = {r["id"]: r for r in rows if r["group"] == "trtllm_serving_v0.14"}
    errors: dict[tuple[float, float, str], list[float]] = {}
    for series in SERIES:
        for ov in map(float, args.overheads.split(",")):
            for k in map(float, args.factors.split(",")):
                cells = []
                for q in RATES:
                    rec = records[f"trtllm014srv_{series}_qps{q}"]
                    case, w = case_of(rec), rec["workload"]
                    inp, out = case.workload.input_len, case.workload.output_len
                    plan = case.plan.with_(batch=int(largest_batch(case)))
                    sched, price = load_instance(case.model, case.cluster, plan,
                                                 case.engine.with_(iteration_overhead=ov / 1e3), inp + out)
                    r = repeated((sched, DearerPrompts(price, k)), w["request_rate"], w["num_requests"],
                                 Lengths("fixed", inp, out), tuple(range(args.seeds)))
                    m = rec["measured"]
                    e = (1e3 * r.mean["ttft"] / m["ttft_ms"] - 1, 1e3 * r.mean["itl"] / m["itl_ms"] - 1)
                    errors.setdefault((ov, k, q), []).extend(e)
                    cells.append(f"q{q} T{100 * e[0]:+4.0f} I{100 * e[1]:+4.0f}")
                print(f"{series:30s} ov {ov:5.3f} k {k:4.2f} | " + " ".join(cells), flush=True)
    print("\nper rate, over the 8 series' TTFT and ITL: median |error|, mean error (%)")
    for (ov, k, q), e in sorted(errors.items(), key=lambda t: (t[0][0], t[0][1], float(t[0][2]))):
        print(f"ov {ov:5.3f} k {k:4.2f} qps {q:>2}: {100 * float(np.median(np.abs(e))):5.1f} "
              f"{100 * float(np.mean(e)):+6.1f}")


if __name__ == "__main__":
    main()
