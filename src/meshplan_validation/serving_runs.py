"""Published serving runs in ``meshplan validate``: a record of the serving schema (data/serving/README.md, "Record
schema") is told from a training one by its blocks, priced by the one serving evaluation the accuracy benchmark uses
(serving_eval.results, which maps it through serving_map.case_of), and written as one RunResult per run, so that
the per-run table, the summaries and the JSON treat both kinds alike.

A run's metric is its headline, as docs/ACCURACY_INFERENCE.md reads it: its throughput (serving_eval.headline_metric).
Where an offered request rate set the throughput (the TensorRT-LLM 0.14 server rows at QPS 2-32: the predicted
requests/s is the rate itself), or the source measured a latency only (a fixed batch timed end to end), it is the first
latency of SERVED_LATENCY the run measured: the inter-token latency first, the time per token at the batch the offered
rate holds; time to first token last, since at a finite rate it is queueing under an arrival process the source does
not state (data/serving/README.md, ``trtllm_serving_v0.14``). The run's other measured metrics go with it
(``RunResult.other_metrics``). The fit / held-out halves are the records' own ``split`` (fit; check and holdout are
out of sample), and a run's unstated settings are its ``assumed`` readings.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.serve.efficiency import SERVE_DEFAULT, ServeEfficiency
from meshplan.specs.bands import Band, serving_band, serving_class
from meshplan.specs.regime import serving_regime
from meshplan_validation.result import RunResult
from meshplan_validation.serving_eval import ServingResult, results, served_of
from meshplan_validation.serving_map import case_of

BLOCKS = ("model", "hardware", "parallel", "precision", "workload", "measured")  # the schema's objects
SERVED_LATENCY = ("itl_ms", "tpot_ms", "e2e_latency_ms", "ttft_ms")


def is_serving(record: Any) -> bool:
    """A record of the serving schema: it names its engine or describes its workload (a training record names
    its framework and has neither)."""
    return isinstance(record, dict) and ("workload" in record or "engine" in record)


def not_read(record: dict[str, Any]) -> str:
    """Why a serving record cannot be read (a block missing or not an object, a group or engine not text), or ""."""
    missing = [b for b in BLOCKS if not isinstance(record.get(b), dict)]
    if missing:
        return (f"serving record lacks the object(s) {', '.join(missing)} (data/serving/README.md, Record schema; "
                f"every one of {', '.join(BLOCKS)} is an object)")
    wrong = [k for k in ("group", "engine") if record.get(k) is not None and not isinstance(record[k], str)]
    return f"serving record's {', '.join(wrong)} must be text" if wrong else ""


def _priced(record: dict[str, Any], eff: ServeEfficiency) -> list[ServingResult] | str:
    """serving_eval.results of the one record, or the reason it is skipped (what it could not read)."""
    reason = not_read(record)
    if reason:
        return reason
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a junk size: a skip below, not a warning on stderr
            return results([record], eff)
    except MeshplanError as exc:
        return f"invalid input: {exc}"
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:  # a misreading case_of does not name
        return f"record not understood ({type(exc).__name__}: {exc})"


def primary(rows: Sequence[ServingResult]) -> ServingResult | None:
    """The run's metric (module docstring): its headline, else the first of SERVED_LATENCY it measured; None when
    meshplan predicts none of what it measured."""
    priced = [r for r in rows if r.error is not None and math.isfinite(r.error)]
    head = [r for r in priced if r.headline]
    if head:
        return head[0]
    return next((r for m in SERVED_LATENCY for r in priced if r.metric == m), None)


def serving_run(record: dict[str, Any], eff: ServeEfficiency = SERVE_DEFAULT) -> RunResult:
    """One serving record evaluated (its metric, the others beside it) or skipped with its reason."""
    rid, split = str(record.get("id")), record.get("split")
    base: dict[str, Any] = {"id": rid, "group": str(record.get("group") or ""), "kind": "serving",
                            "in_fit_set": split == "fit",
                            "unstated": tuple(str(a) for a in record.get("assumed") or ())}
    rows = _priced(record, eff)
    if isinstance(rows, str) or (rows and rows[0].skipped):
        return RunResult(**base, skipped=rows if isinstance(rows, str) else rows[0].skipped)
    main = primary(rows)
    if main is None:
        return RunResult(**base, skipped="no measured metric meshplan predicts for this run")
    others = tuple((r.metric, r.predicted, r.measured, r.error) for r in rows if r is not main)
    band = quoted_band(record, main)
    return RunResult(**base, metric=main.metric, predicted=main.predicted, measured=main.measured, error=main.error,
                     assumptions=base["unstated"], serving_mode=main.mode, batch=main.batch, other_metrics=others,
                     band=band.half_width, band_coverage=band.coverage, band_note=band.note)


def quoted_band(record: dict[str, Any], row: ServingResult) -> Band:
    """The band meshplan quotes for the run's metric on its configuration (specs/bands.py)."""
    case = case_of(record)
    assert not isinstance(case, str)  # priced above, so mapped
    regime = serving_regime(case.model, case.cluster, case.engine, served_of(case, row))
    return serving_band(serving_class(row.metric), regime)
