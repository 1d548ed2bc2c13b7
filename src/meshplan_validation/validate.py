"""Validation against published, measured training runs (``shared/validation/published_runs.jsonl`` schema): every
record of a file mapped to a (ModelSpec, Cluster, Plan, Stack) (case.map_run), evaluated (evaluate.py) or skipped with
its reason; and the text or JSON that ``meshplan validate`` prints (command.py). Serving records (the schema of
data/serving/README.md) in the same file are told apart by their blocks and priced by the serving evaluation the
serving accuracy benchmark uses (serving_runs.py), into the same per-run results.

Every value a source does not state is filled with a documented default of that source's framework and release
(sources.py, recipes.py), and the run carries that assumption as text. The prediction is compared on the basis the
source measured (measurement.py): iteration time or tokens/s where given (exact conversions); otherwise TFLOP/s or
MFU, converted with *that source's* FLOP formula (flops.py, never meshplan's).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from meshplan.errors import MeshplanError, PlanError, SpecError
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan_validation.case import map_run
from meshplan_validation.evaluate import evaluated, with_band
from meshplan_validation.record_fields import Lenders, fill_from_siblings, lenders
from meshplan_validation.records import clean_record, read_runs, unstated_settings
from meshplan_validation.render import finite, render_text
from meshplan_validation.result import RunResult
from meshplan_validation.selection import in_fit_set, select
from meshplan_validation.serving_runs import is_serving, serving_run
from meshplan_validation.skip import Skip
from meshplan_validation.summary import summaries

JSON_KINDS = {str: "string", list: "array", int: "number", float: "number", bool: "boolean", type(None): "null"}


def run_validation(records: Sequence[dict[str, Any]], group: str | None = None, exclude_superseded: bool = False,
                   eff: Efficiency = DEFAULT, hybrid: bool = False) -> list[RunResult]:
    """Every record evaluated or skipped with its reason; ``hybrid``: compare the hybrid Mamba runs too. A record
    this cannot read (not an object, a value of the wrong kind, sizes that contradict each other) is skipped with a
    reason naming what it could not read, never raised. Serving records are priced as serving runs (serving_runs.py),
    in their place in the file."""
    cleaned = [r if is_serving(r) else clean_record(r) if isinstance(r, dict) else {
        "id": f"#{i + 1}", "_not_object": JSON_KINDS.get(type(r), type(r).__name__)} for i, r in enumerate(records)]
    training = [r for r in cleaned if not is_serving(r)]
    siblings = (training, lenders(training))  # the records that lend unstated settings, indexed once
    results = []
    for record, reason in select(cleaned, group, exclude_superseded):
        rid = str(record.get("id"))
        if is_serving(record):
            results.append(RunResult(id=rid, group=str(record.get("group") or ""), kind="serving", skipped=reason)
                           if reason else serving_run(record))
            continue
        # judged on the record as published, before fill_from_siblings lends it a sibling's settings
        unstated = unstated_settings(record)
        if record.get("_not_object"):
            reason = f"record {rid} is a JSON {record['_not_object']}, not an object"
        outcome = reason or _evaluated_or_reason(record, siblings, eff, hybrid)
        if isinstance(outcome, RunResult):
            results.append(replace(outcome, unstated=unstated))
        else:
            results.append(RunResult(id=rid, group=str(record.get("group") or ""), skipped=outcome,
                                     in_fit_set=in_fit_set(rid), unstated=unstated))
    return results


def _evaluated_or_reason(record: dict[str, Any], siblings: tuple[Sequence[dict[str, Any]], Lenders | None],
                         eff: Efficiency, hybrid: bool) -> RunResult | str:
    """The record's RunResult, or the reason it is skipped: a Skip's, invalid input, or what it could not read."""
    try:
        case = map_run(fill_from_siblings(record, *siblings), hybrid)
        return with_band(evaluated(case, eff), case)
    except (Skip, PlanError) as exc:
        return str(exc) or type(exc).__name__
    except MeshplanError as exc:
        return f"invalid input: {exc}"
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:  # a misreading map_run does not name
        return f"record not understood ({type(exc).__name__}: {exc})"


def validate_command(path: str, group: str | None, as_json: bool, exclude_superseded: bool = False,
                     hybrid: bool = False) -> str:
    """The text (a rich table of every run, then the summaries) or JSON that ``meshplan validate`` prints."""
    records = read_runs(path)
    if group is not None and not any(r.get("group") == group for r in records):
        known = sorted({str(r["group"]) for r in records if r.get("group")})
        listed = f"groups: {', '.join(known)}" if known else "no record names a group"
        raise SpecError(f"group={group!r} is not in {path} ({listed})")
    results = run_validation(records, group, exclude_superseded, hybrid=hybrid)
    summary = summaries(results)
    if as_json:
        return json.dumps(finite({"runs": [r.to_dict() for r in results], "summary": summary["overall"],
                                  "complete": summary["complete"],
                                  "in_sample": summary["in_sample"], "out_of_sample": summary["out_of_sample"],
                                  "groups": summary["groups"]}), indent=1, allow_nan=False)
    return render_text(results, summary)
