"""Fit the serving model's free constants on the fit half of the published serving runs; print them and the errors.

The fit half is the data's own (data/serving/README.md, "The split": within each source group, the records ordered by
the SHA-256 of their id, even ranks ``fit``); the ``check`` half and the held-back MI300X source are the out-of-sample
test (docs/ACCURACY_INFERENCE.md). The objective is meshplan_validation.robust_loss.SERVING's: min(|log(predicted /
measured)|, 0.7), over each run's throughput (its headline metric) and, where measured, its
inter-token latency, averaged within each source group and then across groups, so that every source weighs the same
(the leave-one-source-out refits, meshplan_validation/refit.py, minimise the same). The constants:
- ``kv_read`` and ``experts`` (meshplan/serve/efficiency.py: decode attention's share of the streaming rate; the MoE
  path's rate against dense GEMMs), on every fit run;
- the host time per iteration of each engine with fit runs whose host time adds to the GPU's (``iteration_overhead`` of
  presets/engines/trtllm.toml and lmdeploy.toml); TensorRT-LLM's PyTorch backend overlaps it with the GPU's work
  (``host_overlap``) and hides it in every run, vLLM's runs are all held back and SGLang has one fit run: theirs stay 0.
Coordinate descent, golden-section search on each constant in turn, three rounds. The values printed are copied into
the efficiency module and the engine presets by hand: updating them is an explicit act, as for golden outputs.
``--hold NAME`` keeps a constant at the value in the code (the shipped ``experts`` is held: fitted freely it runs to its
bound of 1.0, pulled by the single-run MoE groups of the fit half, and the check half's objective rises from 0.116
to 0.196: docs/SERVING.md says why).

Run: python benchmarks/measure/fit_inference.py [--hold experts]  (a few minutes)
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan_validation.robust_loss import SERVING
from meshplan_validation.serving_eval import results

DATA = Path(__file__).resolve().parents[2] / "data" / "serving" / "published_serving.jsonl"
ENGINES = ("trtllm", "lmdeploy")
FORM = "iteration_overhead"  # the engine constant fitted (the only one the presets ship as fitted: fitted.py)
BOUNDS = {"kv_read": (0.3, 1.0), "experts": (0.15, 1.0)} | {name: (0.0, 10e-3) for name in ENGINES}
GOLDEN = (math.sqrt(5) - 1) / 2


def objective(records: list[dict], values: dict[str, float]) -> float:
    eff = replace(SERVE_DEFAULT, kv_read=values["kv_read"], experts=values["experts"])
    engines = {name: {FORM: values[name]} for name in ENGINES}
    chosen = [r for r in results(records, eff, engines)
              if r.error is not None and (r.headline or r.metric == "itl_ms") and r.error > -1]
    return SERVING.objective(np.log1p([r.error for r in chosen]), np.array([r.group for r in chosen]))


def golden_brackets(f: Callable[[float], float], lo: float, hi: float) -> Iterator[tuple[float, float, float]]:
    """Golden-section search for the minimum of f on [lo, hi] (Kiefer 1953; f unimodal there): each bracket (lo, hi,
    and its better interior point, the left on a tie), the first [lo, hi] itself, each next GOLDEN times as wide, one
    evaluation of f apiece (two for the first). The one search of the fit scripts: this one's and
    fit_llm_inference_bench.py's stop after a number of rounds (golden_rounds), fit_efficiency.py's and fit_ridge.py's
    at a relative width (fit_efficiency.golden_section)."""
    a, b = lo + (1 - GOLDEN) * (hi - lo), lo + GOLDEN * (hi - lo)
    fa, fb = f(a), f(b)
    while True:
        yield lo, hi, (a if fa <= fb else b)
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = lo + (1 - GOLDEN) * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + GOLDEN * (hi - lo)
            fb = f(b)


def golden_rounds(f: Callable[[float], float], lo: float, hi: float, rounds: int) -> float:
    """The point of [lo, hi] a golden-section search of ``rounds`` rounds ends on (f unimodal there)."""
    return next(itertools.islice(golden_brackets(f, lo, hi), rounds, None))[2]


def golden(records: list[dict], values: dict[str, float], name: str, rounds: int = 10) -> dict[str, float]:
    return values | {name: golden_rounds(lambda x: objective(records, values | {name: x}), *BOUNDS[name], rounds)}


def main(argv: list[str] | None = None) -> None:
    args = list(argv or sys.argv[1:])
    held = set()
    while "--hold" in args:
        i = args.index("--hold")
        held.add(args[i + 1])
        del args[i:i + 2]
    path = Path((args or [str(DATA)])[0])
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    fit = [r for r in records if r.get("split") == "fit"]
    values = {"kv_read": 1.0, "experts": 1.0} | {name: 0.0 for name in ENGINES}
    values |= {name: getattr(SERVE_DEFAULT, name) for name in held & {"kv_read", "experts"}}
    print(f"fit half: {len(fit)} runs; start objective {objective(fit, values):.4f}; held: {sorted(held) or 'none'}")
    for round_ in range(3):
        for name in BOUNDS:
            if name not in held:
                values = golden(fit, values, name)
        print(f"round {round_ + 1}: " + ", ".join(f"{k} = {v:.4g}" for k, v in values.items())
              + f"; objective {objective(fit, values):.4f}")


if __name__ == "__main__":
    main()
