"""Refitting constants without one source, fast: each prediction of the fit runs as a linear function of the
constants around their shipped values (one Gauss-Newton step, Nocedal & Wright 2006, §10.3), the robust objective of
the shipped fit minimised over that linear model, the refitted values then priced exactly on the left-out source's
runs (benchmarks/docs/out_of_source.py; issue 79).

``Linear``: per fit observation i its base log-prediction b_i, its measured log value y_i, its group g_i and its
sensitivities J_ik = ∂ log prediction_i / ∂ x_k, x_k the constant's coordinate (its log for a rate or a share, the value
itself for a host time that may be 0: ``Coordinate``). The objective is the shipped fits' (benchmarks/measure/
fit_efficiency.py, fit_inference.py), one in one place (robust_loss.Loss): the mean over groups of each group's mean
loss of b + J·Δx − y, min(|r|, cap), so every source group weighs the same. Each refit starts
from the shipped values and is minimised by Powell's method within the constants' bounds (scipy.optimize.minimize). A
constant that no kept observation reads (its column of J is 0 there) leaves the objective flat: Powell would leave it
wherever its search stopped (TensorRT-LLM's iteration overhead once went to its 10 ms bound that way), so it takes its
prior instead (``priors``; fitted.py).

Why linear: the shipped fits evaluate every fit run hundreds of times (minutes each); a refit per source would take
hours. The constants move a few percent when one source leaves (the registry's tables show by how much), over which
each run's prediction is smooth in them (the max() pieces of the step's composition move little), and the left-out
source is always priced exactly at the refitted values, so the linearisation can only make the fit a little less
than optimal, never the reported error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshplan_validation.robust_loss import Loss

# the least change of a log-prediction over a constant's finite-difference step that counts as the observation reading
# the constant (a run whose pricing never reads it changes by exactly 0: the same arithmetic)
MOVES = 1e-9


@dataclass(frozen=True)
class Coordinate:
    """How constant ``name`` is varied: in log (``log``: a positive rate or share) or as is (a time that may be 0),
    within ``bounds``, by a finite difference of ``step`` in that coordinate."""

    name: str
    bounds: tuple[float, float]
    log: bool = True
    step: float = 0.03

    def to_x(self, value: float) -> float:
        return math.log(value) if self.log else value

    def to_value(self, x: float) -> float:
        return math.exp(x) if self.log else x

    def moves(self, sensitivity: float) -> bool:
        """Whether an observation of sensitivity ``sensitivity`` (∂ log prediction / ∂ x) reads this constant: its
        log-prediction moves by more than ``MOVES`` over one finite-difference step."""
        return abs(sensitivity) * self.step > MOVES

    def stepped(self, value: float) -> float:
        """The value one finite-difference step away (forwards, or backwards at the upper bound)."""
        x = self.to_x(value) + self.step
        if self.to_value(x) > self.bounds[1]:
            x = self.to_x(value) - self.step
        return self.to_value(x)


@dataclass(frozen=True)
class Linear:
    """The fit runs' log-predictions as linear functions of the constants (module docstring)."""

    coords: tuple[Coordinate, ...]
    x0: np.ndarray  # the shipped values' coordinates
    base: np.ndarray  # b_i
    measured: np.ndarray  # y_i
    groups: np.ndarray  # g_i (the objective's weighting)
    sources: np.ndarray  # the source of each observation (what a refit leaves out)
    jacobian: np.ndarray  # J_ik
    loss: Loss  # the shipped fit's (robust_loss.TRAINING or SERVING)

    def objective(self, x: np.ndarray, keep: np.ndarray) -> float:
        residual = self.base[keep] + self.jacobian[keep] @ (x - self.x0) - self.measured[keep]
        return self.loss.objective(residual, self.groups[keep])

    def kept(self, without: str | None) -> np.ndarray:
        return self.sources != without if without is not None else np.ones(len(self.base), bool)

    def unmoved(self, without: str | None = None) -> frozenset[str]:
        """The constants no observation kept without source ``without`` reads (``Coordinate.moves``): the objective
        does not depend on them, so a minimiser leaves them wherever its search happens to stop."""
        keep = self.kept(without)
        return frozenset(c.name for k, c in enumerate(self.coords)
                         if not any(c.moves(j) for j in self.jacobian[keep, k]))

    def refit(self, without: str | None = None, free: Sequence[str] | None = None,
              start: dict[str, float] | None = None, priors: dict[str, float] | None = None) -> dict[str, float]:
        """The constants (``free`` ones only; the rest at ``start`` or shipped) that minimise the objective over the
        observations not from source ``without``; a free constant of ``priors`` that no kept observation reads
        (``unmoved``) takes its prior instead, not refitted (issue 79: nothing then says where it lies)."""
        from scipy.optimize import minimize  # noqa: PLC0415  (the solve extra)

        keep = self.kept(without)
        x = self.x0.copy()
        for i, c in enumerate(self.coords):
            if start and c.name in start:
                x[i] = c.to_x(start[c.name])
        names = [c.name for c in self.coords]
        unmoved = self.unmoved(without)
        unread = {n: v for n, v in (priors or {}).items() if n in (free or names) and n in unmoved}
        chosen = [names.index(n) for n in (free or names) if n not in unread]
        if not keep.any() or not chosen:
            return {c.name: c.to_value(x[i]) for i, c in enumerate(self.coords)} | unread
        bounds = [(self.coords[i].to_x(self.coords[i].bounds[0]) if not self.coords[i].log or
                   self.coords[i].bounds[0] > 0 else -50.0, self.coords[i].to_x(self.coords[i].bounds[1]))
                  for i in chosen]

        def f(sub: np.ndarray) -> float:
            full = x.copy()
            full[chosen] = sub
            return self.objective(full, keep)

        best = minimize(f, np.clip(x[chosen], [b[0] for b in bounds], [b[1] for b in bounds]), method="Powell",
                        bounds=bounds, options={"xtol": 1e-4, "ftol": 1e-7, "maxfev": 4000})
        x[chosen] = best.x
        return {c.name: c.to_value(x[i]) for i, c in enumerate(self.coords)} | unread
