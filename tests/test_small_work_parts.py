"""The split of benchmarks/measure/small_work_parts.py on made-up plans whose parts are known: step times that are
exact lines in the micro-batch count, at two depths, give back the per-layer, outside-the-layers and per-step parts."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "measure"))

import small_work_parts as sp  # noqa: E402


def _rec(layers, gbs, tp=2, dp=1, mb=2, hidden=1024):
    return {"parallel": {"tp": tp, "pp": 1, "dp": dp, "micro_batch_size": mb, "global_batch_size": gbs},
            "model": {"num_layers": layers, "hidden_size": hidden}}


def _made_up(layer, outside, step):
    """Runs of a 12- and a 20-layer model at global batches 4, 8, 16 (micro-batch 2, dp 1: n = 2, 4, 8), every series
    the same step time n x (layers x layer + outside) + step."""
    records = [_rec(L, g) for L in (12, 20) for g in (4, 8, 16)]
    t = np.array([sp.microbatches(r) * (r["model"]["num_layers"] * layer + outside) + step for r in records])
    return records, {name: t for name in sp.SERIES}


def test_microbatch_count():
    """global batch 16 over dp 2 at micro-batch 2: 16 / (2 x 2) = 4 micro-batches a rank."""
    assert sp.microbatches(_rec(12, 16, dp=2)) == 4


def test_line_of_a_plan():
    """12 layers x 3 ms + 5 ms = 41 ms a micro-batch, 7 ms a step: n = 2, 4, 8 give 89, 171, 335 ms."""
    records, times = _made_up(3e-3, 5e-3, 7e-3)
    assert times["measured"][:3] == pytest.approx([0.089, 0.171, 0.335])
    fit = sp.lines(records, times)[(2, 1, 1, 2, 12, 1024)]["measured"]
    assert fit == pytest.approx((0.041, 0.007))


def test_layer_split():
    """slope(20) = 20 x 3 + 5 = 65 ms, slope(12) = 41 ms: (65 - 41) / 8 = 3 ms a layer, 41 - 12 x 3 = 5 ms outside."""
    records, times = _made_up(3e-3, 5e-3, 7e-3)
    parts = sp.layer_split(sp.lines(records, times))[(2, 1, 1, 2, 1024)]["priced"]
    assert parts == pytest.approx({"layer": 3e-3, "outside": 5e-3, "step": 7e-3})


def test_plan_with_one_global_batch_has_no_line():
    """A plan measured at one global batch fixes no slope: it is left out, and so is its depth twin's split."""
    records = [_rec(12, 8), _rec(20, 8), _rec(20, 16)]
    times = {name: np.array([0.1, 0.2, 0.4]) for name in sp.SERIES}
    fits = sp.lines(records, times)
    assert list(fits) == [(2, 1, 1, 2, 20, 1024)]
    assert sp.layer_split(fits) == {}


def test_table_rows_in_milliseconds():
    """One plan's parts as a markdown row, in ms: 3.00 a layer, 5.00 outside, 7.00 a step, in every column."""
    records, times = _made_up(3e-3, 5e-3, 7e-3)
    rows = sp.table(sp.layer_split(sp.lines(records, times)))
    assert rows[2] == "| 2 | 2 | 1024 | 3.00 | 3.00 | 3.00 | 3.00 | 5.00 | 5.00 | 7.00 | 7.00 |"


def test_residual_of_a_line_and_of_a_scatter():
    """Step times on the line give 0; moving the n = 4 run of the 12-layer plan from 171 to 180 ms: the least squares
    line through (2, 89), (4, 180), (8, 335) ms has slope 759.33 / 18.667 = 40.68 and intercept 201.33 - 40.68 x 4.667
    = 11.5, so residuals -3.857, +5.786, -1.929 ms, the largest share 3.857 / 89 = 4.33 %."""
    records, times = _made_up(3e-3, 5e-3, 7e-3)
    assert sp.residual(records, times) == pytest.approx(0.0, abs=1e-12)
    times = {**times, "measured": times["measured"].copy()}
    times["measured"][1] = 0.180
    assert sp.residual(records, times) == pytest.approx(3.857e-3 / 0.089, rel=1e-3)
