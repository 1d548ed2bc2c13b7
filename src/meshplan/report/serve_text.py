"""The serving search's and estimate's tables for the terminal (rich), and their JSON: the best configurations and
the rejected ones as the one shape of a search's result renders them (ranked_serving.py, fold.listing_tables), and
one configuration in detail (its targets, memory per GPU and KV cache, the decode step by op). Pure formatting: the
numbers come from serve/."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplan.report.fold import TermTable, listing_tables
from meshplan.report.ranked_serving import fastest_line, from_serving
from meshplan.serve.plan import cached_note
from meshplan.units import fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from rich.console import Console

    from meshplan.report.console import PlainConsole
    from meshplan.serve.estimate import ServeEstimate
    from meshplan.serve.search import ServeSearchResult

def _verdict(v: dict) -> str:
    name, target = str(v["metric"]).upper(), fmt_time(float(v["target_s"]))
    if v["value_s"] is None:
        return f"{name} ≤ {target}: not met (does not fit)"
    value = fmt_time(float(v["value_s"]))
    return f"{name} {value} ≤ {target}: met" if v["met"] else f"{name} {value} > {target}: NOT met"


def _summary_rows(e: ServeEstimate, price: float | None, targets: list[dict]) -> list[tuple[str, str]]:
    """The summary's rows: fits (with the reasons), the targets' verdicts; the latencies, rates and cost only for
    a configuration that fits (no figure describes one that cannot run)."""
    m = e.metrics
    rows = [("fits", "yes" if e.fits else "NO: " + "; ".join(e.reasons))]
    rows += [("targets", "; ".join(_verdict(v) for v in targets))] if targets else []
    if not e.fits:
        return rows + [("TTFT / TPOT / e2e", "not priced: the configuration does not fit")]
    rows += [("TTFT / TPOT / e2e", f"{fmt_time(m.ttft)} / {fmt_time(m.tpot)} / {fmt_time(m.e2e)}"),
             ("output tokens/s", f"{fmt_count(m.tokens_per_s)} ({fmt_count(e.tokens_per_s_per_gpu)} per GPU, "
                                 f"{fmt_count(m.instance_tokens_per_s)} per instance)"),
             ("requests/s", f"{m.requests_per_s:.3g}"), ("sequences in flight", f"{m.running:.0f} per instance")]
    cost = e.cost_per_million(price)
    return rows + ([("cost", f"${cost:,.3g} per million output tokens")] if cost is not None else [])


def serving_estimate_tables(e: ServeEstimate, console: Console | PlainConsole, price: float | None = None,
                    targets: list[dict] | None = None) -> None:
    """One configuration: whether it fits and meets ``targets`` (check.targets), its metrics, memory per GPU and
    the decode step's time by op."""
    mem = e.memory
    title = (f"{e.model.name} on {e.plan.num_gpus} x {e.cluster.accelerator.name}: {e.plan.describe()}, "
             f"{e.workload.input_len} in{cached_note(e.workload.cached_len)} / {e.workload.output_len} out, "
             f"{e.engine.describe()}")
    summary = TermTable(title=title, show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    for k, v in _summary_rows(e, price, targets or []):
        summary.add_row(k, v)
    console.print(summary)
    memory = TermTable(title="memory per GPU", title_justify="left")
    for col in ("part", "bytes"):
        memory.add_column(col, justify="left" if col == "part" else "right")
    parts = {"weights": mem.weights, "activations (one layer)": mem.activations, "workspace": mem.workspace,
             "KV cache of the batch": mem.kv_used, "KV-cache pool": mem.kv_pool,
             f"sequences the pool holds at {e.engine.resident(e.workload):.0f} tokens": None}
    for part, size in parts.items():
        memory.add_row(part, fmt_bytes(float(size)) if size is not None
                       else f"{float(mem.max_sequences(e.plan.dpa)):,.0f}")
    console.print(memory)
    if e.breakdown and e.fits:
        step = TermTable(title=f"decode step by op ({fmt_time(sum(e.breakdown.values()))} at the running batch)",
                     title_justify="left")
        for col in ("op", "time", "share"):
            step.add_column(col, justify="left" if col == "op" else "right")
        total = sum(e.breakdown.values())
        for name, t in sorted(e.breakdown.items(), key=lambda kv: -kv[1])[:12]:
            step.add_row(name, fmt_time(t), f"{t / total:.1%}")
        console.print(step)


def print_serve(result: ServeSearchResult, price: float | None, as_json: bool) -> None:
    import json

    import click

    from meshplan.report.console import plain_console

    if as_json:
        click.echo(json.dumps(result.to_dict(price)))
        return
    console = plain_console()
    ranked = from_serving(result, price)
    if result.plans:
        for r in listing_tables(ranked.table, console.width):
            console.print(r)
        fastest = fastest_line(result)
        if fastest:
            console.print(fastest, markup=False)
        console.print("[bold]the best configuration in detail[/bold]")
        serving_estimate_tables(result.plans[0], console, price)
    else:
        console.print("[bold red]no configuration meets the targets and fits[/bold red]")
    for r in listing_tables(ranked.rejected, console.width):
        console.print(r)
    rate = result.evaluated / max(result.seconds, 1e-9)
    console.print(f"evaluated {result.evaluated:,} configurations in {result.seconds:.2f} s ({rate:,.0f} per second)")
