"""How far the serving model was from the published serving runs, per GPU architecture: the runs' count, the median
and the 90th percentile of |predicted / measured − 1| (and the median signed error) of their throughput (each run's
headline metric, as docs/ACCURACY_INFERENCE.md's summary counts them), per source and per latency metric (over every
architecture too: the serving search's TTFT note reads it where the GPU's has none), and per engine.
benchmarks/docs/accuracy_inference.py writes it to src/meshplan/presets/serving_errors.json, which the serving report's
trust note reads (report/serve_trust.py: the core never imports meshplan_validation); tests/test_docs.py notices
when the file is stale.

A run's architecture and engine are those meshplan prices it with (serving_map.case_of: the system preset's
``architecture``, the engine preset; ServingResult carries them from serving_eval.results, which mapped the record),
so that the report finds the runs of the GPU it plans for by the same key.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from meshplan_validation.serving_eval import LATENCY, ServingResult


def stats(errors: Sequence[float]) -> dict[str, Any]:
    """Runs, median and p90 of |error|, and the median signed error (``bias``: above 0, the model reads high), to 4
    decimals (the file changes only when a figure does)."""
    e = np.asarray(errors, dtype=float)
    a = np.abs(e)
    return {"runs": int(a.size), "median": round(float(np.median(a)), 4), "p90": round(float(np.percentile(a, 90)), 4),
            "bias": round(float(np.median(e)), 4)}


def _where(results: Sequence[ServingResult]) -> dict[str, tuple[str, str]]:
    """Run id -> (architecture, engine) as meshplan prices it, of every run that was mapped (the last of an id)."""
    return {r.id: (r.architecture, r.engine) for r in results if not r.skipped}


def serving_errors(results: Sequence[ServingResult]) -> dict[str, Any]:
    """The file's contents (module docstring)."""
    where = _where(results)
    rated = [r for r in results if r.error is not None and r.id in where]
    head = [r for r in rated if r.headline and r.layout_stated]  # an unstated MoE layout: no band of a GPU
    by_arch: dict[str, dict[str, Any]] = {}
    for arch in sorted({where[r.id][0] for r in rated}):
        mine = [r for r in head if where[r.id][0] == arch]
        sources: dict[str, list[float]] = defaultdict(list)
        for r in mine:
            sources[r.group].append(r.error)
        latency = {m: stats([r.error for r in rated if where[r.id][0] == arch and r.metric == m])
                   for m in LATENCY if any(where[r.id][0] == arch and r.metric == m for r in rated)}
        names = sorted({r.generation for r in rated if where[r.id][0] == arch})
        by_arch[arch] = ({"name": ", ".join(names)} | (stats([r.error for r in mine]) if mine else {"runs": 0})
                         | {"sources": {g: stats(e) for g, e in sorted(sources.items())}, "latency": latency})
    engines: dict[str, list[float]] = defaultdict(list)
    for r in head:
        engines[where[r.id][1]].append(r.error)
    return {"about": __doc__.split("\n\n")[0].replace("\n", " "), "metric": "throughput (each run's headline)",
            "overall": stats([r.error for r in head]) | {"latency": {
                m: stats([r.error for r in rated if r.metric == m]) for m in LATENCY
                if any(r.metric == m for r in rated)}},
            "architectures": by_arch,
            "engines": {e: stats(v) for e, v in sorted(engines.items())}}


def write(results: Sequence[ServingResult], path: Any) -> None:
    path.write_text(json.dumps(serving_errors(results), indent=1, sort_keys=True) + "\n")
