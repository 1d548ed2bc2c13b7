"""Each source the registry lists for a fitted constant (meshplan_validation/fitted.py ``sources``) has a run that
reads it: moved off its shipped value (to its prior, or half as much again where that is the prior), the prediction of
some run of that source, among the runs it was fitted on, moves. A listed source none of whose runs reads the constant
would leave a leave-one-source-out refit of it (loso_serving, loso_training) without effect, and the refit without the
other sources with nothing to place it by (issue 79: TensorRT-LLM's iteration overhead once listed the DeepSeek-R1
blog, whose runs are the PyTorch backend's)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshplan.specs.efficiency import DEFAULT
from meshplan_validation import loso_serving, loso_training
from meshplan_validation.fitted import FITTED, NO_PREDICTION, Fitted
from meshplan_validation.provenance import record_source
from meshplan_validation.records import read_runs

ROOT = Path(__file__).resolve().parents[1]
SERVING_FILES = ("data/serving/published_serving.jsonl", "data/serving/llm_inference_bench_dev.jsonl",
                 "data/serving/dstack_mi300x.jsonl")
CHUNK = 24
# chosen, not fitted on a prediction: the plan search's margin, the largest |error| of the peaks its source measured
PRICES_NO_PREDICTION = NO_PREDICTION


def _moved(f: Fitted) -> float:
    prior, value = f.prior, f.value()
    return prior if not math.isclose(prior, value, rel_tol=1e-9, abs_tol=1e-15) else (1.5 * value or 1e-3)


def _chunks(records: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    for i in range(0, len(records), CHUNK):
        yield records[i:i + CHUNK]


@pytest.fixture(scope="module")
def serving_records() -> dict[str, list[dict[str, Any]]]:
    """Each source's serving runs, the fit half first where it has one (the runs its constants are fitted on)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in SERVING_FILES:
        for r in read_runs(ROOT / path):
            out.setdefault(record_source(r), []).append(r)
    return {s: sorted(rs, key=lambda r: r.get("split") != "fit") for s, rs in out.items()}


def _serving_reads(f: Fitted, records: list[dict[str, Any]]) -> bool:
    (key, _), = loso_serving.prior_values(f.name).items()
    for chunk in _chunks(records):
        base = loso_serving.priced(chunk)
        moved = loso_serving.priced(chunk, {key: _moved(f)})
        if any(a.predicted and b.predicted and abs(b.predicted / a.predicted - 1) > 1e-9
               for a, b in zip(base, moved, strict=True)):
            return True
    return False


@pytest.mark.parametrize("name", [f.name for f in FITTED if f.domain == "serving"])
def test_each_listed_source_has_a_serving_run_that_reads_the_constant(name, serving_records):
    f = next(f for f in FITTED if f.name == name)
    unread = sorted(s for s in f.sources if not _serving_reads(f, serving_records.get(s, [])))
    assert not unread, f"{name}: no run of {unread} moves with it"


@pytest.fixture(scope="module")
def training_cases() -> dict[str, list[Any]]:
    runs = loso_training.runs_of(read_runs(ROOT / "data/validation/published_runs.jsonl"), "published")
    runs += loso_training.runs_of(read_runs(ROOT / "data/validation/small_work.jsonl"), "small_work")
    out: dict[str, list[Any]] = {}
    for case in loso_training.fit_cases(runs):
        out.setdefault(record_source({"group": case.group}), []).append(case)
    # vTrain's released half, whose runs a choice was made with in view (fitted.py), none of them in the fit half
    vtrain = loso_training.runs_of(read_runs(ROOT / "data/validation/vtrain_single_node_dev.jsonl"), "vtrain")
    out["vtrain"] = [r.case for r in vtrain if r.case is not None]
    return out


def _training_reads(f: Fitted, cases: list[Any]) -> bool:
    for case in cases:
        moved, eff = loso_training.at_prior(case, f.name)
        if f.name in loso_training.EFFICIENCY_NAMES:
            eff = DEFAULT.with_(**{f.name: _moved(f)})
        try:
            before, after = loso_training.log_prediction(case, DEFAULT), loso_training.log_prediction(moved, eff)
        except Exception:  # noqa: BLE001, S112  (a run the model skips reads nothing)
            continue
        if abs(after - before) > 1e-9:
            return True
    return False


@pytest.mark.parametrize("name", [f.name for f in FITTED if f.domain == "training"])
def test_each_listed_source_has_a_training_fit_run_that_reads_the_constant(name, training_cases):
    f = next(f for f in FITTED if f.name == name)
    if name in PRICES_NO_PREDICTION:
        return
    unread = sorted(s for s in f.sources if not _training_reads(f, training_cases.get(s, [])))
    assert not unread, f"{name}: no fit run of {unread} moves with it"
