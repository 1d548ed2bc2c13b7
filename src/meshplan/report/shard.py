"""The sharding planner's answer for the terminal and for scripts: the best plan's time and memory, its placements
as DTensor prints them and as a ``parallelize_module`` plan, the collectives it inserts, the pipelines considered."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from meshplan.autoshard.as_written import AsWritten, as_written
from meshplan.autoshard.output import inserted, params
from meshplan.autoshard.placement import describe, short
from meshplan.autoshard.program import parallelize_code
from meshplan.autoshard.solve import Sharding
from meshplan.autoshard.stages import Pipeline
from meshplan.units import fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from rich.console import Console, JustifyMethod

    from meshplan.autoshard.planner import Result


def _sharding(result: Result) -> Sharding:
    best = result.best
    return best.intra if isinstance(best, Pipeline) else best


_PROGRAMS: dict[int, tuple[Sharding, AsWritten]] = {}


def program(result: Result) -> AsWritten | None:
    """The printed program's price (autoshard/as_written.py) where the best plan is one intra-operator plan that
    fits; None for a pipeline (the program printed is one stage's) or no plan. Solved once per plan shown."""
    best = result.best
    if isinstance(best, Pipeline) or not best.choice or not best.fits:
        return None
    if id(best) not in _PROGRAMS:
        _PROGRAMS[id(best)] = (best, as_written(best))  # the plan kept beside it: its id stays its own
    return _PROGRAMS[id(best)][1]


def _program_dict(result: Result) -> dict[str, Any] | None:
    written = program(result)
    if written is None:
        return None
    return {"step_time_s": written.sharding.step_time, "plan_step_time_s": result.best.step_time,
            "fits": written.sharding.fits, "parameters_written_otherwise": list(written.changed),
            "left_out": list(written.left_out), "gathered_outputs_not_priced": written.unpriced}


def to_dict(result: Result, top: int = 12) -> dict[str, Any]:
    """One JSON object: the request, the best plan (time, memory, stages), every parameter's placements, the
    parallelize_module code, the inserted collectives, every pipeline considered and the solver's timings."""
    best, sharding = result.best, _sharding(result)
    price = sharding.price
    out: dict[str, Any] = {
        "model": result.name, "params": result.params, "layers": result.layers, "traced_layers": result.traced_layers,
        "system": result.request.system, "gpus": result.cluster.num_gpus,
        "mesh": {"names": list(sharding.problem.mesh.names), "shape": list(sharding.problem.mesh.sizes)},
        "fits": bool(best.fits), "reason": "" if best.fits else sharding.reason,
        "step_time_s": best.step_time if best.step_time != float("inf") else None,
        # the printed program's own step (the plan's above), where it writes the plan otherwise (as_written.py)
        "program": _program_dict(result),
        "micro_batches": result.request.micro_batches,
        "pipeline": _pipeline(best) if isinstance(best, Pipeline) else None,
        "memory_limit_bytes": sharding.memory_limit,
        "peak_memory_bytes": max(best.memory) if isinstance(best, Pipeline) else (
            sharding.memory.peak if sharding.memory else None),
        "breakdown_s": {"compute_fwd": price.compute_fwd, "compute_bwd": price.compute_bwd,
                        "comm_fwd": price.comm_fwd, "comm_bwd": price.comm_bwd, "grad_sync": price.grad_sync,
                        "optimizer": price.optimizer, "host_fwd": price.host_fwd,
                        "host_bwd": price.host_bwd} if price else {},
        "parameters": [{"name": p.name, "shape": list(p.shape), "placements": describe(p.placements),
                        "styles": list(p.styles)} for p in params(sharding)] if sharding.choice else [],
        "parallelize_module": parallelize_code(sharding) if sharding.choice else "",
        "collectives": [{"from": m.producer, "to": m.consumer, "shape": list(m.shape), "src": describe(m.src),
                         "dst": describe(m.dst), "kinds": list(m.kinds), "per_step": m.per_step,
                         "seconds": m.seconds} for m in inserted(sharding, top)] if sharding.choice else [],
        "pipelines": [_pipeline(p) for p in result.pipelines],
        "intra_op": {"step_time_s": sharding.step_time if sharding.choice else None, "fits": sharding.fits,
                     "status": sharding.status, "rounds": sharding.rounds, "variables": sharding.variables},
        "timings_s": result.timings,
    }
    return out


def _pipeline(p: Pipeline) -> dict[str, Any]:
    return {"stages": p.stages, "layers_per_stage": list(p.layers), "devices_per_stage": list(p.devices),
            "micro_batches": p.micro_batches, "step_time_s": p.step_time, "bubble_s": p.bubble, "p2p_s": list(p.p2p),
            "stage_memory_bytes": list(p.memory), "fits": p.fits}


def shard_tables(result: Result, console: Console, top: int = 12) -> None:
    """Summary, parameters, code, collectives and pipelines as tables."""
    from rich.table import Table

    best, sharding = result.best, _sharding(result)
    mesh = sharding.problem.mesh
    title = (f"{result.name} ({fmt_count(result.params)} params, {result.layers} layers, traced {result.traced_layers})"
             f" on {result.cluster.num_gpus} x {result.cluster.accelerator.name}, mesh {mesh.describe()}")
    summary = Table(title=title, show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    for row in _summary_rows(result, best, sharding):
        summary.add_row(*row)
    console.print(summary)
    if not sharding.choice:
        return
    table = Table(title="parameters (DTensor placements per mesh dimension; tied layers as *)", title_justify="left")
    for col in ("parameter", "shape", "placements", *(f"on {n}" for n in mesh.names)):
        table.add_column(col)
    for p in params(sharding):
        table.add_row(p.name, "x".join(map(str, p.shape)), describe(p.placements), *p.styles)
    console.print(table)
    console.print("[bold]as PyTorch runs it[/bold] (torch.distributed.tensor.parallel, fully_shard, replicate):")
    console.print(parallelize_code(sharding), markup=False, highlight=False)
    moves = Table(title=f"collectives inserted (top {top} by time per step)", title_justify="left")
    for col, justify in (("from", "left"), ("to", "left"), ("tensor", "left"), ("placements", "left"),
                         ("collectives", "left"), ("when", "left"), ("time/step", "right")):
        moves.add_column(col, justify=cast("JustifyMethod", justify))
    for m in inserted(sharding, top):
        moves.add_row(m.producer, m.consumer, "x".join(map(str, m.shape)), f"{short(m.src)} -> {short(m.dst)}",
                      ", ".join(m.kinds), "step" if m.per_step else "micro-batch", fmt_time(m.seconds))
    console.print(moves)
    if result.pipelines:
        _pipelines(result, console)


def _summary_rows(result: Result, best: Any, sharding: Sharding) -> list[tuple[str, str]]:
    rows = []
    if not best.fits:
        hint = ""
        if result.request.micro_batches == 1:
            hint = " (more micro-batches, --micro-batches N, shrink the activations and let --stages try pipelines)"
        rows.append(("verdict", f"DOES NOT FIT: {sharding.reason}{hint}"))
    written = program(result)
    if written is not None and written.sharding.step_time != best.step_time:
        rows.append(("step time", f"{fmt_time(written.sharding.step_time)} as the program below writes it "
                                  f"({len(written.changed)} parameters placed otherwise than planned: the '# not "
                                  f"written' lines); the plan: {fmt_time(best.step_time)}"
                                  + (" (and its gathered fused outputs are not priced)" if written.unpriced else "")))
    elif best.step_time != float("inf"):
        rows.append(("step time", fmt_time(best.step_time) + (f" ({result.request.micro_batches} micro-batches)"
                                                              if result.request.micro_batches > 1 else "")))
    if isinstance(best, Pipeline):
        rows.append(("pipeline", f"{best.stages} stages of {' + '.join(map(str, best.devices))} GPUs, layers "
                                 f"{list(best.layers)}, bubble {fmt_time(best.bubble)} (placements: the stage of "
                                 f"{best.intra.problem.mesh.devices} GPUs)"))
        rows.append(("memory per GPU", ", ".join(fmt_bytes(m) for m in best.memory) + " (per stage)"))
    elif sharding.memory is not None:
        op = sharding.problem.flow.trace.ops[sharding.memory.index]
        rows.append(("memory per GPU", f"{fmt_bytes(sharding.memory.peak)} of {fmt_bytes(sharding.memory_limit)} at "
                                       f"op {op.index} {op.name} ({op.phase})"))
    if sharding.price is not None:
        p = sharding.price
        rows.append(("per micro-batch", f"compute {fmt_time(p.compute_fwd)} + {fmt_time(p.compute_bwd)} (fwd + bwd), "
                                        f"moves {fmt_time(p.comm_fwd)} + {fmt_time(p.comm_bwd)}, host launches "
                                        f"{fmt_time(p.host_fwd)} + {fmt_time(p.host_bwd)}"
                                        + (" (host-bound)" if p.host_fwd + p.host_bwd > p.compute_fwd + p.compute_bwd
                                           + p.comm_fwd + p.comm_bwd else "")))
        rows.append(("per step", f"gradient reductions {fmt_time(p.grad_sync)}, optimizer {fmt_time(p.optimizer)}"))
    solve = sum(v for k, v in result.timings.items() if k in ("graph", "intra-op solve", "stages"))
    rows.append(("planner", f"{solve:.2f} s ({', '.join(f'{k} {v:.2f} s' for k, v in result.timings.items())})"))
    return rows


def _pipelines(result: Result, console: Console) -> None:
    from rich.table import Table

    table = Table(title="pipelines considered (1F1B, simulator.simulate)", title_justify="left")
    for col in ("stages", "GPUs/stage", "layers per stage", "step time", "bubble", "peak memory", "fits"):
        table.add_column(col)
    for p in result.pipelines:
        table.add_row(str(p.stages), " ".join(map(str, p.devices)), " ".join(map(str, p.layers)), fmt_time(p.step_time),
                      fmt_time(p.bubble), fmt_bytes(max(p.memory)), "yes" if p.fits else "no")
    console.print(table)
