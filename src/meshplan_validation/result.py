"""The outcome of one published run: the prediction on the measured basis, its error, the predicted and measured peak
memory, the assumptions made; or the reason it was skipped. Plain values, written out by ``RunResult.to_dict``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunResult:
    """One run's outcome: evaluated (``error`` set) or skipped (``skipped`` the reason)."""

    id: str
    group: str
    metric: str = ""
    predicted: float | None = None
    measured: float | None = None
    error: float | None = None
    assumptions: tuple[str, ...] = ()
    skipped: str = ""  # the reason, when the run was not evaluated
    step_time: float | None = None
    breakdown: dict[str, float] = field(default_factory=dict)
    memory_predicted: float | None = None  # the peak over the pipeline ranks
    memory_measured: float | None = None
    memory_error: float | None = None
    memory_capacity: float | None = None  # bytes of the GPU's memory, what ``memory_predicted`` must fit in
    fits: bool = True
    in_fit_set: bool = False
    unstated: tuple[str, ...] = ()  # what the record leaves out (``records.unstated_settings``)
    # a serving run (kind "serving", serving_runs.py): how it was driven, the batch priced, and its other measured
    # metrics as (metric, predicted, measured, error)
    kind: str = "training"
    serving_mode: str = ""
    batch: float | None = None
    other_metrics: tuple[tuple[str, float | None, float, float | None], ...] = ()
    # the band meshplan quotes for this run's plan (specs/bands.py): relative half-width, its nominal share, its note
    band: float | None = None
    band_coverage: float | None = None
    band_note: str = ""

    @property
    def complete(self) -> bool:
        """The record states every setting of ``records.unstated_settings``: the runs the accuracy targets are set
        on."""
        return not self.unstated

    @property
    def memory_share(self) -> float:
        """Predicted peak memory as a fraction of the GPU's memory (0 when either is unknown)."""
        if not self.memory_predicted or not self.memory_capacity:
            return 0.0
        return self.memory_predicted / self.memory_capacity

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "group": self.group, "in_fit_set": self.in_fit_set,
                             "complete_configuration": self.complete}
        if self.kind == "serving":
            return d | self._serving_dict()
        if self.skipped:
            return d | {"skipped": self.skipped}
        return d | {"metric": self.metric, "predicted": self.predicted, "measured": self.measured,
                    "error": self.error, "step_time_s": self.step_time, "breakdown_s": self.breakdown,
                    "memory_predicted_bytes": self.memory_predicted, "memory_measured_bytes": self.memory_measured,
                    "memory_capacity_bytes": self.memory_capacity, "memory_error": self.memory_error,
                    "fits": self.fits, "band": self.band, "band_coverage": self.band_coverage,
                    "band_note": self.band_note, "assumptions": list(self.assumptions)}

    def _serving_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": "serving"}
        if self.skipped:
            return d | {"skipped": self.skipped}
        others = {m: {"predicted": p, "measured": v, "error": e} for m, p, v, e in self.other_metrics}
        return d | {"metric": self.metric, "predicted": self.predicted, "measured": self.measured, "error": self.error,
                    "mode": self.serving_mode, "batch": self.batch, "other_metrics": others, "band": self.band,
                    "band_coverage": self.band_coverage, "band_note": self.band_note,
                    "assumptions": list(self.assumptions)}
