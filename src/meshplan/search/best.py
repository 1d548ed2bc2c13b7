"""Best: the k best feasible plans seen so far, fastest first, ties broken towards less memory, then a fixed order
of the plan fields (``plan_key``), so that the ranking is deterministic."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from meshplan.specs.plan import Plan


@dataclass
class Best:
    """The k best feasible plans seen so far (bounded memory)."""

    k: int
    rows: list[tuple[float, float, tuple]] = field(default_factory=list)
    threshold: float = np.inf  # the k-th best time so far: nothing slower can enter

    def offer(self, times: np.ndarray, peaks: np.ndarray, make: Callable[[int], Plan]) -> None:
        """Keep the k fastest of these plans (``make(i)`` builds the i-th), ties broken towards less memory: of
        plans as fast as the k-th, the ones with the smaller peak."""
        if not len(times):
            return
        kth = np.partition(times, self.k - 1)[self.k - 1] if len(times) > self.k else np.inf
        tied = np.flatnonzero(times <= kth)
        top = tied[np.lexsort((peaks[tied], times[tied]))][: self.k]
        self.rows += [(float(times[i]), float(peaks[i]), plan_key(make(int(i)))) for i in top]
        self.rows.sort(key=lambda r: (r[0], r[1], r[2][0]))
        del self.rows[self.k * 4:]
        if len(self.rows) >= self.k:
            self.threshold = self.rows[self.k - 1][0]


def plan_key(plan: Plan) -> tuple:
    """(the ranking's order of the plan fields, the plan)."""
    order = (plan.dp, plan.tp, plan.pp, plan.cp, plan.ep, plan.etp, plan.vpp, plan.last_stage_layers, plan.micro_batch,
             plan.zero, plan.recompute, plan.sequence_parallel, plan.schedule, plan.offload_optimizer,
             plan.offload_activations, plan.placement)
    return (order, plan)
