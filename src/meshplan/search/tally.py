"""Tally: the plans a search rejects, counted by reason, each reason with one concrete example."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Tally:
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
