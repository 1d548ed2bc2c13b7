"""Compute-op times a search task has met, kept for its twin searches (search/workers.run_searches: the same job of
each expert-GEMM choice, whose size combinations and op shapes are the same): each op of a unit group whose record
is equal, field by field, to the one met at the same place is given the time computed for it, the others are timed.

Exact: ``roofline.op_time`` is a pure function of the record, the accelerator, the precision and the efficiency
constants, and a time is reused only under the same accelerator and constants (the same objects) and precision, for a
record whose every field has the same type, shape and values. Only the expert GEMMs' records differ between the
choices (their launch counts and kernels, cost/mlp_moe.py), so only theirs are timed again; DeepSeek-V3's search
timed each shape's ops twice before (issue 83)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from meshplan.cost.records import OpCost
from meshplan.xp import Num

# (group, position in it, precision, id of the accelerator, id of the efficiency constants) -> (record, its time);
# the ids are of objects the search task holds for its whole life
KnownTimes = dict[tuple[str, int, str, int, int], tuple[OpCost, Num]]
_FIELDS = tuple(f.name for f in fields(OpCost))


def same_op(a: OpCost, b: OpCost) -> bool:
    """Whether two compute-op records are the same field by field (arrays: the same dtype, shape and values); a
    collective's record never (its descriptor is not compared)."""
    if a.collective is not None or b.collective is not None:
        return False
    for name in _FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if x is y:
            continue
        if type(x) is not type(y):
            return False
        if isinstance(x, np.ndarray):
            if x.shape != y.shape or x.dtype != y.dtype or not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True
