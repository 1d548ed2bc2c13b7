"""Time one estimate() call, the same with its per-op table built (it is computed on first use), and the
vectorisable core step_costs(), on built-in presets; and the pipeline schedule simulator on a 64-stage 1F1B
step of 512 micro-batches (65,536 actions, the timeline of the HTML report).

Run: python benchmarks/measure/estimate_speed.py
"""

from __future__ import annotations

import time

from meshplan.estimate import estimate
from meshplan.pipeline.simulator import simulate
from meshplan.pipeline.tables import build
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.step.assemble import step_costs

CASES = [
    ("llama3-70b", "h100", 1024, Plan(dp=32, tp=8, pp=4, global_batch=512, sequence_parallel=True,
                                       recompute="selective", zero=1, grad_bytes=4)),
    ("gpt3-175b", "a100", 1024, Plan(dp=16, tp=8, pp=8, vpp=4, schedule="interleaved", global_batch=1536,
                                      sequence_parallel=True, zero=1)),
    ("mixtral-8x7b", "h100", 64, Plan(dp=8, tp=2, pp=4, ep=8, etp=1, global_batch=256, sequence_parallel=True)),
]


def per_call(fn, repeat: int = 2000) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def measure() -> list[dict]:
    """Seconds per call of each case's estimate(), estimate().ops and step_costs() (printed as they come)."""
    rows = []
    print(f"{'case':<32} {'estimate()':>12} {'+ per-op table':>16} {'step_costs()':>14}")
    for model_name, system, gpus, plan in CASES:
        model, cluster = load_model(model_name), load_system(system).cluster(gpus)
        full = per_call(lambda m=model, c=cluster, p=plan: estimate(m, c, p))
        table = per_call(lambda m=model, c=cluster, p=plan: estimate(m, c, p).ops)
        core = per_call(lambda m=model, c=cluster, p=plan: step_costs(m, c, p))
        print(f"{model_name + ' / ' + system + ' x' + str(gpus):<32} {full * 1e6:>9.0f} us {table * 1e6:>13.0f} us"
              f" {core * 1e6:>11.0f} us")
        rows.append({"model": model_name, "system": system, "gpus": gpus, "estimate_s": full, "with_ops_s": table,
                     "step_costs_s": core})
    return rows


def main() -> None:
    measure()
    actions = 64 * 512 * 2
    seconds = per_call(lambda: simulate(build("1f1b", 64, 512), 1.0, 2.0, t_p2p=0.01), repeat=3)
    print(f"schedule simulator, 1F1B p=64 m=512: {seconds:.2f} s ({actions / seconds:,.0f} actions/s)")


if __name__ == "__main__":
    main()
