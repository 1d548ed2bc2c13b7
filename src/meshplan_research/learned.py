"""Seed 002's learned predictor: op times from static features (features.py), trained on the per-op profiles of
other models (meshplan.measure.records) and judged on a model it has not seen (leave-one-model-out).

The learner is gradient-boosted regression trees (scikit-learn's HistGradientBoostingRegressor, the histogram
algorithm of LightGBM: Ke et al., NeurIPS 2017). Why trees and not a GNN over the graph (Gao et al., ICSE-SEIP
2023, seed 002's [3]): the data is ten graphs of a few hundred to two thousand ops, tabular features on six
decades of scale, and interactions that trees cut directly (a convolution's time per byte is not a pointwise
op's); a GNN learns from many graphs (Gao et al. trained on thousands of generated models), and what one op
does to the next here is mostly through the caches, which the reuse-distance feature already carries. The
target is the log of time, each op weighted by its measured time, so that the fit follows the ops that make
the step rather than the many cheap views.

Methods compared (``evaluate``), each predicting every op of the held-out model, summed with the predicted host
work into its step:

    roofline         per op class, t = t₀ + β·bytes + γ·FLOPs (non-negative), fitted on the other models'
                     replayed ops: an analytic model with fitted latency and rates, no replay of this model
    roofline+learned the roofline times exp(a residual learned on the other models)
    learned          the trees alone: log t from the static features
    replay           the analytic prediction check-step makes: this model's own ops replayed (meshplan.measure.replay)
    replay+learned   replay times exp(a residual learned on the other models): ``--learned`` in check-step
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshplan.calibrate.fit import nnls
from meshplan.errors import MissingDependency
from meshplan_research.features import NAMES, matrix, vocabulary

METHODS = ("roofline", "roofline+learned", "learned", "replay", "replay+learned")
SEED = 0


def _regressor() -> Any:
    try:
        from sklearn.ensemble import HistGradientBoostingRegressor
    except ModuleNotFoundError:
        raise MissingDependency("scikit-learn", "learn") from None
    return HistGradientBoostingRegressor(max_iter=80, learning_rate=0.2, max_leaf_nodes=15, min_samples_leaf=10,
                                         l2_regularization=1.0, early_stopping=False, random_state=SEED)


def _measured(ops: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in ops if r["measured_s"] is not None and r["measured_s"] > 0 and r["replay_s"] > 0]


def fit_roofline(ops: Sequence[dict[str, Any]]) -> dict[str, tuple[float, ...]]:
    """Per class, (t₀, β, γ) of t = t₀ + β·bytes + γ·FLOPs ≥ 0 over the replayed ops (one point per op)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in ops:
        if r["replay_s"] > 0 and r["source"] == "replay":
            by.setdefault(r["cls"], []).append(r)
    fits = {}
    for cls, rows in by.items():
        if len(rows) >= 3:
            fit = nnls([[1.0] * len(rows), [r["bytes_read"] + r["bytes_written"] for r in rows],
                        [r["flops"] for r in rows]], [r["replay_s"] for r in rows])
            fits[cls] = fit.coefs
    return fits


def roofline_time(rec: dict[str, Any], fits: dict[str, tuple[float, ...]]) -> float:
    coefs = fits.get(rec["cls"])
    if coefs is None:  # a class the other models never ran: the smallest latency of any class
        return min((c[0] for c in fits.values()), default=1e-6) or 1e-6
    return max(coefs[0] + coefs[1] * (rec["bytes_read"] + rec["bytes_written"]) + coefs[2] * rec["flops"], 1e-9)


@dataclass(frozen=True)
class Learner:
    """A fitted tree model and the vocabulary its target-name feature was coded with; ``base``: None (log time
    alone) or the name of the prediction whose log ratio it learned (``"replay"`` or ``"roofline"``)."""

    model: Any
    vocab: dict[str, int]
    base: str | None
    fits: dict[str, tuple[float, ...]]

    def base_time(self, recs: Sequence[dict[str, Any]]) -> np.ndarray:
        if self.base == "replay":
            return np.array([max(r["replay_s"], 1e-9) for r in recs])
        return np.array([roofline_time(r, self.fits) for r in recs])

    def predict(self, recs: Sequence[dict[str, Any]]) -> np.ndarray:
        """Seconds per op."""
        if not recs:
            return np.zeros(0)
        x = self._x(recs)
        y = self.model.predict(x)
        return np.exp(y) if self.base is None else self.base_time(recs) * np.exp(y)

    def _x(self, recs: Sequence[dict[str, Any]]) -> np.ndarray:
        x = matrix(recs, self.vocab)
        if self.base is not None:
            x = np.column_stack([x, np.log(self.base_time(recs))])
        return x


def train(ops: Sequence[dict[str, Any]], base: str | None) -> Learner:
    """Fit on the measured ops of ``ops`` (log time, or the log ratio of measured to ``base``)."""
    rows = _measured(ops)
    fits = fit_roofline(ops)
    vocab = vocabulary(rows)
    learner = Learner(model=_regressor(), vocab=vocab, base=base, fits=fits)
    measured = np.array([r["measured_s"] for r in rows])
    y = np.log(measured) if base is None else np.log(measured / learner.base_time(rows))
    x = learner._x(rows)
    categorical = np.zeros(x.shape[1], dtype=bool)
    categorical[len(NAMES) - 1] = True  # the aten name
    learner.model.set_params(categorical_features=categorical)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # one thread: the same trees on every machine and every run
        learner.model.fit(x, y, sample_weight=measured / measured.sum())
    return learner


def predict_ops(method: str, train_ops: Sequence[dict[str, Any]], test_ops: Sequence[dict[str, Any]],
                ) -> np.ndarray:
    """Seconds per op of ``test_ops`` by ``method`` (METHODS), trained on ``train_ops``."""
    if method == "replay":
        return np.array([r["replay_s"] for r in test_ops])
    if method == "roofline":
        fits = fit_roofline(train_ops)
        return np.array([roofline_time(r, fits) for r in test_ops])
    base = {"learned": None, "roofline+learned": "roofline", "replay+learned": "replay"}[method]
    return train(train_ops, base).predict(list(test_ops))


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """Leave-one-model-out: per held-out model and method, the predicted step and its error; per method, the
    time-weighted median |log error| of its ops."""

    models: tuple[str, ...]
    measured: dict[str, float]
    predicted: dict[str, dict[str, float]]  # method -> model -> seconds
    op_error: dict[str, float]  # method -> time-weighted median |predicted / measured − 1| over held-out ops

    def error(self, method: str, model: str) -> float:
        return self.predicted[method][model] / self.measured[model] - 1.0

    def summary(self, method: str) -> tuple[float, float]:
        """(median, p90) of |step error| over the models."""
        errs = np.abs([self.error(method, m) for m in self.models])
        return float(np.median(errs)), float(np.percentile(errs, 90))


def evaluate(records: Sequence[dict[str, Any]], methods: Sequence[str] = METHODS) -> Evaluation:
    """Leave-one-model-out over the models of ``records`` (records.read_profiles)."""
    steps = {r["model"]: r for r in records if r["record"] == "step"}
    ops = [r for r in records if r["record"] == "op"]
    models = tuple(m for m in steps if any(r["model"] == m for r in ops))
    predicted: dict[str, dict[str, float]] = {m: {} for m in methods}
    errors: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
    for held in models:
        train_ops = [r for r in ops if r["model"] != held]
        test_ops = [r for r in ops if r["model"] == held]
        for method in methods:
            t = predict_ops(method, train_ops, test_ops)
            predicted[method][held] = float(t.sum()) + steps[held]["host_s"]
            for r, p in zip(test_ops, t, strict=True):
                if r["measured_s"]:
                    errors[method].append((abs(p / r["measured_s"] - 1.0), r["measured_s"]))
    return Evaluation(models=models, measured={m: steps[m]["measured_s"] for m in models}, predicted=predicted,
                      op_error={m: _weighted_median(errors[m]) for m in methods})


def _weighted_median(pairs: list[tuple[float, float]]) -> float:
    if not pairs:
        return math.nan
    pairs = sorted(pairs)
    total, acc = sum(w for _, w in pairs), 0.0
    for value, w in pairs:
        acc += w
        if acc >= total / 2:
            return value
    return pairs[-1][0]


def apply_learned(result: Any, profiles: str) -> dict[str, Any]:
    """check-step ``--learned``: the replay prediction of ``result`` corrected by the residual learned on the
    profiles of the *other* models in ``profiles`` (a .jsonl file or a folder of them)."""
    from meshplan.errors import SpecError
    from meshplan.measure.records import op_records, read_profiles

    records = [r for r in read_profiles(profiles) if r.get("model") != result.name]
    ops = [r for r in records if r["record"] == "op"]
    models = sorted({r["model"] for r in ops})
    if len(models) < 2:
        raise SpecError(f"profiles={profiles!r} holds {len(models)} other model(s): the learned residual needs two "
                        "or more (benchmarks/docs/measured.py profiles the zoo)")
    learner = train(ops, "replay")
    mine = list(op_records(result))
    kernels = learner.predict(mine)
    seconds = float(kernels.sum()) + result.prediction.host_seconds
    return {"predicted_s": seconds, "error": seconds / result.measurement.timing.seconds - 1.0,
            "trained_on": len(models), "models": models}
