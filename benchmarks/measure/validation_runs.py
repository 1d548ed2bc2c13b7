"""The published runs the report's trust panel compares a plan with: for every run meshplan evaluates (data/validation,
the runs of docs/ACCURACY.md), its GPU generation, model class, parallel shape as mapped onto meshplan, and its
measured and predicted values. benchmarks/docs/accuracy.py writes it to src/meshplan/presets/validation_runs.json
(packaged with meshplan: the core never imports meshplan_validation, tests/test_imports.py), which report/trust.py
reads; tests/test_docs.py notices when the file is stale.
"""

from __future__ import annotations

import json
from typing import Any

from meshplan_validation.case import map_run
from meshplan_validation.result import RunResult
from meshplan_validation.skip import Skip

FIELDS = ("id", "source", "url", "framework", "model", "params_b", "moe", "architecture", "gpu", "gpus", "dp", "tp",
          "tp2", "pp", "cp", "ep", "vpp", "precision", "metric", "measured", "predicted", "error", "complete")


def _row(r: RunResult, record: dict[str, Any]) -> dict[str, Any] | None:
    try:
        case = map_run(record)
    except Skip:
        return None
    p, acc = case.plan, case.cluster.accelerator
    return {"id": r.id, "source": str(record.get("source", "")).split(",")[0].strip(),
            "url": record.get("source_url", ""), "framework": record.get("framework", ""), "model": case.model.name,
            "params_b": round(case.model.params() / 1e9, 2), "moe": case.model.is_moe,
            "architecture": acc.architecture or "unstated", "gpu": acc.name, "gpus": case.cluster.num_gpus,
            "dp": p.dp, "tp": p.tp, "tp2": p.tp2, "pp": p.pp, "cp": p.cp, "ep": p.ep, "vpp": p.vpp,
            "precision": p.precision, "metric": r.metric, "measured": r.measured,
            "predicted": round(r.predicted, 6), "error": round(r.error, 6),
            "complete": r.complete}


def validation_runs(results: list[RunResult], records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows = [row for r in results if r.error is not None and (row := _row(r, records[r.id])) is not None]
    return {"about": __doc__.split("\n\n")[0].replace("\n", " "), "fields": list(FIELDS),
            "runs": [[row[k] for k in FIELDS] for row in sorted(rows, key=lambda x: x["id"])]}


def write(results: list[RunResult], records: list[dict[str, Any]], path: Any) -> None:
    by_id = {str(r.get("id")): r for r in records}
    path.write_text(json.dumps(validation_runs(results, by_id), separators=(",", ":")) + "\n")
