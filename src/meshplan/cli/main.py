"""Command line: parse arguments, call the API, print. Errors become one line on stderr and exit code 2."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys

import click

from meshplan.errors import MeshplanError, SpecError
from meshplan.fields import MAX_PLANS, MAX_SIZE, one_line
from meshplan.ranges import RANGES, check_options, step_tokens_problem
from meshplan.specs.plan import (
    LORA_TARGETS,
    PRECISION,
    RECOMPUTE_MODULES,
    fsdp_has_zero,
    recompute_modules_problem,
)
from meshplan.specs.stack import Stack, load_stack, stack_names

MAX_TOKENS = RANGES["tokens"].high  # the bounds of a token budget, a price and a plan count: ranges.RANGES
MAX_PRICE = RANGES["price"].high
MAX_TOP = int(RANGES["top"].high)
DEFAULT_BATCH_TOKENS = 4 * 2**20  # default global batch ≈ 4M tokens (GPT-3: 3.2M; Llama 2: 4M)


def default_global_batch(seq_length: int, dp: int, micro_batch: int) -> int:
    """≈ 4M tokens per step, rounded up to a whole number of dp × micro-batch sequences."""
    unit = dp * micro_batch
    return max(1, math.ceil(DEFAULT_BATCH_TOKENS / seq_length / unit)) * unit


def _split_ints(text: str | None, field: str) -> list[int] | None:
    if text is None:
        return None
    items = [v.strip() for v in text.split(",")]
    try:
        values = [int(v) for v in items]
    except ValueError:
        raise SpecError(f"{field}={text!r} must be integers separated by commas") from None
    return values


common_model = [
    click.option("--model", "model_ref", required=True, help="preset name, .toml file or HF config.json"),
    click.option("--system", "system_ref", required=True, help="system preset (h100, gb200 …) or .toml file"),
    click.option("--seq", "seq", type=int, default=None, help="sequence length (default: the model's)"),
    click.option("--nvlink-domain", type=int, default=None, help="override the NVLink domain size"),
]


def stack_options(f):
    """``--framework`` and an option for every behaviour field of Stack, generated from the field's metadata: a
    choice, a ``--x/--no-x`` switch or a number, each left unset (None) unless given, so that it overrides the
    framework preset's value only when the user states it."""
    for fld in reversed([x for x in dataclasses.fields(Stack) if x.compare]):
        flag = "--" + fld.name.replace("_", "-")
        help_text = fld.metadata.get("help", "") + " (default: the framework's)"
        if fld.metadata.get("choices"):
            option = click.option(flag, "stack_" + fld.name, type=click.Choice(fld.metadata["choices"]), default=None,
                                  help=help_text)
        elif fld.type == "bool":
            option = click.option(f"{flag}/--no-{flag[2:]}", "stack_" + fld.name, default=None, help=help_text)
        else:
            option = click.option(flag, "stack_" + fld.name, type=int, default=None, help=help_text)
        f = option(f)
    return click.option("--framework", default="generic", show_default=True,
                        help="the software stack: a preset (`meshplan presets` lists them) or a .toml file of "
                             "Stack fields; the options below override its fields")(f)


def stack_of(framework: str, options: dict) -> Stack:
    """The stack of ``--framework`` with the stack options that were given (``stack_options``; removed from
    ``options``)."""
    given = {k.removeprefix("stack_"): options.pop(k) for k in [k for k in options if k.startswith("stack_")]}
    return load_stack(framework).with_(**{k: v for k, v in given.items() if v is not None})


recompute_modules_option = click.option(
    "--recompute-modules", "recompute_modules_text", default="core_attn", show_default=True,
    help="with selective recompute: the modules recomputed, comma-separated (Megatron-Core's recompute_modules: "
         + ", ".join(RECOMPUTE_MODULES) + ")")


PRECISION_HELP = "default: bf16, or fp16 on a GPU without bf16 (V100)"


def recompute_modules(text: str) -> tuple[str, ...]:
    """``--recompute-modules`` as a tuple of known module names, each once (plan.recompute_modules_problem)."""
    modules = tuple(m.strip() for m in text.split(","))
    problem = recompute_modules_problem(modules)
    if problem:
        raise SpecError(f"recompute-modules={text} {problem}")
    return modules


def _apply(options):
    def deco(f):
        for opt in reversed(options):
            f = opt(f)
        return f
    return deco


def model_at(model_ref: str, seq: int | None):
    """The model of ``--model``, at ``--seq`` if given."""
    from meshplan.specs.model import load_model

    model = load_model(model_ref)
    if seq is not None:
        if not 0 < seq <= MAX_SIZE:
            raise SpecError(f"seq={seq} must be a positive integer up to {MAX_SIZE:,}")
        model = model.with_seq_length(seq)
    return model


def sequences(value: int | None, field: str) -> int | None:
    """A batch in sequences (``--global-batch``, ``--micro-batch``): positive and at most MAX_SIZE (the search
    enumerates its divisors)."""
    if value is not None and not 0 < value <= MAX_SIZE:
        raise SpecError(f"{field}={value} must be a positive integer up to {MAX_SIZE:,}")
    return value


def load_inputs(model_ref: str, system_ref: str, seq: int | None, nvlink_domain: int | None, gpus: int):
    from meshplan.specs.hardware import load_system

    model = model_at(model_ref, seq)
    system = load_system(system_ref)
    overrides = {"nvlink_domain": nvlink_domain} if nvlink_domain is not None else {}
    return model, system.cluster(gpus, **overrides)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="meshplan")
def cli() -> None:
    """meshplan: how fast will this model train on this hardware, will it fit, and which plan is best."""


@cli.command()
@_apply(common_model)
@click.option("--gpus", type=int, required=True, help="number of GPUs")
@click.option("--tp", type=int, default=1, show_default=True)
@click.option("--pp", type=int, default=1, show_default=True)
@click.option("--cp", type=int, default=1, show_default=True)
@click.option("--dp", type=int, default=None, help="default: gpus / (tp·pp·cp)")
@click.option("--ep", type=int, default=1, show_default=True)
@click.option("--etp", type=int, default=0, help="expert tensor parallel size (default: tp)")
@click.option("--vpp", type=int, default=1, show_default=True, help="virtual pipeline stages per rank")
@click.option("--last-stage-layers", type=int, default=0, show_default=True,
              help="layers on the last pipeline rank (Megatron-Core decoder_last_pipeline_num_layers; 0: even split)")
@click.option("--sp/--no-sp", "sequence_parallel", default=None, help="sequence parallelism (default: on if tp>1)")
@click.option("--micro-batch", type=int, default=1, show_default=True)
@click.option("--global-batch", type=int, default=None, help="sequences per step (default ≈ 4M tokens)")
@click.option("--zero", type=int, default=1, show_default=True, help="ZeRO stage 0-3 (1 = distributed optimizer)")
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default="selective",
              show_default=True)
@click.option("--recompute-layers", type=int, default=0, help="with --recompute full: layers per stage (0 = all)")
@recompute_modules_option
@click.option("--offload-optimizer", is_flag=True)
@click.option("--offload-activations", is_flag=True)
@click.option("--offload-layers", type=int, default=0, show_default=True,
              help="offload the saved activations of this many layers per stage (0 with --offload-activations: all)")
@click.option("--precision", type=click.Choice(PRECISION), default=None, help=PRECISION_HELP)
@click.option("--grad-bytes", type=int, default=4, show_default=True, help="bytes per gradient (4: fp32 main grads)")
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved"]), default=None,
              help="default: interleaved if vpp>1 else 1f1b")
@click.option("--placement", default="tp,cp,dp,pp", show_default=True, help="axis order on the mesh, innermost first")
@stack_options
@click.option("--lora-rank", type=int, default=0, show_default=True,
              help="LoRA fine-tuning with adapters of this rank (0: full training); base weights frozen")
@click.option("--lora-targets", type=click.Choice(LORA_TARGETS), default=LORA_TARGETS[0], show_default=True,
              help="with --lora-rank: adapters on every attention and MLP linear, or the QKV projection only")
@click.option("--ops", "show_ops", is_flag=True, help="print the per-op table")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def estimate(model_ref, system_ref, seq, nvlink_domain, gpus, tp, pp, cp, dp, ep, etp, vpp, last_stage_layers,
             sequence_parallel, micro_batch, global_batch, zero, recompute, recompute_layers, recompute_modules_text,
             offload_optimizer, offload_activations, offload_layers, precision, grad_bytes, schedule,
             placement, lora_rank, lora_targets, show_ops, as_json, framework, **stack_opts) -> None:
    """Estimate one training step of MODEL on GPUS accelerators of SYSTEM under one parallel plan."""
    from meshplan.estimate import estimate as run
    from meshplan.specs.plan import Plan

    model, cluster = load_inputs(model_ref, system_ref, seq, nvlink_domain, gpus)
    stack = stack_of(framework, stack_opts)
    for name, value in (("tp", tp), ("pp", pp), ("cp", cp), ("dp", dp)):
        if value is not None and value < 1:
            raise SpecError(f"{name}={value} must be a positive integer")
    check_options(tp=tp, pp=pp, cp=cp, dp=dp)  # each axis at most the largest cluster, before any arithmetic
    sequences(micro_batch, "micro-batch")
    sequences(global_batch, "global-batch")
    for name, value in (("recompute-layers", recompute_layers), ("offload-layers", offload_layers)):
        if value < 0:
            raise SpecError(f"{name}={value} must be >= 0")
        if value > -(-model.num_layers // pp):
            raise SpecError(f"{name}={value} is more than the {-(-model.num_layers // pp)} layers of a pipeline "
                            f"stage (num_layers={model.num_layers}, pp={pp})")
    if lora_targets != LORA_TARGETS[0] and not lora_rank:
        raise SpecError(f"lora-targets={lora_targets} needs --lora-rank (LoRA fine-tuning)")
    if recompute_layers and recompute != "full":
        raise SpecError(f"recompute-layers={recompute_layers} needs --recompute full (got {recompute})")
    modules = recompute_modules(recompute_modules_text)
    if modules != ("core_attn",) and recompute != "selective":
        raise SpecError(f"recompute-modules={recompute_modules_text} needs --recompute selective (got {recompute})")
    check_options(ep=ep, etp=etp, vpp=vpp, last_stage_layers=last_stage_layers, zero=zero, grad_bytes=grad_bytes,
                  lora_rank=lora_rank if lora_rank > 0 else None)  # a negative rank: Plan.check says it
    if dp is None:
        if gpus % (tp * pp * cp):
            raise SpecError(f"tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp} does not divide gpus={gpus}")
        dp = gpus // (tp * pp * cp)
    if global_batch is None:
        global_batch = default_global_batch(model.seq_length, dp, micro_batch)
    plan = Plan(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, last_stage_layers=last_stage_layers,
                sequence_parallel=tp > 1 if sequence_parallel is None else sequence_parallel,
                micro_batch=micro_batch, global_batch=global_batch, zero=zero, recompute=recompute,
                recompute_layers=recompute_layers, recompute_modules=modules, offload_optimizer=offload_optimizer,
                offload_activations=offload_activations or offload_layers > 0, offload_layers=offload_layers,
                precision=precision or cluster.accelerator.default_precision,
                grad_bytes=grad_bytes, schedule=schedule or ("interleaved" if vpp > 1 else "1f1b"),
                placement=_placement(placement),
                finetune="lora" if lora_rank else "full", lora_rank=lora_rank or 32, lora_targets=lora_targets)
    if stack.fp8_scaling != "delayed" and plan.precision != "fp8" and stack_opts.get("stack_fp8_scaling"):
        raise SpecError(f"fp8-scaling={stack.fp8_scaling} needs --precision fp8 (not {plan.precision})")
    est = run(model, cluster, plan, stack)
    if as_json:
        click.echo(json.dumps(est.to_dict(), indent=None if show_ops else 2))
        return
    from meshplan.report.text import _console, estimate_tables

    estimate_tables(est, _console(), ops=show_ops)


def _placement(text: str) -> tuple[str, ...]:
    """``--placement`` as axes, innermost first: each of tp, cp, dp, pp once (tp2, the SUMMA grid's second axis,
    is optional and sits next to tp when left out)."""
    axes = tuple(a.strip() for a in text.split(","))
    if sorted(a for a in axes if a != "tp2") != sorted(("tp", "cp", "dp", "pp")) or axes.count("tp2") > 1:
        raise SpecError(f"placement={text} must order each of tp, cp, dp, pp once (and tp2 at most once)")
    return axes


_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kMBGT]?)\s*$")
_COUNT_SCALE = {"": 1.0, "k": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def _parse_count(text: str, field: str) -> float:
    """``15T``, ``1.5e12``, ``400B`` → a positive number (a count, not a quantity with units)."""
    match = _COUNT.match(text)
    value = float(match.group(1)) * _COUNT_SCALE[match.group(2)] if match else 0.0
    if not 1 <= value <= MAX_TOKENS:
        raise SpecError(f"{field}={text!r} is not a count from 1 to {MAX_TOKENS:g} like '15T', '400B' or '1.5e12'")
    return value


def check_max_plans(value: int) -> None:
    """``--max-plans`` (plan, report, sweep): a count of plans, 0 for no limit."""
    if value < 0:
        raise SpecError(f"max-plans={value} must be a count of plans (0: no limit)")


def _choices(text: str, allowed: tuple[str, ...], field: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(","))
    if values == ("",):
        raise SpecError(f"{field} is empty")
    for v in values:
        if v not in allowed:
            raise SpecError(f"{field}={v!r} must be one of {', '.join(allowed)}")
    if not values:
        raise SpecError(f"{field} is empty")
    return values


@cli.command("plan")
@_apply(common_model)
@click.option("--gpus", required=True, help="GPU count, or several separated by commas (strong scaling)")
@click.option("--global-batch", type=int, default=None, help="sequences per step (default ≈ 4M tokens)")
@click.option("--top", "top_k", type=int, default=10, show_default=True, help="plans to list")
@click.option("--zero", "zero_opts", default="0,1,2,3", show_default=True, help="ZeRO stages to consider")
@click.option("--recompute", "recompute_opts", default="none,selective,full", show_default=True)
@recompute_modules_option
@click.option("--sp", "sp_opts", default="off,on", show_default=True, help="sequence parallelism options")
@click.option("--offload/--no-offload", default=True, show_default=True, help="consider optimizer / activation offload")
@click.option("--placements", type=click.Choice(["all", "default"]), default="all", show_default=True,
              help="every placement of the axes on the mesh, or tp,cp,dp,pp only")
@click.option("--max-micro-batch", type=int, default=64, show_default=True)
@click.option("--max-plans", type=int, default=MAX_PLANS, show_default=True,
              help="refuse a search space of more plans than this (0: no limit)")
@click.option("--precision", type=click.Choice(PRECISION), default=None, help=PRECISION_HELP)
@click.option("--grad-bytes", type=int, default=4, show_default=True)
@stack_options
@click.option("--tokens", default=None, help="token budget (e.g. 15T) to report days and cost")
@click.option("--price", type=float, default=None, help="price per GPU-hour, for --tokens")
@click.option("--rank", "rank_by", type=click.Choice(["time", "cost"]), default="time", show_default=True,
              help="across GPU counts: fastest, or cheapest for the token budget")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def plan_cmd(model_ref, system_ref, seq, nvlink_domain, gpus, global_batch, top_k, zero_opts, recompute_opts,
             recompute_modules_text, sp_opts, offload, placements, max_micro_batch, max_plans, precision,
             grad_bytes, framework, tokens, price, rank_by, as_json, **stack_opts) -> None:
    """Search every parallel plan of MODEL on GPUS accelerators of SYSTEM and rank the feasible ones."""
    from meshplan.search.run import search
    from meshplan.search.space import Space

    counts = _split_ints(gpus, "gpus") or []
    if not counts or min(counts) < 1:
        raise SpecError(f"gpus={gpus!r} must be positive integers")
    check_max_plans(max_plans)
    check_options(top=top_k, max_micro_batch=max_micro_batch, max_plans=max_plans or None, grad_bytes=grad_bytes)
    stack = stack_of(framework, stack_opts)
    zeros = tuple(z for z in map(int, _choices(zero_opts, ("0", "1", "2", "3"), "zero"))
                  if fsdp_has_zero(stack.fsdp, z))
    if not zeros:
        raise SpecError(f"zero={zero_opts} leaves no stage for fsdp={stack.fsdp} (FSDP has no ZeRO-1)")
    recomputes = _choices(recompute_opts, ("none", "selective", "full"), "recompute")
    modules = recompute_modules(recompute_modules_text)
    if modules != ("core_attn",) and "selective" not in recomputes:
        raise SpecError(f"recompute-modules={recompute_modules_text} needs selective among --recompute "
                        f"(got {recompute_opts})")
    sps = tuple(v == "on" for v in _choices(sp_opts, ("off", "on"), "sp"))
    sequences(global_batch, "global-batch")
    budget = _parse_count(tokens, "tokens") if tokens is not None else None
    if price is not None and not 0 <= price <= MAX_PRICE:
        raise SpecError(f"price={price} must be a number from 0 to {MAX_PRICE:g} per GPU-hour")
    if price is not None and budget is None:
        raise SpecError(f"price={price} needs --tokens (the budget it prices)")
    if rank_by == "cost" and budget is None:
        raise SpecError("rank=cost needs --tokens (the budget whose cost it ranks)")
    clusters = [load_inputs(model_ref, system_ref, seq, nvlink_domain, n) for n in counts]  # all, before any search
    model = clusters[0][0]
    gbs = global_batch or default_global_batch(model.seq_length, 1, 1)  # sequences() checked a stated one
    tokens_problem = step_tokens_problem(gbs, model.seq_length, "global-batch")
    if tokens_problem:
        raise SpecError(tokens_problem)
    results = []
    for model, cluster in clusters:
        space = Space(global_batch=gbs, zero=zeros, recompute=recomputes, recompute_modules=modules,
                      sequence_parallel=sps,
                      offload_optimizer=(False, True) if offload else (False,),
                      offload_activations=(False, True) if offload else (False,),
                      all_placements=placements == "all", max_micro_batch=max_micro_batch,
                      precision=precision or cluster.accelerator.default_precision, grad_bytes=grad_bytes,
                      stack=stack, max_plans=max_plans)
        with _progress(as_json) as progress:
            results.append(search(model, cluster, space, top_k=top_k, progress=progress))
    from meshplan.report.text import print_search

    print_search(results, as_json=as_json, tokens=budget, price=price, rank_by=rank_by)


class _progress:
    """A progress bar on stderr for searches that take more than a moment (interactive terminals only)."""

    def __init__(self, quiet: bool):
        self.quiet, self.bar, self.task = quiet or not sys.stderr.isatty(), None, None

    def __enter__(self):
        if self.quiet:
            return None
        from rich.progress import Progress

        self.bar = Progress(transient=True)
        self.bar.__enter__()
        self.task = self.bar.add_task("evaluating plans (jobs)", total=None)
        return self.update

    def update(self, done: int, total: int) -> None:
        self.bar.update(self.task, completed=done, total=total)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


@cli.command("validate")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--group", default=None, help="only the runs of this source group")
@click.option("--exclude-superseded", is_flag=True,
              help="skip the older numbers of configurations a newer record also gives (evaluated by default)")
@click.option("--hybrid", is_flag=True,
              help="also compare the runs kept apart: hybrid Mamba models with a latent MoE (Nemotron 3 Super), whose "
                   "residual error is not explained")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def validate_cmd(path: str, group: str | None, exclude_superseded: bool, hybrid: bool, as_json: bool) -> None:
    """Predict every run of a published-runs JSONL file and compare with what was measured."""
    from meshplan_validation.validate import validate_command

    click.echo(validate_command(path, group, as_json, exclude_superseded, hybrid))


@cli.command("calibrate")
@click.option("--world-size", type=int, default=None, help="local ranks (default: the mesh's size, the GPUs, or 2)")
@click.option("--mesh", default=None, help="mesh to time collectives on, innermost first, e.g. 2x4 (default: "
              "discovered from pairwise bandwidths)")
@click.option("--quick", is_flag=True, help="small sizes: a smoke test in seconds, not a calibration")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--base", "base_ref", default=None, help="system preset or .toml whose datasheet peaks, TDP and "
              "unmeasured links are kept")
@click.option("--out", default=None, help="write the calibrated system as a hardware TOML (use it as --system)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (fits and raw measurements)")
def calibrate_cmd(world_size, mesh, quick, device, base_ref, out, as_json) -> None:
    """Time GEMMs, memory-bound kernels and collectives on this host with PyTorch and fit meshplan's constants."""
    from meshplan.calibrate import calibrate, parse_mesh, write_system
    from meshplan.files import writable
    from meshplan.specs.hardware import load_system

    shape = parse_mesh(mesh, world_size)
    if base_ref == "":
        raise SpecError("base='' is empty: give a system preset or a .toml file")
    if out is not None and not out.lower().endswith(".toml"):
        raise SpecError(f"out={out!r} must end in .toml")
    if out is not None:
        writable(out, "out")
    base = load_system(base_ref, "base") if base_ref else None
    cal = calibrate(world_size=world_size, mesh=shape, quick=quick, device=device, base=base)
    if out is not None:
        write_system(cal, out, base)
    if as_json:
        click.echo(json.dumps(cal.to_dict(), indent=2))
        return
    from meshplan.calibrate.report import print_calibration
    from meshplan.report.text import _console

    print_calibration(cal, _console(), out)


@cli.command("trace")
@click.argument("model_ref", metavar="MODULE:FACTORY")
@click.option("--input-shape", "shapes", multiple=True, required=True, help="e.g. 2x32; repeat for more inputs")
@click.option("--dtype", "dtypes", multiple=True, help="input dtype, one or one per input (default int64)")
@click.option("--system", "system_ref", default="h100", show_default=True, help="system preset or .toml file")
@click.option("--param-dtype", default=None, help="cast the model's floating-point weights, e.g. bfloat16")
@click.option("--optimizer", default="adam", show_default=True, help="state in the peak: adam(w), momentum, sgd, none")
@click.option("--top", type=int, default=20, show_default=True, help="ops to list")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def trace_cmd(model_ref, shapes, dtypes, system_ref, param_dtype, optimizer, top, as_json) -> None:
    """Trace a PyTorch model (MODULE:FACTORY or file.py:FACTORY returns an nn.Module) on fake tensors: per-op
    time on one GPU of SYSTEM, FLOPs and the liveness peak memory of one forward + backward pass."""
    from meshplan.trace.command import render, run

    if top < 1:
        raise SpecError(f"top={top} must be a positive integer")
    report = run(model_ref, shapes, dtypes, system_ref, param_dtype, optimizer)
    if as_json:
        click.echo(json.dumps(report.to_dict(top), indent=2))
        return
    from meshplan.report.text import _console

    render(report, _console(), top)


@cli.command("presets")
def presets() -> None:
    """List the built-in model and system presets."""
    from meshplan.specs.hardware import system_names
    from meshplan.specs.model import preset_names

    click.echo("models:     " + " ".join(preset_names()))
    click.echo("systems:    " + " ".join(system_names()))
    click.echo("frameworks: " + " ".join(stack_names()))


def _register_extra_commands() -> None:
    """Commands defined beside the code they drive (report / sweep in meshplan.cli.report)."""
    try:
        from meshplan.cli import report as commands
    except ImportError:  # pragma: no cover - the module is optional while it is being written
        return
    for command in commands.COMMANDS:
        cli.add_command(command)


_register_extra_commands()


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI; any bad input becomes one line on stderr and exit status 2."""
    try:
        cli.main(args=argv, prog_name="meshplan", standalone_mode=False)
    except MeshplanError as exc:
        click.echo(f"meshplan: error: {one_line(str(exc))}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("meshplan: aborted", err=True)
        return 130
    except click.ClickException as exc:
        click.echo(f"meshplan: error: {one_line(exc.format_message())}", err=True)
        return 2
    except Exception as exc:  # noqa: BLE001  (a bug, not bad input: still one line, and how to see more)
        if os.environ.get("MESHPLAN_DEBUG"):
            raise
        first = one_line((str(exc).strip().splitlines() or [""])[0])
        click.echo(f"meshplan: internal error: {type(exc).__name__}: {first} (a bug in meshplan: please report "
                   "the command; MESHPLAN_DEBUG=1 shows the traceback)", err=True)
        return 3
    return 0


def run() -> None:
    """Console-script wrapper: exit with main()'s status."""
    sys.exit(main())
