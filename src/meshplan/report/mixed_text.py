"""The mixed-cluster search's tables (search/mixed.py): its best plans laid on the pools, each pool alone, and who
runs each plan. Pure formatting."""

from __future__ import annotations

import json
from typing import Any

from meshplan.derived.mixed import MixedEstimate, runners
from meshplan.report.ranked_training import run_lengths
from meshplan.units import fmt_bytes, fmt_count, fmt_time

LEGEND = ("layout: pipeline (the pipeline's stages over the pools, in the order shown) or data (the data-parallel "
          "replicas over the pools); pools: each pool's stages or replicas (x micro-batches each a step); layers: "
          "decoder layers per pipeline rank (N×k: k ranks of N; the stage DP on each rank's own GPUs); step: predicted "
          "step time; MFU: model FLOPs over the summed peak of every GPU; memory: each pool's peak per GPU; run by: "
          "the framework presets that run the plan, or where none does, who does "
          "(meshplan/derived/mixed.py MIXED_LAYOUTS)")


def _pools_cell(est: MixedEstimate) -> str:
    m, pools = est.mixed, est.pools.pools
    if m.kind == "pipeline":
        return ", ".join(f"{pools[k].name} {c}" for k, c in zip(m.order, m.counts, strict=True))
    return ", ".join(f"{pools[k].name} {c}x{s}" for k, c, s in zip(m.order, m.counts, m.shares, strict=True))


def _row(rank: int, est: MixedEstimate) -> list[str]:
    p = est.mixed.plan
    found, others = runners(est.mixed, est.stack, est.model)
    layers = run_lengths(p.stage_layers) if p.stage_layers else "even"
    recompute = p.recompute + (f" {p.recompute_layers}" if p.recompute == "full" and p.recompute_layers else "")
    memory = ", ".join(fmt_bytes(m) for m in est.pool_memory)
    return [str(rank), est.mixed.kind, _pools_cell(est), f"{p.dp}·{p.tp}·{p.pp}·{p.cp}", str(p.vpp),
            layers if est.mixed.kind == "pipeline" else "-", str(p.micro_batch), str(p.zero), recompute,
            fmt_time(est.step_time), fmt_count(est.tokens_per_s), f"{est.mfu:.1%}", memory,
            ", ".join(found) or f"none of the presets ({others})"]


MIXED_HEADERS = ["#", "layout", "pools", "dp·tp·pp·cp", "vpp", "layers", "mbs", "zero", "recompute", "step", "tokens/s",
           "MFU", "memory", "run by"]


def print_mixed(result: Any, as_json: bool) -> None:
    """The result of search.mixed.mixed_search, as tables or one JSON object."""
    import click

    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    from rich.table import Table

    from meshplan.report.console import terminal_console

    console = terminal_console()
    pools = result.pools
    table = Table(title=f"best plans: {result.model.name} on {pools.name} ({pools.num_gpus} GPUs), global batch "
                  f"{result.space.global_batch:,}, {result.space.stack.name}", title_justify="left")
    for h in MIXED_HEADERS:
        table.add_column(h, justify="left" if h in ("layout", "pools", "layers", "recompute", "run by") else "right")
    for i, est in enumerate(result.plans, 1):
        table.add_row(*_row(i, est))
    console.print(table)
    console.print("legend: " + LEGEND, highlight=False)
    for pool, alone in zip(pools.pools, result.alone, strict=True):
        text = "no plan fits" if alone is None else f"{fmt_time(alone.step_time)} ({alone.plan.describe()})"
        console.print(f"{pool.name} alone ({pool.gpus} GPUs): {text}", highlight=False)
    if result.plans:
        best = result.plans[0]
        console.print(f"#1 in detail: {best.mixed.describe(pools)}; per pool step "
                      + ", ".join(fmt_time(s) for s in best.pool_steps), highlight=False)
    console.print(f"laid {result.shapes} plan shapes on the pools: {result.evaluated} mixed plans priced in "
                  f"{result.seconds:.2f} s; rejected: " + (", ".join(f"{n} ({why})" for why, n in
                                                                      result.rejected.items()) or "none"),
                  highlight=False)
