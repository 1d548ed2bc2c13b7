"""The serving search's and estimate's tables for the terminal (rich), folded to its width as ``plan``'s are
(fold.py), each with its legend; and their JSON. Pure formatting: the numbers come from serve/."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from meshplan.report.fold import Col, folded_tables, headers, legend
from meshplan.units import fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from rich.console import Console

    from meshplan.serve.estimate import ServeEstimate
    from meshplan.serve.search import ServeSearchResult

HEADERS = {
    "#": "rank: the most output tokens/s first (--rank latency: the lowest TPOT)",
    "tp·pp·dpa": "tensor-parallel size, pipeline stages, data-parallel attention groups of one instance",
    "ep": "expert-parallel size (1: every expert split tp ways)",
    "pools": "xN: N co-located instances; PP+DD: P prefill and D decode instances (disaggregated)",
    "batch": "sequences in flight per instance",
    "quant": "weights / activations / KV cache formats",
    "tokens/s": "output tokens per second, the whole deployment",
    "per GPU": "output tokens per second per GPU used",
    "TTFT": "time to first token",
    "TPOT": "time per output token (mean inter-token latency)",
    "e2e": "end-to-end latency of a request",
    "memory": "memory per GPU: weights, activations, workspace and the batch's KV cache",
    "$/Mtok": "price of a million output tokens at --price per GPU-hour",
    "reason": "why configurations were rejected",
    "configs": "how many configurations for that reason",
    "for example": "one of them",
}
UNITS = ("units", "k M B = 10^3 10^6 10^9; KiB MiB GiB = 2^10 2^20 2^30 bytes; ms, us = milli-, microseconds")


def _entries(tables: list) -> list[tuple[str, str]]:
    return [(h, HEADERS[h]) for h in headers(tables) if h in HEADERS] + [UNITS]


def cells(e: ServeEstimate, price: float | None) -> dict[str, str]:
    """One configuration's row of the best configurations' table, by column (HEADERS), as the terminal and the HTML
    report print it."""
    p, m = e.plan, e.metrics
    pools = f"{p.prefill_replicas}P+{p.replicas}D" if p.disaggregated else f"x{p.replicas}"
    out = {"tp·pp·dpa": f"{p.tp}·{p.pp}·{p.dpa}", "ep": str(p.ep), "pools": pools, "batch": str(p.batch),
           "quant": p.quant.label, "tokens/s": fmt_count(m.tokens_per_s), "per GPU": fmt_count(e.tokens_per_s_per_gpu),
           "TTFT": fmt_time(m.ttft), "TPOT": fmt_time(m.tpot), "e2e": fmt_time(m.e2e),
           "memory": fmt_bytes(float(e.memory.total))}
    cost = e.cost_per_million(price)
    return out | ({"$/Mtok": f"${cost:,.3g}"} if cost is not None else {})


def plans_tables(result: ServeSearchResult, price: float | None, width: int) -> list:
    s = result.space
    slo = [f"TTFT ≤ {fmt_time(s.ttft_slo)}"] * bool(s.ttft_slo) + [f"TPOT ≤ {fmt_time(s.tpot_slo)}"] * bool(s.tpot_slo)
    title = (f"best serving configurations: {result.model.name} on {result.cluster.num_gpus} x "
             f"{result.cluster.accelerator.name}, {s.input_len} in / {s.output_len} out, {s.engine.describe()}"
             + (f", {', '.join(slo)}" if slo else ""))
    columns: dict[str, list[str]] = defaultdict(list)
    for e in result.plans:
        for k, v in cells(e, price).items():
            columns[k].append(v)
    if not result.model.is_moe:
        columns.pop("ep", None)
    key = Col("#", [str(i) for i in range(1, len(result.plans) + 1)])
    cols = [Col(h, c, "left" if h in ("quant", "pools") else "right") for h, c in columns.items()]
    tables = folded_tables(title, key, cols, width, ("tokens/s", "per GPU", "TTFT", "TPOT", "$/Mtok"))
    return [*tables, legend(_entries(tables))]


def rejected_tables(result: ServeSearchResult, width: int) -> list:
    ranked = sorted(result.rejected.items(), key=lambda kv: -kv[1])
    key = Col("reason", [r for r, _ in ranked], "left", wrap=True)
    cols = [Col("configs", [f"{n:,}" for _, n in ranked]),
            Col("for example", [result.examples.get(r, "") for r, _ in ranked], "left", wrap=True)]
    tables = folded_tables(f"rejected: {result.rejected_total:,} configurations", key, cols, width)
    return [*tables, legend(_entries(tables))]


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


def estimate_tables(e: ServeEstimate, console: Console, price: float | None = None,
                    targets: list[dict] | None = None) -> None:
    """One configuration: whether it fits and meets ``targets`` (check.targets), its metrics, memory per GPU and
    the decode step's time by op."""
    from rich.table import Table

    mem = e.memory
    title = (f"{e.model.name} on {e.plan.num_gpus} x {e.cluster.accelerator.name}: {e.plan.describe()}, "
             f"{e.workload.input_len} in / {e.workload.output_len} out, {e.engine.describe()}")
    summary = Table(title=title, show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    for k, v in _summary_rows(e, price, targets or []):
        summary.add_row(k, v)
    console.print(summary)
    memory = Table(title="memory per GPU", title_justify="left")
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
        step = Table(title=f"decode step by op ({fmt_time(sum(e.breakdown.values()))} at the running batch)",
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

    from meshplan.report.text import terminal_console

    if as_json:
        click.echo(json.dumps(result.to_dict(price)))
        return
    console = terminal_console()
    if result.plans:
        for r in plans_tables(result, price, console.width):
            console.print(r)
        console.print("[bold]the best configuration in detail[/bold]")
        estimate_tables(result.plans[0], console, price)
    else:
        console.print("[bold red]no configuration meets the targets and fits[/bold red]")
    for r in rejected_tables(result, console.width):
        console.print(r)
    rate = result.evaluated / max(result.seconds, 1e-9)
    console.print(f"evaluated {result.evaluated:,} configurations in {result.seconds:.2f} s ({rate:,.0f} per second)")
