"""Leave-one-source-out errors of the training runs (issue 79): each run priced with every constant of the registry
(fitted.py) refitted without the run's source, beside its in-sample error (the shipped constants).

What is refitted, for a run of source S (provenance.py):
- ``gemm`` and ``attention``, each where S is among its fit sources: refitted (jointly) on the fit half's dense runs of
  the other sources (benchmarks/measure/fit_efficiency.py's fit, its objective, linearised: refit.py), or at its prior
  where none of those runs reads it (refit.Linear ``unmoved``); the MoE runs fit nothing
  (their per-expert path's host time is the stacks' measured cost per kernel: cost/mlp_moe.host_launched);
- Megatron-LM CI's host per micro-batch where S is Megatron-LM's CI, its one source: without it, it falls to its
  prior (0); the DGX A100's python_host is a measurement (presets/hardware/a100.toml), not refitted;
- every other run keeps the shipped value of a constant not fitted on its source: its in-sample error is already
  out of that constant's source.
The refitted values are then priced exactly on S's runs (meshplan_validation.evaluate).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.step.assemble import step_costs
from meshplan_validation.case import Case, map_run
from meshplan_validation.evaluate import evaluated, predicted_metric
from meshplan_validation.fitted import by_name
from meshplan_validation.provenance import record_source
from meshplan_validation.record_fields import fill_from_siblings, lenders
from meshplan_validation.records import clean_record
from meshplan_validation.refit import Coordinate, Linear
from meshplan_validation.robust_loss import TRAINING as LOSS
from meshplan_validation.selection import in_fit_set
from meshplan_validation.skip import Skip

DENSE = (Coordinate("gemm", (0.3, 1.2)), Coordinate("attention", (0.15, 1.0)))
CI_SOURCE = "megatron_lm_ci"
VTRAIN_SOURCE = "vtrain"


@dataclass(frozen=True)
class Run:
    """A record of a training file mapped onto meshplan (``case``), or the reason it is not (``skipped``)."""

    record: dict[str, Any]
    file: str
    source: str
    case: Case | None
    skipped: str = ""


def runs_of(records: list[dict[str, Any]], file: str) -> list[Run]:
    """Every record of one file mapped as ``meshplan validate`` maps it (siblings lend unstated batch sizes)."""
    cleaned = [clean_record(r) for r in records]
    index, out = lenders(cleaned), []
    for r in cleaned:
        try:
            case: Case | None = map_run(fill_from_siblings(r, cleaned, index))
            reason = ""
        except Exception as exc:  # noqa: BLE001  (any record it cannot map: validate reports the reason)
            case, reason = None, str(exc) or type(exc).__name__
        out.append(Run(r, file, record_source(r), case, reason))
    return out


def log_prediction(case: Case, eff: Efficiency) -> float:
    t = float(step_costs(case.model, case.cluster, case.plan, case.stack, case.efficiency(eff)).step_time)
    return math.log(predicted_metric(case, t))


def linearised(cases: list[Case], coords: tuple[Coordinate, ...], eff: Efficiency = DEFAULT) -> Linear:
    """The fit cases' log-predictions as linear functions of ``coords`` around ``eff``'s values (refit.Linear)."""
    values = {c.name: getattr(eff, c.name) for c in coords}
    base = np.array([log_prediction(c, eff) for c in cases])
    jac = np.zeros((len(cases), len(coords)))
    for k, coord in enumerate(coords):
        moved = coord.stepped(values[coord.name])
        shifted = eff.with_(**{coord.name: moved})
        dx = coord.to_x(moved) - coord.to_x(values[coord.name])
        jac[:, k] = (np.array([log_prediction(c, shifted) for c in cases]) - base) / dx
    return Linear(coords=coords, x0=np.array([c.to_x(values[c.name]) for c in coords]), base=base,
                  measured=np.log([c.measured for c in cases]), groups=np.array([c.group for c in cases]),
                  sources=np.array([record_source({"group": c.group}) for c in cases]), jacobian=jac, loss=LOSS)


def fit_cases(published: Iterable[Run]) -> list[Case]:
    """The shipped fit's runs: the fit half of the published runs, superseded records left out."""
    return [r.case for r in published if r.case is not None and in_fit_set(r.case.id)
            and not r.record.get("superseded")]


@dataclass(frozen=True)
class EfficiencyRefit:
    """The linearised efficiency fit (module docstring)."""

    dense: Linear

    @classmethod
    def build(cls, cases: list[Case]) -> EfficiencyRefit:
        return cls(linearised([c for c in cases if not c.model.is_moe], DENSE))

    def without(self, source: str | None) -> dict[str, float]:
        """``gemm`` and ``attention`` refitted without ``source`` where either was fitted on it (jointly); one not
        fitted on it keeps its shipped value, and one that none of the kept runs reads (refit.Linear ``unmoved``)
        falls to its prior."""
        fitted = {c.name: by_name(c.name) for c in DENSE}
        if source is None:
            return self.dense.refit(None)
        if not any(source in f.sources for f in fitted.values()):
            return {c.name: getattr(DEFAULT, c.name) for c in DENSE}
        found = self.dense.refit(source, priors={k: f.prior for k, f in fitted.items()})
        return {k: found[k] if source in f.sources else getattr(DEFAULT, k) for k, f in fitted.items()}


def without_source(case: Case, source: str) -> Case:
    """``case`` with the registry's single-source choices at their priors where ``source`` is theirs: the Megatron-LM
    CI's host per micro-batch, vTrain's passes from an empty queue."""
    stack = case.stack
    if source == CI_SOURCE and stack.microbatch_host == by_name("Megatron-LM CI host per micro-batch").value():
        stack = stack.with_(microbatch_host=by_name("Megatron-LM CI host per micro-batch").prior)
    if source == VTRAIN_SOURCE and stack.drained_passes == "layers":
        stack = stack.with_(drained_passes="none")
    return case if stack is case.stack else replace(case, stack=stack)


EFFICIENCY_NAMES = ("gemm", "attention")


def at_prior(case: Case, name: str) -> tuple[Case, Efficiency]:
    """``case`` and the efficiency it is priced with when the registry's constant ``name`` takes its prior."""
    f = by_name(name)
    if name in EFFICIENCY_NAMES:
        return case, DEFAULT.with_(**{name: f.prior})
    if name == "Megatron-LM CI host per micro-batch" and case.stack.microbatch_host == f.value():
        return replace(case, stack=case.stack.with_(microbatch_host=f.prior)), DEFAULT
    if name == "vTrain passes from an empty queue" and case.stack.drained_passes == "layers":
        return replace(case, stack=case.stack.with_(drained_passes="none")), DEFAULT
    return case, DEFAULT


def error_of(case: Case, eff: Efficiency) -> tuple[float | None, float | None, float | None, str]:
    """(predicted metric, its error, the peak memory's error where measured, skip reason) of ``case`` at ``eff``."""
    try:
        r = evaluated(case, eff)
    except Skip as exc:
        return None, None, None, str(exc)
    return r.predicted, r.error, r.memory_error, ""
