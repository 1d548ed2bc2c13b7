"""``meshplan plan``: search every parallel plan and rank the feasible ones; each can be re-run with ``estimate``."""

from __future__ import annotations

from typing import Any

import click

from meshplan.cli import shard
from meshplan.cli.common import (
    EMIT_DEPTH,
    EMIT_FORMATS,
    EMIT_FRAMEWORK,
    MAX_PRICE,
    apply,
    check_emit,
    common_model,
    default_global_batch,
    load_counts,
    parse_count,
    progress,
    sequences,
    split_ints,
)
from meshplan.cli.conditions import condition_options, conditions_of, conditions_text, result_on, under
from meshplan.cli.goodput_options import reliability_of, reliability_options
from meshplan.cli.help import Sectioned, section
from meshplan.cli.options import DEFAULT_FRAMEWORK, estimate_args, stack_of, stack_options
from meshplan.cli.search_options import pop_search_options, search_options, search_space, space_settings
from meshplan.errors import SpecError
from meshplan.ranges import check_options, step_tokens_problem
from meshplan.specs.model import ModelSpec
from meshplan.specs.pools import is_pools
from meshplan.specs.stack import Stack


@click.command("plan", cls=Sectioned)
@section("Model, system and GPUs")
@apply(common_model)
@click.option("--gpus", default=None, help="GPU count, or several separated by commas (strong scaling); with a mixed "
              "cluster (--system h100:32,a100:32) the pools' sum, which it may leave out")
@click.option("--global-batch", type=int, default=None, help="sequences per step (default ≈ 4M tokens)")
@click.option("--top", "top_k", type=int, default=10, show_default=True,
              help="plans to list (which plans lead does not depend on it)")
@section("Search space: what the search may choose (each axis fixed or narrowed)")
@search_options
@click.option("--per-stage/--no-per-stage", "per_stage", default=True, show_default=True,
              help="refine the first pipelined plans with a layer count and a recompute (or offload) setting per "
                   "pipeline rank where the framework runs them (the stage DP, search/stage_dp.py: Megatron-Core's "
                   "--pipeline-model-parallel-layout)")
@section("Framework and software stack (each option overrides one field of the --framework preset)")
@stack_options
@section("Time and cost")
@click.option("--tokens", default=None, help="token budget (e.g. 15T) to report days and cost")
@click.option("--price", type=float, default=None, help="price per GPU-hour, for --tokens")
@click.option("--rank", "rank_by", type=click.Choice(["time", "cost"]), default="time", show_default=True,
              help="across GPU counts: fastest, or cheapest for the token budget")
@section("Failures and checkpoints (--mtbf)")
@apply(reliability_options)
@apply(condition_options)
@section("Output")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--emit", "emit_format", type=click.Choice(sorted(EMIT_FORMATS)), default=None,
              help="write the plan ranked #1 as this framework's config (printed after the table)")
@click.option("--emit-to", "emit_to", default=None, help="with --emit: the file to write it to")
@click.option("--all", "all_plans", is_flag=True,
              help="also write every feasible plan (not only --top) as CSV to --output, fastest first")
@click.option("-o", "--output", default=None, help="with --all: the CSV file to write")
@section("Sharding planner (--autoshard, or a MODULE:FACTORY model)")
@apply(shard.options)
@click.pass_context
def plan_cmd(ctx: click.Context, model_ref: str, system_ref: str, gpus: str, framework: str, as_json: bool,
             **options: Any) -> None:
    """Search every parallel plan of MODEL on GPUS accelerators of SYSTEM and rank the feasible ones; with a
    MODULE:FACTORY model (or --autoshard), shard it op by op with the sharding planner instead."""
    if shard.wants_planner(model_ref, options):  # the template search's modules are not the planner's
        shard.run_planner(ctx, model_ref, system_ref, gpus, as_json, options)
        return
    from meshplan.report.text import print_search
    from meshplan.search import search

    _no_planner_options(ctx, options)

    if is_pools(system_ref):
        _mixed(model_ref, system_ref, gpus, framework, as_json, options)
        return
    if gpus is None:
        raise SpecError("--gpus is required (a GPU count, or several separated by commas)")
    emit_format, emit_to = options.pop("emit_format"), options.pop("emit_to")
    check_emit(emit_format, emit_to, as_json)
    every, csv_path = _every_plan(options.pop("all_plans"), options.pop("output"))
    counts = split_ints(gpus, "gpus") or []
    if not counts or min(counts) < 1:
        raise SpecError(f"gpus={gpus!r} must be positive integers")
    if emit_format and framework == DEFAULT_FRAMEWORK:  # search what the format's framework runs
        framework = EMIT_FRAMEWORK[emit_format]
    gemm_given = options.get("stack_expert_gemm") is not None
    stack = stack_of(framework, options)
    settings = _settings(options, stack)
    # grouped GEMMs searched beside per-expert ones where the framework has them (search/variants.py)
    settings["expert_gemms"] = () if gemm_given else stack.supports.expert_gemms
    if emit_format:  # what the frameworks run: 1D tensor parallelism in their own rank order
        settings.update(layouts=("1d",), all_placements=False)
    budget = _budget(options)
    stragglers, cap = conditions_of(options)
    _check_recovery(budget["reliability"], stack, every)
    where = {"seq": options["seq"], "nvlink_domain": options["nvlink_domain"]}
    clusters = load_counts(model_ref, system_ref, counts=counts, **where)  # all, before any search
    gbs = _global_batch(clusters[0][0], options["global_batch"])
    spaces = [(model, under(cluster, stragglers, cap), _space(settings, gbs, cluster.accelerator.default_precision,
                                                              stack), under(cluster, None, cap))
              for model, cluster in clusters]
    read_all = as_json or bool(emit_format) or every is not None or budget["reliability"] is not None
    results = _counts(spaces, _listed(spaces, options["top_k"], read_all), every, budget["reliability"], as_json)
    if stragglers is not None or cap:
        click.echo(conditions_text(stragglers, cap, results[0].cluster), err=as_json)
    rerun = ["meshplan", "estimate", "--model", model_ref, "--system", system_ref]
    rerun += [x for k, v in where.items() if v is not None for x in ("--" + k.replace("_", "-"), str(v))]
    print_search(results, as_json=as_json, **budget,
                 rerun=lambda est: [*rerun, "--gpus", str(est.plan.num_gpus), *estimate_args(est.plan, est.stack)])
    if emit_format:
        from meshplan.cli.emit import write_best  # (imported where a plan is emitted)

        write_best(results, emit_format, emit_to,
                   deeper=lambda: [search(m, c, s, top_k=max(EMIT_DEPTH, options["top_k"])) for m, c, s, _ in spaces])
    if csv_path is not None:
        from meshplan.report.plans_csv import write_plans_csv

        path = write_plans_csv(results, csv_path)
        kept = sum(len(r.explored) for r in results if r.explored is not None)
        click.echo(f"wrote {path}: {kept:,} feasible plans", err=as_json)


def _no_planner_options(ctx: click.Context, options: dict[str, Any]) -> None:
    """The sharding planner's options are refused without it, then taken out of ``options``."""
    used = [o for o in ("input_shapes", "dtypes") if options[o]] + [
        o for o in ("micro_batches", "mesh_text", "stages", "param_dtype")
        if ctx.get_parameter_source(o) == click.core.ParameterSource.COMMANDLINE]
    if used:
        flag = next(p.opts[0] for p in ctx.command.params if p.name == used[0])
        raise SpecError(f"{flag} is an option of the sharding planner: "
                        "add --autoshard (or give a MODULE:FACTORY model)")
    for name in ("autoshard", "input_shapes", "dtypes", "param_dtype", "micro_batches", "mesh_text", "stages"):
        options.pop(name)


def _listed(spaces: list[tuple[Any, ...]], top_k: int, read_all: bool) -> int:
    """The plans each count's search lists: the strong-scaling table shows each count's first plan alone
    (report/text.py ``scaling_tables``), so its searches list one, which spares the listed plans' ``estimate()``
    (80 of the 8-count plan's 101): the first and the fastest plan do not depend on the number listed
    (search/select.py; tests/test_top_k.py), nor do what the shares keep and the counts, where the stage DP keeps
    its ``POOL`` in every share (search/run.py ``_kept``: the same ``max(top_k, POOL)``). Every plan is listed
    where anything reads the rest (``read_all``: --json, --emit, --all, --mtbf) or may name them (the notes
    on asynchronous schedules below the table: report/text.py ``print_search``), and where the simplest plan of
    the band leads (``Space.simplest_leads``), whose first plan tests/test_top_k.py does not draw."""
    from meshplan.search.stage_pool import POOL

    if len(spaces) < 2 or read_all or top_k > POOL:
        return top_k
    alike = all(s.stage_layers and not s.simplest_leads and not s.async_schedules for _, _, s, _ in spaces)
    return 1 if alike else top_k


def _counts(spaces: list[tuple[Any, ...]], top_k: int, every: Any, rel: Any, as_json: bool) -> list[Any]:
    """Each GPU count's search (``spaces``: model, cluster priced, space, cluster shown); several counts run in forked
    processes where cores are idle, the largest first (search/workers.forked_map), and those of one process share
    their unit keys' prices (search/key_store.shared_units: the same keys, priced once for all)."""
    if len(spaces) == 1:
        model, priced, space, shown = spaces[0]
        found = [_search(model, priced, space, top_k, every, rel, as_json, shown)]
    else:
        from meshplan.search.key_store import shared_units
        from meshplan.search.shapes_ahead import shapes_ahead
        from meshplan.search.workers import forked_map

        def one(i: int) -> tuple[Any, bool]:
            model, priced, space, shown = spaces[i]
            return _search(model, priced, space, top_k, every, rel, True, shown)

        largest = sorted(range(len(spaces)), key=lambda i: -spaces[i][1].num_gpus)
        # every count's op shapes priced at once before the searches (and any fork): search/shapes_ahead.py
        ahead = [(model, priced, space) for model, priced, space, _ in spaces] if rel is None else []
        with shared_units(), shapes_ahead(ahead), progress(as_json) as update:
            found = forked_map(one, largest, update)
    for _, exact in found:
        if not exact:
            click.echo("ranked by expected time among the fastest plans kept (the bound did not close)", err=True)
    return [result for result, _ in found]


def _search(model: ModelSpec, cluster: Any, space: Any, top_k: int, every: Any, rel: Any, as_json: bool,
            shown: Any) -> tuple[Any, bool]:
    """One GPU count's search: by step time, or with failures (--mtbf) by expected time to train
    (search/by_goodput.py); its plans read against ``shown`` (the GPUs without the stragglers' pace), and whether
    its ranking is exact (by_goodput's bound closed)."""
    from meshplan.search.variants import search_switches

    exact = True
    with progress(as_json) as update:
        if rel is None:
            result = search_switches(model, cluster, space, top_k=top_k, progress=update, explore=every)
        else:
            from meshplan.search.by_goodput import search_by_goodput

            result, exact = search_by_goodput(model, cluster, space, rel, top_k=top_k)
    return result_on(result, shown), exact


def _check_recovery(rel: Any, stack: Stack, every: Any) -> None:
    """``--recovery replica`` needs a framework with replica recovery; ``--all`` lists plans by step time."""
    if rel is not None and every is not None:
        raise SpecError("--all writes every plan by step time: leave out --mtbf (which ranks by expected time)")
    if rel is not None and rel.recovery == "replica" and not stack.supports.replica_recovery:
        raise SpecError(f"recovery=replica: framework {stack.name} restarts the whole job on a failure (no replica "
                        "recovery: TorchFT's replica groups; --framework any prices it)")


def _mixed(model_ref: str, system_ref: str, gpus: str | None, framework: str, as_json: bool,
           options: dict[str, Any]) -> None:
    """``--system preset:GPUs,…``: the search on a mixed cluster (cli/mixed.py)."""
    from meshplan.cli.common import model_at
    from meshplan.cli.mixed import check_mixed, run_mixed
    from meshplan.specs.pools import parse_pools

    pools = parse_pools(system_ref)
    check_mixed(gpus, pools.num_gpus, options)
    if options["nvlink_domain"] is not None:
        raise SpecError("--nvlink-domain is not taken with a mixed cluster: each pool keeps its system's")
    stack = stack_of(framework, options)
    settings = _settings(options, stack) | {"stack": stack}
    model = model_at(model_ref, options["seq"])
    run_mixed(model, system_ref, _global_batch(model, options["global_batch"]), settings, options["top_k"], as_json)


def _settings(options: dict[str, Any], stack: Stack) -> dict[str, Any]:
    """The search's choices from the shared search options (search_options.py) and ``--top``."""
    check_options(top=options["top_k"])
    return space_settings(pop_search_options(options), stack) | {"stage_layers": options.pop("per_stage")}


def _every_plan(all_plans: bool, output: str | None) -> tuple[Any, str | None]:
    """``--all`` and ``--output``: what the search keeps beside its top k (every feasible plan: explore.ALL_FEASIBLE)
    and the CSV file to write them to, checked before the search."""
    if all_plans != (output is not None):
        raise SpecError("--all writes every feasible plan to --output FILE.csv: give both" if all_plans else
                        f"output={output} needs --all (the plans it writes)")
    if not all_plans:
        return None, None
    from meshplan.files import writable
    from meshplan.search.explore import ALL_FEASIBLE

    assert output is not None  # all_plans, checked beside it
    writable(output, "output")
    return ALL_FEASIBLE, output


def _budget(options: dict[str, Any]) -> dict[str, Any]:
    """``--tokens``, ``--price`` and ``--rank``: what a training run of that many tokens takes and costs."""
    tokens, price, rank_by = options["tokens"], options["price"], options["rank_by"]
    rel = reliability_of(options)
    budget = parse_count(tokens, "tokens") if tokens is not None else None
    if price is not None and not 0 <= price <= MAX_PRICE:
        raise SpecError(f"price={price} must be a number from 0 to {MAX_PRICE:g} per GPU-hour")
    if price is not None and budget is None:
        raise SpecError(f"price={price} needs --tokens (the budget it prices)")
    if rank_by == "cost" and budget is None:
        raise SpecError("rank=cost needs --tokens (the budget whose cost it ranks)")
    return {"tokens": budget, "price": price, "rank_by": rank_by, "reliability": rel}


def _global_batch(model: ModelSpec, global_batch: int | None) -> int:
    sequences(global_batch, "global-batch")
    gbs = global_batch or default_global_batch(model.seq_length, 1, 1)
    problem = step_tokens_problem(gbs, model.seq_length, "global-batch")
    if problem:
        raise SpecError(problem)
    return gbs


def _space(settings: dict[str, Any], global_batch: int, default_precision: str, stack: Stack) -> Any:  # a search.Space
    """The search space of one GPU count: the settings, with the GPU's own precision unless one was given."""
    return search_space(settings, global_batch, stack, default_precision)
