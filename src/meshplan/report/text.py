"""Readable tables for the terminal (rich). Pure formatting: numbers come from an Estimate."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from meshplan.units import fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from rich.console import Console

    from meshplan.estimate import Estimate


def estimate_tables(est: Estimate, console: Console, ops: bool = False) -> None:
    from rich.table import Table

    p = est.plan
    title = (f"{est.model.name} ({fmt_count(est.model.params())} params) on {est.cluster.num_gpus} x "
             f"{est.cluster.accelerator.name}, mesh {' x '.join(map(str, est.cluster.mesh_shape))}")
    summary = Table(title=title, show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("plan", p.describe() + f" schedule={p.schedule} precision={p.precision}")
    summary.add_row("step time", fmt_time(est.step_time))
    summary.add_row("tokens/s", f"{fmt_count(est.tokens_per_s)} ({fmt_count(est.tokens_per_s / est.cluster.num_gpus)}"
                    " per GPU)")
    summary.add_row("model TFLOP/s per GPU", f"{est.tflops_per_gpu:.1f}")
    summary.add_row("MFU / HFU", f"{est.mfu:.1%} / {est.hfu:.1%}")
    cap = est.cluster.accelerator.hbm_bytes
    fit = "fits" if est.fits else "DOES NOT FIT: " + "; ".join(est.reasons)
    summary.add_row("peak memory", f"{fmt_bytes(est.peak_memory)} of {fmt_bytes(cap)} ({fit})")
    console.print(summary)

    times = Table(title="step time breakdown", title_justify="left")
    times.add_column("component")
    times.add_column("time", justify="right")
    times.add_column("share", justify="right")
    for name, value in est.breakdown.items():
        if value > 0:
            times.add_row(name, fmt_time(value), f"{value / est.step_time:.1%}")
    memory = Table(title="memory per GPU", title_justify="left")
    memory.add_column("part")
    memory.add_column("bytes", justify="right")
    memory.add_column("share", justify="right")
    for name, value in est.memory.items():
        memory.add_row(name, fmt_bytes(value), f"{value / est.peak_memory:.1%}")
    console.print(times)
    console.print(memory)
    if ops:
        console.print(op_table(est))


def op_table(est: Estimate):  # -> rich.table.Table
    """Per-op totals per step on the busiest rank, grouped by op name, with % of the summed op time."""
    from rich.table import Table

    rows: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    bound: dict[str, str] = {}
    for op in est.ops:
        acc = rows[op.name]
        acc[0] += op.count * op.flops
        acc[1] += op.count * op.nbytes
        acc[2] += op.total_seconds
        bound.setdefault(op.name, op.bound)
    total = sum(r[2] for r in rows.values()) or 1.0
    table = Table(title="per-op time per step (busiest rank, before overlap)", title_justify="left")
    for col in ("op", "FLOP", "bytes", "time", "share", "bound"):
        table.add_column(col, justify="left" if col in ("op", "bound") else "right")
    for name, (flops, nbytes, seconds) in sorted(rows.items(), key=lambda kv: -kv[1][2]):
        table.add_row(name, fmt_count(flops), fmt_bytes(nbytes), fmt_time(seconds), f"{seconds / total:.1%}",
                      bound[name])
    return table
