"""A validation written out: the rich text table of every run and the summaries that ``meshplan validate`` prints,
the markdown section on runs predicted not to fit, and strict-JSON values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from meshplan_validation.measurement import PERCENT_OF_PEAK
from meshplan_validation.result import RunResult


def _fmt(value: float | None, metric: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if metric == "iteration_time_s":
        return f"{value:.3f} s"
    if metric in PERCENT_OF_PEAK:
        return f"{value:.1f} %"
    if metric.endswith("_ms"):
        return f"{value:,.1f} ms"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.1f}"


_UNITS = {"iteration_time_s": "step time", "tokens_per_s_per_gpu": "tokens/s/GPU", "tokens_per_s_total": "tokens/s",
          "model_tflops_per_gpu": "TFLOP/s/GPU", "tflops_per_gpu": "TFLOP/s/GPU", "mfu_pct": "MFU", "hfu_pct": "HFU",
          "pct_of_peak": "% of peak",
          # serving runs (serving_runs.py)
          "output_tokens_per_s": "output tokens/s", "output_tokens_per_s_per_gpu": "output tokens/s/GPU",
          "total_tokens_per_s": "total tokens/s", "requests_per_s": "requests/s",
          "input_tokens_per_s_per_gpu": "input tokens/s/GPU", "ttft_ms": "TTFT", "itl_ms": "ITL", "tpot_ms": "TPOT",
          "e2e_latency_ms": "latency"}


def _note(r: RunResult) -> str:
    """The note of an evaluated run: memory predicted past HBM; a serving run's mode, batch and other metrics."""
    if r.kind != "serving":
        return "" if r.fits else "predicted memory exceeds HBM"
    others = ", ".join(f"{_UNITS.get(m, m)} {100 * e:+.1f}%" for m, _, _, e in r.other_metrics if e is not None)
    batch = "" if r.batch is None else f" batch {r.batch:,.0f}"
    return f"serving, {r.serving_mode}{batch}" + (f"; {others}" if others else "")


def render_text(results: Sequence[RunResult], summary: dict[str, Any], width: int = 200) -> str:
    import io  # noqa: PLC0415

    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, color_system=None)
    table = Table(title="Published runs: predicted vs measured", show_lines=False)
    for name, justify in (("id", "left"), ("group", "left"), ("metric", "left"), ("predicted", "right"),
                          ("measured", "right"), ("error", "right"), ("memory err", "right"), ("note", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    for r in results:
        if r.skipped:
            table.add_row(r.id, r.group, "-", "-", "-", "skipped", "-", r.skipped)
            continue
        mem = "-" if r.memory_error is None else f"{100 * r.memory_error:+.1f}%"
        table.add_row(r.id, r.group, _UNITS.get(r.metric, r.metric), _fmt(r.predicted, r.metric),
                      _fmt(r.measured, r.metric), f"{100 * r.error:+.1f}%", mem, _note(r))
    console.print(table)
    stats = Table(title="|error| by group", caption="complete configurations: the runs whose record states the "
                  "parallel layout, micro and global batch, activation recompute and precision (the accuracy "
                  "targets' scope); a serving run's, that it needs no reading the source leaves out (its `assumed`)")
    for name in ("group", "evaluated", "skipped", "median", "mean", "p90", "max", "memory median", "not fitting"):
        stats.add_column(name, justify="left" if name == "group" else "right")

    def row(name: str, s: dict[str, Any]) -> None:
        pct = [("-" if math.isnan(s[k]) else f"{100 * s[k]:.1f}%") for k in (
            "median_abs_error", "mean_abs_error", "p90_abs_error", "max_abs_error", "memory_median_abs_error")]
        stats.add_row(name, str(s["evaluated"]), str(s["skipped"]), *pct, str(s["not_fitting"]))

    for g, s in summary["groups"].items():
        row(g, s)
    row("in sample (fit half)", summary["in_sample"])
    row("out of sample", summary["out_of_sample"])
    row("complete configurations", summary["complete"])
    row("overall", summary["overall"])
    console.print(stats)
    return out.getvalue()


def fit_check_markdown(results: Sequence[RunResult]) -> list[str]:
    """A markdown section on the measured runs meshplan says would not fit in GPU memory (``not_fitting``): each
    with its predicted peak, the GPU's memory and the recompute setting it was evaluated with."""
    wrong = [r for r in results if r.error is not None and not r.fits]
    out = ["## Will it fit? Measured runs that meshplan says would not", "",
           f"Every evaluated run was measured, so it fitted in its GPUs' memory. meshplan's peak memory exceeds the "
           f"GPU's on {len(wrong)} of {sum(1 for r in results if r.error is not None)}: a \"does not fit\" it would "
           "have got wrong (the time is still predicted for the plan as stated). Where the recompute setting is not "
           "stated, the runs read as the source's default; a stack that recomputed more, or saved less than "
           "meshplan counts, fits where meshplan says it does not.", ""]
    if not wrong:
        return out
    out += ["| run | predicted peak | GPU memory | recompute |", "|---|---:|---:|---|"]
    for r in sorted(wrong, key=lambda r: -r.memory_share):
        recompute = next((a for a in r.assumptions if "recompute" in a.lower()), "-")
        out.append(f"| {r.id} | {(r.memory_predicted or 0.0) / 2**30:.1f} GiB | "
                   f"{(r.memory_capacity or 0.0) / 2**30:.1f} GiB | {recompute} |")
    return out


def finite(value: Any) -> Any:
    """NaN (an empty summary) → null, so the JSON is strict."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

