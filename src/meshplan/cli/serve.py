"""``meshplan serve``: the best serving configuration of a model on a cluster under latency targets (serve/), or,
with every axis fixed, the price of that one configuration."""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from meshplan.cli import serve_emit, serve_load
from meshplan.cli.common import MAX_PRICE, apply, common_model, load_inputs, split_ints
from meshplan.errors import SpecError
from meshplan.fields import MAX_SIZE
from meshplan.ranges import RANGES, check_options

FIXED = ("tp", "pp", "dpa", "ep", "batch", "replicas", "prefill_replicas")
SEARCH_ONLY = ("top_k", "rank_by", "disaggregate")  # options of the search: no effect with every axis fixed
SEQ = click.option("--seq", "seq", type=int, default=None,
                   help="longest context served, prompt + output tokens (vLLM's --max-model-len; default: the "
                        "model's max_position_embeddings, else its seq_length)")


def _flag(name: str) -> str:
    names = {"top_k": "top", "rank_by": "rank", "quants": "quant", "disaggregate": "(no-)disaggregate"}
    return "--" + names.get(name, name).replace("_", "-")


@click.command("serve")
@apply([*common_model[:2], SEQ, *common_model[3:]])
@click.option("--gpus", type=int, required=True, help="GPU count")
@click.option("--input-len", type=int, required=True, help="prompt tokens per request")
@click.option("--output-len", type=int, required=True, help="generated tokens per request")
@click.option("--ttft-slo", default=None, help="time-to-first-token target with its unit, e.g. 500ms or 2s")
@click.option("--tpot-slo", default=None, help="time-per-output-token target with its unit, e.g. 50ms")
@click.option("--engine", "engine_ref", default="vllm", show_default=True,
              help="serving engine preset (vllm, vllm-v0, vllm-v0.5, vllm-v0.6-rocm, trtllm, sglang, lmdeploy, "
                   "generic) or .toml file")
@click.option("--quant", "quants", default=None,
              help="schemes to try, comma-separated: bf16, fp8, int4, fp4 or weights/activations/kv like "
                   "fp8/fp8/fp8, or all (16 bits, fp8, fp8 with fp8 KV, int4, fp4 with fp8 KV); default: the "
                   "checkpoint's 16 bits (fp16 on GPUs without bf16), quantised only when asked")
@click.option("--tp", default=None, help="tensor-parallel sizes to try (comma-separated)")
@click.option("--pp", default=None, help="pipeline stages to try")
@click.option("--dpa", default=None, help="data-parallel attention groups to try (MoE)")
@click.option("--ep", type=int, default=None, help="with every axis fixed: the expert-parallel size (MoE)")
@click.option("--batch", default=None, help="decode batches to try (sequences in flight per instance)")
@click.option("--replicas", type=int, default=None, help="with every axis fixed: (decode) instances")
@click.option("--prefill-replicas", type=int, default=None, help="with every axis fixed: prefill instances (0: none)")
@click.option("--disaggregate/--no-disaggregate", default=True, show_default=True,
              help="also try prefill / decode pools")
@click.option("--rank", "rank_by", type=click.Choice(["throughput", "latency"]), default="throughput",
              show_default=True, help="most output tokens/s, or the lowest TPOT")
@click.option("--simplest-first", is_flag=True, default=False,
              help="let the simplest configuration within the best one's error band lead (by default the best leads "
                   "and the others in its band follow it, the simplest first)")
@click.option("--price", type=float, default=None, help="price per GPU-hour, for the cost of a million tokens")
@click.option("--top", "top_k", type=int, default=10, show_default=True, help="configurations to list")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--report", "report_path", default=None, help="also write an HTML report of the search to this file")
@apply(serve_load.LOAD_OPTIONS)
@apply(serve_emit.emit_options)
def serve_cmd(model_ref: str, system_ref: str, gpus: int, as_json: bool, **options: Any) -> None:
    """Find the best way to serve MODEL on GPUS accelerators of SYSTEM for requests of INPUT-LEN / OUTPUT-LEN tokens
    under the TTFT and TPOT targets."""
    from meshplan.serve.engine import load_engine
    from meshplan.serve.plan import cached_tokens

    price, report_path = options.pop("price"), options.pop("report_path")
    hit = serve_load.take_prefix_hit(options)
    load = serve_load.take(options, hit)
    if price is not None and not 0 <= price <= MAX_PRICE:
        raise SpecError(f"price={price} must be a number from 0 to {MAX_PRICE:g} per GPU-hour")
    check_options(gpus=gpus, top=options["top_k"], input_len=options["input_len"], output_len=options["output_len"])
    model, cluster = load_inputs(model_ref, system_ref, gpus=gpus, seq=None, nvlink_domain=options.pop("nvlink_domain"))
    emit = serve_emit.take_emit(options, click.get_current_context().get_parameter_source("engine_ref")
                                == ParameterSource.COMMANDLINE, as_json)
    served = options.pop("seq")
    context(model, served, options["input_len"], options["output_len"])
    options["slo"] = tuple(_seconds(options.pop(k), k.replace("_", "-")) for k in ("ttft_slo", "tpot_slo"))
    fixed = all(options[k] is not None for k in FIXED)
    _no_effect(model, options, fixed, report_path)
    engine = load_engine(options.pop("engine_ref"))
    options["cached_len"] = cached_tokens(options["input_len"], hit, engine.block_size)
    if report_path:
        from meshplan.files import writable
        from meshplan.report.vega import require_report_extra

        writable(report_path, "report")
        require_report_extra()
    if load is not None:
        if emit[0]:
            raise SpecError(f"--emit {emit[0]} writes the launch of one steady-state configuration: leave out --rate, "
                            "--concurrency and --trace (or fix every axis and emit that configuration)")
        return _loaded(model, cluster, engine, options, load, (fixed, price, as_json, report_path))
    best = (_one if fixed else _search)(model, cluster, engine, options, price, as_json, report_path)
    if emit[0]:
        serve_emit.write_launch(best, emit[0], emit[1], served or options["input_len"] + options["output_len"])


def context(model, seq: int | None, input_len: int, output_len: int) -> None:
    """A request's prompt and output must fit the context served: ``--seq`` (vLLM's --max-model-len), by default
    the model's max_position_embeddings (the context its checkpoint serves: a Hugging Face config's, a preset's
    from it) or its seq_length; a learned position table has no positions past its rows."""
    if seq is not None:
        if not 0 < seq <= MAX_SIZE:
            raise SpecError(f"seq={seq} must be a positive integer up to {MAX_SIZE:,}")
        if model.position_embedding == "learned" and seq > model.max_position_embeddings:
            raise SpecError(f"seq={seq:,} exceeds {model.name}'s learned position table (max_position_embeddings="
                            f"{model.max_position_embeddings:,})")
    total = input_len + output_len
    served = max(model.seq_length, model.max_position_embeddings)
    if total > (seq or served):
        limit = f"seq={seq:,}" if seq else (f"{model.name}'s context of {served:,} (its max_position_embeddings or "
                                            "seq_length; --seq serves a longer one where the model takes it)")
        raise SpecError(f"input-len + output-len = {total:,} tokens exceed {limit}")


def _no_effect(model, options: dict[str, Any], fixed: bool, report_path: str | None) -> None:
    """Options that the rest of the command line leaves without effect are refused rather than ignored."""
    source = click.get_current_context().get_parameter_source
    if fixed:
        given = [k for k in SEARCH_ONLY if source(k) == ParameterSource.COMMANDLINE] + ["report"] * bool(report_path)
        if given:
            raise SpecError(f"{_flag(given[0])[2:]}: with every axis fixed, serve prices one configuration; "
                            f"{_flag(given[0])} applies to the search (leave out one of --tp … --prefill-replicas)")
    else:
        lone = [k for k in ("ep", "replicas", "prefill_replicas") if options[k] is not None]
        if lone:
            missing = ", ".join(_flag(k) for k in FIXED if options[k] is None)
            raise SpecError(f"{lone[0].replace('_', '-')}={options[lone[0]]} applies only with every axis fixed "
                            f"(missing {missing}); the search chooses it")
    if not model.is_moe:
        for k in ("dpa", "ep"):
            if any(v > 1 for v in split_ints(None if options[k] is None else str(options[k]), k) or ()):
                raise SpecError(f"{k}={options[k]}: {model.name} is dense, it has no experts; data-parallel "
                                "attention and expert parallelism serve a mixture of experts (replicas serve a "
                                "dense model side by side)")


def _quants(acc, text: str | None, one: bool) -> tuple:
    """The schemes of ``--quant`` (one only with every axis fixed), each one the GPU runs, their unsaid 16-bit parts
    in its 16-bit format; by default the checkpoint's 16 bits (serve/space.py); ``all``: every scheme of
    space.QUANTS (those the GPU cannot run are rejected with their reason)."""
    from meshplan.serve.precision import formats_run, half_formats, native, parse_quant, unsupported
    from meshplan.serve.space import QUANTS

    half = half_formats(acc)[0]
    if text is None:
        return (parse_quant(half, half),)
    if text.strip() == "all" and not one:
        return tuple(dict.fromkeys(native(acc, q) for q in QUANTS))  # the ones the GPU lacks: tallied, not ranked
    words = [w.strip() for w in text.split(",")]
    if one and len(words) != 1:
        raise SpecError(f"quant={text!r}: with every axis fixed, give one scheme")
    out = []
    for word in words:
        quant = parse_quant(word, half)
        problem = unsupported(acc, quant)
        if problem:
            raise SpecError(f"quant={word} ({quant.label}): {problem}; it multiplies in {formats_run(acc)} (weight-"
                            "only schemes such as int4 keep 16-bit activations)")
        out.append(quant)
    return tuple(out)


def _space(engine, options: dict[str, Any], acc):
    from meshplan.serve.space import BATCHES, ServeSpace

    sizes = {k: tuple(split_ints(options[k], k) or ()) for k in ("tp", "pp", "dpa", "batch")}
    for k, values in sizes.items():
        for v in values:
            check_options(**{k: v})
    ttft, tpot = options["slo"]
    return ServeSpace(input_len=options["input_len"], output_len=options["output_len"],
                      cached_len=options["cached_len"],
                      quants=_quants(acc, options["quants"], False), batches=sizes["batch"] or BATCHES,
                      tp=sizes["tp"], pp=sizes["pp"], dpa=sizes["dpa"], disaggregate=options["disaggregate"],
                      ttft_slo=ttft, tpot_slo=tpot, engine=engine, rank_by=options["rank_by"],
                      simplest_leads=options["simplest_first"])


def _seconds(text: str | None, field: str) -> float:
    """A latency target: a time with its unit in the range of ranges.RANGES["slo"]; 0 when not given."""
    from meshplan.units import parse_duration

    if text is None:
        return 0.0
    r = RANGES["slo"]
    return parse_duration(text, field, r.low, r.high)


def _search(model, cluster, engine, options, price, as_json, report_path) -> Any:
    from meshplan.report.serve_text import print_serve
    from meshplan.serve.check import refused_prompt
    from meshplan.serve.plan import Workload
    from meshplan.serve.search import search

    refused = refused_prompt(engine, Workload(input_len=options["input_len"], output_len=options["output_len"]))
    if refused:  # whatever the configuration: one line, nothing searched
        raise SpecError(f"engine {engine.name}: {refused}; an engine file with prefill = \"chunked\" runs it")
    space = _space(engine, options, cluster.accelerator)
    result = search(model, cluster, space, top_k=options["top_k"], keep=bool(report_path))
    print_serve(result, price, as_json)
    if report_path:
        from meshplan.report.serve_html import write_serving

        write_serving(report_path, result, price)
        if not as_json:
            click.echo(f"wrote {report_path}")
    return result.plans[0] if result.plans else None


def _loaded(model, cluster, engine, options, load, how) -> None:
    """Under a load (``--rate`` / ``--concurrency`` / ``--trace``): serve_load.py."""
    fixed, price, as_json, report_path = how
    if fixed:
        return serve_load.run_fixed(model, cluster, _fixed_plan(cluster, options), engine, load, options, price,
                                    as_json)
    space = _space(engine, options, cluster.accelerator)
    serve_load.run_search(model, cluster, space, load, options, (price, as_json, report_path))


def _fixed_plan(cluster, options):
    """The one plan of ``--tp`` … ``--prefill-replicas`` and ``--quant``, on at most the cluster's GPUs."""
    from meshplan.serve.plan import ServePlan

    sizes = {k: split_ints(str(options[k]), k) for k in FIXED}
    if any(len(v) != 1 for v in sizes.values()):
        raise SpecError("with every axis fixed, give one value each of --tp, --pp, --dpa, --ep, --batch, --replicas, "
                        "--prefill-replicas")
    (quant,) = _quants(cluster.accelerator, options["quants"], True)
    plan = ServePlan(**{k: v[0] for k, v in sizes.items()}, quant=quant)
    if plan.num_gpus > cluster.num_gpus:
        raise SpecError(f"the plan needs {plan.num_gpus} GPUs, more than gpus={cluster.num_gpus}")
    return plan


def _one(model, cluster, engine, options, price, as_json, report_path=None) -> Any:
    """One configuration (every axis fixed) priced and printed; it (when it fits) for --emit."""
    import json

    from meshplan.report.console import plain_console
    from meshplan.report.serve_text import serving_estimate_tables
    from meshplan.serve.check import targets
    from meshplan.serve.estimate import serve_estimate
    from meshplan.serve.plan import Workload

    plan = _fixed_plan(cluster, options)
    est = serve_estimate(model, cluster, plan, Workload(input_len=options["input_len"],
                                                        output_len=options["output_len"],
                                                        cached_len=options["cached_len"]), engine)
    verdicts = targets(est.metrics.ttft, est.metrics.tpot, est.fits, *options["slo"])
    if as_json:
        met = all(v["met"] for v in verdicts) if verdicts else None
        click.echo(json.dumps(est.to_dict(price) | {"targets": verdicts, "meets_targets": met}))
    else:
        serving_estimate_tables(est, plain_console(), price, verdicts)
    return est if est.fits else None
