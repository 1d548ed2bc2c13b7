"""Time the serving search (meshplan serve) on the cases a user runs, and print configurations per second.

Target (issue 39): a serving search in at most 1 s. Each case is timed best of three, one process.

Run: python benchmarks/measure/serve_speed.py
"""

from __future__ import annotations

import time

from meshplan.serve.engine import load_engine
from meshplan.serve.search import search
from meshplan.serve.space import ServeSpace
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

CASES = (  # model, system, GPUs, input, output, TTFT target, TPOT target
    ("llama3-8b", "h100", 8, 1024, 256, 0.5, 0.03),
    ("llama3-70b", "h100", 16, 2048, 512, 2.0, 0.05),
    ("llama3.1-405b", "h200", 64, 4096, 1024, 5.0, 0.1),
    ("mixtral-8x22b", "b200", 32, 1024, 1024, 1.0, 0.05),
    ("deepseek-v3", "h200", 64, 2048, 2048, 3.0, 0.1),
)


def main() -> None:
    print(f"{'model':<16}{'system':<8}{'GPUs':>6}{'configurations':>16}{'seconds':>9}{'per second':>12}  best")
    for name, system, gpus, inp, out, ttft, tpot in CASES:
        model, cluster = load_model(name), load_system(system).cluster(gpus)
        space = ServeSpace(input_len=inp, output_len=out, ttft_slo=ttft, tpot_slo=tpot, engine=load_engine("vllm"))
        best = None
        for _ in range(3):
            start = time.perf_counter()
            result = search(model, cluster, space, top_k=10)
            took = time.perf_counter() - start
            best = took if best is None else min(best, took)
        top = result.plans[0].plan.describe() if result.plans else "none"
        rate = result.evaluated / best
        print(f"{name:<16}{system:<8}{gpus:>6}{result.evaluated:>16,}{best:>9.2f}{rate:>12,.0f}  {top}")


if __name__ == "__main__":
    main()
