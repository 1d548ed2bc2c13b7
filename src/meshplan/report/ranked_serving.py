"""The serving search's result (serve/search.py's ServeSearchResult) as the one shape the reports render
(ranked.Ranked): the best configurations' columns as the terminal prints them (the instance's shape, its pools, batch
and formats, throughput, latencies, memory and the price of a million tokens), the rejected configurations by reason,
and the page's lead. Pure formatting: the numbers come from serve/.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from meshplan.report.fold import Col, Listing
from meshplan.report.ranked import Lead, Ranked, rejected_listing
from meshplan.serve.plan import cached_note
from meshplan.units import fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from meshplan.serve.estimate import ServeEstimate
    from meshplan.serve.search import ServeSearchResult

SERVING_HEADERS = {
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
SERVING_UNITS = ("units", "k M B = 10^3 10^6 10^9; KiB MiB GiB = 2^10 2^20 2^30 bytes; ms, us = milli-, microseconds")


def serving_cells(e: ServeEstimate, price: float | None) -> dict[str, str]:
    """One configuration's row of the best configurations' table, by column (SERVING_HEADERS), as the terminal and the
    HTML report print it."""
    p, m = e.plan, e.metrics
    pools = f"{p.prefill_replicas}P+{p.replicas}D" if p.disaggregated else f"x{p.replicas}"
    out = {"tp·pp·dpa": f"{p.tp}·{p.pp}·{p.dpa}", "ep": str(p.ep), "pools": pools, "batch": str(p.batch),
           "quant": p.quant.label, "tokens/s": fmt_count(m.tokens_per_s), "per GPU": fmt_count(e.tokens_per_s_per_gpu),
           "TTFT": fmt_time(m.ttft), "TPOT": fmt_time(m.tpot), "e2e": fmt_time(m.e2e),
           "memory": fmt_bytes(float(e.memory.total))}
    cost = e.cost_per_million(price)
    return out | ({"$/Mtok": f"${cost:,.3g}"} if cost is not None else {})


def target_titles(result: ServeSearchResult) -> list[str]:
    """The latency targets the search held to, as the titles write them ("TTFT ≤ 1 s")."""
    s = result.space
    return [f"TTFT ≤ {fmt_time(s.ttft_slo)}"] * bool(s.ttft_slo) + [f"TPOT ≤ {fmt_time(s.tpot_slo)}"] * bool(
        s.tpot_slo)


def rank_meaning(result: ServeSearchResult) -> str:
    """What the ``#`` column ranks by: the metric, and the tie band in which the simplest leads (serve/search.py)."""
    metric = "the lowest TPOT" if result.space.rank_by == "latency" else "the most output tokens/s"
    if not result.band:
        return f"rank: {metric} first"
    lead = "the simplest of them first" if result.space.simplest_leads else \
        f"{metric} first, then the others of them, the simplest first"
    return (f"rank: configurations within ±{result.band:.1%} of {metric} (the band of the measured serving "
            f"runs like it, out of source) cannot be told apart: {lead} (fewest of tp, "
            "pp, dpa, ep above 1, prefill / decode pools and a format other than the checkpoint's), then the fewest "
            f"GPUs; the others after, {metric} first")


def ttft_note(result: ServeSearchResult) -> list[tuple[str, str]]:
    """Where a TTFT target filters the configurations: how far the serving model's TTFT was from published runs
    (presets/serving_errors.json, specs/bands.serving_latency_error)."""
    from meshplan.serve.search import search_regime
    from meshplan.specs.bands import serving_latency_error

    if not result.space.ttft_slo:
        return []
    found, where = serving_latency_error(search_regime(result.model, result.cluster, result.space), "ttft")
    if not found:
        return [("TTFT target", "no published time to first token was evaluated: the target filters on an "
                 "unmeasured figure")]
    return [("TTFT target", f"filters on the predicted TTFT, whose median |error| on {found['runs']:,} published "
             f"runs ({where}) is {found['median']:.0%} (p90 {found['p90']:.0%}): a configuration that close to the "
             "target may meet or miss it")]


def fastest_line(result: ServeSearchResult) -> str | None:
    """When the configuration listed first is not the best by the metric alone (``ServeSearchResult.fastest``): that
    one, and by how much it is better."""
    f, plans = result.fastest, result.plans
    if f is None or not plans or f.plan == plans[0].plan:
        return None
    if result.space.rank_by == "latency":
        figure, gain = f"TPOT {fmt_time(f.metrics.tpot)}", f"{1 - f.metrics.tpot / plans[0].metrics.tpot:.1%} lower"
    else:
        figure = f"{fmt_count(f.metrics.tokens_per_s)} output tokens/s"
        gain = f"{f.metrics.tokens_per_s / plans[0].metrics.tokens_per_s - 1:.1%} more"
    return (f"best by the metric alone: {f.plan.describe()}, {figure}, {gain} than #1: within the tie band, where "
            "with --simplest-first the simpler configuration leads (#), whatever --top")


def best_configurations(result: ServeSearchResult, price: float | None = None) -> Listing:
    """The best configurations' table (``serving_cells``; ep only for a mixture of experts), each header with its
    meaning."""
    s, slo = result.space, target_titles(result)
    title = (f"best serving configurations: {result.model.name} on {result.cluster.num_gpus} x "
             f"{result.cluster.accelerator.name}, {s.input_len} in{cached_note(s.cached_len)} / {s.output_len} out, "
             f"{s.engine.describe()}"
             + (f", {', '.join(slo)}" if slo else ""))
    columns: dict[str, list[str]] = defaultdict(list)
    for e in result.plans:
        for k, v in serving_cells(e, price).items():
            columns[k].append(v)
    if not result.model.is_moe:
        columns.pop("ep", None)
    key = Col("#", [str(i) for i in range(1, len(result.plans) + 1)], meaning=rank_meaning(result))
    cols = tuple(Col(h, c, "left" if h in ("quant", "pools") else "right", meaning=SERVING_HEADERS[h])
                 for h, c in columns.items())
    return Listing(title, key, cols, ("tokens/s", "per GPU", "TTFT", "TPOT", "$/Mtok"),
                   (*ttft_note(result), SERVING_UNITS))


def serving_lead(result: ServeSearchResult, price: float | None) -> Lead:
    """The workload, engine, targets and counts in a line; the best configuration's figures as cards."""
    model, cluster, s = result.model, result.cluster, result.space
    slo = target_titles(result)
    text = (f"{fmt_count(model.params())} parameters; requests of {s.input_len:,} prompt and {s.output_len:,} output "
            f"tokens on the {s.engine.describe()} engine; {' and '.join(slo) if slo else 'no latency target'}; "
            f"{result.evaluated:,} configurations weighed, {result.feasible:,} fit in "
            f"{fmt_bytes(cluster.accelerator.hbm_bytes)} HBM and meet the targets.")
    heading = f"meshplan serving report: {model.name} on {cluster.num_gpus} × {cluster.accelerator.name}"
    if not result.plans:
        return Lead(heading=heading, text=text)
    best = result.plans[0]
    m = best.metrics
    cards = [("output tokens/s", fmt_count(m.tokens_per_s)), ("per GPU", fmt_count(best.tokens_per_s_per_gpu)),
             ("TTFT", fmt_time(m.ttft)), ("TPOT", fmt_time(m.tpot)), ("end-to-end", fmt_time(m.e2e)),
             ("memory per GPU", f"{fmt_bytes(float(best.memory.total))} / {fmt_bytes(cluster.accelerator.hbm_bytes)}")]
    cost = best.cost_per_million(price)
    if cost is not None:
        cards.append(("$ per M output tokens", f"{cost:,.3g}"))
    note = (f"on {best.plan.num_gpus} of the {cluster.num_gpus} GPUs, {m.running:,.0f} sequences in flight per "
            f"instance, {m.requests_per_s:,.3g} requests/s")
    return Lead(heading=heading, text=text, cards=cards, best=best.plan.describe(), best_note=note,
                best_label="best configuration")


def from_serving(result: ServeSearchResult, price: float | None = None) -> Ranked:
    """The serving search's result as the reports' one shape (``price``: per GPU-hour, the $/Mtok column)."""
    from meshplan import __version__

    s, slo, cluster = result.space, target_titles(result), result.cluster
    ranking = (f"Ranked by {'the lowest TPOT' if s.rank_by == 'latency' else 'output tokens/s of the deployment'}"
               f"{', under ' + ' and '.join(slo) if slo else ''}"
               + (f"; within ±{result.band:.1%} of the best (the band of the measured serving runs like it, "
                  "out of source) configurations cannot be told apart, and the simplest is listed first"
                  if result.band else "") + ". Hover a column's name for what it means.")
    footer = (f"meshplan {__version__}: analytic serving estimate (roofline per op, α-β collectives, continuous "
              f"batching in steady state); search took {result.seconds:.2f} s.")
    metrics = tuple({"tokens_per_s": e.metrics.tokens_per_s, "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
                     "ttft_s": e.metrics.ttft, "tpot_s": e.metrics.tpot, "e2e_s": e.metrics.e2e,
                     "memory_bytes": float(e.memory.total)} for e in result.plans)
    return Ranked(noun="configurations", page_title=f"serving {result.model.name} on {cluster.num_gpus} × "
                                                    f"{cluster.accelerator.name}",
                  table=best_configurations(result, price),
                  rejected=rejected_listing(result.rejected, result.examples, "configurations", "configs",
                                            SERVING_HEADERS, (SERVING_UNITS,)),
                  rejected_total=result.rejected_total, evaluated=result.evaluated, feasible=result.feasible,
                  seconds=result.seconds, lead=serving_lead(result, price), footer=footer, ranking=ranking,
                  metrics=metrics, band=result.band or None,
                  labels=tuple(e.plan.describe() for e in result.plans),
                  empty="No configuration fits and meets the targets.")
