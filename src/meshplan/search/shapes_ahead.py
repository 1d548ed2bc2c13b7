"""A strong-scaling plan's op shapes priced before its searches (issue 83): the kernel units of the shapes of every
GPU count, priced in one batch per store into the stores the counts' searches share (key_store.shared_units).

The searches of one model on several GPU counts meet mostly the same op shapes (tp, tp2, cp, the micro-batch, ep,
etp: ``keyed.SHAPE_KEYS``): the same tensor and pipeline sizes beside another dp. Each count's search priced the shapes
the counts before it had not met (keyed.KeyUnits) in a batch of its own, and each batch paid the Python of pricing
every op record once more: Llama-3-70B on 128 … 16,384 H100 met 245 shapes at 128 GPUs, then about 49 new ones a
count and tensor mode, at ~15 ms a batch whatever its size. Here each count's pool of size combinations (one row per
combination: candidates.mode_pool, every mode's as its search builds it) is built first, the distinct shapes of all
counts are joined per store and priced at once, and the searches, in this process or forked from it
(search/workers.forked_map), find every shape priced.

A shape's kernel units are its own element-wise arithmetic, one number per row whatever the other rows of its batch:
the premise on which the counts already share their stores (key_store.store_for), so that a search reads the units it
would have priced itself, bit for bit (tests/test_shapes_ahead.py). The expert-GEMM twins of a MoE model
(search/variants.py) are priced one after the other under ``twin_times``, as one task's searches are
(workers._evaluate_task).

The valid combinations and pools built here are what the searches would build again: each is handed, once, to the
search that asks for the same (``handed_combos``: run._prepare; ``handed_pool``: evaluate, with the build rejections
its building tallied), and the rest let go when the sweep ends (``shapes_ahead``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from meshplan.search.batch import CATEGORICAL, PlanBatch, joined
from meshplan.search.candidates import Sized, mode_pool, pool_works
from meshplan.search.combos import Combo, valid_combos
from meshplan.search.key_store import distinct, shared, twin_times
from meshplan.search.keyed import SHAPE_KEYS, KeyUnits, units_store
from meshplan.search.space import Space, switch_spaces
from meshplan.search.tally import Tally
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec

# within ``shapes_ahead``: the combinations and pools built, each until a search takes it (by what it was built from)
_HANDED: list[dict[Any, Any]] = []


@contextmanager
def shapes_ahead(searches: Sequence[tuple[ModelSpec, Cluster, Space]], eff: Efficiency = DEFAULT) -> Iterator[None]:
    """Within ``shared_units`` (else nothing is done): the kernel units of the shapes of every search of ``searches``
    (model, cluster, space: search_switches's arguments, a GPU count each) stored where their searches look them up,
    each store's shapes priced in one batch; within, the combinations and pools built for it handed to the searches
    (module docstring)."""
    if not shared():
        yield
        return
    handed: dict[Any, Any] = {}
    groups: dict[tuple[tuple[str, bool], int, int], tuple[ModelSpec, Cluster, Space, list[PlanBatch], tuple[str, ...]]]
    groups = {}
    for model, cluster, space in searches:
        for switch, each in enumerate(switch_spaces(model, space)):
            combos, tally = handed[model, cluster, each] = valid_combos(model, cluster, each)
            for mode in each.modes():
                mode_combos = [c for c in combos if c.layout == mode[0]]
                built = Tally()
                pooled = mode_pool(mode, mode_combos, cluster, each, built)
                handed[_pool_key(mode, mode_combos, cluster, each)] = pooled, built, mode_combos  # (ids held)
                if pooled is None:
                    continue
                pool, works = pooled[0], pool_works(pooled[0], each)
                store = units_store(model, cluster, pool, each.stack, eff, each.recompute, works)
                key = (mode, switch, id(store))
                if key not in groups:
                    groups[key] = (model, cluster, each, [], works)
                if _alike(groups[key][3][0] if groups[key][3] else pool, pool):  # its distinct shapes' first rows
                    groups[key][3].append(pool.select(distinct(np.stack([getattr(pool, k) for k in SHAPE_KEYS]))[0]))
    with twin_times():  # a mode's twins one after the other: the second takes the first's equal ops' times
        for key in sorted(groups, key=lambda k: k[:2]):
            model, cluster, each, pools, works = groups[key]
            KeyUnits(model, cluster, joined(pools), each.stack, each.recompute, eff, works)
    _HANDED.append(handed)
    try:
        yield
    finally:
        _HANDED.pop()


def handed_combos(model: ModelSpec, cluster: Cluster, space: Space) -> tuple[list[Combo], Tally] | None:
    """``valid_combos(model, cluster, space)`` as ``shapes_ahead`` built it, taken (once), or None."""
    return _HANDED[-1].pop((model, cluster, space), None) if _HANDED else None


def handed_pool(mode: tuple[str, bool], combos: list[Combo], cluster: Cluster, space: Space, tally: Tally
                ) -> tuple[PlanBatch, Sized] | None:
    """``mode_pool(mode, combos, cluster, space, tally)`` as ``shapes_ahead`` built it, taken (once), its build
    rejections added to ``tally``; None where it built none (or found no rows)."""
    if not _HANDED:
        return None
    found = _HANDED[-1].pop(_pool_key(mode, combos, cluster, space), None)
    if found is None or found[0] is None:
        return None
    pooled, built, _ = found
    tally.merge(built)
    return pooled


def _pool_key(mode: tuple[str, bool], combos: list[Combo], cluster: Cluster, space: Space) -> tuple[Any, ...]:
    """What a pool is built from: the combinations by identity (the handed entry holds them: their ids stay theirs),
    the rest by value."""
    return mode, tuple(id(c) for c in combos), cluster, space


def _alike(a: PlanBatch, b: PlanBatch) -> bool:
    """Whether two pools can be joined: the same categorical settings and placements."""
    return a.placements == b.placements and all(getattr(a, n) == getattr(b, n) for n in CATEGORICAL)
