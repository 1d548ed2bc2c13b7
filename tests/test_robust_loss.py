"""The fits' one robust loss (meshplan_validation/robust_loss.py; issue 79): min(|r|, cap) with its two kinks rounded
over ``knee``, continuously differentiable, exactly the old capped L1 outside the knees, and the objective that the
shipped fits' scripts and the leave-one-source-out refits (refit.Linear) share."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from meshplan_validation.refit import Coordinate, Linear
from meshplan_validation.robust_loss import CAPPED_TRAINING, ROUNDED_SERVING, SERVING, TRAINING, Loss

ROOT = Path(__file__).resolve().parents[1]
LOSSES = [TRAINING, ROUNDED_SERVING, Loss(cap=0.5, knee=0.25)]


@pytest.mark.parametrize("loss", LOSSES)
def test_outside_the_knees_it_is_the_capped_l1(loss):
    k, cap = loss.knee, loss.cap
    r = np.concatenate([np.linspace(k, cap - k, 50), np.linspace(cap + k, 3.0, 50)])
    for sign in (1, -1):
        assert loss.of(sign * r) == pytest.approx(np.minimum(np.abs(r), cap), abs=1e-12)
    # knee 0 is the capped L1 everywhere: the fits' objective until 2026-11-30
    r = np.linspace(-2, 2, 401)
    assert np.array_equal(Loss(cap, 0.0).of(r), np.minimum(np.abs(r), cap))


def test_training_ships_the_rounded_loss_and_serving_the_capped_l1():
    # robust_loss.py: the training fit's loss is rounded over 0.09 (it equals min(|r|, 0.5) beyond the knees, not at
    # 0: 0.045 there), the serving fit's is min(|r|, 0.7) exactly; the training fit's capped L1 stays, measured beside
    r = np.linspace(-2, 2, 401)
    far = (np.abs(r) >= 0.09) & (np.abs(np.abs(r) - 0.5) >= 0.09)
    assert np.array_equal(TRAINING.of(r)[far], np.minimum(np.abs(r), 0.5)[far])
    assert TRAINING.of(np.zeros(1))[0] == pytest.approx(0.045)
    assert np.array_equal(CAPPED_TRAINING.of(r), np.minimum(np.abs(r), 0.5))
    assert np.array_equal(SERVING.of(r), np.minimum(np.abs(r), 0.7))


def test_the_worked_values():
    # TRAINING: knee 0.09, cap 0.5. At r = 0: 0.09 / 2 = 0.045; at r = 0.03: 0.03² / 0.18 + 0.045 = 0.05;
    # at r = 0.5 (the cap, the middle of its knee): 0.5 - 0.09² / 0.36 = 0.4775; at 0.59 and beyond: 0.5
    assert TRAINING.of(np.array([0.0, 0.03, -0.03, 0.5, 0.59, 7.0])) == pytest.approx(
        [0.045, 0.05, 0.05, 0.4775, 0.5, 0.5])


@pytest.mark.parametrize("loss", LOSSES)
def test_it_is_smooth_its_slope_hampels_three_part_psi(loss):
    # central differences of the loss across both knees match ψ(r) / knee of Hampel's three-part ψ (a = knee,
    # b = cap - knee, c = cap + knee): r / knee, then 1, then falling linearly to 0 at c, then 0; no jump anywhere
    k, cap, h = loss.knee, loss.cap, 1e-6
    r = np.linspace(1e-4, cap + 2 * k, 2001)
    slope = (loss.of(r + h) - loss.of(r - h)) / (2 * h)
    psi = np.clip(np.minimum(r / k, (cap + k - r) / (2 * k)), 0, 1)
    assert slope == pytest.approx(psi, abs=1e-4)
    assert np.max(np.abs(np.diff(slope))) < 0.01  # continuous: the grid step over the knee, at most
    assert np.all(np.diff(loss.of(r)) >= -1e-15) and loss.of(r).max() <= cap  # monotone in |r|, bounded by the cap


def test_a_knee_must_fit_twice_under_the_cap():
    with pytest.raises(ValueError, match="knee"):
        Loss(cap=0.5, knee=0.3)


def _location(points: list[float], loss: Loss) -> Linear:
    """A one-constant fit: log-predictions x + 0 against measured ``points`` (a location estimate), one group."""
    n = len(points)
    return Linear(coords=(Coordinate("x", (0.8, 1.25)),), x0=np.zeros(1), base=np.zeros(n),
                  measured=np.array(points), groups=np.array(["g"] * n), sources=np.array(["s"] * n),
                  jacobian=np.ones((n, 1)), loss=loss)


def test_the_optimum_is_unique_and_moves_smoothly_where_the_capped_l1_is_flat():
    # two runs at log-errors 0 and 0.06: the capped L1 (|x| + |x - 0.06|) / 2 is 0.03 at every x between them, so its
    # optimum is wherever the search stops (a weighted median of the runs, not unique); inside the knee (0.09) the
    # rounded loss is least squares: (x² + (x - 0.06)²) / 0.36 + 0.045 is least at their mean, 0.03 (0.05 there,
    # 0.0522 at 0.01 and 0.05)
    two = _location([0.0, 0.06], TRAINING)
    flat = _location([0.0, 0.06], CAPPED_TRAINING)  # the training fit's capped L1 until 2026-11-30
    at = [np.array([x]) for x in (0.01, 0.03, 0.05)]
    assert [flat.objective(x, np.ones(2, bool)) for x in at] == pytest.approx([0.03] * 3)
    assert [two.objective(x, np.ones(2, bool)) for x in at] == pytest.approx([0.05222, 0.05, 0.05222], abs=1e-5)

    # three runs at 0, m, 0.06: the rounded fit is their mean, moving by a third of the middle run's move, evenly
    def fitted(points: list[float]) -> float:
        return float(np.log(_location(points, TRAINING).refit(None)["x"]))

    middle = np.linspace(0.02, 0.07, 11)
    assert [fitted([0.0, m, 0.06]) for m in middle] == pytest.approx((middle + 0.06) / 3, abs=2e-4)


def test_the_fit_scripts_and_the_refits_share_the_objective(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "measure"))
    import fit_efficiency  # noqa: PLC0415  (a script's module)
    import fit_inference  # noqa: PLC0415

    assert fit_efficiency.TRAINING is TRAINING and fit_inference.SERVING is SERVING
    from meshplan_validation import loso_serving, loso_training  # noqa: PLC0415

    assert loso_training.LOSS is TRAINING and loso_serving.LOSS is SERVING
    sys.modules.pop("fit_efficiency", None)
    sys.modules.pop("fit_inference", None)
