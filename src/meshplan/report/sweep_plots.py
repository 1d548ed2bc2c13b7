"""Pictures of sweeps (matplotlib): best-plan throughput and MFU over GPU counts, per system × NVLink domain, and
over a hardware parameter's scale factors. From sweep rows (sweep.py); figures as in plots.py (no pyplot).

    scaling_figure(rows)          best-plan throughput and MFU vs GPU count, per system × NVLink domain
    param_figure(rows, param)     best-plan throughput vs a hardware parameter's scale factor
    sweep_figures(rows)           the pictures of one sweep, by name
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from meshplan.errors import SpecError
from meshplan.report.plots import LINESTYLES, MARKERS, SYSTEM_COLORS, new_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _series(rows: Sequence[dict[str, Any]], x: str, y: str, by: Sequence[str]) -> dict[tuple, list[tuple]]:
    out: dict[tuple, list[tuple]] = defaultdict(list)
    for row in rows:
        value = row.get(y)
        if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
            continue
        out[tuple(row[k] for k in by)].append((float(row[x]), float(value)))
    return {k: sorted(v) for k, v in out.items()}


def _styles(keys: Sequence[tuple]) -> dict[tuple, dict[str, Any]]:
    """Colour by the first key (system), line style and marker by the second (NVLink domain)."""
    firsts = list(dict.fromkeys(k[0] for k in keys))
    seconds = sorted(dict.fromkeys(k[1] for k in keys), key=lambda v: (isinstance(v, str), v))
    return {k: {"color": SYSTEM_COLORS[firsts.index(k[0]) % len(SYSTEM_COLORS)],
                "linestyle": LINESTYLES[seconds.index(k[1]) % len(LINESTYLES)],
                "marker": MARKERS[seconds.index(k[1]) % len(MARKERS)]} for k in keys}


def _log2_ticks(ax: Axes, values: Sequence[float]) -> None:
    ticks = sorted(set(values))
    ax.set_xticks(ticks, [f"{v:g}" for v in ticks])
    ax.minorticks_off()


def scaling_figure(rows: Sequence[dict[str, Any]], title: str | None = None) -> Figure:
    """Strong scaling from sweep rows (``param == "none"``): the best plan's tokens/s (log-log, with the
    ideal linear scaling from each curve's first point dotted) and its MFU, vs GPU count, one curve per
    system × NVLink domain. Points where no plan fits are missing from their curve."""
    rows = [r for r in rows if r.get("param", "none") in ("none", None, "")]
    if not rows:
        raise SpecError("scaling_figure: no strong-scaling rows (param 'none')")
    tput = _series(rows, "gpus", "tokens_per_s", ("system", "nvlink_domain"))
    mfu = _series(rows, "gpus", "mfu", ("system", "nvlink_domain"))
    styles = _styles(list(tput) or [(r["system"], r["nvlink_domain"]) for r in rows])
    fig = new_figure(11, 4.6)
    left, right = fig.subplots(1, 2)
    for key, pts in tput.items():
        xs, ys = zip(*pts, strict=True)
        left.plot(xs, ys, label=f"{key[0]} NVL{key[1]}", markersize=4.5, linewidth=1.4, **styles[key])
    if tput:
        x0, y0 = min((p[0] for pts in tput.values() for p in pts[:1]), default=1), None
        firsts = [pts[0] for pts in tput.values() if pts[0][0] == x0]
        y0 = max(p[1] for p in firsts)
        sizes = sorted({p[0] for pts in tput.values() for p in pts})
        left.plot(sizes, [y0 * x / x0 for x in sizes], color="#999999", linestyle=":", linewidth=1, label="linear")
    for key, pts in mfu.items():
        xs, ys = zip(*pts, strict=True)
        right.plot(xs, [100 * y for y in ys], markersize=4.5, linewidth=1.4, **styles[key])
    gpus = [float(r["gpus"]) for r in rows]
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        _log2_ticks(ax, gpus)
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
    left.set_yscale("log")
    left.set_ylabel("tokens/s (best plan)")
    right.set_ylabel("MFU of the best plan (%)")
    top = max((100 * y for pts in mfu.values() for _, y in pts), default=50.0)
    right.set_ylim(0, top * 1.2)  # room above the highest point: no curve on the frame's top edge
    fig.legend(*left.get_legend_handles_labels(), loc="outside right upper", fontsize=8)
    model = rows[0].get("model", "")
    batch = rows[0].get("global_batch", "")
    fig.suptitle(title or f"strong scaling: {model}, global batch {batch}", fontsize=11, x=0.01,
                 horizontalalignment="left")
    return fig


def param_figure(rows: Sequence[dict[str, Any]], param: str, title: str | None = None) -> Figure:
    """A hardware-parameter sweep from sweep rows: best-plan tokens/s per GPU vs the parameter's scale factor
    (vs the domain size itself for ``nvlink_domain``), one panel per GPU count, one curve per system ×
    NVLink domain, the unmodified hardware (factor 1) marked."""
    from meshplan.search.sweep import PARAMS

    rows = [r for r in rows if r.get("param") == param]
    if not rows:
        raise SpecError(f"param_figure: no rows for param {param!r}")
    x = "value" if param == "nvlink_domain" else "factor"
    counts = sorted({int(r["gpus"]) for r in rows})
    fig = new_figure(min(4.2 * len(counts), 16) + 1.8, 4.2)
    axes = fig.subplots(1, len(counts), squeeze=False, sharey=True)[0]
    keys = list(dict.fromkeys((r["system"], r["nvlink_domain"] if x == "factor" else "") for r in rows))
    styles = _styles(keys)
    for ax, n in zip(axes, counts, strict=True):
        sel = [r for r in rows if int(r["gpus"]) == n]
        by = ("system", "nvlink_domain") if x == "factor" else ("system",)
        for key, pts in _series(sel, x, "tokens_per_s_per_gpu", by).items():
            full = key if x == "factor" else (key[0], "")
            xs, ys = zip(*pts, strict=True)
            label = f"{key[0]} NVL{key[1]}" if x == "factor" else key[0]
            ax.plot(xs, ys, label=label, markersize=4.5, linewidth=1.4, **styles[full])
        ax.set_xscale("log", base=2)
        _log2_ticks(ax, [float(r[x]) for r in sel])
        if x == "factor":
            ax.axvline(1.0, color="#999999", linewidth=0.8, linestyle=":")
        ax.set_title(f"{n} GPUs", fontsize=9)
        ax.set_xlabel("NVLink domain size (GPUs)" if x == "value" else "× the system's value")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("tokens/s per GPU (best plan)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=8)
    fig.suptitle(title or f"{PARAMS[param][0]}: {rows[0].get('model', '')}, global batch "
                          f"{rows[0].get('global_batch', '')}", fontsize=11, x=0.01, horizontalalignment="left")
    return fig


def sweep_figures(rows: Sequence[dict[str, Any]]) -> dict[str, Figure]:
    """Every figure a set of sweep rows supports: ``scaling`` and ``param-<name>`` per swept parameter."""
    figs = {}
    params = list(dict.fromkeys(r.get("param") or "none" for r in rows))
    for param in params:
        if param == "none":
            if len({r["gpus"] for r in rows if (r.get("param") or "none") == "none"}) > 1:
                figs["scaling"] = scaling_figure(rows)
        else:
            figs[f"param-{param}"] = param_figure(rows, param)
    return figs


__all__ = ["param_figure", "scaling_figure", "sweep_figures"]
