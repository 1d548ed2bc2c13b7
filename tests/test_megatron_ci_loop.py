"""The training loop's host work of Megatron-LM's CI runs (Stack.microbatch_host, Stack.iteration_host; the
validation profile "Megatron-LM CI 2024" of meshplan_validation/sources.py): the per-micro-batch constant is the
least-squares fit on the fit half of those records and nothing else, and each term moves the estimate as
step/stages.py says: m + p − 1 micro-batch slots on a 1F1B pipeline's critical path, once per step."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from meshplan_validation.case import Case, map_run
from meshplan_validation.evaluate import evaluate_case
from meshplan_validation.record_fields import fill_from_siblings
from meshplan_validation.records import clean_record, read_runs
from meshplan_validation.sources import MEGATRON_LM_CI_MICROBATCH, MEGATRON_LM_CI_STEP

RECORDS = Path(__file__).resolve().parents[1] / "data" / "validation" / "small_work.jsonl"


def _cases(split: str) -> list[tuple[Case, float]]:
    records = [clean_record(r) for r in read_runs(RECORDS)]
    return [(map_run(fill_from_siblings(r, records)), r["measured"]["iteration_time_s"]) for r in records
            if r["group"].startswith("megatron_lm_ci") and r["split"] == split]


def _step(case: Case, microbatch: float, step: float = MEGATRON_LM_CI_STEP) -> float:
    stack = case.stack.with_(microbatch_host=microbatch, iteration_host=step)
    return evaluate_case(replace(case, stack=stack)).step_time


def test_the_profile_carries_the_loop():
    case, _ = _cases("fit")[0]
    assert (case.stack.microbatch_host, case.stack.iteration_host) == (MEGATRON_LM_CI_MICROBATCH,
                                                                       MEGATRON_LM_CI_STEP)


def test_microbatch_host_is_the_least_squares_fit_on_the_fit_half():
    """X* = Σ s·r / Σ s², r the measured step less the estimate without the term, s the estimate's growth per
    second of it (each run's slope, measured on the estimate: (m + p − 1) · python_host on a 1F1B pipeline)."""
    cases = _cases("fit")
    assert len(cases) == 6  # the six pipelined runs of the fit half
    num = den = 0.0
    for case, measured in cases:
        base = _step(case, 0.0)
        slope = (_step(case, 1e-3) - base) / 1e-3
        num, den = num + slope * (measured - base), den + slope * slope
    assert num / den == pytest.approx(MEGATRON_LM_CI_MICROBATCH, rel=0.03)


@pytest.mark.parametrize("index", [0, 1])
def test_each_micro_batch_slot_pays_the_loop_once(index):
    """A 1F1B pipeline pays the per-micro-batch term on each of its m + p − 1 slots (the busiest rank's m, the
    others' once each in the bubble), at the host's speed (Cluster.python_host); the per-step term once."""
    case, _ = _cases("fit")[index]
    m, p, host = case.plan.grad_accum, case.plan.pp, case.cluster.python_host
    assert p > 1 and case.plan.schedule == "1f1b"
    base = _step(case, 0.0, 0.0)
    assert _step(case, 1e-3, 0.0) - base == pytest.approx((m + p - 1) * 1e-3 * host, rel=1e-6)
    assert _step(case, 0.0, 1e-3) - base == pytest.approx(1e-3 * host, rel=1e-6)

