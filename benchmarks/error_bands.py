"""The step-time error band of comparable runs: for each GPU architecture and model kind (dense / MoE), the 80th
percentile of |predicted / measured − 1| over the published runs meshplan evaluates (data/validation, the runs of
docs/ACCURACY.md). benchmarks/accuracy.py writes it to src/meshplan/presets/error_bands.json, from which every
Estimate reads its ``error_band`` (specs/bands.py); tests/test_docs.py notices when the file is stale.

A group with fewer than MIN_RUNS runs takes its architecture's band (both kinds), and an architecture with fewer
its generation's overall band: a band is only as good as the runs behind it, and the file says how many there were.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np

from meshplan_validation.case import map_run
from meshplan_validation.result import RunResult
from meshplan_validation.skip import Skip

QUANTILE = 0.8  # the band covers four in five comparable runs
MIN_RUNS = 8


def _kinds(results: list[RunResult], records: dict[str, dict[str, Any]]) -> dict[tuple[str, str], list[float]]:
    """|error| of every evaluated run by (architecture, dense | moe), from the record mapped onto meshplan."""
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in results:
        if r.error is None:
            continue
        try:
            case = map_run(records[r.id])
        except Skip:
            continue
        arch = case.cluster.accelerator.architecture or "unstated"
        out[(arch, "moe" if case.model.is_moe else "dense")].append(abs(r.error))
    return out


def _band(errors: list[float]) -> float:
    return round(float(np.quantile(errors, QUANTILE)), 4)


def error_bands(results: list[RunResult], records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The bands file: per "architecture/kind", the band and the runs it rests on (or where it fell back to)."""
    kinds = _kinds(results, records)
    every = [e for errors in kinds.values() for e in errors]
    by_arch: dict[str, list[float]] = defaultdict(list)
    for (arch, _), errors in kinds.items():
        by_arch[arch] += errors
    bands: dict[str, Any] = {}
    for arch in sorted(by_arch):
        for kind in ("dense", "moe"):
            errors = kinds.get((arch, kind), [])
            if len(errors) >= MIN_RUNS:
                bands[f"{arch}/{kind}"] = {"band": _band(errors), "runs": len(errors), "from": f"{arch}/{kind}"}
            elif len(by_arch[arch]) >= MIN_RUNS:
                bands[f"{arch}/{kind}"] = {"band": _band(by_arch[arch]), "runs": len(by_arch[arch]), "from": arch}
    return {"about": __doc__.split("\n\n")[0].replace("\n", " "), "quantile": QUANTILE,
            "overall": {"band": _band(every), "runs": len(every)}, "bands": bands}


def write(results: list[RunResult], records: list[dict[str, Any]], path: Any) -> None:
    by_id = {str(r.get("id")): r for r in records}
    path.write_text(json.dumps(error_bands(results, by_id), indent=1, sort_keys=True) + "\n")
