"""``meshplan plan`` with the sharding planner: any PyTorch model (``module.py:factory``), a Hugging Face config.json
or a preset (with ``--autoshard``), sharded op by op on the cluster's mesh (meshplan.autoshard)."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import click
from click.core import ParameterSource

from meshplan.cli.search_options import NAMES as SEARCH_OPTIONS
from meshplan.errors import MissingDependency, SpecError
from meshplan.fields import MAX_SIZE, MEMORY_HEADROOM
from meshplan.specs.model_load import preset_names

# the template search's options (plan.py), which the sharding planner does not read: refused when given
SEARCH_ONLY = ("top_k", *(n for n in SEARCH_OPTIONS if n not in ("headroom", "optimizer")), "tokens", "price",
               "rank_by", "framework", "emit_format", "emit_to")

options = [
    click.option("--autoshard", is_flag=True, help="plan a preset or config.json with the sharding planner "
                 "(op-by-op placements, ILP + pipeline stages); implied by MODULE:FACTORY"),
    click.option("--input-shape", "input_shapes", multiple=True, help="MODULE:FACTORY's inputs, e.g. 8x1024; repeat"),
    click.option("--dtype", "dtypes", multiple=True, help="input dtype, one or one per input (default: int64 token "
              "ids for a model with an embedding, else the parameters' dtype)"),
    click.option("--param-dtype", default="bfloat16", show_default=True, help="cast the parameters (none: as built)"),
    click.option("--micro-batches", type=int, default=1, show_default=True,
                 help="micro-batches per step (the traced batch is global / micro-batches); pipelines need >= stages"),
    click.option("--mesh", "mesh_text", default=None, help="device mesh shape, e.g. 8x8 (default: the tiers)"),
    click.option("--stages", type=click.Choice(["off", "auto", "search"]), default="auto", show_default=True,
                 help="pipeline stages: never, when one stage does not fit, or always searched"),
]


def is_factory(model_ref: str) -> bool:
    """MODULE:FACTORY (not a preset, a .toml or a config.json)."""
    return ":" in model_ref and model_ref not in preset_names() and not model_ref.endswith((".json", ".toml"))


def wants_planner(model_ref: str, opts: dict[str, Any]) -> bool:
    return is_factory(model_ref) or bool(opts.get("autoshard"))


def _refuse_search_options(ctx: click.Context) -> None:
    given = [name for name in SEARCH_ONLY if name in ctx.params and
             ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE]
    if given:
        flag = next(p.opts[0] for p in ctx.command.params if p.name == given[0])
        raise SpecError(f"{flag} is an option of the template search, which the sharding planner does not run "
                        "(leave it out, or drop --autoshard / MODULE:FACTORY)")


def _shape(text: str, field: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise SpecError(f"{field}={text!r} must be positive integers separated by 'x' (e.g. 8x8)")
    return shape


def _checked(model_ref: str, gpus: str, opts: dict[str, Any]) -> tuple[int, dict[str, Any], tuple]:
    """The planner's GPU count, its options (the search's default headroom where none is given) and input shapes,
    each bad value refused in one line."""
    if "," in gpus:
        raise SpecError(f"gpus={gpus!r}: the sharding planner plans one GPU count at a time")
    try:
        count = int(gpus)
    except ValueError:
        count = 0
    if count < 1:
        raise SpecError(f"gpus={gpus!r} must be a positive integer")
    if opts["micro_batches"] < 1:
        raise SpecError(f"micro-batches={opts['micro_batches']} must be a positive integer")
    if opts["headroom"] is None:  # the search's default (search_options.py)
        opts = {**opts, "headroom": MEMORY_HEADROOM}
    if not 0 <= opts["headroom"] < 1:
        raise SpecError(f"headroom={opts['headroom']} must be in [0, 1)")
    if opts["global_batch"] is not None and opts["global_batch"] < 1:
        raise SpecError(f"global-batch={opts['global_batch']} must be a positive integer")
    if opts["global_batch"] is not None and is_factory(model_ref):
        raise SpecError(f"global-batch={opts['global_batch']}: a MODULE:FACTORY model's batch is its --input-shape "
                        "(the first dimension of each input); leave --global-batch out")
    if opts["seq"] is not None and not 0 < opts["seq"] <= MAX_SIZE:  # 0 was silently the model's default
        raise SpecError(f"seq={opts['seq']} must be a positive integer up to {MAX_SIZE:,}")
    if opts["seq"] is not None and is_factory(model_ref):
        raise SpecError(f"seq={opts['seq']}: a MODULE:FACTORY model's sequence is its --input-shape; leave --seq out")
    shapes = tuple(_shape(s, "input-shape") for s in opts["input_shapes"])
    if shapes and not is_factory(model_ref):
        raise SpecError("input-shape is for a MODULE:FACTORY model; a preset or config.json takes --global-batch and "
                        "--seq")
    return count, opts, shapes


def run_planner(ctx: click.Context, model_ref: str, system_ref: str, gpus: str, as_json: bool,
                opts: dict[str, Any]) -> None:
    """Check the options, run the planner, print tables or JSON."""
    _refuse_search_options(ctx)
    count, opts, shapes = _checked(model_ref, gpus, opts)
    mesh = _shape(opts["mesh_text"], "mesh") if opts["mesh_text"] else None
    needed = [("torch", "torch"), ("scipy", "solve")]
    needed += [("transformers", "hf")] if model_ref.endswith(".json") else []
    for module, extra in needed:
        if importlib.util.find_spec(module) is None:  # before any work: the extra that brings it
            raise MissingDependency(module, extra)
    from meshplan.autoshard.planner import Request, plan_sharding

    param_dtype = None if opts["param_dtype"] in ("none", "") else opts["param_dtype"]
    request = Request(model=model_ref, system=system_ref, gpus=count, input_shapes=shapes,
                      dtypes=tuple(opts["dtypes"]), param_dtype=param_dtype,
                      global_batch=opts["global_batch"], seq=opts["seq"], micro_batches=opts["micro_batches"],
                      mesh=mesh, headroom=opts["headroom"], stages=opts["stages"],
                      nvlink_domain=opts["nvlink_domain"], optimizer=opts["optimizer"],
                      host_dispatch=opts.get("stack_host_dispatch"))  # --host-dispatch, else eager PyTorch's
    from meshplan.autoshard.solve import collector_paused
    from meshplan.cli import SCRIPT
    from meshplan.cli.common import working

    with collector_paused(frozen=SCRIPT):  # the plan and its printed program's price (report/shard.py)
        with working(f"sharding {model_ref} on {count} x {system_ref}", quiet=as_json):
            result = plan_sharding(request)
        from meshplan.report.shard import shard_tables, to_dict

        if as_json:
            click.echo(json.dumps(to_dict(result), indent=2, default=float))
            return
        from meshplan.report.console import terminal_console

        shard_tables(result, terminal_console())
