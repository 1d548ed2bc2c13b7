"""Placements: the orders in which the dense axes are laid onto the mesh, and which of them differ in cost.

Of the 5! orders of (tp, tp2, cp, dp, pp), the search keeps per size combination one of every group of orders that
split each communicating group alike across the mesh's tiers: the tier split is all that a placement changes in a
plan's cost (comm.py).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from meshplan.collectives.comm import Layout, block_members
from meshplan.collectives.groups import send_stride
from meshplan.search.keyed import distinct
from meshplan.specs.plan import DENSE_AXES

PLACEMENTS = tuple(itertools.permutations(DENSE_AXES))
_ORDER = np.array([[DENSE_AXES.index(a) for a in order] for order in PLACEMENTS])  # (orders, axes): axis ids
_AX = {a: i for i, a in enumerate(DENSE_AXES)}


def distinct_placements(sizes: np.ndarray, tiers: tuple[int, ...]) -> list[list[int]]:
    """For each row of axis sizes (rows × DENSE_AXES): the first of every group of axis orders with the same
    key (the tier split of each communicating group: tp, tp2, cp, the pipeline neighbours and the dp·cp gradient
    group). Exact: orders with equal keys cost the same; an MoE model's expert-parallel and expert-data-parallel
    groups split alike whenever those do (tests/test_placements.py checks both against a scalar reference key).
    All orders of all rows at once with NumPy."""
    rows = len(sizes)
    in_order = sizes[:, _ORDER]  # (rows, orders, axes in order)
    inner = np.cumprod(in_order, axis=2) // in_order  # product of the axes placed before each one
    strides = np.empty_like(inner)
    np.put_along_axis(strides, np.broadcast_to(_ORDER, inner.shape), inner, axis=2)  # back to axis order
    size = {a: sizes[:, i][:, None] for a, i in _AX.items()}
    s = {a: strides[:, :, i] for a, i in _AX.items()}
    groups: list[tuple[Any, Layout, Any]] = [(size[a], s[a], True) for a in ("tp", "tp2", "cp")]
    groups += [(size["dp"] * size["cp"], ((size["cp"], s["cp"]), (size["dp"], s["dp"])), True),
               (2, send_stride(s["pp"], size["pp"]), size["pp"] > 1)]  # no sends when pp = 1
    columns, span = [np.repeat(np.arange(rows), len(PLACEMENTS))], 1  # (row, order) flattened, row-major
    for tier in tiers[:-1]:  # members inside each boundary determine the whole split
        span *= tier
        for group, layout, active in groups:
            members = np.where(active, block_members(group, layout, span), 0)
            columns.append(np.rint(np.broadcast_to(members, inner.shape[:2])).astype(np.int64).reshape(-1))
    first = distinct(np.stack(columns))[0]
    first.sort()
    combo, order = np.divmod(first, len(PLACEMENTS))
    return [order[combo == r].tolist() for r in range(rows)] if rows > 1 else [order.tolist()]
