"""The per-tp split of benchmarks/measure/small_work_tp_split.py on made-up plans whose parts are known: a run's
signed error is the sum of what its layers, the rest of its micro-batches and its once-a-step part add."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "measure"))

import small_work_tp_split as ts  # noqa: E402


def _rec(layers, gbs, tp=4, mb=2):
    return {"parallel": {"tp": tp, "pp": 1, "dp": 1, "micro_batch_size": mb, "global_batch_size": gbs},
            "model": {"num_layers": layers, "hidden_size": 2048}}


RECORDS = [_rec(L, g) for L in (12, 20) for g in (4, 8, 16)]  # n = 2, 4, 8 micro-batches of 2


def _times(layer, outside, step):
    return np.array([ts.microbatches(r) * (r["model"]["num_layers"] * layer + outside) + step for r in RECORDS])


def test_shares_of_one_run():
    """Measured 3 ms a layer, 5 ms outside, 7 ms a step; priced 4, 4 and 7. The 12-layer run at n = 2:
    measured 2 x (36 + 5) + 7 = 89 ms, priced 2 x (48 + 4) + 7 = 111 ms, error 22 / 89 = +24.7 %:
    layers 2 x 12 x 1 / 89 = +27.0 %, outside 2 x (-1) / 89 = -2.2 %, step 0."""
    rows = ts.shares(RECORDS, _times(3e-3, 5e-3, 7e-3), _times(4e-3, 4e-3, 7e-3))
    tp, err, parts = rows[0]
    assert tp == 4
    assert err == pytest.approx(22 / 89)
    assert parts["layers"] == pytest.approx(24 / 89)
    assert parts["outside"] == pytest.approx(-2 / 89)
    assert parts["step"] == pytest.approx(0.0, abs=1e-12)


def test_shares_add_up_to_the_error():
    """Every run's three shares sum to its signed error (the lines are exact)."""
    rows = ts.shares(RECORDS, _times(3e-3, 5e-3, 7e-3), _times(2.5e-3, 6e-3, 6e-3))
    assert len(rows) == 6
    for _, err, parts in rows:
        assert sum(parts.values()) == pytest.approx(err)


def test_plan_at_one_depth_is_left_out():
    """Without its 20-layer twin a 12-layer plan fixes no per-layer time: no row."""
    records = RECORDS[:3]
    t = np.array([0.1, 0.2, 0.4])
    assert ts.shares(records, t, t) == []


def test_table_row():
    """One tp, six runs all priced exactly: 0 everywhere."""
    t = _times(3e-3, 5e-3, 7e-3)
    rows = ts.table(ts.shares(RECORDS, t, t))
    assert rows[2] == "| 4 | 6 | +0.0 % | +0.0 % | +0.0 % | +0.0 % | +0.0 % |"
