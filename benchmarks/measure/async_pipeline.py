"""The asynchronous pipeline schedules beside 1F1B: the schedule simulator's steady step on equal stages, and
estimate() of one plan under 1f1b, pipedream and pipedream-2bw (step time, bubble, optimizer, first rank's weights and
peak memory). The figures docs/USAGE.md quotes ("Asynchronous pipeline schedules").

Run: python benchmarks/measure/async_pipeline.py
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.estimate import estimate
from meshplan.memory import model_state_memory
from meshplan.pipeline.simulator import simulate
from meshplan.pipeline.steady import steady_step
from meshplan.pipeline.tables import build
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.units import fmt_bytes, fmt_time

P, M, F, B = 4, 8, 1.0, 2.0
PLAN = Plan(dp=2, tp=4, pp=4, global_batch=64, sequence_parallel=True, zero=1, recompute="none", grad_bytes=2)


def main() -> None:
    flushed = simulate(build("1f1b", P, M), F, B)
    print(f"simulator, p = {P}, m = {M}, t_f = {F:g}, t_b = {B:g}: 1f1b step {flushed.step_time:g} "
          f"(bubble {flushed.bubble_time:g}); steady step pipedream {steady_step('pipedream', P, M, F, B):g}, "
          f"pipedream-2bw {steady_step('pipedream-2bw', P, M, F, B):g}")
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(PLAN.num_gpus)
    print(f"llama3-8b on {cluster.num_gpus} x H100, {PLAN.describe()}:")
    for schedule in ("1f1b", "pipedream", "pipedream-2bw"):
        est = estimate(model, cluster, replace(PLAN, schedule=schedule), Stack())  # generic: no framework runs them
        print(f"  {schedule:14s} step {fmt_time(est.step_time):>8s}  bubble {fmt_time(est.breakdown['bubble']):>8s}  "
              f"dp {fmt_time(est.breakdown['dp']):>8s}  optimizer {fmt_time(est.breakdown['optimizer']):>8s}  "
              f"first rank's weights {fmt_bytes(_weights(est)):>9s}  "
              f"peak {fmt_bytes(est.peak_memory)}")


def _weights(est) -> float:
    """The first pipeline rank's weights (with its stashed versions)."""
    return float(model_state_memory(est.model, est.plan, est.stack)[0][0])


if __name__ == "__main__":
    main()
