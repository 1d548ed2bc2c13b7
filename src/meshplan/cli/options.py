"""Command-line options generated from the specs' fields, and back: a (plan, stack) as ``estimate`` options.

Each field of ``Plan`` and ``Stack`` is defined once, with its help text, its choices and the command line's default
in the field's metadata (specs/plan.py, specs/stack.py); ``plan_options`` and ``stack_options`` make one option per
field from it, ``plan_of`` and ``stack_of`` build the specs from what was given, and ``estimate_args`` writes a plan
and a stack as the options that reproduce them, so that every plan ``plan`` prints can be re-run with ``estimate``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from meshplan.cli.common import default_global_batch, sequences
from meshplan.errors import SpecError
from meshplan.pipeline.registry import default_schedule
from meshplan.ranges import RANGES, check_options
from meshplan.specs.check import recompute_modules_problem
from meshplan.specs.hardware import Cluster
from meshplan.specs.layouts import layout_of
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import (
    DEFAULT_FRAMEWORK,
    TORCH_COMPILE_REGION_HOST,
    Stack,
    load_stack,
    stack_modules,
    stack_names,
)
from meshplan.specs.stack_variants import STATED

PLAN_PREFIX, STACK_PREFIX = "plan_", "stack_"
AXES = ("tp", "tp2", "pp", "cp", "dp")  # the axes whose product is the GPU count
# set from the other options when not given (the metadata's default_help says how)
COMPUTED = ("dp", "global_batch", "sequence_parallel", "precision", "schedule", "finetune", "offload_activations")


def plan_fields() -> list[dataclasses.Field]:
    """The fields of Plan the command line sets (not the search's tags)."""
    return [f for f in dataclasses.fields(Plan) if f.compare]


def flag(fld: dataclasses.Field) -> str:
    return "--" + (fld.metadata.get("flag") or fld.name).replace("_", "-")


def cli_default(fld: dataclasses.Field) -> Any:
    """The value an option not given stands for (None: computed from the others)."""
    return fld.metadata.get("cli_default", fld.default)


def _help(fld: dataclasses.Field, default: Any) -> str:
    shown = fld.metadata.get("default_help") or (",".join(default) if isinstance(default, tuple) else default)
    return f"{fld.metadata.get('help', '')} (default: {shown})"


def _option(fld: dataclasses.Field, dest: str, default: Any) -> Any:
    """One option for a field: a choice, a ``--x/--no-x`` switch, a comma-separated list, a number (seconds for a
    float field: ``--host-dispatch 15e-6``) or an integer, None unless given."""
    name, text, choices = flag(fld), _help(fld, default), fld.metadata.get("choices")
    if fld.type.startswith("bool"):
        return click.option(f"{name}/--no-{name[2:]}", dest, default=None, help=text)
    if fld.type.startswith("tuple"):
        return click.option(name, dest, default=None, help=text)
    if choices:
        return click.option(name, dest, type=click.Choice(choices), default=None, help=text)
    number = float if fld.type.removesuffix(" | None") == "float" else int
    return click.option(name, dest, type=number, default=None, help=text)


def plan_options(f: Any) -> Any:
    """An option for every field of Plan (``--tp``, ``--layout``, ``--sp/--no-sp`` ...)."""
    for fld in reversed(plan_fields()):
        f = _option(fld, PLAN_PREFIX + fld.name, cli_default(fld))(f)
    return f


def stack_options(f: Any) -> Any:
    """``--framework`` and an option for every behaviour field of Stack, each overriding the framework preset's
    value only when given."""
    for fld in reversed([x for x in dataclasses.fields(Stack) if x.compare]):
        f = _option(fld, STACK_PREFIX + fld.name, "the framework's")(f)
    return click.option("--framework", default=DEFAULT_FRAMEWORK, show_default=True,
                        help="the software stack: a preset (`meshplan presets` lists them; 'any': every plan meshplan "
                             "models) or a .toml file of Stack fields; the options below override its fields")(f)


def _given(options: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The options of one spec (removed from ``options``), by field name, with the ones not given left out."""
    mine = {k.removeprefix(prefix): options.pop(k) for k in [k for k in options if k.startswith(prefix)]}
    return {k: v for k, v in mine.items() if v is not None}


def stack_of(framework: str, options: dict[str, Any]) -> Stack:
    """The stack of ``--framework`` with the stack options that were given."""
    return stack_with(load_stack(framework), _given(options, STACK_PREFIX))


def stack_with(stack: Stack, given: dict[str, Any]) -> Stack:
    """``stack`` with the stack options ``given``: ``--compiled`` on a stack with no compiled region's host cost
    prices the one measured (TORCH_COMPILE_REGION_HOST, as a torchtitan job's ``[compile] enable`` reads) unless
    ``--region-host`` says another; ``--no-compiled`` drops it unless ``--region-host`` is given too (which the
    stack then refuses: a region's host time needs a compiled region). ``--tensor-host`` on a stack
    whose wrapper is picked per plan (``optimizer_wrapper``, cost/wrappers.py) states the wrapper's cost instead,
    unless ``--optimizer-wrapper`` is given too; ``--tensor-sharded`` alone there the stack refuses (specs/stack.py)."""
    if stack.wrapper.per_plan and "optimizer_wrapper" not in given and "tensor_host" in given:
        given = {**given, "optimizer_wrapper": STATED}
    if "compiled" in given and "region_host" not in given:
        given = {**given, "region_host": TORCH_COMPILE_REGION_HOST if given["compiled"] else 0.0}
        if given["compiled"] and stack.compiled and stack.region_host:
            given["region_host"] = stack.region_host
    return stack.with_(**given)


def recompute_modules(text: str) -> tuple[str, ...]:
    """``--recompute-modules`` as a tuple of known module names, each once (check.recompute_modules_problem)."""
    modules = tuple(m.strip() for m in text.split(","))
    problem = recompute_modules_problem(modules)
    if problem:
        raise SpecError(f"recompute-modules={text} {problem}")
    return modules


def placement(text: str) -> tuple[str, ...]:
    """``--placement`` as axes, innermost first: each of tp, cp, dp, pp once (tp2, the SUMMA grid's second axis,
    is optional and sits next to tp when left out)."""
    axes = tuple(a.strip() for a in text.split(","))
    if sorted(a for a in axes if a != "tp2") != sorted(("tp", "cp", "dp", "pp")) or axes.count("tp2") > 1:
        raise SpecError(f"placement={text} must order each of tp, cp, dp, pp once (and tp2 at most once)")
    return axes


def _checked(given: dict[str, Any]) -> dict[str, Any]:
    """Given values parsed (lists) and checked against their ranges before any arithmetic."""
    for name in AXES:
        if name in given and given[name] < 1:
            raise SpecError(f"{name}={given[name]} must be a positive integer")
    for name in ("micro_batch", "global_batch"):
        sequences(given.get(name), name.replace("_", "-"))
    check_options(**{k: v for k, v in given.items() if k in RANGES and isinstance(v, (int, float))
                     and not isinstance(v, bool) and (k != "lora_rank" or v != 0)})  # 0: full training (_computed)
    if "recompute_modules" in given:
        given["recompute_modules"] = recompute_modules(given["recompute_modules"])
    if "placement" in given:
        given["placement"] = placement(given["placement"])
    if "stage_recompute" in given:  # check.check_stage_settings says what is wrong with an entry
        given["stage_recompute"] = tuple(e.strip() for e in given["stage_recompute"].split(","))
    if "stage_offload" in given:
        given["stage_offload"] = stage_offload(given["stage_offload"])
    if "stage_layers" in given:
        given["stage_layers"] = stage_offload(given["stage_layers"], "stage-layers", "20,20,20,20")
    return given


def stage_offload(text: str, name: str = "stage-offload", example: str = "4,2,0,0") -> tuple[int, ...]:
    """``--stage-offload`` (or ``--stage-layers``) as a layer count per pipeline rank."""
    counts = tuple(e.strip() for e in text.split(","))
    if not all(c.isdigit() and len(c) < 7 for c in counts):
        raise SpecError(f"{name}={text} must list a non-negative layer count per pipeline rank, e.g. {example}")
    return tuple(int(c) for c in counts)


def _computed(values: dict[str, Any], given: dict[str, Any], model: ModelSpec, cluster: Cluster) -> dict[str, Any]:
    """The defaults that follow from the other options (each field's ``default_help``)."""
    if values["dp"] is None:
        other = values["tp"] * values["tp2"] * values["pp"] * values["cp"]
        if cluster.num_gpus % other:
            raise SpecError(f"tp*tp2*pp*cp = {other} does not divide gpus={cluster.num_gpus}")
        values["dp"] = cluster.num_gpus // other
    if values["global_batch"] is None:
        values["global_batch"] = default_global_batch(model.seq_length, values["dp"], values["micro_batch"])
    values["precision"] = values["precision"] or cluster.accelerator.default_precision
    if given.get("lora_rank") == 0:  # the option's 0 is full training (ranges.RANGES["lora_rank"].zero)
        if values["finetune"] == "lora":
            raise SpecError("lora-rank=0 is full training: --finetune lora needs a rank of 1 … 65,536")
        values["lora_rank"] = next(f.default for f in plan_fields() if f.name == "lora_rank")
    values["finetune"] = values["finetune"] or ("lora" if given.get("lora_rank", 0) > 0 else "full")
    if values["offload_activations"] is None:
        values["offload_activations"] = values["offload_layers"] > 0
    return values


def plan_of(options: dict[str, Any], model: ModelSpec, cluster: Cluster) -> Plan:
    """The Plan the plan options describe (removed from ``options``) for ``model`` on ``cluster``; what a plan may
    not be is ``check``'s to say."""
    given = _checked(_given(options, PLAN_PREFIX))
    values = _computed({f.name: given.get(f.name, cli_default(f)) for f in plan_fields()}, given, model, cluster)
    _no_effect(given, values)
    return Plan(**values)


def _no_effect(given: dict[str, Any], values: dict[str, Any]) -> None:
    """Options that the rest of the command line leaves without effect are refused rather than ignored."""
    if given.get("recompute_modules", ("core_attn",)) != ("core_attn",) and values["recompute"] != "selective":
        raise SpecError(f"recompute-modules={','.join(given['recompute_modules'])} needs --recompute selective "
                        f"(got {values['recompute']})")
    if given.get("summa_panels") is not None and not layout_of(values["tensor_layout"]).panels:
        raise SpecError(f"summa-panels={given['summa_panels']} needs --layout summa (got {values['tensor_layout']})")
    if given.get("lora_rank", 0) > 0 and given.get("finetune") == "full":
        raise SpecError(f"lora-rank={given['lora_rank']} needs --finetune lora (got full; or leave --finetune out)")
    if given.get("servers", 0) > 0 and values["dp_mode"] != "ps":
        raise SpecError(f"servers={given['servers']} needs --dp-mode ps (got {values['dp_mode']})")
    if "lora_targets" in given and values["finetune"] != "lora":
        raise SpecError(f"lora-targets={given['lora_targets']} needs --lora-rank or --finetune lora")


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _derived(plan: Plan) -> dict[str, Any]:
    """What the command line makes of the fields it computes from the plan's other fields (``plan_of``), and Plan of
    the fields it defaults from others; dp, the global batch and the precision depend on the cluster: stated."""
    return {"etp": plan.tp, "summa_panels": max(plan.tp, plan.tp2),
            "sequence_parallel": plan.tp > 1 and layout_of(plan.tensor_layout).sequence_parallel,
            "schedule": default_schedule(plan.vpp), "finetune": "full",
            "offload_activations": plan.offload_layers > 0}


def _plan_args(plan: Plan, stack: Stack) -> list[str]:
    """The options that reproduce ``plan`` under ``stack``: those whose value is not the command line's default
    (``recompute_modules``: the framework's own selective recompute, specs/stack.stack_modules)."""
    args: list[str] = []
    own = stack_modules(("core_attn",), stack) if plan.recompute == "selective" else ("core_attn",)
    derived = _derived(plan) | {"recompute_modules": own}
    for fld in plan_fields():
        value = getattr(plan, fld.name)
        if fld.name in derived and value == derived[fld.name]:
            continue
        if fld.name == "recompute_modules":  # not the framework's own: said, whatever the command line's default
            args += [flag(fld), _shown(value)]
            continue
        if fld.name not in COMPUTED and value == cli_default(fld):
            continue
        if fld.type.startswith("bool"):
            args.append(flag(fld) if value else f"--no-{flag(fld)[2:]}")
        else:
            args += [flag(fld), _shown(value)]
    return args


def _stack_args(stack: Stack) -> list[str]:
    """``--framework`` and the stack options where ``stack`` differs from that preset."""
    preset = stack.name if stack.name in stack_names() else "generic"
    base, args = load_stack(preset), ["--framework", preset]
    for fld in (x for x in dataclasses.fields(Stack) if x.compare):
        value = getattr(stack, fld.name)
        if value == getattr(base, fld.name):
            continue
        name = "--" + fld.name.replace("_", "-")
        args += [name if value else f"--no-{name[2:]}"] if fld.type == "bool" else [name, str(value)]
    return args


def estimate_args(plan: Plan, stack: Stack) -> list[str]:
    """``plan`` and ``stack`` as ``estimate`` options: ``plan_of`` and ``stack_of`` give them back."""
    return _plan_args(plan, stack) + _stack_args(stack)
