"""``meshplan calibrate``, ``trace`` and ``presets``: the commands that measure a machine, cost a PyTorch module, and
list what is built in."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from meshplan.errors import SpecError
from meshplan.specs.stack import stack_names

if TYPE_CHECKING:
    from meshplan.calibrate.settings import Settings


@click.command("calibrate")
@click.option("--world-size", type=int, default=None, help="local ranks (default: the mesh's size, the GPUs, or 2)")
@click.option("--mesh", default=None, help="mesh to time collectives on, innermost first, e.g. 2x4 (default: "
              "discovered from pairwise bandwidths)")
@click.option("--quick", is_flag=True, help="small sizes: a smoke test in seconds, not a calibration")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--threads", type=int, default=None, help="intra-op threads of the GEMM and memory benchmarks: the "
              "training step's (default: PyTorch's)")
@click.option("--model", "model_ref", default=None, help="shape the benchmarks like this model's ops: a check-step "
              "zoo name or MODULE:FACTORY (its GEMM shapes, element-wise sizes and gradient sizes)")
@click.option("--base", "base_ref", default=None, help="system preset or .toml whose datasheet peaks, TDP and "
              "unmeasured links are kept")
@click.option("--out", default=None, help="write the calibrated system as a hardware TOML (use it as --system)")
@click.option("--stack-out", default=None, help="write --stack-base with host_dispatch set to this host's measured "
              "cost per eager PyTorch call, as a stack TOML (use it as --framework)")
@click.option("--stack-base", default="generic", show_default=True, help="stack preset or .toml that --stack-out "
              "copies")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (fits and raw measurements)")
def calibrate_cmd(world_size: int | None, mesh: str | None, quick: bool, device: str, **options: Any) -> None:
    """Time GEMMs, memory-bound kernels and collectives on this host with PyTorch and fit meshplan's constants."""
    from dataclasses import replace

    from meshplan.calibrate import calibrate, parse_mesh, settings_for, write_system
    from meshplan.calibrate.bench import resolve_device
    from meshplan.files import writable
    from meshplan.specs.hardware import load_system

    shape = parse_mesh(mesh, world_size)
    base_ref, out = options["base_ref"], options["out"]
    if base_ref == "":
        raise SpecError("base='' is empty: give a system preset or a .toml file")
    if out is not None and not out.lower().endswith(".toml"):
        raise SpecError(f"out={out!r} must end in .toml")
    if out is not None:
        writable(out, "out")
    stack_out = options["stack_out"]
    if stack_out is not None:
        from meshplan.calibrate.stackfile import preset_text

        if not stack_out.lower().endswith(".toml"):
            raise SpecError(f"stack-out={stack_out!r} must end in .toml")
        writable(stack_out, "stack-out")
        preset_text(options["stack_base"])  # a bad base refused before measuring
    base = load_system(base_ref, "base") if base_ref else None
    if options["threads"] is not None and not 1 <= options["threads"] <= 1024:  # before torch is imported
        raise SpecError(f"threads={options['threads']} must be an integer from 1 to 1024")
    settings = replace(settings_for(resolve_device(device), quick), threads=options["threads"])
    if options["model_ref"]:
        settings = _shaped_like(str(options["model_ref"]), settings)
    from meshplan.cli.common import working

    with working("calibrating this host: GEMMs, memory-bound kernels, collectives", quiet=options["as_json"],
                 animate=False):  # its ranks are forked
        cal = calibrate(world_size=world_size, mesh=shape, quick=quick, device=device, base=base, settings=settings)
    if out is not None:
        write_system(cal, out, base)
    if stack_out is not None:
        from meshplan.calibrate.stackfile import write_stack

        write_stack(cal, stack_out, options["stack_base"])
    if options["as_json"]:
        click.echo(json.dumps(cal.to_dict(), indent=2))
        return
    from meshplan.calibrate.report import print_calibration
    from meshplan.report.console import terminal_console

    print_calibration(cal, terminal_console(), out)
    if stack_out is not None:
        click.echo(f"wrote {stack_out}")


def _shaped_like(ref: str, settings: Settings) -> Settings:
    """``settings`` with the GEMM shapes, element-wise sizes and gradient sizes of ``ref``'s traced step."""
    from meshplan.calibrate.settings import settings_for_trace
    from meshplan.measure.check import trace_step
    from meshplan.measure.command import load_target, optimizer_factory

    target = load_target(ref)
    trace, _ = trace_step(target.model, target.inputs, optimizer_factory("adamw", list(target.model.parameters())))
    return settings_for_trace(trace, settings)


@click.command("trace")
@click.argument("model_ref", metavar="MODULE:FACTORY")
@click.option("--input-shape", "shapes", multiple=True, required=True, help="e.g. 2x32; repeat for more inputs")
@click.option("--dtype", "dtypes", multiple=True, help="input dtype, one or one per input (default: int64 token "
              "ids for a model with an embedding, else the parameters' dtype)")
@click.option("--system", "system_ref", default="h100", show_default=True, help="system preset or .toml file")
@click.option("--param-dtype", default=None, help="cast the model's floating-point weights, e.g. bfloat16")
@click.option("--optimizer", default="adam", show_default=True,
              help="state in the peak, as Plan.optimizer names it (momentum: sgd-momentum), or none")
@click.option("--top", type=int, default=20, show_default=True, help="ops to list")
@click.option("--ops", "all_ops", is_flag=True, help="list every op in order (with its launches, fixed overhead "
              "and fused chain), not the top ones")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def trace_cmd(model_ref: str, shapes: tuple[str, ...], dtypes: tuple[str, ...], system_ref: str,
              param_dtype: str | None, optimizer: str, top: int, **flags: bool) -> None:
    """Trace a PyTorch model (MODULE:FACTORY or file.py:FACTORY returns an nn.Module) on fake tensors: per-op
    time on one GPU of SYSTEM, FLOPs and the liveness peak memory of one forward + backward pass."""
    from meshplan.trace.command import trace_report, trace_tables

    if top < 1:
        raise SpecError(f"top={top} must be a positive integer")
    report = trace_report(model_ref, shapes, dtypes, system_ref, param_dtype, optimizer)
    if flags["as_json"]:
        click.echo(json.dumps(report.to_dict(top), indent=2))
        return
    from meshplan.report.console import terminal_console

    trace_tables(report, terminal_console(), 0 if flags["all_ops"] else top)


@click.command("presets")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def presets(as_json: bool) -> None:
    """List the built-in model, system and framework presets, one a row with their sizes (plain columns: they read
    in a pipe, grep and sort as well as on a terminal)."""
    rows = _preset_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for kind, table in rows.items():
        heads = list(table[0])
        cells = [[str(row[h]) for h in heads] for row in table]
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
        click.echo(f"{kind} ({len(table)})")
        for line in [heads, *cells]:
            click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        click.echo("")


def _preset_rows() -> dict[str, list[dict[str, Any]]]:
    """Each preset's row: a model's parameters (all, and active per token for a MoE), layers, width, experts and
    sequence; a system's accelerator, HBM, dense bf16 peak and NVLink domain; a framework's source."""
    from meshplan.specs.hardware import load_system, system_names
    from meshplan.specs.model_load import load_model, preset_names
    from meshplan.specs.stack import load_stack
    from meshplan.units import fmt_bytes, fmt_count

    models = []
    for name in preset_names():
        m = load_model(name)
        models.append({"name": name, "params": fmt_count(m.params()),
                       "active": fmt_count(m.params(active=True)) if m.is_moe else "-", "layers": m.num_layers,
                       "hidden": m.hidden_size, "experts": f"{m.moe_topk}/{m.num_experts}" if m.is_moe else "-",
                       "seq": m.seq_length})
    systems = []
    for name in system_names():
        s = load_system(name)
        acc = s.accelerator
        systems.append({"name": name, "accelerator": acc.name, "HBM": fmt_bytes(acc.hbm_bytes),
                        "bf16 TFLOP/s": f"{acc.peak_flops.get('bf16', 0) / 1e12:,.0f}",
                        "NVLink domain": s.network.nvlink_domain or "-"})
    stacks = [{"name": name, "source": load_stack(name).source[:90]} for name in stack_names()]
    return {"models": models, "systems": systems, "frameworks": stacks}
