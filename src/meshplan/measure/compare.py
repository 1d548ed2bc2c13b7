"""Predicted against measured: the step, its peak memory, per op class and phase, and the largest discrepancies,
as one JSON-ready dict (``--json``) and as tables. No torch here.

Per class and phase, "measured" sums the matched ops' in-step times (profile.py); what the step took beyond
them is the host's own work between ops (Python, autograd, the allocator) and shows as ``between ops``, against
the predicted host work (host.py) that is not charged to an op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshplan.measure.hostbound import host_bound
from meshplan.units import fmt_bytes, fmt_time

if TYPE_CHECKING:
    from rich.console import Console

    from meshplan.measure.check import CheckResult


def _err(pred: float, meas: float) -> float | None:
    return pred / meas - 1.0 if meas > 0 else None


def groups(result: CheckResult, key: str) -> list[dict[str, Any]]:
    """Predicted and measured seconds per op class (``"cls"``) or phase (``"phase"``), most measured first."""
    pred: dict[str, float] = {}
    meas: dict[str, float] = {}
    count: dict[str, int] = {}
    for p, m in zip(result.prediction.ops, result.measurement.op_seconds or [None] * len(result.prediction.ops),
                    strict=True):
        k = p.cls if key == "cls" else p.op.phase
        pred[k] = pred.get(k, 0.0) + p.seconds
        count[k] = count.get(k, 0) + 1
        if m is not None:
            meas[k] = meas.get(k, 0.0) + m
    rows = [{"group": k, "ops": count[k], "predicted_s": pred[k], "measured_s": meas.get(k),
             "error": _err(pred[k], meas[k]) if k in meas else None} for k in pred]
    return sorted(rows, key=lambda r: -(r["measured_s"] or r["predicted_s"]))


def discrepancies(result: CheckResult, top: int) -> list[dict[str, Any]]:
    """The ``top`` ops whose in-step time is furthest from the prediction (seconds either way)."""
    rows: list[dict[str, Any]] = []
    for p, m in zip(result.prediction.ops, result.measurement.op_seconds, strict=False):
        if m is None:
            continue
        op = p.op
        rows.append({"index": p.index, "name": op.name, "target": op.target, "phase": op.phase, "class": p.cls,
                     "shape": "x".join(map(str, op.outputs[0].shape)) if op.outputs else "",
                     "predicted_s": p.seconds, "measured_s": m, "difference_s": p.seconds - m,
                     "launches": p.launches, "host_s": p.host, "fused_group": p.group, "fused_s": p.fused})
    return sorted(rows, key=lambda r: -abs(r["difference_s"]))[:top]


def check_dict(result: CheckResult, top: int = 10) -> dict[str, Any]:
    """The check-step result as data (``check-step --json``): settings, load, step, peak memory, host costs, op
    counts, per class and per phase, the ``top`` largest discrepancies."""
    p, m = result.prediction, result.measurement
    matched = sum(x for x in m.op_seconds if x is not None)
    return {
        "model": result.name, "machine": result.machine,
        "settings": {"device": result.settings.device, "threads": result.settings.threads,
                     "clock": m.timing.clock, "warmup": result.settings.warmup, "steps": result.settings.steps,
                     "rounds": result.settings.rounds, "allocator": result.settings.allocator},
        "load": {"before": m.timing.load_before, "after": m.timing.load_after},
        "step": {"predicted_s": p.seconds, "measured_s": m.timing.seconds, "error": result.error,
                 "measured_steps_s": list(m.timing.times), "wall_steps_s": list(m.timing.wall),
                 "spread": m.timing.spread, "page_faults": m.timing.page_faults,
                 "predicted_kernels_s": p.kernels, "predicted_host_s": p.host_seconds,
                 "predicted_fused_s": p.fused_seconds, "replay_spread": result.replay_spread,
                 "measured_in_ops_s": matched if m.op_seconds else None},
        "peak_memory": {"predicted_bytes": p.peak_bytes, "measured_bytes": m.peak_bytes,
                        "error": result.memory_error},
        "host": p.host.to_dict() | {"module_calls": p.module_calls},
        "host_bound": host_bound(p).to_dict(),
        "ops": {"traced": len(p.ops), "kernels": sum(o.launches for o in p.ops),
                "replayed": sum(1 for o in p.ops if o.source == "replay"), "fused_chains": len(p.groups),
                "fused_kernels": sum(o.launches for o in p.ops if o.group < 0) + len(p.groups)},
        "by_class": groups(result, "cls"), "by_phase": groups(result, "phase"),
        "discrepancies": discrepancies(result, top),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def render_check(result: CheckResult, console: Console, top: int = 10, learned: dict[str, Any] | None = None) -> None:
    """The summary, the per-class and per-phase tables and the largest discrepancies; with ``learned``
    (learned.apply_learned), the step as the learned residual corrects it."""
    from rich.table import Table

    d = check_dict(result, top)
    mach, step, mem = d["machine"], d["step"], d["peak_memory"]
    console.print(f"[bold]{result.name}[/bold] on {mach['name']} ({mach['cores']} cores, {mach['threads']} "
                  f"thread(s), torch {mach['torch']}), clock {d['settings']['clock']}, load "
                  f"{d['load']['before']:.2f} → {d['load']['after']:.2f}")
    summary = Table(show_header=True, title="predicted vs measured", title_justify="left")
    for col in ("", "predicted", "measured", "error"):
        summary.add_column(col, justify="left" if not col else "right")
    summary.add_row("step time", fmt_time(step["predicted_s"]), fmt_time(step["measured_s"]), _pct(step["error"]))
    summary.add_row("peak memory", fmt_bytes(mem["predicted_bytes"]), fmt_bytes(mem["measured_bytes"]),
                    _pct(mem["error"]))
    if learned is not None:
        summary.add_row(f"step time, learned residual ({learned['trained_on']} models)",
                        fmt_time(learned["predicted_s"]), fmt_time(step["measured_s"]), _pct(learned["error"]))
    summary.add_row("  kernels / host", f"{fmt_time(step['predicted_kernels_s'])} / "
                    f"{fmt_time(step['predicted_host_s'])}", "", "")
    bound = d["host_bound"]
    summary.add_row(f"  work alone (less {bound['launches']} launches × {fmt_time(bound['host_dispatch_s'])})",
                    fmt_time(bound["without_host_s"]), "", _pct(_err(bound["without_host_s"], step["measured_s"])))
    summary.add_row("  fused (one kernel per chain)", fmt_time(step["predicted_fused_s"]), "",
                    f"{d['ops']['kernels']} → {d['ops']['fused_kernels']} kernels")
    console.print(summary)
    for key, title in (("by_class", "per op class"), ("by_phase", "per phase")):
        table = Table(title=title, title_justify="left")
        for col in ("group", "ops", "predicted", "measured in step", "error"):
            table.add_column(col, justify="left" if col == "group" else "right")
        for r in d[key]:
            table.add_row(r["group"], str(r["ops"]), fmt_time(r["predicted_s"]),
                          "-" if r["measured_s"] is None else fmt_time(r["measured_s"]), _pct(r["error"]))
        console.print(table)
    table = Table(title=f"largest {top} discrepancies (op by op)", title_justify="left")
    for col in ("#", "op", "phase", "class", "out shape", "predicted", "measured", "launches", "host", "fused",
                "fused time"):
        table.add_column(col, justify="left" if col in ("op", "phase", "class", "out shape") else "right")
    for r in d["discrepancies"]:
        table.add_row(str(r["index"]), r["name"], r["phase"], r["class"], r["shape"], fmt_time(r["predicted_s"]),
                      fmt_time(r["measured_s"]), str(r["launches"]), fmt_time(r["host_s"]),
                      "-" if r["fused_group"] < 0 else str(r["fused_group"]), fmt_time(r["fused_s"]))
    console.print(table)
