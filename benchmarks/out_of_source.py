"""Out-of-source errors (issue 79): every measured run meshplan holds, training and serving, priced twice: with the
shipped constants (in sample) and with every constant of the registry (meshplan_validation/fitted.py) refitted
without the run's source (leave-one-source-out; meshplan_validation/loso_training.py, loso_serving.py). Writes
docs/out_of_source.json: per run its source, regime (meshplan/specs/regime.py), metric and both errors; per constant
its shipped value and its value refitted without each of its sources. docs/ACCURACY.md and
docs/ACCURACY_INFERENCE.md lead with these errors, and benchmarks/error_bands.py builds the bands every estimate
quotes from them.

Run: python benchmarks/out_of_source.py [--out DIR]   (about two minutes; tests/test_out_of_source.py checks that the
     committed file prices what the code prices now)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.regime import serving_regime, training_regime
from meshplan_validation import loso_serving, loso_training
from meshplan_validation.fitted import FITTED
from meshplan_validation.provenance import record_source
from meshplan_validation.records import read_runs
from meshplan_validation.render import finite
from meshplan_validation.serving_eval import weights_of
from meshplan_validation.serving_map import case_of

ROOT = Path(__file__).resolve().parents[1]
TRAINING = {"published": "data/validation/published_runs.jsonl", "small_work": "data/validation/small_work.jsonl",
            "vtrain": "data/validation/vtrain_single_node_dev.jsonl",
            "independent": "benchmarks/data/independent_runs.jsonl"}
SERVING = {"published": "data/serving/published_serving.jsonl", "small_work": "data/serving/small_work.jsonl",
           "argonne": "data/serving/llm_inference_bench_dev.jsonl"}
OUT = ROOT / "docs" / "out_of_source.json"


def training_rows(constants: dict[str, Any]) -> list[dict[str, Any]]:
    runs = {name: loso_training.runs_of(read_runs(ROOT / path), name) for name, path in TRAINING.items()}
    refit = loso_training.EfficiencyRefit.build(loso_training.fit_cases(runs["published"]))
    values: dict[str, dict[str, float]] = {}
    rows = []
    for run in (r for file in runs.values() for r in file):
        row: dict[str, Any] = {"id": run.record["id"], "file": run.file, "source": run.source, "kind": "training"}
        if run.case is None:
            rows.append(row | {"skipped": run.skipped})
            continue
        c = run.case
        if run.source not in values:
            values[run.source] = refit.without(run.source)
        predicted, error, memory, skip = loso_training.error_of(c, DEFAULT)
        if skip:
            rows.append(row | {"skipped": skip})
            continue
        oos_pred, oos_err, _, _ = loso_training.error_of(loso_training.without_source(c, run.source),
                                                          DEFAULT.with_(**values[run.source]))
        # no fitted constant prices memory: its in-sample error is out of source
        rows.append(row | {"metric": c.metric, "measured": c.measured, "predicted": predicted, "error": error,
                           "oos_predicted": oos_pred, "oos_error": oos_err, "memory_error": memory,
                           "regime": training_regime(c.model, c.cluster, c.plan, c.stack)})
    fitted_on = {s for f in FITTED if f.domain == "training" for s in f.sources}
    constants["training"] = {"all sources": refit.without(None)} | {
        s: v for s, v in sorted(values.items()) if s in fitted_on}
    return rows


def serving_rows(constants: dict[str, Any]) -> list[dict[str, Any]]:
    files = {name: read_runs(ROOT / path) for name, path in SERVING.items()}
    fit = [r for r in files["published"] if r.get("split") == "fit"]
    linear = loso_serving.linearised(fit)
    rows, values = [], {}
    for file, records in files.items():
        for record in records:
            source = record_source(record)
            if source not in values:
                values[source] = (loso_serving.refit_without(linear, source)
                                  if source in loso_serving.fit_sources() else loso_serving.shipped())
            rows += _serving_record(record, file, source, values[source])
    constants["serving"] = {"all sources": linear.refit(None)} | {
        s: v for s, v in sorted(values.items()) if s in loso_serving.fit_sources()}
    return rows


def _serving_record(record: dict[str, Any], file: str, source: str, values: dict[str, float]) -> list[dict[str, Any]]:
    base = {"id": record["id"], "file": file, "source": source, "kind": "serving"}
    inside = loso_serving.priced([record])
    outside = loso_serving.priced([record], values)
    case = case_of(record)
    out = []
    for r, o in zip(inside, outside, strict=True):
        if r.skipped or r.predicted is None or r.error is None:
            out.append(base | {"metric": r.metric, "skipped": r.skipped or "no prediction"})
            continue
        regime = serving_regime(case.model, case.cluster, case.engine, case.mode, r.batch or 1.0,
                                weights_of(case)) if not isinstance(case, str) else {}
        out.append(base | {"metric": r.metric, "headline": r.headline, "split": r.split, "measured": r.measured,
                           "layout_stated": r.layout_stated,
                           "predicted": r.predicted, "error": r.error, "oos_predicted": o.predicted,
                           "oos_error": o.error, "regime": regime})
    return out


def main() -> None:
    out = OUT
    if "--out" in sys.argv:
        out = Path(sys.argv[sys.argv.index("--out") + 1]) / OUT.name
    start = time.perf_counter()
    constants: dict[str, Any] = {}
    rows = training_rows(constants) + serving_rows(constants)
    registry = [{"name": f.name, "where": f.where, "domain": f.domain, "value": f.value(), "data": f.data,
                 "sources": sorted(f.sources), "script": f.script, "prior": f.prior, "unit": f.unit} for f in FITTED]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(finite({"about": __doc__.split("\n\n")[0].replace("\n", " "), "registry": registry,
                                      "refitted": constants, "runs": rows}), indent=None, sort_keys=True) + "\n")
    done = [r for r in rows if r.get("oos_error") is not None]
    print(f"wrote {out}: {len(done)} priced observations of {len(rows)} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
