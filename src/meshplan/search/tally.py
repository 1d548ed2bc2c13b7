"""Tally: the plans a search rejects, counted by reason, each reason with one concrete example; the examples read
back from the search's settings grid: the plan at a flat index of the (recompute, zero, offload opt, offload act,
row) grid (``decode``, the search's results too), the first element a mask of the grid sets (``first_set``), some
rows of a batch read a plan at a time (``Rows``)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from meshplan.cost.wrapper_work import work_of
from meshplan.search.batch import PlanBatch
from meshplan.specs.plan import Plan, revised
from meshplan.specs.stack import Stack

if TYPE_CHECKING:
    from meshplan.search.keyed import Panels


@dataclass
class Tally:
    """The plans rejected, counted by reason, with an example of each."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)  # how far a scored example misses (lowest kept)

    def add(self, reason: str, example: str, count: int, score: float | None = None) -> None:
        """Count ``count`` plans rejected for ``reason``; keep the first example, or with a ``score`` the one
        that misses least (the nearest plan to fitting, for memory)."""
        if not count:
            return
        self.counts[reason] += count
        if score is None:
            self.examples.setdefault(reason, example)
        elif example and score < self.scores.get(reason, math.inf):
            self.examples[reason], self.scores[reason] = example, score

    def merge(self, other: Tally) -> None:
        """Add another tally's counts, keeping the examples as ``add`` does."""
        for reason, count in other.counts.items():
            self.add(reason, other.examples.get(reason, ""), count, other.scores.get(reason))


@dataclass(frozen=True)
class Rows:
    """Some ``rows`` of a batch, read a plan at a time: the block the search counts and takes its examples from,
    without gathering every column of it."""

    batch: PlanBatch
    rows: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)

    def plan(self, i: int) -> Plan:
        return self.batch.plan(int(self.rows[i]))


_PLAIN_MODULES = Plan().recompute_modules  # a plan's recompute modules where it has no selective recompute


def decode(batch: PlanBatch | Rows, grid: tuple[tuple, ...], shape: tuple[int, ...], flat: int,
           panels: list[Panels] | None = None, layers: int = 0, stack: Stack | None = None) -> Plan:
    """The plan at a flat index of the (recompute, zero, offload opt, offload act, row) grid; the space's partial
    recompute and offload counts under the settings they belong to, 0 (all) where they cover a stage of the
    ``layers`` (check._check_counts: a count is at most a stage's layers; the step is the same), and its recompute
    modules under selective recompute, Plan's default elsewhere (they change nothing there)."""
    r, z, o, a, row = np.unravel_index(flat, shape)
    plan = batch.plan(int(row))
    per_stage = -(-layers // plan.pp)
    partial: dict[str, Any] = {"recompute_layers": plan.recompute_layers if grid[0][r] == "full" else 0,
               "offload_layers": plan.offload_layers if grid[3][a] else 0}
    partial = {k: 0 if v >= per_stage else v for k, v in partial.items()}
    modules = plan.recompute_modules if grid[0][r] == "selective" else _PLAIN_MODULES
    plan = revised(plan, {"recompute": grid[0][r], "zero": grid[1][z], "offload_optimizer": grid[2][o],
                          "offload_activations": grid[3][a], "recompute_modules": modules, **partial})
    if panels is None:
        return plan
    assert stack is not None  # the panel count of a setting depends on its wrapper's work (keyed._units_of)
    return revised(plan, {"summa_panels": int(panels[r][work_of(plan, stack)][row])})


def first_set(mask: np.ndarray) -> int:
    """np.argmax(mask.ravel()) (settings × combinations; the first element set, C order) for a mask that has one.
    A view of combinations-first memory (``GroupMemory.at``'s) is read in its own order (no transposing copy): the
    first setting any combination has, then its first combination."""
    if mask.flags.c_contiguous:  # settings first in memory too (memory_pass.left_out's)
        return int(np.argmax(mask.reshape(-1)))
    count = mask.shape[-1]
    rows = np.moveaxis(mask, -1, 0).reshape(count, -1)
    setting = int(np.argmax(rows.any(axis=0)))
    return setting * count + int(np.argmax(rows[:, setting]))
