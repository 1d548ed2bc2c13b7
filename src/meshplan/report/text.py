"""Readable tables for the terminal (rich): one estimate in detail, the best plans and the rejected ones of a search
(its result in the reports' one shape, ranked_training.py, folded to the terminal by fold.listing_tables), strong
scaling, and the searches' JSON. Pure formatting: numbers come from an Estimate."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from meshplan.collectives.groups import axis_tiers
from meshplan.derived.energy import step_energy
from meshplan.derived.goodput import Reliability, plan_goodput
from meshplan.estimate import op_totals
from meshplan.fields import MEMORY_HEADROOM, usable_hbm
from meshplan.pipeline.registry import schedule_of
from meshplan.report import terms
from meshplan.report.console import plain_console
from meshplan.report.fold import Col, TermTable, folded_tables, headers, legend, listing_tables, shell_command
from meshplan.report.host_note import host_note
from meshplan.report.ranked_training import (
    band_entry,
    band_text,
    best_plans,
    cost_columns,
    failures_text,
    from_training,
    metric_cells,
    prefers_simple,
    rejected_plans,
    simplest_leads,
    step_text,
    training_cost,
)
from meshplan.report.tiers import mesh_text
from meshplan.search.best import simplicity
from meshplan.specs.stack import frameworks_running
from meshplan.units import fmt_bytes, fmt_count, fmt_over, fmt_time

if TYPE_CHECKING:
    from rich.console import Console

    from meshplan.estimate import Estimate
    from meshplan.report.console import PlainConsole

def estimate_tables(est: Estimate, console: Console | PlainConsole, ops: bool = False) -> None:
    p = est.plan
    title = (f"{est.model.name} ({fmt_count(est.model.params())} params) on {est.cluster.num_gpus} x "
             f"{est.cluster.accelerator.name}, mesh {mesh_text(est.cluster, ' x ')}, seq {est.model.seq_length:,}, "
             f"global batch {p.global_batch:,}")
    summary = TermTable(title=title, show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    scaling = f" ({est.stack.fp8_scaling} scaling)" if p.precision == "fp8" else ""
    summary.add_row("plan", p.describe() + f" schedule={p.schedule} precision={p.precision}{scaling}")
    if p.pp > 1 and not (record := schedule_of(p.schedule)).flushes:  # what it changes in training: its record's
        summary.add_row("asynchronous", record.note)
    tiers = axis_tiers(p, est.cluster)
    summary.add_row("axes on tiers", ", ".join(f"{a}={getattr(p, a)}: {t}" for a, t in tiers.items())
                    or "one GPU per group")
    summary.add_row("stack", est.stack.describe())
    band = band_text(est)  # its regime's band, widened to hold for a source not yet measured (specs/bands.py)
    summary.add_row("step time", fmt_time(est.step_time) + (f"{band} (error band: {est.band.coverage:.0%} of a new "
                                                             f"source's runs, from {est.band.runs} measured runs like "
                                                             "it)" if band else ""))
    if band and est.band.note:
        summary.add_row("", est.band.note)
    summary.add_row("tokens/s", f"{fmt_count(est.tokens_per_s)} ({fmt_count(est.tokens_per_s / est.cluster.num_gpus)}"
                    " per GPU)")
    summary.add_row("model TFLOP/s per GPU", f"{est.tflops_per_gpu:.1f}")
    basis = f"of the {est.mfu_basis} peak"
    if est.peak_flops_per_gpu != est.cluster.accelerator.half_flops and est.mfu_bf16 is not None:
        basis += f"; {est.mfu_bf16:.1%} / {est.hfu_bf16 or 0.0:.1%} of the 16-bit peak"
    summary.add_row("MFU / HFU", f"{est.mfu:.1%} / {est.hfu:.1%} ({basis})")
    cap = est.cluster.accelerator.hbm_bytes
    fit = "fits" if est.fits else "DOES NOT FIT: " + "; ".join(est.reasons)
    if est.fits and est.peak_memory > usable_hbm(cap):  # plan's rule: it would reject this plan
        fit = (f"fits HBM, but not the {MEMORY_HEADROOM:.0%} headroom `plan` keeps free for the model's memory "
               f"error: {fmt_over(est.peak_memory, usable_hbm(cap))}; plan rejects it")
    summary.add_row("peak memory", f"{fmt_bytes(est.peak_memory)} of {fmt_bytes(cap)} ({fit})")
    energy = step_energy(est)
    if energy is not None:
        summary.add_row("energy", energy.text())
    console.print(summary)

    times = TermTable(title="step time breakdown", title_justify="left")
    times.add_column("component")
    times.add_column("time", justify="right")
    times.add_column("share", justify="right")
    for name, value in est.breakdown.items():
        if value > 0:
            times.add_row(name, fmt_time(value), f"{value / est.step_time:.1%}")
    memory = TermTable(title="memory per GPU", title_justify="left")
    memory.add_column("part")
    memory.add_column("bytes", justify="right")
    memory.add_column("share", justify="right")
    for name, value in est.memory.items():
        memory.add_row(name, fmt_bytes(value), f"{value / est.peak_memory:.1%}")
    console.print(times)
    console.print(memory)
    if est.stage_steps:
        console.print(stage_table(est))
    if ops:
        console.print(op_table(est))


def stage_table(est: Estimate) -> Any:
    """Every pipeline rank where they are priced apart (step/ranks.py): its layers, recompute, offloaded layers,
    step beside the bubble and peak memory."""
    from meshplan.cost.params import layers_on_rank
    from meshplan.step.ranks import rank_view

    table = TermTable(title="pipeline ranks (each priced apart; the step: the busiest + the bubble)",
                      title_justify="left")
    for name in ("rank", "layers", "recompute", "offloaded layers", "step", "memory"):
        table.add_column(name, justify="left" if name == "recompute" else "right")
    for r, (step, mem) in enumerate(zip(est.stage_steps, est.stage_memory, strict=True)):
        view = rank_view(est.plan, r)
        recompute = f"full {view.recompute_layers}" if view.recompute == "full" and view.recompute_layers else (
            view.recompute)
        offloaded = (view.offload_layers or "all") if view.offload_activations else 0
        table.add_row(str(r), str(layers_on_rank(est.model, est.plan, r)), recompute, str(offloaded), fmt_time(step),
                      fmt_bytes(mem))
    return table


def op_table(est: Estimate):  # -> rich.table.Table
    """Per-op totals per step on the busiest rank, grouped by op name, with % of the summed op time."""
    table = TermTable(title="per-op time per step (busiest rank, before overlap)", title_justify="left")
    for col in ("op", "FLOP", "bytes", "time", "share", "bound"):
        table.add_column(col, justify="left" if col in ("op", "bound") else "right")
    for o in op_totals(est):
        table.add_row(o.name, fmt_count(o.flops), fmt_bytes(o.nbytes), fmt_time(o.seconds), f"{o.share:.1%}", o.bound)
    return table


# ---- search results --------------------------------------------------------------------------------------
def plans_tables(result, tokens: float | None, price: float | None, width: int, rel: Reliability | None = None
                 ) -> list:
    """The best plans as rich renderables that fit ``width`` columns: one table when it fits, else folded into
    several that share the rank column (the numbers first), and the legend of what they show."""
    return listing_tables(best_plans(result, tokens, price, rel), width)


def fastest_note(result) -> str | None:
    """When the plan ranked first is not the fastest (``SearchResult.fastest``): the fastest, and how much faster."""
    fastest, plans = getattr(result, "fastest", None), result.plans
    if fastest is None or not plans or fastest.plan == plans[0].plan:
        return None
    gain = 1 - fastest.step_time / plans[0].step_time
    return (f"fastest plan found: {fastest.plan.describe()}, {step_text(fastest)}, {gain:.1%} faster than #1: within "
            "the ranking band, where with --simplest-first the simpler and lighter plan leads (#), whatever --top")


def simpler_note(result) -> str | None:
    """When #1 (the fastest) is not the simplest plan within its ranking band: the simplest, how much slower, and
    that the model cannot tell them apart (search/select.py)."""
    plans = result.plans
    if not prefers_simple(result) or simplest_leads(result) or len(plans) < 2:
        return None
    same = getattr(result, "equivalent", ()) or ()
    close = [(i, e) for i, (e, eq) in enumerate(zip(plans, same, strict=False), 1) if eq and i > 1]
    if not close or simplicity(close[0][1].plan) >= simplicity(plans[0].plan):
        return None
    i, e = close[0]
    slower = e.step_time / plans[0].step_time - 1
    return (f"#{i} is the simplest plan within #1's ranking band ({simplicity(e.plan)} of the parallel axes, offloads "
            f"and recompute against {simplicity(plans[0].plan)}), {slower:.1%} slower: as fast to the model's "
            "accuracy; --simplest-first ranks it first")


def rejected_tables(result, width: int) -> list:
    """The rejected plans tallied by reason, with one example each, fitting ``width``, and their legend."""
    return listing_tables(rejected_plans(result), width)


def scaling_tables(results, tokens: float | None, price: float | None, width: int, rel: Reliability | None = None
                   ) -> list:
    """The best plan per GPU count, fitting ``width``, and the legend."""
    rows = [(r, r.plans[0] if r.plans else None) for r in results]
    key = Col("GPUs", [str(r.cluster.num_gpus) for r, _ in rows])
    cells: dict[str, list[str]] = defaultdict(list)
    for r, est in rows:
        cells["best plan"].append(est.plan.describe() if est else "no feasible plan")
        metrics = metric_cells(est, tokens, price, rel) if est else {}
        for name in ("step", "tokens/s", "MFU", "memory"):
            cells[name].append(metrics.get(name, ""))
        cells["evaluated"].append(f"{r.evaluated:,}")
        for name in cost_columns(tokens, price, rel):
            cells[name].append(metrics.get(name, ""))
    cols = [Col(h, cs, "left" if h == "best plan" else "right", wrap=h == "best plan") for h, cs in cells.items()]
    tables = folded_tables("strong scaling: the best plan per GPU count", key, cols, width,
                           ("step", "tokens/s", "MFU", "memory", "best plan"))
    ests = [e for _, e in rows if e is not None]
    used = {e.plan.tensor_layout for e in ests}
    extra = [note for name, note in terms.LAYOUT_PLANS.items() if name in used]
    extra += band_entry(ests)
    best = terms.HEADERS["best plan"].replace("the plan ranked first at that count", terms.BEST_SIMPLE)
    meanings = {"best plan": best} if any(simplest_leads(r) for r in results) else {}
    return [*tables, legend(terms.entries(headers(tables), extra, meanings=meanings))]


def search_json(results, tokens: float | None, price: float | None, rank_by: str, rerun=None,
                rel: Reliability | None = None) -> dict:
    """The searches as one JSON object; with ``rerun`` (an Estimate -> command line) each plan says the
    ``estimate`` command that prices it again."""
    def one(r) -> dict:
        d = r.to_dict()
        for plan, est in zip(d["plans"], r.plans, strict=True):
            plan.update(training_cost(est, tokens, price, rel))
            if rel is not None:
                plan["failures"] = plan_goodput(est, rel).as_dict()
            plan["frameworks"] = frameworks_running(est.plan, est.model)
            energy = step_energy(est)
            if energy is not None:
                plan["energy"] = energy.as_dict()
            if rerun is not None:
                plan["estimate_command"] = rerun(est)
        return d

    if len(results) == 1:
        return one(results[0])
    runs = [one(r) for r in results]
    best = [r["plans"][0] for r in runs if r["plans"]]
    key = "cost" if rank_by == "cost" and tokens and price is not None else (
        "expected_step_time_s" if rel is not None else "step_time_s")
    return {"scaling": runs, "plans": sorted(best, key=lambda p: p[key] * (1 if key == "cost" else p["gpus"])),
            "evaluated": sum(r["evaluated"] for r in runs), "seconds": sum(r["seconds"] for r in runs),
            "rejected": {"count": sum(r["rejected"]["count"] for r in runs)}}


def _print_all(console: Console | PlainConsole, renderables: list) -> None:
    for renderable in renderables:
        console.print(renderable)


def print_search(results, as_json: bool, tokens: float | None, price: float | None, rank_by: str,
                 rerun=None, reliability: Reliability | None = None) -> None:
    import json

    import click

    if as_json:
        click.echo(json.dumps(search_json(results, tokens, price, rank_by, rerun, reliability)))
        return
    console = plain_console()
    if len(results) > 1:
        _print_all(console, scaling_tables(results, tokens, price, console.width, reliability))
    else:
        r = results[0]
        ranked = from_training(r, tokens, price, reliability)
        if r.plans:
            _print_all(console, listing_tables(ranked.table, console.width))
            for note in (fastest_note(r), simpler_note(r)):
                if note:
                    console.print(note, markup=False)
            console.print("[bold]#1 in detail[/bold]")
            estimate_tables(r.plans[0], console)
            host = host_note(r.plans[0])
            if host is not None:
                console.print(host.text(), markup=False, highlight=False)
            runs = frameworks_running(r.plans[0].plan, r.plans[0].model)
            console.print(f"frameworks that run it: {', '.join(runs) or 'none of the presets'}", markup=False)
            if rerun is not None:
                console.print(shell_command("re-run it:", rerun(r.plans[0]), console.width), soft_wrap=True,
                              markup=False, highlight=False)
            if reliability is not None:
                console.print(failures_text(r.plans[0], reliability), markup=False)
        else:
            console.print("[bold red]no feasible plan[/bold red]")
        _print_all(console, listing_tables(ranked.rejected, console.width))
    shown = {e.plan.schedule for r in results for e in r.plans if e.plan.pp > 1}
    for record in (schedule_of(s) for s in sorted(shown)):
        if not record.flushes:
            console.print(f"{record.name} (asynchronous, asked for with --async-pipeline): {record.note}", markup=False)
    evaluated = sum(r.evaluated for r in results)
    seconds = sum(r.seconds for r in results)
    bounded = sum(r.bounded for r in results)
    console.print(f"evaluated {evaluated:,} plans in {seconds:.2f} s ({evaluated / max(seconds, 1e-9):,.0f} plans/s; "
                  f"memory checked for all, step time skipped for {bounded:,} whose lower bound cannot reach the "
                  "ranking)")
