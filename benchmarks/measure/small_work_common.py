"""What the small-work regime's reports share (benchmarks/measure/small_work.py's training and serving sections,
benchmarks/measure/small_work_vtrain.py's vTrain subsection): the error statistics of (metric, error) pairs and their
table rows. Apart so that neither report imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

TIME_METRICS = ("iteration_time_s", "ttft_ms", "itl_ms", "tpot_ms", "e2e_latency_ms")


def pct(x: float | None, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:+.1f} %" if signed else f"{100 * x:.1f} %"


def num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def too_fast(metric: str, error: float) -> bool:
    """The prediction is faster than the run: a shorter time, or a higher throughput."""
    return error < 0 if metric in TIME_METRICS else error > 0


def stats(rows: Sequence[tuple[str, float]]) -> dict[str, Any]:
    """Runs, median / p90 / mean |error|, median signed error and the share predicted too fast, of (metric, error)
    pairs."""
    if not rows:
        return {"runs": 0, "median_abs_error": None, "p90_abs_error": None, "mean_abs_error": None,
                "median_signed_error": None, "too_fast_share": None}
    e = np.array([err for _, err in rows], dtype=float)
    a = np.abs(e)
    fast = sum(too_fast(m, err) for m, err in rows)
    return {"runs": int(a.size), "median_abs_error": float(np.median(a)), "p90_abs_error": float(np.percentile(a, 90)),
            "mean_abs_error": float(a.mean()), "median_signed_error": float(np.median(e)),
            "too_fast_share": fast / a.size}


def stats_row(name: str, s: dict[str, Any]) -> str:
    share = "-" if s["too_fast_share"] is None else f"{100 * s['too_fast_share']:.0f} %"
    return (f"| {name} | {s['runs']} | {pct(s['median_abs_error'])} | {pct(s['p90_abs_error'])} | "
            f"{pct(s['mean_abs_error'])} | {pct(s['median_signed_error'], True)} | {share} |")


STATS_HEAD = ["| runs | evaluated | median \\|error\\| | p90 \\|error\\| | mean \\|error\\| | median signed "
              "| too fast |", "|---|---:|---:|---:|---:|---:|---:|"]
