"""Out-of-source errors (issue 79): every measured run meshplan holds, training and serving, priced twice: with the
shipped constants (in sample) and with every constant of the registry (meshplan_validation/fitted.py) refitted
without the run's source (leave-one-source-out; meshplan_validation/loso_training.py, loso_serving.py). Writes
docs/out_of_source.json: per run its source, regime (meshplan/specs/regime.py), metric and both errors; per constant
its shipped value and its value refitted without each of its sources. docs/ACCURACY.md and
docs/ACCURACY_INFERENCE.md lead with these errors, and benchmarks/docs/error_bands.py builds the bands every estimate
quotes from them.

Run: python benchmarks/docs/out_of_source.py [--out DIR]   (about two minutes; tests/test_out_of_source.py checks that
     the committed file prices what the code prices now)
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
from meshplan_validation.fitted import FITTED, NO_PREDICTION
from meshplan_validation.provenance import record_source
from meshplan_validation.records import read_runs
from meshplan_validation.render import finite
from meshplan_validation.serving_eval import served_of
from meshplan_validation.serving_map import case_of

ROOT = Path(__file__).resolve().parents[2]
TRAINING = {"published": "data/validation/published_runs.jsonl", "small_work": "data/validation/small_work.jsonl",
            "vtrain": "data/validation/vtrain_single_node_dev.jsonl",
            "independent": "benchmarks/data/independent_runs.jsonl"}
SERVING = {"published": "data/serving/published_serving.jsonl", "small_work": "data/serving/small_work.jsonl",
           "argonne": "data/serving/llm_inference_bench_dev.jsonl", "dstack": "data/serving/dstack_mi300x.jsonl"}
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
    constants["elsewhere"] = training_priors(runs)
    return rows


def training_priors(runs: dict[str, list[Any]]) -> dict[str, Any]:
    """Each training constant's effect on the runs of the sources it was not fitted on: their errors with it as
    shipped and at its prior, over the runs whose prediction it moves (it earns its place out of source where the
    shipped value reads them better)."""
    out: dict[str, Any] = {}
    for f in (f for f in FITTED if f.domain == "training" and f.name not in NO_PREDICTION):
        shipped, prior = [], []
        for run in (r for file in runs.values() for r in file if r.case is not None and r.source not in f.sources):
            p0, e0, _, skip = loso_training.error_of(run.case, DEFAULT)
            p1, e1, _, skip1 = loso_training.error_of(*loso_training.at_prior(run.case, f.name))
            if not (skip or skip1) and e0 is not None and e1 is not None and abs(p1 / p0 - 1) > 1e-9:
                shipped.append(e0)
                prior.append(e1)
        out[f.name] = {"runs": len(shipped), "shipped": shipped, "prior": prior}
    return out


def serving_priors(files: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """serving's ``training_priors``: each serving constant at its prior on the runs of the other sources."""
    out: dict[str, Any] = {}
    for f in (f for f in FITTED if f.domain == "serving"):
        records = [r for rs in files.values() for r in rs if record_source(r) not in f.sources]
        base = loso_serving.priced(records)
        moved = loso_serving.priced(records, loso_serving.prior_values(f.name))
        judged = _judged(base)
        pairs = [(a.error, b.error) for i, (a, b) in enumerate(zip(base, moved, strict=True)) if i in judged and
                 a.error is not None and b.error is not None and a.predicted and b.predicted and
                 abs(b.predicted / a.predicted - 1) > 1e-9]
        out[f.name] = {"runs": len(pairs), "shipped": [a for a, _ in pairs], "prior": [b for _, b in pairs]}
    return out


def _judged(results: list[Any]) -> set[int]:
    """The index of each run's observation that judges it (loso_serving.judged: its headline throughput, or, for a run
    that measured no throughput and was not driven at an offered rate, the first metric it measured)."""
    chosen = {id(r) for r in loso_serving.judged(results)}
    return {i for i, r in enumerate(results) if id(r) in chosen}


def serving_rows(constants: dict[str, Any]) -> list[dict[str, Any]]:
    files = {name: read_runs(ROOT / path) for name, path in SERVING.items()}
    fit = [r for r in files["published"] if r.get("split") == "fit"]
    every = [r for rs in files.values() for r in rs]
    linear = loso_serving.linearised(fit)
    rows, values = [], {}
    for file, records in files.items():
        for record in records:
            source = record_source(record)
            if source not in values:
                values[source] = (loso_serving.refit_without(linear, source)
                                  if source in loso_serving.fit_sources() else loso_serving.shipped()
                                  ) | loso_serving.single_without(source, every)
            rows += _serving_record(record, file, source, values[source])
    fitted_on = loso_serving.fit_sources() | {s for f in FITTED if f.domain == "serving" for s in f.sources}
    constants["serving"] = {"all sources": linear.refit(None)} | {
        s: v for s, v in sorted(values.items()) if s in fitted_on}
    constants["elsewhere"] |= serving_priors(files)
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
        regime = serving_regime(case.model, case.cluster, case.engine, served_of(case, r)) if not isinstance(
            case, str) else {}
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
