"""The error statistics of a validation: median / mean / p90 / max of |error| and of the peak-memory error, the runs
predicted not to fit; over all runs, the complete configurations, each source group and the fit / held-out halves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from meshplan_validation.result import RunResult


def summarize(results: Sequence[RunResult]) -> dict[str, Any]:
    """median / mean / p90 / max of |error| over evaluated runs, counts, and the peak-memory errors.

    ``not_fitting`` counts the evaluated runs whose predicted peak memory exceeds the GPU's: each of them was
    measured, so it fitted, and each is a "does not fit" that meshplan would have got wrong."""
    errors = np.array([abs(r.error) for r in results if r.error is not None])
    mem = np.array([abs(r.memory_error) for r in results if r.memory_error is not None])
    summary: dict[str, Any] = {"evaluated": int(errors.size), "skipped": sum(1 for r in results if r.skipped)}
    for key, fn in (("median_abs_error", np.median), ("mean_abs_error", np.mean),
                    ("p90_abs_error", lambda a: np.percentile(a, 90)), ("max_abs_error", np.max)):
        summary[key] = float(fn(errors)) if errors.size else math.nan
    signed = [r.error for r in results if r.error is not None]
    summary["mean_signed_error"] = float(np.mean(signed)) if signed else math.nan
    summary["memory_evaluated"] = int(mem.size)
    summary["memory_median_abs_error"] = float(np.median(mem)) if mem.size else math.nan
    summary["memory_max_abs_error"] = float(np.max(mem)) if mem.size else math.nan
    summary["not_fitting"] = sum(1 for r in results if r.error is not None and not r.fits)
    return summary


def summaries(results: Sequence[RunResult]) -> dict[str, Any]:
    """Overall, on the runs with complete configurations (``records.unstated_settings``), per group, and for the
    fit / held-out halves."""
    groups = sorted({r.group for r in results})
    return {
        "overall": summarize(results),
        "complete": summarize([r for r in results if r.complete]),
        "in_sample": summarize([r for r in results if r.in_fit_set]),
        "out_of_sample": summarize([r for r in results if not r.in_fit_set]),
        "groups": {g: summarize([r for r in results if r.group == g]) for g in groups},
    }
