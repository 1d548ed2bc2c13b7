"""The measurements behind check-step's calibration choices (docs/MEASURE.md and measure/replay.py quote them):

1. threads on a shared host: one element-wise multiply, 1 thread against every core, by the wall clock;
2. page faults: a GPT-2 step with glibc's default malloc thresholds, then with freed memory kept (mallopt);
3. replay conditions: the zoo's GPT-2 and ConvNeXt, each signature replayed (a) in a loop of its own with data
   at its reuse distance, (b) every op once in step order, (c) round-robin in windows of 4 and 16, against the
   same ops timed inside the step (profile.py);
4. eager host costs (host.py) and, for GPT-2, how many kernels the fused chains would leave.

    python benchmarks/measure/conditions.py            # about two minutes on 2 cores; prints, writes nothing

The figures move with the machine's load (printed with each): quote them with their date and load.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections import defaultdict
from dataclasses import replace

import torch

from meshplan.measure.check import keep_freed_memory, trace_step
from meshplan.measure.command import optimizer_factory
from meshplan.measure.host import measure_host
from meshplan.measure.profile import op_profile
from meshplan.measure.replay import ReplaySettings, build_calls, replay_all
from meshplan.measure.reuse import step_distances
from meshplan.measure.signature import signature_key, signatures
from meshplan.measure.step import make_step, time_steps
from meshplan.measure.timing import make_clock, median
from meshplan.trace.classes import op_class
from meshplan.trace.fusion import fused, fusion_groups
from meshplan_research.zoo import ZOO


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def threads() -> None:
    x = torch.randn(4, 128, 1024)
    for n in (1, os.cpu_count() or 1):
        torch.set_num_threads(n)
        runs = []
        for _ in range(9):
            start = time.perf_counter()
            for _ in range(20):
                x * 0.5
            runs.append((time.perf_counter() - start) / 20)
        print(f"1. 4x128x1024 multiply, {n} thread(s): {statistics.median(runs) * 1e3:.2f} ms per call ({load()})")
    torch.set_num_threads(1)


def setup(name: str):
    model, inputs = ZOO[name].build()
    make = optimizer_factory("adamw", list(model.parameters()))
    trace, opt_ops = trace_step(model, inputs, make)
    return model, inputs, make, trace, opt_ops


def faults(clock) -> None:
    import resource

    model, inputs, make, _, _ = setup("gpt2")
    step = make_step(model, inputs, make(list(model.parameters())))
    for label in ("glibc defaults", "freed memory kept"):
        if label != "glibc defaults":
            keep_freed_memory()
        timing = time_steps(step, clock, warmup=3, steps=7)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        print(f"2. GPT-2 step, {label}: {timing.seconds * 1e3:.1f} ms, {timing.page_faults:.0f} page faults per "
              f"step (median; {resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0} in the next) ({load()})")


def in_order(sigs, ops, clock) -> dict[str, float]:
    """Every op once per pass in step order, one copy per signature, each call timed alone."""
    calls = {}
    for s in sigs:
        try:
            calls[s.key] = build_calls(s, "cpu", 1)[0]
        except Exception:  # noqa: BLE001  (not replayable)
            continue
    samples: dict[str, list[float]] = defaultdict(list)
    held = {}
    for _ in range(6):
        for op in ops:
            key = signature_key(op)
            if key in calls:
                start = clock.now()
                held[key] = calls[key]()
                samples[key].append(clock.now() - start)
    return {s.key: median(samples[s.key][1:]) if len(samples[s.key]) > 1 else math.nan for s in sigs}


def conditions(name: str, clock) -> None:
    model, inputs, make, trace, opt_ops = setup(name)
    ops = [*trace.ops, *opt_ops]
    sigs = signatures(ops)
    distances = step_distances(trace.ops, opt_ops)
    step = make_step(model, inputs, make(list(model.parameters())))
    time_steps(step, clock, warmup=3, steps=3)
    measured = op_profile(step, clock, [o.target for o in ops])
    variants = {"own loop, data at reuse distance": replay_all(sigs, clock, replace(ReplaySettings(), window=1),
                                                               "cpu", distances),
                "every op in step order, one copy": in_order(sigs, ops, clock),
                "windows of 4": replay_all(sigs, clock, ReplaySettings(window=4), "cpu", distances),
                "windows of 16": replay_all(sigs, clock, ReplaySettings(window=16), "cpu", distances)}
    for label, times in variants.items():
        total = {"all": [0.0, 0.0], "gemm": [0.0, 0.0], "conv": [0.0, 0.0], "pointwise": [0.0, 0.0]}
        for s in sigs:
            for i in s.indices:
                if measured[i] is None or not math.isfinite(times[s.key]):
                    continue
                for key in ("all", op_class(ops[i])):
                    if key in total:
                        total[key][0] += times[s.key]
                        total[key][1] += measured[i]
        ratios = ", ".join(f"{k} {a / b:.2f}" for k, (a, b) in total.items() if b > 0)
        print(f"3. {name}, {label}: replayed / in-step time: {ratios} ({load()})")


def main() -> None:
    torch.manual_seed(0)
    threads()
    clock = make_clock("cpu", "cpu", 1)
    faults(clock)
    for name in ("gpt2", "convnext"):
        conditions(name, clock)
    host = measure_host(clock)
    print("4. host costs: " + ", ".join(f"{k} {v * 1e6:.2f} us" for k, v in host.to_dict().items()) + f" ({load()})")
    _, _, _, trace, opt_ops = setup("gpt2")
    chains = fused(trace.ops, fusion_groups(trace.ops)) + fused(opt_ops, fusion_groups(opt_ops))
    kernels = sum(1 for o in (*trace.ops, *opt_ops) if o.kind != "view")
    inside = sum(len(c.ops) for c in chains)
    print(f"4. GPT-2 kernels: {kernels} in eager mode, {kernels - inside + len(chains)} with every chain fused")


if __name__ == "__main__":
    main()
