"""vLLM V0's scheduler on a static batch that overflows its KV cache (issue 79), in closed form
(src/meshplan/serve/preemption.py, the vllm-v0 engine's kv_overflow = "recompute_kept"), against its block-by-block
replay (vllm_v0_static_sim.py) and the waves it replaced (kv_overflow = "recompute"), on Argonne's 15 overflowing
static runs. Out of source it moved the Argonne and every-serving p90s up a little (MI300X's decode, already too
fast there, runs faster still) and the H100 runs from -17 / -15 / -10 % to -2 / -1 / +2 %
(data/measured/2026-12-01-vllm-v0-static-closed-form-not-landed.md: measured before it landed).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from meshplan.serve.metrics import Setting, first_token_step, instance, static_capacity
from meshplan.serve.preemption import recompute_kept, schedule


def closed_rate(s: Setting) -> float:
    """Output tokens/s of the setting's static batch priced by ``recompute_kept`` (one lane)."""
    b = float(s.micro_batch)
    shape = (s.workload.input_len, s.workload.output_len, float(s.engine.max_seqs))
    whole = recompute_kept(s.time, b, static_capacity(s), shape, lambda n: first_token_step(s, n))
    return b * s.workload.output_len / float(np.asarray(whole))


def _waves(s: Setting) -> float:
    """Output tokens/s of the setting's static batch priced in waves (kv_overflow "recompute", before it landed)."""
    return float(np.asarray(instance(replace(s, engine=replace(s.engine, kv_overflow="recompute"))).tokens_per_s))


def main() -> None:
    """Argonne's 15 overflowing static runs: measured, replayed, waves (serve/metrics.py) and the closed form."""
    from benchmarks.measure.vllm_v0_static_sim import batch_of, overflowing, simulate, wall_time  # noqa: PLC0415

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    print("run | C | measured tok/s | replay (error) | waves (error) | closed form (error) | closed / replay | "
          "decode steps replay / closed")
    total = {"replay": 0.0, "waves": 0.0, "closed": 0.0}
    for rid, s, measured in overflowing():
        b = batch_of(s)
        trace = simulate(b)
        rates = {"replay": b.batch * b.output_len / wall_time(s, trace),
                 "waves": _waves(s), "closed": closed_rate(s)}
        errors = {k: 100 * (v / measured - 1) for k, v in rates.items()}
        for k, v in errors.items():
            total[k] += abs(v)
        counts = schedule(b.batch, float(static_capacity(s)), b.input_len, b.output_len, float(s.engine.max_seqs))
        print(f"{rid.removeprefix('llminfbench_vllm_')} | {float(static_capacity(s)):.0f} | {measured:.1f} | "
              + " | ".join(f"{rates[k]:.1f} ({errors[k]:+.1f} %)" for k in total)
              + f" | {rates['closed'] / rates['replay'] - 1:+.3f} | {len(trace.decodes)} / {float(counts.steps):.0f}")
    print("sum |error|: " + ", ".join(f"{k} {v:.1f}" for k, v in total.items()))


if __name__ == "__main__":
    main()
