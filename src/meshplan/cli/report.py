"""``meshplan report`` and ``meshplan sweep``: pictures, an HTML report and design-space sweeps.

Registered by cli/main.py (``COMMANDS``). Imports stay inside the commands so that ``meshplan --help`` does not load
matplotlib, Ray or the search.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, overload

import click

from meshplan.cli.common import working
from meshplan.cli.options import stack_of, stack_options
from meshplan.cli.search_options import pop_search_options, search_options, search_space, space_settings
from meshplan.errors import MissingDependency, SpecError
from meshplan.files import make_dir, writable_dir
from meshplan.ranges import RANGES, check_options, step_tokens_problem
from meshplan.report.vega import require_report_extra

FACTORS = "0.5,1,2,4"  # --factors' default
SAMPLE = 10_000  # --sample's default: plans of the plan-space view (about 60 bytes each in the page)
MAX_FACTOR = RANGES["factors"].high  # a parameter scaled a million-fold (ranges.RANGES)
MAX_SAMPLE = 200_000  # a plan space of more points makes a page of tens of MB


def _model_options(f):
    for opt in reversed([
        click.option("--model", "model_ref", required=True, help="preset name, .toml file, HF config.json or Hub id"),
        click.option("--seq", type=int, default=None, help="sequence length (default: the model's; config.json: 4096)"),
        click.option("--global-batch", type=int, default=None, help="sequences per step (default ≈ 4M tokens)"),
    ]):
        f = opt(f)
    return f


def _run_options(f):
    for opt in reversed([
        click.option("--workers", type=int, default=None, help="local processes (default: all cores; 1: serial)"),
        click.option("--ray", "ray_address", default=None,
                     help="run the searches (sweep points, scaling curves) on Ray: 'auto', an address "
                          "(ray://host:10001), or 'local'"),
    ]):
        f = opt(f)
    return search_options(f)


def _run_settings(options: dict[str, Any]) -> tuple:
    """The values of ``_run_options``: the search options (removed from ``options``; search_options.py), workers,
    ray_address."""
    return pop_search_options(options), options["workers"], options["ray_address"]


def _global_batch(model, global_batch: int | None) -> int:
    from meshplan.cli.common import default_global_batch, sequences

    sequences(global_batch, "global-batch")
    gbs = global_batch if global_batch is not None else default_global_batch(model.seq_length, 1, 1)
    problem = step_tokens_problem(gbs, model.seq_length, "global-batch")
    if problem:
        raise SpecError(problem)
    return gbs


@overload
def _positive_ints(text: str, field: str) -> list[int]: ...
@overload
def _positive_ints(text: str | None, field: str) -> list[int] | None: ...
def _positive_ints(text: str | None, field: str) -> list[int] | None:
    from meshplan.cli.common import split_ints

    values = split_ints(text, field)
    if values is not None and (not values or min(values) < 1):
        raise SpecError(f"{field}={text!r} must be positive integers separated by commas")
    return values


def _scaling_counts(text: str | None, gpus: int, system: Any) -> list[int]:
    """``--scaling``: explicit counts, ``none``, or the default N/4, N/2, N, 2N (those the mesh can hold: whole
    NVLink domains, within the outermost tier's capacity of an N-tier network)."""
    if text is not None and text.strip().lower() in ("none", "off", ""):
        return []
    if text is not None:
        counts = _positive_ints(text, "scaling") or []
    else:
        counts = [gpus * k // 4 for k in (1, 2, 4, 8) if gpus * k % 4 == 0]
    domain = system.network.nvlink_domain
    fit = [n for n in counts if n % min(domain, n) == 0]
    if text is not None and len(fit) < len(counts):
        unfit = next(n for n in counts if n not in fit)
        raise SpecError(f"scaling={text!r}: {unfit} GPUs is not a whole number of {domain}-GPU NVLink domains")
    held = []
    for n in fit:
        try:
            system.cluster(n)
        except SpecError as exc:  # beyond the outermost tier's capacity
            if text is not None:
                raise SpecError(f"scaling={text!r}: {exc}") from None
            continue
        held.append(n)
    ok = sorted({*held, gpus})
    return ok if len(ok) > 1 else []


@click.command("report")
@_model_options
@click.option("--system", "system_ref", required=True, help="system preset (h100, gb200 …) or .toml file")
@click.option("--gpus", type=int, required=True, help="number of GPUs")
@click.option("--nvlink-domain", type=int, default=None, help="override the NVLink domain size")
@click.option("--top", "top_k", type=int, default=5, show_default=True, help="plans to show")
@click.option("--scaling", default=None,
              help="GPU counts for the scaling curves, e.g. 256,512,1024 (default: N/4,N/2,N,2N; 'none': skip)")
@click.option("--sample", type=int, default=SAMPLE, show_default=True,
              help="plans drawn for the plan-space view (its Pareto front is kept whole); 0: no plan space")
@click.option("--from", "config", default=None,
              help="your own plan: a framework config (Megatron-LM arguments, torchtitan TOML, DeepSpeed JSON, "
                   "Megatron-Bridge overrides), estimated and compared with the search's plans")
@click.option("--compare", default=None,
              help="the two plans the comparison opens on: two of #1, #2 ... (best plans), front1, front2 ... (the "
                   "Pareto front, fastest first), mine (--from), e.g. 'mine,#1' (default: mine,#1 or #1,#2)")
@_run_options
@stack_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("report.html"),
              show_default=True, help="the HTML file to write")
def report(model_ref: str, system_ref: str, gpus: int, top_k: int, output: Path, **options: Any) -> None:
    """Search the plans of MODEL on GPUS accelerators of SYSTEM and write one self-contained HTML report:
    best plans, the plan space (every plan scored, its Pareto front), two plans compared, the trust panel,
    step-time and memory breakdowns, pipeline timeline, per-op roofline and scaling curves."""
    from dataclasses import replace

    from meshplan.cli.common import MAX_TOP, model_at, working
    from meshplan.files import writable
    from meshplan.report.html import write
    from meshplan.search.explore import Explore
    from meshplan.search.key_store import shared_units
    from meshplan.search.limits import check_space
    from meshplan.search.run import search
    from meshplan.search.sweep import param_points
    from meshplan.specs.hardware import load_system

    seq, global_batch, nvlink_domain, scaling, sample, config, compare = (options[k] for k in (
        "seq", "global_batch", "nvlink_domain", "scaling", "sample", "config", "compare"))
    given, workers, ray_address = _run_settings(options)
    stack = stack_of(options.pop("framework"), options)
    if gpus < 1:
        raise SpecError(f"gpus={gpus} must be a positive integer")
    if not 0 < top_k <= MAX_TOP:
        raise SpecError(f"top={top_k} must be a positive integer up to {MAX_TOP}")
    if workers is not None and workers < 1:
        raise SpecError(f"workers={workers} must be a positive integer")
    if not 0 <= sample <= MAX_SAMPLE:
        raise SpecError(f"sample={sample} must be from 0 to {MAX_SAMPLE:,} plans")
    settings = space_settings(given, stack)
    check_options(workers=workers, nvlink_domain=nvlink_domain)
    writable(str(output), "output")
    model = model_at(model_ref, seq)
    gbs = _global_batch(model, global_batch)
    system = load_system(system_ref)
    if nvlink_domain is not None:
        system = replace(system, network=replace(system.network, nvlink_domain=nvlink_domain))
    cluster = system.cluster(gpus)
    space = search_space(settings, gbs, stack, system.accelerator.default_precision)
    counts = _scaling_counts(scaling, gpus, system)
    check_space(model, cluster, space)
    own = _config_estimate(config, model, cluster) if config else None
    require_report_extra()  # after the input checks: bad input gets its own message whatever is installed
    explore = Explore(sample=sample) if sample else None
    with working(f"report: {model.name} on {gpus} x {system_ref}"), shared_units():
        result = search(model, cluster, space, top_k=top_k, explore=explore)
        rows = None
        if counts:
            label = Path(system_ref).stem if system_ref.endswith(".toml") else system_ref
            points = param_points(model, [system], counts, gbs, space=space)
            points = [replace(p, label=label, explore=Explore(sample=0) if sample else None) for p in points]
            rows = _scaling_rows(points, result, workers, ray_address)
        path = write(output, result, rows, top=top_k, mine=own, compare=compare)
    size = path.stat().st_size
    click.echo(f"wrote {path} ({size / 1e6:.2f} MB): {len(result.plans)} plans"
               + (f", {len(result.explored):,} in the plan space with a front of {len(result.explored.front)}"
                  if result.explored else "")
               + (f", scaling over {', '.join(map(str, counts))} GPUs" if counts else ""))


def _scaling_rows(points: list, result, workers: int | None, ray_address: str | None) -> list[dict[str, Any]]:
    """The scaling curve's rows: the report's own search for its GPU count, the others searched (with their Pareto
    fronts, when the report draws the plan space). By default (no ``--workers``, no ``--ray``) as the strong-scaling
    plan runs its counts (cli/plan.py): in processes forked where cores are idle, the largest count first, else in
    this one, each search reusing the unit keys the report's own search priced (``shared_units``, held by the
    caller). A pool of every core, whose workers priced every key again and paid for their copied pages, took 1.3x the
    CPU seconds (0.91 / 0.71 and 0.82 / 0.64 s: Llama-3-70B's 64, 128 and 512 H100s beside 256, a loaded two-core
    machine, 2026-11-29)."""
    from meshplan.search.sweep import result_row, search_point, search_points
    from meshplan.search.workers import forked_map

    gpus = result.cluster.num_gpus
    others = [p for p in points if p.gpus != gpus]
    if workers is None and ray_address is None:
        rows = forked_map(lambda i: search_point(others[i]), sorted(range(len(others)), key=lambda i: -others[i].gpus))
    else:
        rows = search_points(others, workers=workers, ray_address=ray_address)
    done = dict(zip((p.gpus for p in others), rows, strict=True))
    done[gpus] = result_row(next(p for p in points if p.gpus == gpus), result)
    return [done[p.gpus] for p in points]


def _config_estimate(path: str, model, cluster):
    """``--from``: the config's plan run by the config's framework, estimated on this cluster."""
    from meshplan.configs import read
    from meshplan.estimate import estimate

    plan, stack = read(path, model, cluster.num_gpus)
    return estimate(model, cluster, plan, stack)


def _fastest_points(given: dict[str, Any]) -> None:
    """sweep takes the search's options but ranks each point by time alone: --simplest-first would change nothing."""
    if given["simplest_first"]:
        raise SpecError("simplest-first: each point of a sweep is its fastest plan (a scaling curve); plan and "
                        "report rank by it")


@click.command("sweep")
@_model_options
@click.option("--systems", default="a100,h200,b200", show_default=True,
              help="system presets or .toml files, separated by commas")
@click.option("--nvlink", default=None, help="NVLink domain sizes, e.g. 4,8,64 (default: each system's own)")
@click.option("--gpus", required=True, help="GPU counts, e.g. 512,1024,2048,4096")
@click.option("--param", "params", default=None,
              help="hardware parameters to scale (comma-separated): peak_flops, hbm_bandwidth, hbm_capacity, "
                   "nvlink_bandwidth, nic_bandwidth, nvlink_domain, nvlink_latency, nic_latency, host_bandwidth "
                   "(default: none, a strong-scaling sweep)")
@click.option("--factors", default=FACTORS, show_default=True, help="scale factors for --param")
@_run_options
@stack_options
@click.option("--format", "formats", default="png,svg", show_default=True,
              help="picture formats: png, svg; none: no pictures (sweep.csv and sweep.json only)")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), default=Path("sweep"),
              show_default=True, help="directory for sweep.csv, sweep.json and the pictures")
def sweep(model_ref: str, systems: str, gpus: str, output: Path, **options: Any) -> None:
    """Best-plan throughput of MODEL over GPU counts × systems × NVLink sizes (strong scaling) or over a
    hardware parameter's scale factors; writes CSV / JSON (pandas reads them) and PNG / SVG pictures (none with
    --format none)."""
    from meshplan.cli.common import model_at
    from meshplan.search.sweep import PARAMS, param_points, write_csv, write_json

    seq, global_batch, nvlink, params, factors, formats = (options[k] for k in (
        "seq", "global_batch", "nvlink", "params", "factors", "formats"))
    given, workers, ray_address = _run_settings(options)
    stack = stack_of(options.pop("framework"), options)
    model = model_at(model_ref, seq)
    gbs = _global_batch(model, global_batch)
    counts = _positive_ints(gpus, "gpus") or []
    domains = _positive_ints(nvlink, "nvlink") if nvlink is not None else [None]
    for n in counts:
        check_options(gpus=n)
    for domain in domains:
        check_options(nvlink=domain)
    refs = [s.strip() for s in systems.split(",") if s.strip()]
    if not refs:
        raise SpecError("systems is empty")
    names = [p.strip() for p in params.split(",")] if params is not None else ["none"]
    unknown = [name for name in names if name not in PARAMS] if params is not None else []
    if unknown:
        raise SpecError(f"param={unknown[0]!r} must be one of {', '.join(PARAMS)}")
    try:
        scale = [float(f) for f in factors.split(",") if f.strip()]
    except ValueError:
        raise SpecError(f"factors={factors!r} must be numbers separated by commas") from None
    if not scale or not all(1 / MAX_FACTOR <= f <= MAX_FACTOR for f in scale):
        raise SpecError(f"factors={factors!r} must be numbers from {1 / MAX_FACTOR:g} to {MAX_FACTOR:g}")
    if params is None and factors != FACTORS:
        raise SpecError(f"factors={factors} needs --param (the hardware parameter they scale)")
    kinds = [f.strip().lower() for f in formats.split(",")]
    for kind in (k for k in kinds if k not in ("png", "svg", "none")):
        raise SpecError(f"format={kind!r} must be png or svg (or none: no pictures)")
    if "none" in kinds and len(kinds) > 1:
        raise SpecError(f"format={formats!r}: none (no pictures) goes alone")
    if workers is not None and workers < 1:
        raise SpecError(f"workers={workers} must be a positive integer")
    check_options(workers=workers)
    _fastest_points(given)
    # bf16 unless given: param_points gives each system its GPU's own 16-bit precision; no headroom unless given; the
    # fastest plan of each point (a scaling curve), not the simplest within the error band
    space = search_space(space_settings(given, stack, headroom=0.0), gbs, stack, "bf16", prefer_simple=False)
    points = []
    for name in names:
        points += param_points(model, refs, counts, gbs, param=name, factors=scale, nvlink=domains, space=space)
    writable_dir(output, "output")
    with working(f"sweep: searching {len(points)} points", animate=False):  # its workers are forked
        rows = _search_or_keep(points, workers, ray_address, output)
    make_dir(output, "output")
    written = [write_csv(rows, output / "sweep.csv"), write_json(rows, output / "sweep.json")]
    if kinds != ["none"]:  # --format none: the rows only, matplotlib not loaded
        written += _pictures(rows, kinds, output)
    _print_rows(rows, written)


def _pictures(rows: list, kinds: list[str], output: Path) -> list:
    """The sweep's pictures in each of ``kinds``, written to ``output``; none, said on stderr, without matplotlib."""
    written: list = []
    try:
        from meshplan.report.plots import save
        from meshplan.report.sweep_plots import sweep_figures

        for key, fig in sweep_figures(rows).items():
            written += [save(fig, output / f"{key}.{kind}") for kind in kinds]
    except MissingDependency as exc:
        click.echo(f"meshplan: no pictures: {exc}", err=True)
    return written


def _search_or_keep(points: list, workers: int | None, ray_address: str | None, output: Path) -> list:
    """The sweep's rows; on Ctrl-C, the points that finished written to sweep.csv / sweep.json before it exits."""
    from meshplan.search.sweep import Interrupted, search_points, write_csv, write_json

    try:
        return search_points(points, workers=workers, ray_address=ray_address)
    except Interrupted as stop:  # keep the points that finished, then exit 130
        done = [r for r in stop.rows if r is not None]
        if done:
            make_dir(output, "output")
            kept = [write_csv(done, output / "sweep.csv"), write_json(done, output / "sweep.json")]
            click.echo(f"meshplan: interrupted: wrote the {len(done)} of {len(points)} points done to "
                       f"{', '.join(map(str, kept))}", err=True)
        raise


def _print_rows(rows, written: list) -> None:
    """The best plan per point, folded to the terminal's width (report/fold.py: numbers never cut, the plan wraps),
    and the files written."""
    from meshplan.report.console import terminal_console
    from meshplan.report.fold import Col, folded_tables
    from meshplan.units import fmt_bytes, fmt_count, fmt_time

    cells: dict[str, list[str]] = {h: [] for h in ("system", "NVLink", "GPUs", "param", "factor", "step", "tokens/s",
                                                   "MFU", "memory", "best plan")}
    for r in rows:
        found = bool(r["feasible"])
        values = [str(r["system"]), str(r["nvlink_domain"]), str(r["gpus"]), str(r["param"]), f"{r['factor']:g}",
                  fmt_time(r["step_time_s"]) if found else "", fmt_count(r["tokens_per_s"]) if found else "",
                  f"{r['mfu']:.1%}" if found else "", fmt_bytes(r["peak_memory_bytes"]) if found else "",
                  r["plan"] if found else "no feasible plan"]
        for h, v in zip(cells, values, strict=True):
            cells[h].append(v)
    key = Col("#", [str(i) for i in range(1, len(rows) + 1)])
    cols = [Col(h, c, "left" if h in ("system", "param", "best plan") else "right", wrap=h == "best plan")
            for h, c in cells.items()]
    console = terminal_console()
    for table in folded_tables("sweep: the best plan per point", key, cols, console.width,
                               ("system", "GPUs", "step", "tokens/s", "MFU", "memory")):
        console.print(table)
    console.print("wrote " + ", ".join(str(p) for p in written), markup=False, highlight=False)
    sys.stdout.flush()
