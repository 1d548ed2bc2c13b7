"""docs/out_of_source.json (benchmarks/docs/out_of_source.py) prices what the code prices now: a change that moves a
prediction makes it stale, as tests/test_docs.py makes the accuracy documents stale. Every fourth run of every file is
priced again with the shipped constants and compared with the file's in-sample prediction; the refits the file holds
rest on those predictions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.specs.efficiency import DEFAULT
from meshplan_validation import loso_serving, loso_training
from meshplan_validation.records import read_runs

ROOT = Path(__file__).resolve().parents[1]
STALE = "docs/out_of_source.json is stale: regenerate it with `python benchmarks/docs/out_of_source.py` (then " \
        "`python benchmarks/docs/error_bands.py`)"


@pytest.fixture(scope="module")
def committed():
    data = json.loads((ROOT / "docs" / "out_of_source.json").read_text())
    return {(r["file"], r["id"], r.get("metric")): r for r in data["runs"]}


def _files(kind: str) -> dict[str, str]:
    import sys  # noqa: PLC0415

    sys.path.insert(0, str(ROOT / "benchmarks" / "docs"))
    import out_of_source  # noqa: PLC0415

    return out_of_source.TRAINING if kind == "training" else out_of_source.SERVING


def test_the_training_runs_price_as_the_file_says(committed):
    for name, path in _files("training").items():
        runs = loso_training.runs_of(read_runs(ROOT / path), name)
        for run in runs[::4]:
            if run.case is None:
                continue
            predicted, _, _, skip = loso_training.error_of(run.case, DEFAULT)
            row = committed[(name, run.record["id"], run.case.metric)]
            if skip:
                assert "skipped" in row, STALE
                continue
            assert row.get("predicted") == pytest.approx(predicted, rel=1e-9), f"{STALE} ({run.record['id']})"


def test_the_serving_runs_price_as_the_file_says(committed):
    for name, path in _files("serving").items():
        records = read_runs(ROOT / path)[::4]
        for r in loso_serving.priced(records):
            row = committed.get((name, r.id, r.metric))
            if r.predicted is None or row is None or "predicted" not in row:
                continue
            assert row["predicted"] == pytest.approx(r.predicted, rel=1e-9), f"{STALE} ({r.id} {r.metric})"
