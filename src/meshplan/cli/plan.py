"""``meshplan plan``: search every parallel plan and rank the feasible ones; each can be re-run with ``estimate``."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from meshplan.cli import shard
from meshplan.cli.common import (
    MAX_PRICE,
    apply,
    check_max_plans,
    choices,
    common_model,
    default_global_batch,
    load_inputs,
    parse_count,
    progress,
    sequences,
    split_ints,
)
from meshplan.cli.emit import EMIT_FRAMEWORK, FORMATS, check_emit, write_best
from meshplan.cli.options import DEFAULT_FRAMEWORK, estimate_args, recompute_modules, stack_of, stack_options
from meshplan.errors import SpecError
from meshplan.fields import MAX_PLANS, MEMORY_HEADROOM
from meshplan.ranges import check_options, step_tokens_problem
from meshplan.specs.check import fsdp_has_zero
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import PRECISION, Plan
from meshplan.specs.stack import Stack

_FIELDS = {f.name: f for f in dataclasses.fields(Plan)}
RECOMPUTE_MODULES_HELP = _FIELDS["recompute_modules"].metadata["help"]
PRECISION_HELP = "default: " + _FIELDS["precision"].metadata["default_help"]


@click.command("plan")
@apply(common_model)
@click.option("--gpus", required=True, help="GPU count, or several separated by commas (strong scaling)")
@click.option("--global-batch", type=int, default=None, help="sequences per step (default ≈ 4M tokens)")
@click.option("--top", "top_k", type=int, default=10, show_default=True,
              help="plans to list (which plans lead does not depend on it)")
@click.option("--zero", "zero_opts", default="0,1,2,3", show_default=True, help="ZeRO stages to consider")
@click.option("--recompute", "recompute_opts", default="none,selective,full", show_default=True)
@click.option("--recompute-modules", "recompute_modules_text", default="core_attn", show_default=True,
              help=RECOMPUTE_MODULES_HELP)
@click.option("--sp", "sp_opts", default="off,on", show_default=True, help="sequence parallelism options")
@click.option("--offload/--no-offload", default=True, show_default=True, help="consider optimizer / activation offload")
@click.option("--placements", type=click.Choice(["all", "default"]), default="all", show_default=True,
              help="every placement of the axes on the mesh, or tp,cp,dp,pp only")
@click.option("--max-micro-batch", type=int, default=64, show_default=True)
@click.option("--max-plans", type=int, default=MAX_PLANS, show_default=True,
              help="refuse a search space of more plans than this (0: no limit)")
@click.option("--precision", type=click.Choice(PRECISION), default=None, help=PRECISION_HELP)
@click.option("--grad-bytes", type=int, default=4, show_default=True)
@click.option("--headroom", type=float, default=MEMORY_HEADROOM, show_default=True,
              help="share of HBM every plan leaves free (default: the model's largest memory error against measured "
                   "runs, docs/ACCURACY.md); plans inside it are listed as rejected")
@stack_options
@click.option("--tokens", default=None, help="token budget (e.g. 15T) to report days and cost")
@click.option("--price", type=float, default=None, help="price per GPU-hour, for --tokens")
@click.option("--rank", "rank_by", type=click.Choice(["time", "cost"]), default="time", show_default=True,
              help="across GPU counts: fastest, or cheapest for the token budget")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--emit", "emit_format", type=click.Choice(sorted(FORMATS)), default=None,
              help="write the plan ranked #1 as this framework's config (printed after the table)")
@click.option("--emit-to", "emit_to", default=None, help="with --emit: the file to write it to")
@apply(shard.options)
@click.pass_context
def plan_cmd(ctx: click.Context, model_ref: str, system_ref: str, gpus: str, framework: str, as_json: bool,
             **options: Any) -> None:
    """Search every parallel plan of MODEL on GPUS accelerators of SYSTEM and rank the feasible ones; with a
    MODULE:FACTORY model (or --autoshard), shard it op by op with the sharding planner instead."""
    from meshplan.report.text import print_search
    from meshplan.search import search

    if shard.wants_planner(model_ref, options):
        shard.run_planner(ctx, model_ref, system_ref, gpus, as_json, options)
        return
    used = [o for o in ("input_shapes", "dtypes") if options[o]] + [
        o for o in ("micro_batches", "mesh_text", "stages", "param_dtype")
        if ctx.get_parameter_source(o) == click.core.ParameterSource.COMMANDLINE]
    if used:
        raise SpecError(f"--{used[0].removesuffix('_text').replace('_', '-')} is an option of the sharding planner: "
                        "add --autoshard (or give a MODULE:FACTORY model)")
    for name in ("autoshard", "input_shapes", "dtypes", "param_dtype", "micro_batches", "mesh_text", "stages"):
        options.pop(name)

    emit_format, emit_to = options.pop("emit_format"), options.pop("emit_to")
    check_emit(emit_format, emit_to, as_json)
    counts = split_ints(gpus, "gpus") or []
    if not counts or min(counts) < 1:
        raise SpecError(f"gpus={gpus!r} must be positive integers")
    if emit_format and framework == DEFAULT_FRAMEWORK:  # search what the format's framework runs
        framework = EMIT_FRAMEWORK[emit_format]
    stack = stack_of(framework, options)
    settings = _settings(options, stack)
    if emit_format:  # what the frameworks run: 1D tensor parallelism in their own rank order
        settings.update(layouts=("1d",), all_placements=False)
    budget = _budget(options)
    where = {"seq": options["seq"], "nvlink_domain": options["nvlink_domain"]}
    clusters = [load_inputs(model_ref, system_ref, gpus=n, **where) for n in counts]  # all, before any search
    gbs = _global_batch(clusters[0][0], options["global_batch"])
    results = []
    for model, cluster in clusters:
        space = _space(settings, gbs, cluster.accelerator.default_precision, stack)
        with progress(as_json) as update:
            results.append(search(model, cluster, space, top_k=options["top_k"], progress=update))
    rerun = ["meshplan", "estimate", "--model", model_ref, "--system", system_ref]
    rerun += [x for k, v in where.items() if v is not None for x in ("--" + k.replace("_", "-"), str(v))]
    print_search(results, as_json=as_json, **budget,
                 rerun=lambda est: [*rerun, "--gpus", str(est.plan.num_gpus), *estimate_args(est.plan, est.stack)])
    if emit_format:
        write_best(results, emit_format, emit_to)


def _settings(options: dict[str, Any], stack: Stack) -> dict[str, Any]:
    """The search's choices from the options: ZeRO stages (those the stack's FSDP has), recomputes and their
    modules, sequence parallelism, offload, placements and the limits."""
    check_max_plans(options["max_plans"])
    check_options(top=options["top_k"], max_micro_batch=options["max_micro_batch"],
                  max_plans=options["max_plans"] or None, grad_bytes=options["grad_bytes"],
                  headroom=options["headroom"])
    can = stack.supports
    zeros = tuple(z for z in map(int, choices(options["zero_opts"], ("0", "1", "2", "3"), "zero"))
                  if fsdp_has_zero(stack.fsdp, z))
    if not zeros:
        raise SpecError(f"zero={options['zero_opts']} leaves no stage for fsdp={stack.fsdp} (FSDP has no ZeRO-1)")
    zeros = tuple(z for z in zeros if z in can.zero)
    if not zeros:
        raise SpecError(f"zero={options['zero_opts']} leaves no stage that framework {stack.name} runs (it runs "
                        f"zero {', '.join(map(str, can.zero))})")
    sps = tuple(v == "on" for v in choices(options["sp_opts"], ("off", "on"), "sp")
                if v == "off" or can.sequence_parallel)
    if not sps:
        raise SpecError(f"sp={options['sp_opts']}: framework {stack.name} has no sequence parallelism")
    recomputes = choices(options["recompute_opts"], ("none", "selective", "full"), "recompute")
    modules = recompute_modules(options["recompute_modules_text"])
    if modules != ("core_attn",) and "selective" not in recomputes:
        raise SpecError(f"recompute-modules={options['recompute_modules_text']} needs selective among --recompute "
                        f"(got {options['recompute_opts']})")
    offload = (False, True) if options["offload"] else (False,)
    return {"zero": zeros, "recompute": recomputes, "recompute_modules": modules,
            "sequence_parallel": sps, "headroom": options["headroom"],
            "offload_optimizer": offload, "offload_activations": offload,
            "all_placements": options["placements"] == "all", "max_micro_batch": options["max_micro_batch"],
            "precision": options["precision"], "grad_bytes": options["grad_bytes"],
            "max_plans": options["max_plans"]}


def _budget(options: dict[str, Any]) -> dict[str, Any]:
    """``--tokens``, ``--price`` and ``--rank``: what a training run of that many tokens takes and costs."""
    tokens, price, rank_by = options["tokens"], options["price"], options["rank_by"]
    budget = parse_count(tokens, "tokens") if tokens is not None else None
    if price is not None and not 0 <= price <= MAX_PRICE:
        raise SpecError(f"price={price} must be a number from 0 to {MAX_PRICE:g} per GPU-hour")
    if price is not None and budget is None:
        raise SpecError(f"price={price} needs --tokens (the budget it prices)")
    if rank_by == "cost" and budget is None:
        raise SpecError("rank=cost needs --tokens (the budget whose cost it ranks)")
    return {"tokens": budget, "price": price, "rank_by": rank_by}


def _global_batch(model: ModelSpec, global_batch: int | None) -> int:
    sequences(global_batch, "global-batch")
    gbs = global_batch or default_global_batch(model.seq_length, 1, 1)
    problem = step_tokens_problem(gbs, model.seq_length, "global-batch")
    if problem:
        raise SpecError(problem)
    return gbs


def _space(settings: dict[str, Any], global_batch: int, default_precision: str, stack: Stack) -> Any:  # a search.Space
    """The search space of one GPU count: the settings, with the GPU's own precision unless one was given."""
    from meshplan.search import Space

    return Space(**{**settings, "precision": settings["precision"] or default_precision}, global_batch=global_batch,
                 stack=stack, prefer_simple=True)
