"""The ridge of the roofline: a kernel whose math and HBM times are close reaches neither roof (roofline.work_time,
their p-norm), with p measured on a lent H200's single decode GEMMs (benchmarks/measure/fit_ridge.py) and checked on an
H100's (data/measured/gpu/*-gemm-rows.json)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from meshplan.roofline import work_time
from meshplan.specs.efficiency import DEFAULT

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    path = next(ROOT.glob(f"benchmarks/*/{name}.py"))
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fit = _script("fit_ridge")


def test_equal_times_take_two_to_the_one_over_p_of_either():
    """p = 3.5: a GEMM whose math and traffic each take 8 us runs 8 x 2^(1/3.5) = 9.75 us, not 8 (the plain
    roofline) nor 16 (no overlap at all)."""
    assert DEFAULT.ridge == 3.5
    assert work_time(8e-6, 8e-6, DEFAULT) == pytest.approx(8e-6 * 2 ** (1 / 3.5)) == pytest.approx(9.75e-6, abs=1e-8)


def test_one_side_three_times_the_other_costs_under_one_per_cent_more():
    """3 us of math beside 1 us of traffic: 3 x (1 + (1/3)^3.5)^(1/3.5) = 3.018 us; a side that is zero adds
    nothing."""
    assert work_time(3e-6, 1e-6, DEFAULT) == pytest.approx(3e-6 * (1 + 3**-3.5) ** (1 / 3.5))
    assert work_time(3e-6, 1e-6, DEFAULT) == pytest.approx(3.018e-6, abs=1e-9)
    assert work_time(5e-6, 0.0, DEFAULT) == 5e-6 and work_time(0.0, 2e-6, DEFAULT) == 2e-6


def test_arrays_and_plain_numbers_agree():
    """The search prices plans in arrays, one plan in floats: the same numbers either way."""
    compute = np.array([0.0, 1e-6, 3e-6, 8e-6, 2e-3])
    memory = np.array([2e-6, 1e-6, 1e-6, 8e-6, 0.0])
    together = work_time(compute, memory, DEFAULT)
    for i in range(compute.size):
        assert together[i] == pytest.approx(work_time(float(compute[i]), float(memory[i]), DEFAULT), rel=1e-12)


def test_more_of_either_time_never_shortens_the_op_and_it_stays_between_max_and_sum():
    """Monotone in each time (a faster GPU never slows an op), at least the larger time, at most their sum."""
    rng = np.random.default_rng(7)
    a, b = rng.uniform(0, 1e-3, 2000), rng.uniform(0, 1e-3, 2000)
    t = work_time(a, b, DEFAULT)
    assert np.all(t >= np.maximum(a, b)) and np.all(t <= a + b + 1e-18)
    assert np.all(work_time(a * 1.1, b, DEFAULT) >= t) and np.all(work_time(a, b * 1.1, DEFAULT) >= t)


def test_the_h200_s_decode_gemms_give_the_shipped_exponent():
    """fit_ridge's least mean |log error| over the H200's 945 decode GEMMs falls at p = 3.46, shipped rounded to 3.5;
    the objective is flat there (3.5 within 0.1 % of the minimum) and the plain roofline's is 21 % higher."""
    p = fit.fit()
    assert p == pytest.approx(DEFAULT.ridge, rel=0.05)
    assert fit.objective(DEFAULT.ridge) <= 1.001 * fit.objective(p)
    assert fit.objective(math.inf) > 1.15 * fit.objective(p)


def test_the_h100_measured_after_agrees_on_decode():
    """Not in the fit: the H100's decode GEMMs' p90 |error| falls from 9.9 to 6.1 % and its fp8 ones' from 10.0 to
    8.2 %; the median of neither rises."""
    for kind, p90_now in (("decode", 0.065), ("fp8", 0.085)):
        now, plain = fit.summary("h100", kind, DEFAULT.ridge), fit.summary("h100", kind, math.inf)
        assert now["p90"] <= p90_now < plain["p90"], kind
        assert now["median"] <= plain["median"] + 0.001, kind


def test_training_gemms_keep_their_spread_around_their_bias():
    """Training's single GEMMs are compute-bound (their math 2-5x their traffic), so the ridge moves them a few per
    cent, all one way: they already read slow on median (``gemm`` is fitted on whole published steps, not single
    GEMMs), so the p90 |error| grows (H100 11 → 13 %) while their spread around their own median hardly moves
    (mean |deviation| 5.6 → 5.9 % on the H100, 4.6 → 4.6 % on the H200)."""
    for gpu, spread in (("h100", 0.060), ("h200", 0.048)):
        logs = fit.log_errors(gpu, "train", DEFAULT.ridge)
        assert np.mean(np.abs(logs - np.median(logs))) <= spread, gpu
        assert np.median(logs) > 0.0, gpu  # slow on median: the bias that is gemm's, not the ridge's


def test_the_fits_share_one_golden_section_search():
    """fit_efficiency.golden_section (the training constants' fit and this one's) is fit_inference's golden-section
    search (golden_brackets, the serving fits' golden_rounds) stopped at a relative width of 1e-3: on [1.5, 16] about
    a minimum at 3.1 the bracket is 14.5 x 0.618^16 = 0.0066 wide after 16 rounds, over 1e-3 x (a + b) = 0.0062, and
    0.0041 after 17, so it evaluates f 2 + 17 = 19 times, at golden_rounds' points in golden_rounds' order, and
    answers the last bracket's middle, within half its width of 3.1."""
    import fit_efficiency
    import fit_inference

    seen: list[float] = []
    rounds_seen: list[float] = []
    found = fit_efficiency.golden_section(lambda x: seen.append(x) or (x - 3.1) ** 2, 1.5, 16.0)
    fit_inference.golden_rounds(lambda x: rounds_seen.append(x) or (x - 3.1) ** 2, 1.5, 16.0, 17)
    assert len(seen) == 19 and seen == rounds_seen
    assert abs(found - 3.1) < 0.0041 / 2
