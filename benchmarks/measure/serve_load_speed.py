"""Time the request-level serving simulation (meshplan/serve/load/) and print requests simulated per second.

Target (issue 49): a 10-minute trace at 50 requests/s (30,000 requests) in at most 1 s. Each case: Poisson arrivals
of ShareGPT-like lengths (serve/load/lengths.py) through one configuration, best of three, one process; the time
includes building the price grid (prices.py) and the percentiles (summary.py).

Run: python benchmarks/measure/serve_load_speed.py
"""

from __future__ import annotations

import time

from meshplan.serve.engine import load_engine
from meshplan.serve.load import arrivals, lengths
from meshplan.serve.load.run import load_run
from meshplan.serve.plan import ServePlan
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

CASES = (  # model, system, GPUs, plan, engine, requests/s
    ("llama3-8b", "h100", 1, ServePlan(batch=1024), "vllm", 50.0),
    ("llama3-70b", "h100", 8, ServePlan(tp=4, batch=512, replicas=2), "vllm", 50.0),
    ("llama3-8b", "h100", 1, ServePlan(batch=256), "trtllm", 50.0),
)
SECONDS = 600  # a 10-minute trace


def main() -> None:
    print(f"{'model':<12}{'system':<7}{'plan':<34}{'engine':<8}{'requests':>9}{'seconds':>9}{'requests/s':>12}"
          f"{'TTFT p99':>10}{'TPOT p99':>10}")
    for name, system, gpus, plan, engine, rate in CASES:
        model, cluster = load_model(name), load_system(system).cluster(gpus)
        reqs = arrivals.poisson(rate, int(rate * SECONDS), lengths.Lengths("sharegpt"))
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            result = load_run(model, cluster, plan, reqs, load_engine(engine))
            best = min(best, time.perf_counter() - start)
        print(f"{name:<12}{system:<7}{plan.describe():<34}{engine:<8}{len(reqs):>9,}{best:>9.2f}"
              f"{len(reqs) / best:>12,.0f}{result.ttft[99] * 1e3:>8.0f}ms{result.tpot[99] * 1e3:>8.1f}ms")


if __name__ == "__main__":
    main()
