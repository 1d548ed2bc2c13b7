"""``meshplan serve`` under a load: ``--rate`` (Poisson requests/s), ``--concurrency`` (a closed loop of clients)
or ``--trace`` (a file of arrivals and lengths), simulated request by request (serve/load/): the chosen
configuration's TTFT / TPOT / E2E percentiles, throughput and goodput; with an axis left free, the configurations
ranked by goodput per GPU that meet ``--ttft-slo`` / ``--tpot-slo`` at ``--percentile``; ``--recommend``: the
deployment of the fewest GPUs (the lowest cost with ``--price``) that meets them."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import click

from meshplan.cli.common import working
from meshplan.errors import SpecError
from meshplan.ranges import check_value

LOAD = ("rate", "concurrency", "trace")
WITH_LOAD = ("lengths", "requests", "percentile", "recommend", "seed", "burstiness", "speculative", "scheduler")
LIMITS = {"rate": (1e-6, math.inf, "requests/s (inf: every request at once)"), "concurrency": (1, 10**6, "clients"),
          "requests": (1, 10**7, "requests"),
          "burstiness": (1e-3, 1e3, "(a gamma shape)")}
PREFIX_HIT = (0.0, 1.0)  # a share of each prompt (1: a prompt served before, all but its last page found)

LOAD_OPTIONS = [
    click.option("--rate", type=float, default=None, help="simulate requests arriving at this many per second "
                 "(Poisson; --burstiness for a gamma process; inf: every request at once, a benchmark's burst)"),
    click.option("--concurrency", type=int, default=None, help="simulate this many clients, each sending its next "
                 "request when the last one finishes"),
    click.option("--trace", default=None, help="simulate a trace: CSV / JSONL of arrival_s, input_len, output_len"),
    click.option("--lengths", default=None, help="request lengths under --rate / --concurrency, as the benchmark "
                 "tools draw them around --input-len / --output-len: fixed (default), uniform[:ratio] (vLLM's "
                 "random), sglang-random[:ratio], synthetic:SD[:SD_OUT] (GenAI-Perf's), sharegpt (vLLM's filter), "
                 "sharegpt-sglang, alpaca, or a CSV / JSONL of input_len, output_len"),
    click.option("--requests", type=int, default=None, help="requests simulated (default 1000, benchmark_serving's)"),
    click.option("--percentile", type=click.Choice(["50", "90", "95", "99"]), default=None,
                 help="the percentile the latency targets hold at under a load (default 99)"),
    click.option("--prefix-hit", type=float, default=None, help="share of each prompt found in the prefix cache "
                 "(whole KV pages, its last token always computed; 1: prompts served before), with or without a load"),
    click.option("--burstiness", type=float, default=None, help="the gamma shape of --rate's gaps (1: Poisson)"),
    click.option("--speculative", default=None, help="speculative decoding under the load: K:ALPHA[:DRAFT], K draft "
                 "tokens per step accepted at rate ALPHA, from MTP heads (default) or a draft model preset"),
    click.option("--scheduler", default=None, help="the engine's scheduler under the load (default: the engine "
                 "version's; presets in meshplan/presets/schedulers: vllm-v1, vllm-v0, vllm-v0-chunked, sglang, "
                 "sglang-mixed, trtllm, trtllm-chunked, trtllm-max-utilization, turbomind, static-cache)"),
    click.option("--seed", type=int, default=None, help="the random seed of arrivals and lengths (default 0)"),
    click.option("--recommend", is_flag=True, default=None,
                 help="the fewest GPUs (the lowest cost with --price) meeting the targets under the load"),
]


def take_prefix_hit(options: dict[str, Any]) -> float:
    """``--prefix-hit`` out of ``options`` (0 when not given), checked: it prices the prompts of every mode."""
    hit = options.pop("prefix_hit")
    if hit is None:
        return 0.0
    low, high = PREFIX_HIT
    if not low <= hit <= high:
        raise SpecError(f"prefix-hit={hit} must be from {low:g} to {high:g} (a share of each prompt)")
    return float(hit)


def take(options: dict[str, Any], prefix_hit: float = 0.0) -> dict[str, Any] | None:
    """The load options out of ``options`` (``prefix_hit``: take_prefix_hit's); None when no load is given (and
    none of its options either)."""
    load = {k: options.pop(k) for k in (*LOAD, *WITH_LOAD)} | {"prefix_hit": prefix_hit}
    given = [k for k in LOAD if load[k] is not None]
    if not given:
        extra = [k for k in WITH_LOAD if load[k] is not None]
        if extra:
            raise SpecError(f"{_flag(extra[0])}: applies under a load; give --rate, --concurrency or --trace")
        return None
    if len(given) > 1:
        raise SpecError(f"{_flag(given[0])} and {_flag(given[1])}: give one load (--rate, --concurrency or --trace)")
    for k, (low, high, unit) in LIMITS.items():
        v = load[k]
        if v is not None and not low <= v <= high:
            raise SpecError(f"{k.replace('_', '-')}={v} must be from {low:g} to {high:g} {unit}")
    check_value("seed", load["seed"], "--")  # before the search: NumPy refuses a negative seed (ranges.py)
    if load["trace"] is not None:
        clash = [k for k in ("lengths", "requests", "seed", "burstiness") if load[k] is not None]
        if clash:
            raise SpecError(f"{_flag(clash[0])}: a trace gives its own arrivals and lengths")
    if load["concurrency"] is not None and load["burstiness"] is not None:
        raise SpecError("--burstiness: shapes --rate's arrivals; a closed loop sends as requests finish")
    return load


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def requests_of(load: dict[str, Any], input_len: int, output_len: int):
    """The simulated requests the options describe."""
    from meshplan.serve.load import arrivals
    from meshplan.serve.load.lengths import parse_lengths

    if load["trace"] is not None:
        return arrivals.trace(load["trace"])
    lengths = parse_lengths(load["lengths"] or "fixed", input_len, output_len)
    count, seed = load["requests"] or 1000, load["seed"] or 0
    if load["rate"] is not None:
        return arrivals.poisson(load["rate"], count, lengths, seed, load["burstiness"] or 1.0)
    return arrivals.closed(load["concurrency"], count, lengths, seed)


def targets_of(load: dict[str, Any], slo: tuple[float, float], model):
    from meshplan.serve.load.speculation import parse_speculation
    from meshplan.serve.load.under_load import Targets

    spec = parse_speculation(load["speculative"], model) if load["speculative"] else None
    return Targets(ttft=slo[0], tpot=slo[1], percentile=int(load["percentile"] or 99),
                   prefix_hit=load["prefix_hit"] or 0.0, speculation=spec, scheduler=_scheduler(load["scheduler"]))


def _scheduler(name: str | None) -> str | None:
    """``--scheduler``, checked against the presets (one clear line naming them)."""
    if name is not None:
        from meshplan.serve.load.policy import policies

        if name not in policies():
            raise SpecError(f"scheduler={name!r} is not a scheduler preset (presets: {', '.join(sorted(policies()))})")
    return name


def run_fixed(model, cluster, plan, engine, load, options, price, as_json) -> None:
    """One configuration under the load."""
    from meshplan.serve.load.run import load_run_with
    from meshplan.serve.load.under_load import Loaded

    if load["recommend"]:
        raise SpecError("--recommend: with every axis fixed there is nothing to choose (leave out one of --tp … "
                        "--prefill-replicas)")
    reqs = requests_of(load, options["input_len"], options["output_len"])
    targets = targets_of(load, options["slo"], model)
    with working(f"serve: simulating {len(reqs.arrival):,} requests on {plan.describe()}", quiet=as_json):
        result = load_run_with(model, cluster, plan, reqs, engine, options["slo"], targets.choices)
    _print([Loaded(plan, result, targets.met(result, len(reqs)))], targets, price, as_json, "configuration")


def run_search(model, cluster, space, load, options, how) -> None:
    """The configurations under the load, ranked, or the recommendation; ``how``: price, JSON, report path."""
    from meshplan.serve.load.under_load import rank, recommend
    from meshplan.serve.plan import cached_tokens

    price, as_json, report_path = how
    reqs = requests_of(load, options["input_len"], options["output_len"])
    targets = targets_of(load, options["slo"], model)
    # the steady-state shortlist at the requests' mean lengths (a trace's, a distribution's)
    mean_in = max(1, round(float(reqs.input_len.mean())))
    space = replace(space, input_len=mean_in, output_len=max(1, round(float(reqs.output_len.mean()))),
                    cached_len=cached_tokens(mean_in, load["prefix_hit"], space.engine.block_size))
    what = f"serve: simulating {len(reqs.arrival):,} requests on each configuration"
    if load["recommend"]:
        if not targets.ttft and not targets.tpot:
            raise SpecError("--recommend: give a target to meet (--ttft-slo and / or --tpot-slo)")
        with working(what, quiet=as_json):
            found = recommend(model, cluster, space, reqs, targets)
        if not found:
            raise SpecError(f"no deployment of up to {cluster.num_gpus} GPUs meets the targets at p"
                            f"{targets.percentile} under this load (raise --gpus or loosen the targets)")
        title = "recommended"
    else:
        with working(what, quiet=as_json):
            found, title = rank(model, cluster, space, reqs, targets), "ranked"
    _print(found[: options["top_k"]], targets, price, as_json, title)
    if report_path:
        _report(report_path, (model, cluster, space), found[0], reqs, targets, (price, options["top_k"], as_json))


def _report(path, where, best, reqs, targets, how) -> None:
    """The serving report of the steady-state search, with the load's section for ``best``."""
    from meshplan.report.serve_html import write_serving
    from meshplan.report.serve_load_section import load_section
    from meshplan.serve.load.sweep import load_sweep
    from meshplan.serve.search import search

    model, cluster, space = where
    price, top_k, as_json = how
    result = search(model, cluster, space, top_k=top_k, keep=True)
    sweep = load_sweep(model, cluster, best.plan, reqs, space.engine, targets.percentile, targets.choices)
    section = load_section(best.plan.describe(), sweep, best.result.timeline, (targets.ttft, targets.tpot),
                           bool(reqs.concurrency))
    write_serving(path, result, price, extra=[section])
    if not as_json:
        click.echo(f"wrote {path}")


def _print(rows, targets, price, as_json, title) -> None:
    p, sp = targets.percentile, targets.speculation
    spec = ({"draft_tokens": sp.tokens, "acceptance": sp.acceptance, "draft": sp.label,
             "tokens_per_step": sp.per_step} if sp else None)
    if as_json:
        click.echo(json.dumps({"percentile": p, "ttft_slo_s": targets.ttft or None, "tpot_slo_s": targets.tpot or None,
                               "speculative": spec, "plans": [r.to_dict(price) for r in rows]}))
        return
    from meshplan.report.console import plain_console
    from meshplan.report.fold import listing_tables

    extra = (f", speculative decoding: {sp.tokens} draft tokens from {sp.label} at acceptance {sp.acceptance:g}, "
             f"{sp.per_step:.2f} tokens a step" if sp else "")
    console = plain_console()
    for renderable in listing_tables(load_listing(rows, targets, price, title, extra), console.width):
        console.print(renderable)


_SIMPLER = ("simplicity: fewer GPUs, co-located before split pools, smaller model-parallel groups (tp·pp·dpa), "
            "16-bit weights before quantised, a smaller batch")
# how each table's rows are ordered (serve/load/under_load.py rank and recommend)
_ORDER = {"ranked": "rank: the configurations that meet every target first, then by goodput per GPU (within 5 % of "
                    f"each other by {_SIMPLER})",
          "recommended": "rank: every row meets the targets; fewest GPUs first, then by goodput per GPU (within 5 % "
                         f"by {_SIMPLER})",
          "configuration": "the configuration asked for (every axis fixed)"}


def load_listing(rows, targets, price, title, extra=""):
    """The table of configurations under the load (the terminal's width, folded: report/fold.py) with its legend:
    every column, the units, what 'meets' checks, and the ranking (serve/load/under_load.rank: the configurations
    that meet every target first, then by goodput per GPU, within 5 % by simplicity)."""
    from meshplan.report.fold import Col, Listing

    p = targets.percentile
    data = [(r, r.result, r.to_dict(price)) for r in rows]
    limits = ", ".join(f"{name} p{p} ≤ {limit * 1e3:g} ms" for name, limit in (("TTFT", targets.ttft),
                                                                               ("TPOT", targets.tpot)) if limit)
    cols = [Col("plan", [r.plan.describe() for r, _, _ in data], "left", True,
                "the configuration: tensor / pipeline parallel sizes, xN replicas (or NP+MD prefill and decode "
                "pools), its batch limit, quantisation of weights / activations / KV cache"),
            Col("GPUs", [f"{r.plan.num_gpus}" for r, _, _ in data], meaning="GPUs it uses"),
            Col("TTFT p50", [_ms(x.ttft[50]).strip() for _, x, _ in data], meaning="time to first token, median"),
            Col(f"TTFT p{p}", [_ms(x.ttft[p]).strip() for _, x, _ in data],
                meaning=f"time to first token, {p}th percentile"),
            Col("TPOT p50", [_ms(x.tpot[50]).strip() for _, x, _ in data],
                meaning="time per output token after the first, median"),
            Col(f"TPOT p{p}", [_ms(x.tpot[p]).strip() for _, x, _ in data],
                meaning=f"time per output token after the first, {p}th percentile"),
            Col("tok/s", [f"{x.output_tokens_per_s:,.0f}" for _, x, _ in data],
                meaning="output tokens per second, all replicas"),
            Col("goodput", [f"{x.goodput:.2f}" for _, x, _ in data],
                meaning="requests per second that meet every target (DistServe's goodput)"),
            Col("preempted", [f"{x.preemptions}" for _, x, _ in data],
                meaning="requests the engine preempted for KV-cache room (recomputed or swapped back later)"),
            Col("meets", ["yes" if r.meets else "no" for r, _, _ in data],
                meaning=f"whether it meets the targets ({limits or 'none given'})")]
    if price is not None:
        cols.append(Col("$/M tok", [f"{d['cost_per_million_tokens']:.3f}" if d["cost_per_million_tokens"] else "-"
                                    for _, _, d in data], meaning="dollars per million output tokens at --price"))
    key = Col("#", [f"{i}" for i in range(1, len(data) + 1)], meaning=_ORDER[title])
    return Listing(f"{title} under the load (targets at p{p}{extra})", key, tuple(cols),
                   first=("GPUs", f"TTFT p{p}", f"TPOT p{p}", "goodput", "meets"), notes=(("ms", "milliseconds"),))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:>8.1f}ms"
