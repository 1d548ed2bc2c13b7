"""``meshplan serve``: the best serving configuration of a model on a cluster under latency targets (serve/), or,
with every axis fixed, the price of that one configuration."""

from __future__ import annotations

from typing import Any

import click

from meshplan.cli.common import MAX_PRICE, apply, common_model, load_inputs, split_ints
from meshplan.errors import SpecError
from meshplan.ranges import check_options
from meshplan.report.vega import require_report_extra

FIXED = ("tp", "pp", "dpa", "ep", "batch", "replicas", "prefill_replicas")


@click.command("serve")
@apply(common_model)
@click.option("--gpus", type=int, required=True, help="GPU count")
@click.option("--input-len", type=int, required=True, help="prompt tokens per request")
@click.option("--output-len", type=int, required=True, help="generated tokens per request")
@click.option("--ttft-slo", default=None, help="time-to-first-token target, e.g. 500ms or 2s")
@click.option("--tpot-slo", default=None, help="time-per-output-token target, e.g. 50ms")
@click.option("--engine", "engine_ref", default="vllm", show_default=True,
              help="serving engine preset (vllm, vllm-v0, trtllm, sglang, lmdeploy, generic) or .toml file")
@click.option("--quant", "quants", default=None,
              help="schemes to try, comma-separated: fp8, int4, fp4 or weights/activations/kv like fp8/fp8/fp8 "
                   "(default: bf16, fp8, fp8 with fp8 KV, int4, fp4)")
@click.option("--tp", default=None, help="tensor-parallel sizes to try (comma-separated)")
@click.option("--pp", default=None, help="pipeline stages to try")
@click.option("--dpa", default=None, help="data-parallel attention groups to try (MoE)")
@click.option("--ep", type=int, default=None, help="with every axis fixed: the expert-parallel size")
@click.option("--batch", default=None, help="decode batches to try (sequences in flight per instance)")
@click.option("--replicas", type=int, default=None, help="with every axis fixed: (decode) instances")
@click.option("--prefill-replicas", type=int, default=None, help="with every axis fixed: prefill instances (0: none)")
@click.option("--disaggregate/--no-disaggregate", default=True, show_default=True,
              help="also try prefill / decode pools")
@click.option("--rank", "rank_by", type=click.Choice(["throughput", "latency"]), default="throughput",
              show_default=True, help="most output tokens/s, or the lowest TPOT")
@click.option("--price", type=float, default=None, help="price per GPU-hour, for the cost of a million tokens")
@click.option("--top", "top_k", type=int, default=10, show_default=True, help="configurations to list")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--report", "report_path", default=None, help="also write an HTML report of the search to this file")
def serve_cmd(model_ref: str, system_ref: str, gpus: int, as_json: bool, **options: Any) -> None:
    """Find the best way to serve MODEL on GPUS accelerators of SYSTEM for requests of INPUT-LEN / OUTPUT-LEN tokens
    under the TTFT and TPOT targets."""
    from meshplan.serve.engine import load_engine

    price, report_path = options.pop("price"), options.pop("report_path")
    if price is not None and not 0 <= price <= MAX_PRICE:
        raise SpecError(f"price={price} must be a number from 0 to {MAX_PRICE:g} per GPU-hour")
    check_options(gpus=gpus, top=options["top_k"], input_len=options["input_len"], output_len=options["output_len"])
    model, cluster = load_inputs(model_ref, system_ref, gpus=gpus, seq=options.pop("seq"),
                                 nvlink_domain=options.pop("nvlink_domain"))
    engine = load_engine(options.pop("engine_ref"))
    if report_path:
        from meshplan.files import writable

        writable(report_path, "report")
        require_report_extra()
    if all(options[k] is not None for k in FIXED):
        return _one(model, cluster, engine, options, price, as_json)
    _search(model, cluster, engine, options, price, as_json, report_path)


def _space(engine, options: dict[str, Any]):
    from meshplan.serve.precision import parse_quant
    from meshplan.serve.space import BATCHES, QUANTS, ServeSpace

    sizes = {k: tuple(split_ints(options[k], k) or ()) for k in ("tp", "pp", "dpa", "batch")}
    for k, values in sizes.items():
        for v in values:
            check_options(**{k: v})
    quants = tuple(parse_quant(q) for q in options["quants"].split(",")) if options["quants"] else QUANTS
    return ServeSpace(input_len=options["input_len"], output_len=options["output_len"], quants=quants,
                      batches=sizes["batch"] or BATCHES, tp=sizes["tp"], pp=sizes["pp"], dpa=sizes["dpa"],
                      disaggregate=options["disaggregate"], ttft_slo=_seconds(options["ttft_slo"], "ttft-slo"),
                      tpot_slo=_seconds(options["tpot_slo"], "tpot-slo"), engine=engine, rank_by=options["rank_by"])


def _seconds(text: str | None, field: str) -> float:
    from meshplan.units import parse_quantity

    if text is None:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = parse_quantity(text, field, "s")
    if not 0 < value <= 3600:
        raise SpecError(f"{field}={text!r} must be a time from 1 us to 1 h, like 200ms or 2s")
    return value


def _search(model, cluster, engine, options, price, as_json, report_path) -> None:
    from meshplan.report.serve_text import print_serve
    from meshplan.serve.search import search

    result = search(model, cluster, _space(engine, options), top_k=options["top_k"], keep=bool(report_path))
    print_serve(result, price, as_json)
    if report_path:
        from meshplan.report.serve_html import write

        write(report_path, result, price)
        if not as_json:
            click.echo(f"wrote {report_path}")


def _one(model, cluster, engine, options, price, as_json) -> None:
    import json

    from meshplan.report.serve_text import estimate_tables
    from meshplan.report.text import terminal_console
    from meshplan.serve.estimate import serve_estimate
    from meshplan.serve.plan import ServePlan, Workload
    from meshplan.serve.precision import parse_quant

    sizes = {k: split_ints(str(options[k]), k) for k in FIXED}
    if any(len(v) != 1 for v in sizes.values()):
        raise SpecError("with every axis fixed, give one value each of --tp, --pp, --dpa, --ep, --batch, --replicas, "
                        "--prefill-replicas")
    quant = parse_quant(options["quants"] or "bf16")
    plan = ServePlan(**{k: v[0] for k, v in sizes.items()}, quant=quant)
    if plan.num_gpus > cluster.num_gpus:
        raise SpecError(f"the plan needs {plan.num_gpus} GPUs, more than gpus={cluster.num_gpus}")
    est = serve_estimate(model, cluster, plan, Workload(input_len=options["input_len"],
                                                        output_len=options["output_len"]), engine)
    if as_json:
        click.echo(json.dumps(est.to_dict(price)))
    else:
        estimate_tables(est, terminal_console(), price)


COMMANDS = [serve_cmd]
