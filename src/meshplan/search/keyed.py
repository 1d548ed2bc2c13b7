"""Per-key units for the search: what one micro-batch of a layer, the embedding, the head and a pipeline send
costs (``step.units.Units``), computed once per distinct key of the plans that share it.

A unit depends only on tp, tp2, cp, the micro-batch, ep, etp, the SUMMA panels, the tier split of each group its
collectives use (which is all the placement decides: ``split_codes``) and the categorical settings. Its kernel
times and saved activations depend on the op shapes alone (``SHAPE_KEYS``): those are computed for one key per
shape up front; the collectives, most of a key's cost to compute, when a plan first needs them (``KeyUnits``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from functools import lru_cache
from typing import Any

import numpy as np

from meshplan.collectives.comm import Layout, block_members
from meshplan.collectives.groups import expert_layout, send_stride
from meshplan.search.batch import CATEGORICAL, PlanBatch
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.stack import Stack
from meshplan.step.passes import ZERO, PassTimes
from meshplan.step.units import Saved, Units, compute_times, kernel_parts, plan_ops, timed_parts, units_for_recomputes
from meshplan.xp import Num, where


@lru_cache(maxsize=4096)
def panel_counts(hidden: int, tp: int, tp2: int) -> list[int]:
    """SUMMA panel counts nb (seed 003 ``summa_nb_candidates``): max(tp, tp2)·2^i dividing the hidden size
    while panels keep at least 512 columns (or just the first one if none does)."""
    start, h = max(tp, tp2), hidden
    options = [nb for nb in (start << i for i in range(16)) if nb <= h and h % nb == 0 and h // nb >= 512]
    return options or ([start] if h % start == 0 else [])


Panels = dict[str, np.ndarray]  # a SUMMA panel count per row, per kind of wrapper work ("": none; Units.under)
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
    """Compute-op times at ``index`` (of ``n`` rows; a time that is one number for all rows is spread)."""
    def pick(t: Any) -> Num:  # an array (or one number for all rows, with n)
        return (np.broadcast_to(t, (n,)) if n is not None else t)[index]

    return {k: [None if t is None else pick(t) for t in v] for k, v in compute.items()}


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
    (``_KeyStore``) that the searches of one model, system and settings share whatever their GPU count (``_store``):
    a strong-scaling plan's later counts compute only the shapes and keys the earlier ones did not meet."""

    def __init__(self, model: ModelSpec, cluster: Cluster, pool: PlanBatch, stack: Stack, recomputes: tuple[str, ...],
                 eff: Efficiency, works: tuple[str, ...] = ()) -> None:
        self.model, self.cluster, self.stack, self.recomputes, self.eff = model, cluster, stack, recomputes, eff
        self.works = works  # the grid's kinds of per-micro-batch wrapper work (cost/wrapper_work.py): a twin each
        shape_first, self.shape_of = distinct(np.stack([getattr(pool, k) for k in SHAPE_KEYS]))
        self.n_shapes = len(shape_first)
        store = self._store = _store(model, cluster, pool, stack, recomputes, eff, works)
        self._shape_ids = store.shape_ids(np.stack([getattr(pool, k)[shape_first] for k in SHAPE_KEYS]))
        new = self._shape_ids >= store.shaped  # shapes whose kernel times no search of the store has computed
        if new.any():
            shaped = _key_batch(pool, shape_first[new])
            ops = plan_ops(model, shaped, stack)
            compute = compute_times(model, cluster, shaped, stack, eff, ops)
            # kernel times and saved bytes only: without the twins, the collectives nor a choice of SUMMA panels
            parts = kernel_parts(model, cluster, shaped, stack, _rows_of(compute, slice(None), int(new.sum())), ops)
            store.add_shapes(compute, {rc: _lean(u) for rc, u in units_for_recomputes(model, shaped, stack, parts,
                                                                                       recomputes, eff).items()})
        self.compute = _rows_of(store.compute, self._shape_ids, store.shaped)
        self.shapes = {rc: u.take(self._shape_ids) for rc, u in store.shapes.items()}

    def saved(self, shapes: np.ndarray) -> dict[str, Saved]:
        """The saved activations of ``shapes`` (indices into the pool's) per recompute mode: what memory reads."""
        return {rc: u.saved(shapes) for rc, u in self.shapes.items()}

    def price(self, batch: PlanBatch, shapes: np.ndarray) -> tuple[dict[str, Units], dict[str, Panels]]:
        """The full units and SUMMA panel counts of every plan of ``batch`` (``shapes``: each plan's shape, an
        index into the pool's) per recompute mode, computing those of keys not met before."""
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
        rows = slot[inverse]
        return ({rc: u.take(rows) for rc, u in store.units.items()},
                {rc: {w: nb[rows] for w, nb in by_work.items()} for rc, by_work in store.panels.items()})

    @property
    def priced(self) -> int:
        """Keys whose units are stored (those of every search that shares this one's store: ``_store``)."""
        return self._store.priced


# A strong-scaling plan searches the same model on several GPU counts: their unit keys are mostly the same (a unit
# reads the cluster only through its tiers' links and the sizes of all but the outermost: ``_pricing_key``), so
# the keys priced for one count are kept for the next (the few latest contexts: ``_STORES``).
_STORES = 4


@lru_cache(maxsize=_STORES)
def _stored_keys(context: tuple[Any, ...], panel_radix: int, recomputes: tuple[str, ...],
                 works: tuple[str, ...]) -> _KeyStore:
    return _KeyStore(panel_radix, recomputes, works)


def _store(model: ModelSpec, cluster: Cluster, pool: PlanBatch, stack: Stack, recomputes: tuple[str, ...],
           eff: Efficiency, works: tuple[str, ...]) -> _KeyStore:
    """The store of priced keys for searches of ``model`` on ``cluster`` whatever its GPU count, with ``pool``'s
    settings (the unit-level ones: ``_key_batch``'s), ``stack``, ``recomputes``, ``eff`` and ``works``."""
    settings = tuple(getattr(pool, k) for k in CATEGORICAL if k not in _GRID_SETTINGS)
    return _stored_keys((model, _pricing_key(cluster), stack, eff, settings), model.hidden_size + 1, recomputes,
                        works)


def _pricing_key(cluster: Cluster) -> tuple[Any, ...]:
    """What a unit's price reads of ``cluster``: every field but the GPU count and the outermost tier's size (a
    unit's groups are split over the tiers by the sizes of the inner ones alone, the outermost holding the rest:
    comm.split_group, split_codes). A one-tier cluster keeps its size."""
    if len(cluster.tiers) < 2:
        return (cluster,)
    *inner, outer = cluster.tiers
    rest = tuple((f.name, getattr(cluster, f.name)) for f in fields(cluster)
                 if f.compare and f.name not in ("num_gpus", "tiers"))
    return (*rest, tuple(inner), tuple((f.name, getattr(outer, f.name)) for f in fields(outer) if f.name != "size"))


class _KeyStore:
    """Priced unit keys: a key is known by its shape (an index into the shapes met so far), its SUMMA panel count
    and its tier splits (an index into the split tuples met so far), packed into one integer; the codes seen so
    far are kept sorted, beside where each key's units are stored."""

    SHAPES = 1 << 20  # distinct shapes a store can tell apart

    def __init__(self, panel_radix: int, recomputes: tuple[str, ...], works: tuple[str, ...]) -> None:
        self._panel_radix = panel_radix  # panels: at most the hidden size (SUMMA's divide it; 1D's = tp)
        self._split_radix = 2**62 // (self.SHAPES * panel_radix)
        self._shapes: dict[tuple[int, ...], int] = {}
        self._splits: dict[tuple[int, ...], int] = {}
        self._codes = np.zeros(0, dtype=np.int64)  # sorted key codes
        self._slot = np.zeros(0, dtype=np.int64)  # where each code's units are stored
        self.priced = 0  # keys whose units are stored
        self.shaped = 0  # shapes whose compute-op times and kernel units are stored
        self.compute: dict[str, list[Num | None]] = {}  # per op group, each op's time per shape (None: not compute)
        self.shapes: dict[str, Units] = {}  # per recompute mode, the lean kernel units per shape
        self.units: dict[str, Units] = {}
        self.panels: dict[str, Panels] = {rc: {w: np.zeros(0, dtype=np.int64) for w in ("", *works)}
                                          for rc in recomputes}

    def shape_ids(self, shapes: np.ndarray) -> np.ndarray:
        """The store's index of each shape (``shapes``: SHAPE_KEYS × shapes), new ones numbered on in their order
        (``add_shapes`` then stores their kernel times in that order)."""
        return np.array([self._number(self._shapes, tuple(map(int, s)), self.SHAPES) for s in shapes.T],
                        dtype=np.int64)

    def add_shapes(self, compute: dict[str, list[Num | None]], shapes: dict[str, Units]) -> None:
        """Store the compute-op times and lean kernel units of the shapes numbered since the last call."""
        n = len(self._shapes) - self.shaped
        slots = self.shaped + np.arange(n)
        self.shapes = {rc: _stored(self.shapes.get(rc), slots, u) for rc, u in shapes.items()}
        self.compute = {k: [_joined(old, t, self.shaped, n) for old, t in
                            zip(self.compute.get(k, [None] * len(v)), v, strict=True)] for k, v in compute.items()}
        if self.compute.keys() != compute.keys():
            raise RuntimeError("searches of one store met different op groups")
        self.shaped += n

    def split_id(self, split: tuple[int, ...]) -> int:
        return self._number(self._splits, split, self._split_radix)

    @staticmethod
    def _number(ids: dict[tuple[int, ...], int], key: tuple[int, ...], limit: int) -> int:
        if key not in ids:
            if len(ids) >= limit:
                raise RuntimeError("more distinct shapes or tier splits than the key code can hold")
            ids[key] = len(ids)
        return ids[key]

    def code(self, shape: np.ndarray, panels: np.ndarray, split: np.ndarray) -> np.ndarray:
        return (shape * self._panel_radix + panels) * self._split_radix + split

    def lookup(self, key: np.ndarray) -> np.ndarray:
        """Where the units of each key code are stored, -1 for codes not met before."""
        if not len(self._codes):
            return np.full(len(key), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._codes, key), len(self._codes) - 1)
        return np.where(self._codes[pos] == key, self._slot[pos], -1)

    def add(self, key: np.ndarray, units: dict[str, Units], panels: dict[str, Panels]) -> np.ndarray:
        """Store the units and panel counts of new keys (codes ``key``), return their slots."""
        slots = self.priced + np.arange(len(key))
        for rc, by_work in self.panels.items():
            self.units[rc] = _stored(self.units.get(rc), slots, units[rc])
            self.panels[rc] = {w: np.concatenate([nb, panels[rc][w]]) for w, nb in by_work.items()}
        self.priced += len(key)
        order = np.argsort(np.concatenate([self._codes, key]), kind="stable")
        self._codes = np.concatenate([self._codes, key])[order]
        self._slot = np.concatenate([self._slot, slots])[order]
        return slots


def _stored(store: Units | None, slots: np.ndarray, part: Units) -> Units:
    """``store`` (the units of slots 0 … slots[0] - 1, or None) extended by ``part`` at ``slots`` (consecutive, at
    its end): a new array per field, with the constant fields (``ZERO``) kept as they are."""
    def cat(x: Any, y: Any) -> Any:  # a field: PassTimes, Num, or the wrapped twins (work -> Units, or None)
        if y is None or isinstance(y, dict):  # one stack and settings per KeyUnits: the same twins in every batch
            return None if y is None else {w: _stored(None if x is None else x[w], slots, u) for w, u in y.items()}
        if isinstance(y, PassTimes):
            return PassTimes(*(cat(None if x is None else getattr(x, f), getattr(y, f)) for f in PassTimes.__slots__))
        if y is ZERO and (x is None or x is ZERO):
            return ZERO
        # a field constant in one batch of keys and not in another (a host-bound pass: PassTimes.host): zeros there
        tail = np.broadcast_to(np.asarray(0.0 if y is ZERO else y, dtype=np.float64), (len(slots),))
        if x is ZERO:
            x = np.zeros(int(slots[0]))
        return tail.copy() if x is None else np.concatenate([x, tail])

    return Units(*(cat(None if store is None else getattr(store, f), getattr(part, f)) for f in Units.__slots__))


def _joined(old: Num | None, new: Num | None, n_old: int, n_new: int) -> Num | None:
    """One op's times per shape: ``old``'s (``n_old`` shapes) then ``new``'s (``n_new``), each an array or one
    number for all its shapes; None (not a compute op) in both or neither."""
    if (old is None) != (new is None) and n_old:
        raise RuntimeError("searches of one store met different ops")
    if new is None or not n_old:
        return new
    assert old is not None
    return np.concatenate([np.broadcast_to(np.asarray(old, dtype=np.float64), (n_old,)),
                           np.broadcast_to(np.asarray(new, dtype=np.float64), (n_new,))])


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


def distinct(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For key columns (fields × rows of non-negative integers): the first row of each distinct key and each
    row's key index. The columns are packed into one integer (mixed radix) for a fast 1-D unique; the code is
    renumbered densely whenever the next column would overflow int64."""
    packed = np.zeros(keys.shape[1], dtype=np.int64)
    for column in keys:
        radix = int(column.max()) + 1
        if int(packed.max()) >= 2**62 // radix:
            packed = np.unique(packed, return_inverse=True)[1].reshape(-1)
        packed = packed * radix + column
    _, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)
