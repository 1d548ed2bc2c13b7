"""A strong-scaling plan's op shapes priced before its searches (issue 83): the kernel units of the shapes of every
GPU count, priced in one batch per store into the stores the counts' searches share (key_store.shared_units).

The searches of one model on several GPU counts meet mostly the same op shapes (tp, tp2, cp, the micro-batch, ep,
etp: ``keyed.SHAPE_KEYS``): the same tensor and pipeline sizes beside another dp. Each count's search priced the shapes
the counts before it had not met (keyed.KeyUnits) in a batch of its own, and each batch paid the Python of pricing
every op record once more: Llama-3-70B on 128 … 16,384 H100 met 245 shapes at 128 GPUs, then about 49 new ones a
count and tensor mode, at ~15 ms a batch whatever its size. Here each count's size combinations are built first (one
row per combination: candidates.layout_rows once a layout, each tensor mode's rows selected from them as its search
selects them, candidates.mode_rows), the distinct shapes of all counts are joined per store and priced at once, and
the searches, in this process or forked from it (search/workers.forked_map), find every shape priced.

A shape's kernel units are its own element-wise arithmetic, one number per row whatever the other rows of its batch:
the premise on which the counts already share their stores (key_store.store_for), so that a search reads the units it
would have priced itself, bit for bit (tests/test_shapes_ahead.py). The expert-GEMM twins of a MoE model
(search/variants.py) are priced one after the other under ``twin_times``, as one task's searches are
(workers._evaluate_task).

The valid combinations and pools built here are what the searches would build again: each is handed, once, to the
search that asks for the same (candidates.taken: run._prepare's combinations; candidates.mode_pool: evaluate's rows,
with the build rejections their building tallied), and the rest let go when the sweep ends (``shapes_ahead``). This
module is imported by the strong-scaling plan alone (cli/plan.py): the searches read only candidates.AHEAD.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from meshplan.search.batch import PlanBatch, alike, joined
from meshplan.search.candidates import AHEAD, layout_rows, mode_rows, pool_key, pool_works
from meshplan.search.combos import valid_combos
from meshplan.search.key_store import distinct, shared, twin_times
from meshplan.search.keyed import SHAPE_KEYS, KeyUnits, units_store
from meshplan.search.space import Space, switch_spaces
from meshplan.search.tally import Tally
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec


@contextmanager
def shapes_ahead(searches: Sequence[tuple[ModelSpec, Cluster, Space]], eff: Efficiency = DEFAULT) -> Iterator[None]:
    """Within ``shared_units`` (else nothing is done): the kernel units of the shapes of every search of ``searches``
    (model, cluster, space: search_switches's arguments, a GPU count each) stored where their searches look them up,
    each store's shapes priced in one batch; within, the combinations and pools built for it handed to the searches
    (module docstring)."""
    if not shared():
        yield
        return
    handed: dict[tuple[Any, ...], Any] = {}
    groups: dict[tuple[tuple[str, bool], int, int], tuple[ModelSpec, Cluster, Space, list[PlanBatch], tuple[str, ...]]]
    groups = {}
    for model, cluster, space in searches:
        for switch, each in enumerate(switch_spaces(model, space)):
            found = handed["combos", model, cluster, each] = valid_combos(model, cluster, each)
            combos = found[0]
            rows: dict[str, Any] = {}  # each layout's rows, built once for its modes (its first mode's tally)
            for mode in each.modes():
                mode_combos = [c for c in combos if c.layout == mode[0]]
                if mode[0] not in rows:
                    built = Tally()
                    rows[mode[0]] = layout_rows(mode_combos, cluster, each, built), built
                found, built = rows[mode[0]]
                handed[pool_key(mode, mode_combos, cluster, each)] = found, built, mode_combos  # (ids held)
                rows[mode[0]] = found, Tally()
                pooled = None if found is None else mode_rows(mode, *found)
                if pooled is None:
                    continue
                pool, works = pooled[0], pool_works(pooled[0], each)
                store = units_store(model, cluster, pool, each.stack, eff, each.recompute, works)
                key = (mode, switch, id(store))
                if key not in groups:
                    groups[key] = (model, cluster, each, [], works)
                if alike(groups[key][3][0] if groups[key][3] else pool, pool):  # its distinct shapes' first rows
                    groups[key][3].append(pool.select(distinct(np.stack([getattr(pool, k) for k in SHAPE_KEYS]))[0]))
    with twin_times():  # a mode's twins one after the other: the second takes the first's equal ops' times
        for key in sorted(groups, key=lambda k: k[:2]):
            model, cluster, each, pools, works = groups[key]
            KeyUnits(model, cluster, joined(pools), each.stack, each.recompute, eff, works)
    AHEAD.append(handed)
    try:
        yield
    finally:
        AHEAD.pop()

