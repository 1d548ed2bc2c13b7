"""Pictures (matplotlib, the optional ``plot`` extra): what a step spends its time and memory on, the
pipeline timeline and where each op sits under the roofline.

Every function returns a ``matplotlib.figure.Figure`` built without pyplot (no global state, no GUI
backend), so it is safe in worker processes and servers; ``save`` writes it as PNG or SVG by suffix and
``svg_text`` returns it as an SVG string for the HTML report. Numbers come from an ``Estimate`` (estimate.py),
the schedule simulator (pipeline/simulator.py) or sweep rows (sweep.py); nothing here computes a cost of its own.

    breakdown_figure(estimates)   step time per plan, stacked by component (compute, tp, bubble, dp …)
    memory_figure(estimates)      memory per GPU per plan, stacked by part, against the HBM capacity
    timeline_figure(estimate)     per-rank Gantt of the plan's pipeline schedule, idle time (bubbles) hatched
    roofline_figure(estimate)     per-op arithmetic intensity vs achieved FLOP/s under the compute / HBM roofs

The sweeps' pictures (scaling, hardware parameters) are in sweep_plots.py.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from meshplan.errors import MissingDependency, SpecError
from meshplan.files import write_bytes
from meshplan.pipeline.registry import one_chunk, schedule_of
from meshplan.report.split_runs import PipelineRun, split_run
from meshplan.units import GiB, fmt_bytes, fmt_time
from meshplan.xp import recent

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from meshplan.estimate import Estimate

COMPONENT_COLORS = {
    "compute": "#4C72B0", "recompute": "#8FAADC", "tp": "#DD8452", "cp": "#E6B84C", "ep": "#937860",
    "pp": "#8172B3", "host": "#C44E52", "bubble": "#B8B8B8", "dp": "#55A868", "optimizer": "#DA8BC3",
    "offload": "#8C8C3C",
}
MEMORY_COLORS = {"weights": "#4C72B0", "grads": "#55A868", "optimizer": "#DA8BC3", "activations": "#DD8452",
                 "buffers": "#B8B8B8"}
KIND_COLORS = {"gemm": "#4C72B0", "attention": "#DD8452", "memory": "#55A868"}
SYSTEM_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")


def new_figure(width: float, height: float) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependency("matplotlib", "plot") from None
    return Figure(figsize=(width, height), layout="constrained")


def settled(fig: Figure) -> Figure:
    """``fig`` with its constrained layout solved once and then fixed: the solver's result depends on the label
    extents of the draw before it, so every save would move the axes a little (a bar's end label shifting the axes by
    thousandths of a point); fixed after one solve, the same figure gives the same file."""
    if fig.get_layout_engine() is not None:
        fig.draw_without_rendering()
        fig.set_layout_engine("none")
    return fig


def save(fig: Figure, path: str | Path, dpi: int = 150) -> Path:
    """Write ``fig`` as PNG or SVG (by the suffix)."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg"):
        raise SpecError(f"{path}: plots are written as .png or .svg")
    settled(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lower()[1:], dpi=dpi,
                metadata={"Software": None} if path.suffix.lower() == ".png" else {"Date": None})
    return write_bytes(path, buf.getvalue(), "output")


def svg_text(fig: Figure) -> str:
    """The figure as a standalone SVG document (text drawn as paths: no fonts needed to view it)."""
    import matplotlib

    settled(fig)
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "meshplan"}):  # stable ids: the same figure, the same text
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def png_bytes(fig: Figure, dpi: int = 150) -> bytes:
    settled(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


# ---- labels ----------------------------------------------------------------------------------------------------
def short_label(est: Estimate) -> str:
    """``dp32 tp8 pp4 v2 · mb1 · z1`` : the axes larger than 1, then micro-batch and ZeRO stage."""
    p = est.plan
    tensor = f"tp{p.tp}x{p.tp2}" if p.tp2 > 1 else f"tp{p.tp}"
    axes = [f"dp{p.dp}", tensor, f"pp{p.pp}", f"cp{p.cp}", f"ep{p.ep}", f"v{p.vpp}"]
    keep = [a for a in axes if not a.endswith(("p1", "v1", "x1")) or a == f"dp{p.dp}"]
    extra = [f"mb{p.micro_batch}", f"z{p.zero}"]
    if p.recompute != "none":
        extra.append({"selective": "sel", "full": "full"}[p.recompute])
    if p.offload_optimizer or p.offload_activations:
        extra.append("offload-" + "+".join(k for k, on in (("opt", p.offload_optimizer),
                                                           ("act", p.offload_activations)) if on))
    return " ".join(keep) + " · " + " ".join(extra)


def _time_unit(seconds: float) -> tuple[str, float]:
    return ("s", 1.0) if seconds >= 1.0 else ("ms", 1e3)


def _labels(estimates: Sequence[Estimate], labels: Sequence[str] | None) -> list[str]:
    if labels is not None:
        if len(labels) != len(estimates):
            raise SpecError(f"{len(labels)} labels for {len(estimates)} estimates")
        return list(labels)
    if len(estimates) == 1:
        return [short_label(estimates[0])]
    return [f"#{i} {short_label(e)}" for i, e in enumerate(estimates, 1)]


# ---- step time ---------------------------------------------------------------------------------------------------
def breakdown_figure(estimates: Sequence[Estimate], labels: Sequence[str] | None = None,
                     title: str | None = None) -> Figure:
    """One horizontal bar per plan (the first on top), stacked by step-time component, with the step time and
    MFU at the end. Components that are zero in every plan are left out of the bars and the legend."""
    if not estimates:
        raise SpecError("breakdown_figure needs at least one estimate")
    names = _labels(estimates, labels)
    unit, scale = _time_unit(max(e.step_time for e in estimates))
    fig = new_figure(10, 1.7 + 0.5 * len(estimates))
    ax = fig.add_subplot()
    y = list(range(len(estimates)))[::-1]
    left = [0.0] * len(estimates)
    for comp, color in COMPONENT_COLORS.items():
        widths = [e.breakdown.get(comp, 0.0) * scale for e in estimates]
        if not any(w > 0 for w in widths):
            continue
        ax.barh(y, widths, left=left, color=color, label=comp, height=0.6, edgecolor="white", linewidth=0.5)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for yi, e, total in zip(y, estimates, left, strict=True):
        ax.text(total, yi, f"  {fmt_time(e.step_time)} · MFU {e.mfu:.1%}", va="center", fontsize=8)
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlabel(f"step time ({unit})")
    ax.set_xlim(0, max(left) * 1.28)
    fig.legend(*ax.get_legend_handles_labels(), ncols=min(10, len(ax.containers)), fontsize=8,
               loc="outside lower center", frameon=False)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    first = estimates[0]
    ax.set_title(title or f"step time breakdown: {first.model.name} on {first.cluster.num_gpus} x "
                          f"{first.cluster.accelerator.name}", fontsize=10, loc="left")
    return fig


# ---- memory ------------------------------------------------------------------------------------------------------
def memory_figure(estimates: Sequence[Estimate], labels: Sequence[str] | None = None,
                  title: str | None = None) -> Figure:
    """One bar per plan: memory per GPU (of the pipeline rank with the larger footprint) stacked by part, and
    the accelerator's HBM capacity as a dashed line."""
    if not estimates:
        raise SpecError("memory_figure needs at least one estimate")
    names = _labels(estimates, labels)
    capacity = estimates[0].cluster.accelerator.hbm_bytes / GiB
    fig = new_figure(max(6.0, 3.0 + 1.1 * len(estimates)), 4.6)
    ax = fig.add_subplot()
    x = list(range(len(estimates)))
    bottom = [0.0] * len(estimates)
    for part, color in MEMORY_COLORS.items():
        heights = [e.memory.get(part, 0.0) / GiB for e in estimates]
        if not any(h > 0 for h in heights):
            continue
        ax.bar(x, heights, bottom=bottom, color=color, label=part, width=0.6, edgecolor="white", linewidth=0.5)
        bottom = [a + b for a, b in zip(bottom, heights, strict=True)]
    for xi, e, top in zip(x, estimates, bottom, strict=True):
        ax.text(xi, top, fmt_bytes(e.peak_memory), ha="center", va="bottom", fontsize=8)
    ax.axhline(capacity, color="#C44E52", linestyle="--", linewidth=1.5,
               label=f"HBM {fmt_bytes(estimates[0].cluster.accelerator.hbm_bytes)}")
    short = [textwrap.fill(n.replace(" · ", " "), 18) for n in names]
    ax.set_xticks(x, short, fontsize=7 if len(estimates) > 3 else 8)
    ax.set_ylabel("memory per GPU (GiB)")
    ax.set_ylim(0, max(capacity, max(bottom)) * 1.12)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="outside right upper", frameon=False)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    first = estimates[0]
    ax.set_title(title or f"memory per GPU vs HBM: {first.model.name} on {first.cluster.accelerator.name}",
                 fontsize=10, loc="left")
    return fig


# ---- pipeline timeline -------------------------------------------------------------------------------------------
def pipeline_times(est: Estimate) -> tuple[str, int, tuple[float, ...], tuple[float, ...]]:
    """The schedule ``pipeline_run`` simulates, its chunks per rank and each rank's forward and backward times per
    micro-batch and chunk (its docstring); the HTML report's page simulates the long ones itself (detail.py)."""
    from meshplan.specs.efficiency import DEFAULT
    from meshplan.step.assemble import step_costs

    plan, kept = est.plan, est.detail  # the estimate's own step costs where it kept them (estimate.Detail)
    costs = kept.costs if kept is not None and kept.efficiency is DEFAULT else step_costs(
        est.model, est.cluster, plan, est.stack)
    vpp = plan.vpp if plan.pp > 1 else 1
    schedule = str(plan.schedule) if plan.pp > 1 else one_chunk()
    if not schedule_of(schedule).chunks and vpp == 1:  # interleaved on one chunk: 1F1B's table
        schedule = one_chunk()
    (first, middle, last) = costs.ranks
    per_rank = [first] + [middle] * (plan.pp - 2) + [last] if plan.pp > 1 else [first]
    return (schedule, vpp, tuple(float(f) / vpp for f, _ in per_rank), tuple(float(b) / vpp for _, b in per_rank))


def pipeline_run(est: Estimate) -> PipelineRun:
    """Simulate ``est.plan``'s pipeline schedule (tables.build / simulator.simulate; the split-backward and
    two-direction schedules' own tables: split_runs.py); the last few estimates' runs are kept (by identity:
    xp.recent), as the HTML report's comparison and its pipeline section both draw plan #1's.

    Per micro-batch and chunk, each rank's forward and backward times (the first rank with the embedding,
    the last with the LM head and loss, the others with their layers only), each with its share of the
    pass's own exposed TP, CP, EP and p2p time (step.passes.PassTimes.passes), divided by vpp. The simulated step is the
    estimate's pipelined part, compute + recompute + tp + cp + ep + pp + bubble (bubble.flow_bubble; the
    tests check it).
    """
    return recent(_RUNS, (est,), lambda: _simulated(est))


_RUNS: list[tuple[tuple[object, ...], PipelineRun]] = []  # pipeline_run's last answers (xp.recent)


def _simulated(est: Estimate) -> PipelineRun:
    from meshplan.pipeline.simulator import simulate
    from meshplan.pipeline.tables import build

    plan, m = est.plan, est.plan.grad_accum
    schedule, vpp, t_f, t_b = pipeline_times(est)
    split = split_run(schedule, plan.pp, m, t_f, t_b) if plan.pp > 1 else None
    if split is not None:  # zb-h1, zb-v, dualpipe, chimera: their action tables (split_runs.py)
        return split
    table = build(schedule, plan.pp, m, vpp)
    return PipelineRun(schedule=schedule, pp=plan.pp, vpp=vpp, micro_batches=m, t_fwd=t_f, t_bwd=t_b, table=table,
                       timeline=simulate(table, t_f, t_b, built=True))


def timeline_figure(est: Estimate, run: PipelineRun | None = None, title: str | None = None) -> Figure:
    """Per-rank Gantt chart of the plan's pipeline schedule: forward blocks blue, backward blocks green
    (shaded by model chunk when interleaved), idle time (the pipeline bubble) hatched red. Micro-batch numbers
    (``micro.chunk`` when interleaved) are written in the blocks wide enough to hold them."""
    run = run or pipeline_run(est)
    tl = run.timeline
    unit, scale = _time_unit(tl.step_time)
    fig = new_figure(11, 1.5 + 0.42 * max(run.pp, 2))
    ax = fig.add_subplot()
    fwd_shades = ("#4C72B0", "#7F9FD0", "#2F4F80", "#A9C0E8")
    bwd_shades = ("#55A868", "#86C697", "#33774A", "#B3DDBE")
    per_rank = run.micro_batches * run.vpp
    points_wide = 72 * 9.5 / tl.step_time if tl.step_time > 0 else 0.0  # ≈ axis points per second
    shade = run.vpp > 1 and per_rank <= 48  # chunk shades only where blocks are wide enough to tell apart
    edge = "white" if per_rank <= 48 else "none"
    idle, idle_labelled = run.idle(), False
    for r, (row, starts, ends) in enumerate(zip(run.table, tl.starts, tl.ends, strict=True)):
        bars: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
        for action, s, e in zip(row, starts, ends, strict=True):
            bars[(action.kind, action.chunk % 4 if shade else 0)].append((s * scale, (e - s) * scale))
            text = str(action.micro) if run.vpp == 1 else f"{action.micro}.{action.chunk}"
            if (e - s) * points_wide >= 4.5 * len(text) + 5:  # write the micro-batch where it fits
                ax.text((s + e) / 2 * scale, r, text, ha="center", va="center", fontsize=6.5, color="white")
        for (kind, chunk), spans in sorted(bars.items()):
            color = (fwd_shades if kind == "F" else bwd_shades)[chunk]
            ax.broken_barh(spans, (r - 0.38, 0.76), facecolors=color, edgecolor=edge, linewidth=0.3,
                           label=f"{'forward' if kind == 'F' else 'backward'}" + (f" chunk {chunk}" if shade
                                                                                  else "") if r == 0 else None)
        if idle[r]:
            ax.broken_barh([(s * scale, w * scale) for s, w in idle[r]], (r - 0.38, 0.76), facecolors="#F4D6D6",
                           edgecolor="#C44E52", hatch="////", linewidth=0.4,
                           label=None if idle_labelled else "idle (bubble)")
            idle_labelled = True
    ax.set_yticks(range(run.pp), [f"rank {r}" for r in range(run.pp)], fontsize=8)
    ax.set_ylim(run.pp - 0.5, -0.5)
    ax.set_xlim(0, tl.step_time * scale)
    ax.set_xlabel(f"time within the step ({unit}); DP reduction and optimizer step not shown")
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: (labels[i].startswith("idle"), labels[i]))
    fig.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=8, loc="outside lower center",
               ncols=min(len(labels), 5), frameon=False)
    name = schedule_of(run.schedule).title
    ax.set_title(title or f"pipeline timeline ({name}): pp={run.pp}"
                          + (f", vpp={run.vpp}" if run.vpp > 1 else "")
                          + f", {run.micro_batches} micro-batches; bubble {tl.idle_fraction:.1%} of "
                          f"{fmt_time(tl.step_time)}", fontsize=10, loc="left")
    return fig


# ---- roofline ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RooflinePoint:
    name: str
    phase: str
    kind: str
    intensity: float  # FLOP per HBM byte
    achieved: float  # FLOP/s
    share: float  # of the summed op time per step


def roofline_points(est: Estimate) -> list[RooflinePoint]:
    """Every compute op of ``est.ops`` (collectives have no FLOPs) with its arithmetic intensity
    FLOPs / bytes and its achieved rate FLOPs / seconds (the estimate's time, efficiencies included)."""
    ops = [o for o in est.ops if o.kind != "collective" and o.flops > 0 and o.nbytes > 0 and o.seconds > 0]
    total = sum(o.total_seconds for o in est.ops) or 1.0
    return [RooflinePoint(o.name, o.phase, o.kind, o.flops / o.nbytes, o.flops / o.seconds, o.total_seconds / total)
            for o in ops]


def roofline_figure(est: Estimate, label_top: int = 6, title: str | None = None) -> Figure:
    """Arithmetic intensity (FLOP/byte) against achieved FLOP/s of every op, log-log, under the roofs
    min(peak, intensity × HBM bandwidth) of the plan's precision (and of FP32 for element-wise math).
    Marker area grows with the op's share of the step; the ``label_top`` largest are named."""
    points = roofline_points(est)
    acc, precision = est.cluster.accelerator, est.plan.precision
    peak, bw = acc.flops(precision), acc.hbm_bandwidth
    fig = new_figure(8.5, 5.2)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    lo = min([p.intensity for p in points] + [peak / bw]) / 4
    hi = max([p.intensity for p in points] + [peak / bw]) * 4
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, x * bw) for x in xs], color="black", linewidth=1.6,
            label=f"roof: {precision} {peak / 1e12:.0f} TFLOP/s, HBM {bw / 1e12:.2f} TB/s")
    roofs = [("bf16 (attention)", acc.half_flops)] if acc.half_flops != peak else []
    if "fp32" in acc.peak_flops:
        roofs.append(("fp32 (element-wise)", acc.peak_flops["fp32"]))
    for (name, value), style in zip(roofs, ("--", ":"), strict=False):
        ax.plot(xs, [min(value, x * bw) for x in xs], color="#555555", linewidth=1, linestyle=style,
                label=f"{name} {value / 1e12:.1f} TFLOP/s")
    ax.axvline(peak / bw, color="#999999", linewidth=0.6, linestyle=":")
    for kind, color in KIND_COLORS.items():
        sel = [p for p in points if p.kind == kind]
        if not sel:
            continue
        ax.scatter([p.intensity for p in sel], [p.achieved for p in sel],
                   s=[18 + 600 * p.share for p in sel], color=color, alpha=0.75, edgecolor="white",
                   linewidth=0.5, label=f"{kind} ops", zorder=3)
    for (x, y), names in _label_groups(points, label_top):
        ax.annotate("\n".join(names), (x, y), textcoords="offset points", xytext=(8, -6), fontsize=7.5, va="top")
    ax.set_xlim(lo, hi)
    ax.set_ylim(min([p.achieved for p in points] + [lo * bw]) / 3, peak * 2.5)
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte)")
    ax.set_ylabel("achieved FLOP/s per GPU")
    ax.legend(fontsize=7.5, loc="lower right", framealpha=0.9)
    ax.grid(which="major", alpha=0.3)
    ax.set_title(title or f"per-op roofline: {est.model.name} on {acc.name} ({short_label(est)})", fontsize=10,
                 loc="left")
    return fig


def _label_groups(points: Sequence[RooflinePoint], top: int) -> list[tuple[tuple[float, float], list[str]]]:
    """The ``top`` op names by time share, grouped when their points nearly coincide (within 0.3 decades),
    so that labels of clustered GEMMs do not overprint each other."""
    best: dict[str, RooflinePoint] = {}
    for p in sorted(points, key=lambda p: -p.share):
        best.setdefault(p.name, p)
    groups: list[tuple[tuple[float, float], list[str]]] = []
    for p in list(best.values())[:top]:
        for (x, y), names in groups:
            if abs(math.log10(p.intensity / x)) < 0.3 and abs(math.log10(p.achieved / y)) < 0.3:
                names.append(p.name)
                break
        else:
            groups.append(((p.intensity, p.achieved), [p.name]))
    return groups


__all__ = ["breakdown_figure", "memory_figure", "timeline_figure", "roofline_figure", "pipeline_run", "pipeline_times",
           "roofline_points", "save", "svg_text", "png_bytes", "short_label"]
