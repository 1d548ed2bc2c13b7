"""``meshplan estimate``: one training step of a model on a cluster under one plan (its options: cli/options.py)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import TYPE_CHECKING, Any

import click

from meshplan.cli.common import apply, common_model, load_inputs
from meshplan.cli.conditions import as_on, condition_options, conditions_of, conditions_text, under
from meshplan.cli.options import DEFAULT_FRAMEWORK, plan_of, plan_options, stack_of, stack_options
from meshplan.derived.energy import step_energy
from meshplan.errors import SpecError
from meshplan.fields import usable_hbm
from meshplan.report.fit_hints import fit_hints, print_hints
from meshplan.report.host_note import host_note
from meshplan.specs.host_cost import tp_hidden
from meshplan.specs.refusals import refused
from meshplan.specs.stack import stack_modules

if TYPE_CHECKING:
    from meshplan.estimate import Estimate
    from meshplan.specs.model import ModelSpec


@click.command()
@apply(common_model)
@click.option("--gpus", type=int, required=True, help="number of GPUs")
@plan_options
@stack_options
@click.option("--from", "config", default=None, help="the plan and stack of a framework config (Megatron-LM "
              "arguments, torchtitan TOML, DeepSpeed JSON, Megatron-Bridge overrides); plan options are refused "
              "beside it, stack options override it")
@apply(condition_options)
@click.option("--ops", "show_ops", is_flag=True, help="print the per-op table")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def estimate(model_ref: str, system_ref: str, gpus: int, framework: str, config: str | None, show_ops: bool,
             as_json: bool, **options: Any) -> None:
    """Estimate one training step of MODEL on GPUS accelerators of SYSTEM under one parallel plan."""
    from meshplan.estimate import estimate as run

    where = {"seq": options.pop("seq"), "nvlink_domain": options.pop("nvlink_domain")}
    model, cluster = load_inputs(model_ref, system_ref, where["seq"], where["nvlink_domain"], gpus)
    stragglers, cap = conditions_of(options)
    shown, cluster = under(cluster, None, cap), under(cluster, stragglers, cap)
    fp8_scaling_given = options.get("stack_fp8_scaling") is not None
    if config is not None:
        plan, stack = _from_config(config, model, gpus, framework, options)
    else:
        stack = stack_of(framework, options)
        zero_given = options.get("plan_zero") is not None
        modules_given = options.get("plan_recompute_modules") is not None
        plan = plan_of(options, model, cluster)
        piped = plan.pp > 1 and stack.pipeline_runtime_mode.fsdp_nosync
        if not zero_given and stack.fsdp_mode.shards and plan.zero == 1 and not piped:
            # FSDP has no ZeRO-1: the default is its own, FULL_SHARD (torch FSDP's ShardingStrategy default,
            # torchtitan's fully_shard reshard_after_forward), i.e. ZeRO-3; on torch's pipeline runtime FSDP2 keeps
            # each stage gathered, ZeRO-1 (specs/check.fsdp_has_zero)
            plan = dataclasses.replace(plan, zero=3)
        if not modules_given and plan.recompute == "selective":  # the framework's own selective recompute
            plan = dataclasses.replace(plan, recompute_modules=stack_modules(plan.recompute_modules, stack))
        _runs(plan, stack, framework)
    if fp8_scaling_given and stack.fp8_scaling_mode.current and plan.precision != "fp8":
        raise SpecError(f"fp8-scaling={stack.fp8_scaling} needs --precision fp8 (not {plan.precision})")
    est = as_on(run(model, cluster, plan, stack), shown)
    hints = fit_hints(est)
    conditions = conditions_text(stragglers, cap, shown)
    search = _search_command(model_ref, system_ref, where, est, framework)
    refusals, notes = _refusals(model, plan, stack)
    unrun = [p for p in stack.supports.problems(plan) if config is None]  # the default framework's: JSON only
    host = host_note(est)
    if as_json:
        out = est.to_dict() | ({} if est.fits else {"fit_hints": [h.to_dict() for h in hints], "fit_search": search})
        out |= {"host_bound": host.to_dict()} if host else {}
        # plan's rule (fields.usable_hbm): "fits" is HBM alone, this one the headroom plan keeps free as well
        out["fits_headroom"] = bool(est.fits and est.peak_memory <= usable_hbm(est.cluster.accelerator.hbm_bytes))
        out |= {"refused_by_framework": refusals + unrun} if refusals or unrun else {}
        energy = step_energy(est)
        out |= {"energy": energy.as_dict()} if energy is not None else {}
        out |= {"conditions": conditions} if conditions else {}
        out |= {"notes": notes} if notes else {}
        click.echo(json.dumps(out, indent=None if show_ops else 2))
        return
    for note in notes:
        click.echo(f"note: {note}", err=True)
    from meshplan.report.console import plain_console
    from meshplan.report.text import estimate_tables

    console = plain_console()
    if conditions:
        console.print(conditions, highlight=False, markup=False)
    estimate_tables(est, console, ops=show_ops)
    if host is not None:
        console.print(host.text(), highlight=False, markup=False)
    if not est.fits:
        print_hints(est, hints, search, console)


def _refusals(model: Any, plan: Any, stack: Any) -> tuple[list[str], list[str]]:
    """What the stack's framework refuses of this plan (priced all the same: the search leaves such plans out), and
    the notes on the plan: those refusals and a TP overlap the framework turns off (specs/host_cost.py), which the
    text output prints on stderr and the JSON carries as ``notes``."""
    refusals = [f"{r.what} ({r.source})" for r in refused(stack.supports.refuses, plan, model, stack)]
    notes = [f"{stack.name} refuses this plan: {text}" for text in refusals]
    if stack.overlap_tp and plan.tp > 1 and not tp_hidden(stack, plan.sequence_parallel):
        notes.append(f"{stack.name} turns its TP overlap off without sequence parallelism (specs/host_cost.py): "
                     "the TP collectives are priced exposed")
    return refusals, notes


def _runs(plan: Any, stack: Any, framework: str) -> None:
    """A plan the named framework cannot run (its Supports: a 2D tensor layout under Megatron-Core, a schedule it
    lacks …) is refused when ``--framework`` names it; under the default framework it is priced (the JSON's
    refused_by_framework lists what it does not run)."""
    problems = stack.supports.problems(plan)
    named = click.get_current_context().get_parameter_source("framework") == click.core.ParameterSource.COMMANDLINE
    if problems and (named or framework != DEFAULT_FRAMEWORK):
        raise SpecError(f"framework {stack.name} does not run {problems[0]} (specs/supports.py: its "
                        f"{stack.supports.source or 'preset'}); --framework any prices every plan meshplan models")


def _search_command(model_ref: str, system_ref: str, where: dict, est: Estimate, framework: str) -> str:
    """The ``plan`` command line that searches every plan of this model, cluster, batch and framework."""
    args = ["meshplan", "plan", "--model", model_ref, "--system", system_ref, "--gpus", str(est.plan.num_gpus),
            "--global-batch", str(est.plan.global_batch)]
    args += [x for k, v in where.items() if v is not None for x in ("--" + k.replace("_", "-"), str(v))]
    args += ["--framework", est.stack.name] if est.stack.name != DEFAULT_FRAMEWORK else []
    return shlex.join(args)


def _from_config(path: str, model: ModelSpec, gpus: int, framework: str, options: dict) -> tuple:
    """``--from``: the config's plan and stack; a plan option or ``--framework`` beside it is refused (the config
    says them), a stack option overrides the stack the config gives."""
    from meshplan.cli.options import PLAN_PREFIX, STACK_PREFIX, stack_with
    from meshplan.configs import read

    given = sorted(k.removeprefix(PLAN_PREFIX) for k, v in options.items()
                   if k.startswith(PLAN_PREFIX) and v is not None)
    if given or framework != DEFAULT_FRAMEWORK:
        shown = given[0].replace("_", "-") if given else "framework"
        raise SpecError(f"--{shown} given with --from {path}: the config sets the plan and the framework")
    plan, stack = read(path, model, gpus)
    stack_options = {k.removeprefix(STACK_PREFIX): v for k, v in options.items() if k.startswith(STACK_PREFIX)}
    return plan, stack_with(stack, {k: v for k, v in stack_options.items() if v is not None})
