"""What an instance holds over time, one row per iteration: its start (s), its length (s), the KV cache's
occupancy (a share of its capacity), the running and the waiting requests."""

from __future__ import annotations

from itertools import chain

import numpy as np


class LoadTimeline:
    """Rows appended by the simulation (simulate.py), read back as arrays."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, float, float, int, int]] = []
        self._columns: dict[str, np.ndarray] = {}
        self._built = -1  # the row count the columns were built from

    def add(self, start: float, length: float, occupancy: float, running: int, waiting: int) -> None:
        self.rows.append((start, length, occupancy, running, waiting))

    def columns(self) -> dict[str, np.ndarray]:
        """start_s, length_s, kv_occupancy, running, waiting: one array each."""
        if self._built != len(self.rows):
            self._built = len(self.rows)
            # the rows' numbers in one pass (np.asarray of a list of tuples is about twice as slow), the same floats
            table = np.fromiter(chain.from_iterable(self.rows), dtype=float, count=5 * len(self.rows)).reshape(-1, 5)
            self._columns = {name: table[:, i] for i, name in enumerate(("start_s", "length_s", "kv_occupancy",
                                                                          "running", "waiting"))}
        return self._columns

    def mean_in_system(self, until: float) -> float:
        """Time-average of running + waiting requests from 0 to ``until`` (idle gaps count 0)."""
        c = self.columns()
        return float(np.sum((c["running"] + c["waiting"]) * c["length_s"]) / until) if until > 0 else 0.0

    def sampled(self, points: int = 200) -> dict[str, list[float]]:
        """About ``points`` rows evenly spaced in time (a report's occupancy curve)."""
        c = self.columns()
        if not len(c["start_s"]):
            return {k: [] for k in c}
        grid = np.linspace(c["start_s"][0], c["start_s"][-1], points)
        at = np.clip(np.searchsorted(c["start_s"], grid), 0, len(c["start_s"]) - 1)  # non-decreasing
        pick = at[np.concatenate(([True], at[1:] != at[:-1]))]  # its distinct values (np.unique imports numpy.ma)
        return {k: [float(x) for x in v[pick]] for k, v in c.items()}
