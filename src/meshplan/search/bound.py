"""A lower bound on the step time of a plan under every setting, from the kernel times of its op shapes alone:
plans whose bound cannot reach the k-th best time so far are not timed (branch and bound; exact)."""

from __future__ import annotations

import numpy as np

from meshplan.cost.params import layers_on_first, layers_on_last
from meshplan.search.batch import PlanBatch
from meshplan.specs.model import ModelSpec
from meshplan.step.units import Units

BOUND_SLACK = 1e-5  # the float32 step-time sums may round below the float64 bound by a few 1e-8


def lower_bound(model: ModelSpec, pool: PlanBatch, shapes: dict[str, Units], shape_of: np.ndarray,
                bubble: bool = True) -> np.ndarray:
    """A lower bound on every setting's step time of each plan, from the kernel times of its shape (``shapes``;
    ``shape_of``: each plan's shape). Every rank runs at least its layers' forward and backward kernels per
    micro-batch, c = t_fwd + t_bwd of a layer, L_f of them on the first (and middle) ranks and L_l on the last,
    and the first rank the embedding's (e), the last the head's (h); everything else (communication, recompute,
    sends, DP, optimizer, offload) only adds. So the busiest rank takes at least B = max(L_f·c + e, L_l·c + h) (a
    single stage holds both: L·c + e + h), and the bubble, the other ranks' times over v
    (``bubble.flow_bubble``), at least ((p − 1)·min(L_f, L_l)·c + min(e, h)) / v: the step takes at least
    m·B + that. Without a ``bubble`` (the asynchronous schedules, bubble.flow_bubble): m·B."""
    def least(part: str) -> np.ndarray:
        times = [np.broadcast_to(getattr(u, part).fwd + getattr(u, part).bwd, shape_of.max() + 1)
                 for u in shapes.values()]
        return np.minimum.reduce(times)[shape_of]

    layer = np.minimum(least("layer"), least("layer_plain"))
    first, last = layers_on_first(model, pool) * layer, layers_on_last(model, pool) * layer
    embed, head = least("embed"), least("head")
    single = pool.pp == 1
    busiest = np.maximum(first + embed + single * head, last + head + single * embed)
    others = (pool.pp - 1) * np.minimum(first, last) + np.minimum(embed, head)
    return pool.grad_accum * busiest + (~single * others / pool.vpp if bubble else 0.0)
