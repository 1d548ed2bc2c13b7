"""Per-key units for the search: what one micro-batch of a layer, the embedding, the head and a pipeline send
costs (``step.units.Units``), computed once per distinct key of the plans that share it.

A unit depends only on tp, tp2, cp, the micro-batch, ep, etp, the SUMMA panels, the tier split of each group its
collectives use (which is all the placement decides: ``split_codes``) and the categorical settings. Its kernel
times and saved activations depend on the op shapes alone (``SHAPE_KEYS``): those are computed for one key per
shape up front; the collectives, most of a key's cost to compute, when a plan first needs them (``KeyUnits``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from typing import Any

import numpy as np

from meshplan.collectives.comm import Layout, block_members
from meshplan.collectives.groups import expert_layout, send_stride
from meshplan.search.batch import CATEGORICAL, PlanBatch
from meshplan.search.key_store import KeyStore, Panels, distinct, shape_compute_times, shape_ops, store_for
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.stack import Stack
from meshplan.step.passes import PassTimes
from meshplan.step.units import Saved, Units, kernel_parts, timed_parts, units_for_recomputes
from meshplan.xp import Num, where


@lru_cache(maxsize=4096)
def panel_counts(hidden: int, tp: int, tp2: int) -> list[int]:
    """SUMMA panel counts nb (seed 003 ``summa_nb_candidates``): max(tp, tp2)·2^i dividing the hidden size
    while panels keep at least 512 columns (or just the first one if none does)."""
    start, h = max(tp, tp2), hidden
    options = [nb for nb in (start << i for i in range(16)) if nb <= h and h % nb == 0 and h // nb >= 512]
    return options or ([start] if h % start == 0 else [])


_UNIT_KEYS = ("tp", "tp2", "cp", "micro_batch", "ep", "etp", "summa_panels")
SHAPE_KEYS = ("tp", "tp2", "cp", "micro_batch", "ep", "etp")  # what the op shapes depend on
# settings the search's grid varies itself (each part of the step is computed per value); every other categorical
# setting of the batch (precision, expert_gemm …) is the plans' own and goes into the per-key units
_GRID_SETTINGS = ("recompute", "zero", "offload_optimizer", "offload_activations", "schedule")
_UNIT_STRIDES = ("tp", "tp2", "cp", "pp")


def split_codes(model: ModelSpec, cluster: Cluster, batch: PlanBatch) -> list[np.ndarray]:
    """For each group a unit's collectives use, how many members share each tier but the last (integers): the
    collective times depend on the placement only through this split (comm.split_group)."""
    groups: dict[str, tuple[Num, Layout]] = {a: (getattr(batch, a), batch.stride(a)) for a in _UNIT_STRIDES}
    groups["pp"] = (2, send_stride(batch.stride("pp"), batch.pp))  # a send: a pair of neighbouring stages
    if model.is_moe:  # the expert all-to-all (groups.expert_layout)
        groups["ep"] = (batch.ep, expert_layout(batch, batch.ep, batch.etp))
    codes, span = [], 1
    for tier in cluster.tiers[:-1]:
        span *= tier.size
        for group, layout in groups.values():
            codes.append(np.rint(block_members(group, layout, span)).astype(np.int64))
    return codes


def _key_batch(batch: PlanBatch, first: np.ndarray) -> PlanBatch:
    """One row per unit key (the plans at ``first``), as the units see it: dp, vpp and the batch are 1.
    Any row of a key will do: its pipeline (size and stride) sets only the tier splits of its sends and expert
    groups, which the key holds; nothing else in a unit depends on pp."""
    ones = np.ones(len(first), dtype=np.int64)
    cols = {k: getattr(batch, k)[first] for k in _UNIT_KEYS}
    strides = {a: batch.stride(a)[first] for a in _UNIT_STRIDES} | {"dp": ones}
    return PlanBatch(dp=ones, pp=batch.pp[first], vpp=ones, last_stage_layers=0 * ones,
                     global_batch=cols["micro_batch"], placement_id=0 * ones, placements=batch.placements,
                     strides=strides, **cols,
                     **{k: getattr(batch, k) for k in CATEGORICAL if k not in _GRID_SETTINGS})


def _units_of(model: ModelSpec, cluster: Cluster, keyed: PlanBatch, stack: Stack,
              compute: dict[str, list[Num | None]], recomputes: tuple[str, ...], eff: Efficiency,
              works: tuple[str, ...] = ()) -> tuple[dict[str, Units], dict[str, Panels]]:
    """Units of every row of ``keyed`` for each recompute mode (lean: the forward, backward and total times of
    each pass are all the ranking needs), and each row's SUMMA panel count per mode and per kind of wrapper work.
    ``compute``: the rows' compute-op times (``_rows_of``); ``works``: the kinds of per-micro-batch wrapper work the
    grid's settings run (cost/wrapper_work.py), a twin of the units each.

    The panel count changes only how much of a SUMMA layer's communication is exposed and how many calls the host
    issues for it (cost/summa.py), nothing else in the step, so the best one per key is chosen here among
    ``panel_counts`` (exact: no other part of the step time or memory depends on it), for each twin on its own: a
    wrapper's per-micro-batch work adds host time to the passes (a ZeRO 2 gradient hook per parameter), and with the
    host the binding resource more panels can cost more than they hide (a DeepSpeed ZeRO 2 plan at nb 4 read 4.5 %
    slower than at nb 2 while the plain twin preferred nb 4: tests/test_properties.py's top-plan property)."""
    cols = {k: getattr(keyed, k) for k in ("tp", "tp2", "summa_panels")}
    options = _panel_options(model, keyed.tensor_layout, cols)
    count = (options > 0).sum(axis=1)
    best: dict[str, Units] = {}
    best_nb: dict[str, Panels] = {}
    for j in range(int(count.max())):  # the j-th panel option of every key that has one
        rows = np.flatnonzero(count > j)
        nb = options[rows, j]
        some = replace(keyed.select(rows) if j else keyed, summa_panels=nb)
        parts = timed_parts(model, cluster, some, stack, eff, _rows_of(compute, rows) if j else compute, works)
        for rc, full in units_for_recomputes(model, some, stack, parts, recomputes, eff).items():
            units = _lean(full)
            if not j:
                best[rc], best_nb[rc] = units, {w: nb for w in ("", *(units.wrapped or {}))}
                continue
            old = best[rc].take(rows)
            better = {w: units.under(w).layer.total < old.under(w).layer.total for w in best_nb[rc]}
            best[rc] = _scatter(best[rc], rows, _choose_twins(better, units, old), len(count))
            for w, b in better.items():
                best_nb[rc][w] = best_nb[rc][w].copy()
                best_nb[rc][w][rows] = np.where(b, nb, best_nb[rc][w][rows])
    return best, best_nb


def _choose_twins(better: Mapping[str, Any], a: Units, b: Units) -> Units:
    """Elementwise ``a`` where ``better``, else ``b``: the plain units by ``better[""]``, each wrapped twin by its own
    mask (``_units_of``: each twin's panel count is chosen on its own)."""
    plain = _choose(better[""], replace(a, wrapped=None), replace(b, wrapped=None))
    if a.wrapped is None or b.wrapped is None:
        return plain
    return replace(plain, wrapped={w: _choose(better[w], u, b.wrapped[w]) for w, u in a.wrapped.items()})


def _rows_of(compute: dict[str, list[Num | None]], index: np.ndarray | slice, n: int | None = None
             ) -> dict[str, list[Num | None]]:
    """Compute-op times at ``index`` (of ``n`` rows; a time that is one number for all rows is spread). An array of
    ``n`` rows read at an index array is gathered as it is: the same new array as its spread view's gather, without
    the view (``np.broadcast_to``: ~1,000 calls in DeepSeek-V3's search); a slice still reads the read-only view."""
    fancy = isinstance(index, np.ndarray)

    def pick(t: Any) -> Num:  # an array (or one number for all rows, with n)
        if n is None or (fancy and type(t) is np.ndarray and t.shape == (n,)):
            return t[index]
        return np.broadcast_to(t, (n,))[index]

    return {k: [None if t is None else pick(t) for t in v] for k, v in compute.items()}


def units_store(model: ModelSpec, cluster: Cluster, pool: PlanBatch, stack: Stack, eff: Efficiency,
                recomputes: tuple[str, ...], works: tuple[str, ...]) -> KeyStore:
    """The store ``KeyUnits`` of ``pool`` keeps its units in (key_store.store_for: shared by the searches of one
    model, system and settings within ``shared_units``)."""
    settings = tuple(getattr(pool, k) for k in CATEGORICAL if k not in _GRID_SETTINGS)
    return store_for(model, cluster, settings, stack, eff, recomputes, works)


class KeyUnits:
    """The units of plans, one per distinct unit key, computed when a plan first needs them.

    A key's forward and backward kernel times and its saved activations depend only on the op shapes
    (``SHAPE_KEYS``), not on the placement or the SUMMA panels, which only the collectives see. So the units of
    one key per shape of ``pool`` (any batch of plans, or of size combinations without their placements),
    computed up front, give every plan's lower bound (``search.bound.lower_bound``) and memory (``saved``); the
    collectives, most of a key's cost to compute, are priced only for the plans the search times (``price``):
    the same numbers, for a fraction of the keys.

    It is a memo table, the search's one mutable object (DESIGN example 4's cache of the per-layer costs that many
    plans share): which keys get priced is decided by the branch and bound as it goes, so they cannot all be
    computed up front without losing the point. The shapes' kernel units and the keys priced are kept in a store
    (``key_store.KeyStore``) that the searches of one model, system and settings may share whatever their GPU count
    (``key_store.shared_units``): a strong-scaling plan's later counts compute only what the earlier did not meet."""

    def __init__(self, model: ModelSpec, cluster: Cluster, pool: PlanBatch, stack: Stack, recomputes: tuple[str, ...],
                 eff: Efficiency, works: tuple[str, ...] = ()) -> None:
        self.model, self.cluster, self.stack, self.recomputes, self.eff = model, cluster, stack, recomputes, eff
        self.works = works  # the grid's kinds of per-micro-batch wrapper work (cost/wrapper_work.py): a twin each
        self._held: tuple[tuple[Units, ...], list[tuple[list[int], np.ndarray]]] = ((), [])  # _stacked's
        shape_first, self.shape_of = distinct(np.stack([getattr(pool, k) for k in SHAPE_KEYS]))
        self.n_shapes = len(shape_first)
        store = self._store = units_store(model, cluster, pool, stack, eff, recomputes, works)
        self._shape_ids = store.shape_ids(np.stack([getattr(pool, k)[shape_first] for k in SHAPE_KEYS]))
        new = self._shape_ids >= store.shaped  # shapes whose kernel times no search of the store has computed
        if new.any():
            shaped = _key_batch(pool, shape_first[new])
            ops = shape_ops(model, shaped, stack)
            compute = shape_compute_times(model, cluster, shaped, stack, eff, ops)
            # kernel times and saved bytes only: without the twins, the collectives nor a choice of SUMMA panels
            parts = kernel_parts(model, cluster, shaped, stack, _rows_of(compute, slice(None), int(new.sum())), ops)
            store.add_shapes(compute, {rc: _lean(u) for rc, u in units_for_recomputes(model, shaped, stack, parts,
                                                                                       recomputes, eff).items()})
        if np.array_equal(self._shape_ids, np.arange(store.shaped)):  # the store's shapes, in their order
            self.compute, self.shapes = store.compute, store.shapes
        else:
            self.compute = _rows_of(store.compute, self._shape_ids, store.shaped)
            self.shapes = {rc: u.take(self._shape_ids) for rc, u in store.shapes.items()}

    def saved(self, shapes: np.ndarray) -> dict[str, Saved]:
        """The saved activations of ``shapes`` (indices into the pool's) per recompute mode: what memory reads."""
        return {rc: u.saved(shapes) for rc, u in self.shapes.items()}

    def price(self, batch: PlanBatch, shapes: np.ndarray) -> tuple[dict[str, Units], dict[str, Panels]]:
        """The full units and SUMMA panel counts of every plan of ``batch`` (``shapes``: each plan's shape, an
        index into the pool's) per recompute mode, computing those of keys not met before."""
        store, rows = self._store, self.slots(batch, shapes)
        return (_taken(self._stacked(), rows, store.units),
                {rc: {w: nb[rows] for w, nb in by_work.items()} for rc, by_work in store.panels.items()})

    def slots(self, batch: PlanBatch, shapes: np.ndarray) -> np.ndarray:
        """Where the units of each plan of ``batch`` are stored (``price``'s arguments), computing those of keys not
        met before (in one batch: each batch of keys pays the Python of the units' composition once)."""
        store, codes = self._store, split_codes(self.model, self.cluster, batch)
        first, inverse = distinct(np.stack([shapes, batch.summa_panels, *codes]))
        split_first, split_of = distinct(np.stack([c[first] for c in codes])) if codes else (
            np.zeros(1, dtype=np.int64), np.zeros(len(first), dtype=np.int64))
        split_ids = np.array([store.split_id(tuple(int(c[first[i]]) for c in codes)) for i in split_first],
                             dtype=np.int64)
        key = store.code(self._shape_ids[shapes[first]], batch.summa_panels[first], split_ids[split_of])
        slot = store.lookup(key)
        new = slot < 0
        if new.any():
            rows, local = first[new], shapes[first[new]]
            units, panels = _units_of(self.model, self.cluster, _key_batch(batch, rows), self.stack,
                                      _rows_of(self.compute, local, self.n_shapes), self.recomputes, self.eff,
                                      self.works)
            slot[new] = store.add(key[new], units, panels)
        return slot[inverse]

    def _stacked(self) -> list[tuple[list[int], np.ndarray]]:
        """The stored units' arrays (by id), 64 at a time the rows of one matrix (arrays × keys), made again
        when keys were added (their units are new objects: the ones stacked are held with the matrices)."""
        units, (held, stacked) = tuple(self._store.units.values()), self._held
        if len(held) != len(units) or any(a is not b for a, b in zip(held, units, strict=True)):
            arrays = [v for v in {i: v for u in units for i, v in _arrays(u).items()}.values()
                      if v.shape == (self._store.priced,) and v.dtype == np.float64]  # the others taken on their own
            stacked = [([id(v) for v in some], np.stack(some)) for some in
                       (arrays[i:i + 64] for i in range(0, len(arrays), 64))]
            self._held = (units, stacked)
        return stacked

    @property
    def priced(self) -> int:
        """Keys whose units are stored (those of every search that shares this one's store: key_store.store_for)."""
        return self._store.priced


def _arrays(units: Units) -> dict[int, np.ndarray]:
    """The array fields (with a shape) of ``units``, their passes' and their wrapped twins', by id."""
    out: dict[int, np.ndarray] = {}
    for f in Units.__slots__:
        v = getattr(units, f)
        values = [getattr(v, g) for g in PassTimes.__slots__] if isinstance(v, PassTimes) else [v]
        out |= {id(x): x for x in values if isinstance(x, np.ndarray) and x.shape}
        out |= {i: x for u in (v.values() if isinstance(v, dict) else ()) for i, x in _arrays(u).items()}
    return out


def _taken(stacked: list[tuple[list[int], np.ndarray]], rows: np.ndarray, units: dict[str, Units]
           ) -> dict[str, Units]:
    """``u.take(rows)`` of each of ``units``, their arrays read from ``stacked`` (KeyUnits._stacked): each matrix's
    columns at ``rows`` in one ``np.take``, each array's a row of the result (a view: contiguous, no copy out; 0.55-0.7x
    the time of the transposed matrix's row gather and column copies on 1,300-16,000 rows of 3,000-15,000 keys);
    where the arrays differ in shape or type, each taken on its own."""
    new: dict[int, np.ndarray] = {}
    for ids, matrix in stacked:
        part = np.take(matrix, rows, axis=1)
        new |= {i: part[j] for j, i in enumerate(ids)}

    def pick(v: Any) -> Any:  # a Num field
        if isinstance(v, np.ndarray) and v.shape:
            return new[id(v)] if id(v) in new else v[rows]
        return v

    def each(v: Any) -> Any:  # a field: PassTimes, Num, or the wrapped twins (work -> Units, or None)
        if isinstance(v, PassTimes):
            return PassTimes(*[pick(getattr(v, f)) for f in PassTimes.__slots__])
        return {w: mapped(u) for w, u in v.items()} if isinstance(v, dict) else pick(v)

    def mapped(u: Units) -> Units:
        return Units(*[each(getattr(u, f)) for f in Units.__slots__])

    return {rc: mapped(u) for rc, u in units.items()}


def _panel_options(model: ModelSpec, layout: str, cols: dict[str, np.ndarray]) -> np.ndarray:
    """(keys × options): the SUMMA panel counts each key may use, padded with 0; under the 1D layout the one
    count its plans carry."""
    if layout != "summa":
        return cols["summa_panels"][:, None].astype(np.int64)
    lists = [panel_counts(model.hidden_size, int(t), int(t2)) for t, t2 in zip(cols["tp"], cols["tp2"], strict=True)]
    options = np.zeros((len(lists), max(map(len, lists))), dtype=np.int64)
    for i, panels in enumerate(lists):
        options[i, :len(panels)] = panels
    return options


def _lean(units: Units) -> Units:
    """Units with each pass reduced to its forward, backward and total times (PassTimes.lean), their wrapped
    twins' too."""
    def lean(v: Any) -> Any:  # a field: PassTimes, Num, or the wrapped twins (work -> Units, or None)
        if isinstance(v, dict):
            return {w: _lean(u) for w, u in v.items()}
        return v.lean() if isinstance(v, PassTimes) else v

    return Units(*(lean(getattr(units, f)) for f in Units.__slots__))


def _choose(mask: Num, a: Units, b: Units) -> Units:
    """Elementwise: ``a`` where ``mask``, else ``b`` (every field of the units)."""
    def pick(x: Any, y: Any) -> Any:  # a field: PassTimes, Num, or the wrapped twins (work -> Units, or None)
        if x is None or isinstance(x, dict):
            return None if x is None else {w: _choose(mask, u, y[w]) for w, u in x.items()}
        if isinstance(x, PassTimes):
            return PassTimes(*(where(mask, getattr(x, f), getattr(y, f)) for f in PassTimes.__slots__))
        return where(mask, x, y)

    return Units(*(pick(getattr(a, f), getattr(b, f)) for f in Units.__slots__))


def _scatter(full: Units, rows: np.ndarray, part: Units, n: int) -> Units:
    """``full`` with the elements at ``rows`` replaced by ``part`` (every field of the units)."""
    def put(x: Any, y: Any) -> Any:  # a field: PassTimes, Num, or the wrapped twins (work -> Units, or None)
        if x is None or isinstance(x, dict):
            return None if x is None else {w: _scatter(u, rows, y[w], n) for w, u in x.items()}
        if isinstance(x, PassTimes):
            return PassTimes(*(put(getattr(x, f), getattr(y, f)) for f in PassTimes.__slots__))
        if x is y:  # the same constant (a folded-away component)
            return x
        out = np.array(np.broadcast_to(x, (n,)), dtype=np.float64)
        out[rows] = y
        return out

    return Units(*(put(getattr(full, f), getattr(part, f)) for f in Units.__slots__))
