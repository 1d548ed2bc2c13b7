"""Tables of a calibration for the terminal (rich). Pure formatting: the numbers come from a Calibration."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplan.units import fmt_time

if TYPE_CHECKING:
    from rich.console import Console

    from meshplan.calibrate.run import Calibration


def _rate(x: float, unit: str = "B/s") -> str:
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _residuals(fit) -> str:
    """Relative residuals of a fit: RMS / largest, in %."""
    return f"{fit.residual_rms:.1%} / {fit.residual_max:.1%}"


def print_calibration(cal: Calibration, console: Console, out: str | None = None) -> None:
    from rich.table import Table

    mesh = "x".join(map(str, cal.mesh))
    console.print(f"[bold]{cal.device_name}[/bold] on {cal.host}, {cal.date}: {cal.world_size} ranks over "
                  f"{cal.backend}, mesh {mesh} (innermost first)")
    gemm = Table(title="GEMMs: t = t0 + 2mnk / F", title_justify="left")
    for col in ("precision", "F (fit)", "t0", "best", "at m×n×k", "peak", "best / peak", "R²", "resid rms / max"):
        gemm.add_column(col, justify="left" if col in ("precision", "at m×n×k") else "right")
    for f in cal.gemm:
        gemm.add_row(f.precision, _rate(f.rate, "FLOP/s"), fmt_time(f.overhead), _rate(f.best, "FLOP/s"),
                     "×".join(map(str, f.best_shape)), _rate(f.peak, "FLOP/s") if f.peak else "-",
                     f"{f.efficiency:.1%}" if f.peak else "-", f"{f.r2:.3f}", _residuals(f))
    console.print(gemm)
    if cal.attention is not None:
        att = cal.attention
        table = Table(title="causal attention (scaled_dot_product_attention): t = t0 + 2·b·A·s²·d / F",
                      title_justify="left")
        for col in ("precision", "F (fit)", "t0", "best", "at b×A×s×d", "R²", "resid rms / max"):
            table.add_column(col, justify="left" if col in ("precision", "at b×A×s×d") else "right")
        table.add_row(att.precision, _rate(att.rate, "FLOP/s"), fmt_time(att.overhead), _rate(att.best, "FLOP/s"),
                      "×".join(map(str, att.best_shape)), f"{att.r2:.3f}", _residuals(att))
        console.print(table)
    memory = Table(title="memory-bound kernels: t = t0 + bytes / BW", title_justify="left")
    for col in ("kernel", "BW (fit)", "t0", "best", "R²", "resid rms / max"):
        memory.add_column(col, justify="left" if col == "kernel" else "right")
    for m in cal.memory:
        memory.add_row(m.op, _rate(m.bandwidth), fmt_time(m.overhead), _rate(m.best), f"{m.r2:.3f}", _residuals(m))
    console.print(memory)
    _print_dispatch(cal, console)
    if cal.links:
        links = Table(title="collectives: t = α + f·n / busbw (NCCL bus bandwidth)", title_justify="left")
        for col in ("dim", "group", "collective", "busbw", "α", "α / step", "R²", ""):
            links.add_column(col, justify="left" if col in ("collective", "") else "right")
        for k in cal.links:
            links.add_row(str(k.dim), str(k.group), k.kind, _rate(k.bandwidth), fmt_time(k.latency),
                          fmt_time(k.step_latency), f"{k.r2:.3f}", "latency-bound: busbw ≥" if k.bound else "")
        for t in cal.tiers:
            links.add_row(str(t.dim), str(t.group), "[bold]median[/bold]", _rate(t.bandwidth), "",
                          fmt_time(t.latency), "", "")
        console.print(links)
    guess = cal.discovered
    if guess is not None:
        shape = "x".join(map(str, guess.shape))
        tiers = "; ".join(f"tier {i} ({t.size}): {_rate(t.bandwidth)}, {fmt_time(t.latency)}"
                          for i, t in enumerate(guess.tiers))
        where = "" if guess.contiguous else f", ranks reordered {list(guess.order)}"
        console.print(f"discovered mesh {shape} from pairwise ping-pong{where}: {tiers}")
    if out:
        console.print(f"wrote {out}")


def _print_dispatch(cal: Calibration, console: Console) -> None:
    """The host's cost per eager call (calibrate/dispatch.py): t0 is what ``--stack-out`` writes."""
    from rich.table import Table

    if not cal.dispatch:
        return
    table = Table(title="host dispatch per eager call: t = t0 + work / rate", title_justify="left")
    for col in ("call", "t0", "rate", "R²", "resid rms / max", ""):
        table.add_column(col, justify="left" if col in ("call", "") else "right")
    for f in cal.dispatch:
        unit = "B/s" if f.op in ("add", "layer_norm") else "FLOP/s"
        table.add_row(f.op, fmt_time(f.overhead), _rate(f.rate, unit) if f.rate > 0 else "-", f"{f.r2:.3f}",
                      _residuals(f), f.problem and "refused: outside 0 … 1 ms")
    console.print(table)
