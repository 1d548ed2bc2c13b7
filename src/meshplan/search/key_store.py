"""The units a search's per-key memo (keyed.KeyUnits) has computed: its shapes' kernel units and compute-op times
and the priced keys' units, packed by key code; shared by the searches of one model, system and settings whatever
their GPU count within ``shared_units`` (a strong-scaling plan, cli/plan.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

import numpy as np

from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.stack import Stack
from meshplan.step.passes import ZERO, PassTimes
from meshplan.step.units import Units
from meshplan.xp import Num

Panels = dict[str, np.ndarray]  # a SUMMA panel count per row, per kind of wrapper work ("": none; Units.under)


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
        if x is ZERO or (x is not None and not np.ndim(x)):  # one number for the stored slots: spread
            x = np.broadcast_to(np.asarray(0.0 if x is ZERO else x, dtype=np.float64), (int(slots[0]),))
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




# A strong-scaling plan searches the same model on several GPU counts: their unit keys are mostly the same (a unit
# reads the cluster only through its tiers' links and the sizes of all but the outermost: ``_pricing_key``), so
# within ``shared_units`` the keys priced for one count are kept for the next; elsewhere a search keeps its own
# (kept longer, DeepSeek-V3's twin searches' stores raised its peak memory 193 -> 274 MiB).
_SHARED: list[dict[tuple[Any, ...], KeyStore]] = []


@contextmanager
def shared_units() -> Iterator[None]:
    """Within: the searches of one model, system and settings share their shapes' and keys' units (``_store``)."""
    _SHARED.append({})
    try:
        yield
    finally:
        _SHARED.pop()


def store_for(model: ModelSpec, cluster: Cluster, settings: tuple[Any, ...], stack: Stack, eff: Efficiency,
              recomputes: tuple[str, ...], works: tuple[str, ...]) -> KeyStore:
    """The store of priced keys for the searches of ``model`` on ``cluster`` whatever its GPU count (within
    ``shared_units``; a new one elsewhere), with the unit-level plan ``settings`` (keyed._key_batch's), ``stack``,
    ``eff``, ``recomputes`` and ``works``."""
    if not _SHARED:
        return KeyStore(model.hidden_size + 1, recomputes, works)
    context = (model, _pricing_key(cluster), stack, eff, settings, recomputes, works)
    if context not in _SHARED[-1]:
        _SHARED[-1][context] = KeyStore(model.hidden_size + 1, recomputes, works)
    return _SHARED[-1][context]


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


class KeyStore:
    """Priced unit keys: a key is known by its shape (an index into the shapes met so far), its SUMMA panel count
    and its tier splits (an index into the split tuples met so far), packed into one integer; the codes seen so
    far are kept sorted, beside where each key's units are stored."""

    SHAPES = 1 << 20  # distinct shapes a store can tell apart

    def __init__(self, panel_radix: int, recomputes: tuple[str, ...], works: tuple[str, ...]) -> None:
        self._panel_radix = panel_radix  # panels: at most the hidden size (SUMMA's divide it; 1D's = tp)
        self._split_radix = 2**62 // (self.SHAPES * panel_radix)
        self._shapes = np.zeros((0, 0), dtype=np.int64)  # the known shapes (a column each), by index
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
        (``add_shapes`` then stores their kernel times in that order). One sort of the known shapes and these
        (``distinct``), the known ones first and each stored once, in its index's place: a distinct shape whose
        first column is a known one is that one (its index); the others are new, numbered in the order of their
        first column."""
        known, shapes = self._shapes.shape[1], shapes.astype(np.int64)
        if not shapes.shape[1]:
            return np.zeros(0, dtype=np.int64)
        first, inverse = distinct(np.concatenate([self._shapes, shapes], axis=1) if known else shapes)
        fresh = np.flatnonzero(first >= known)
        fresh = fresh[np.argsort(first[fresh], kind="stable")]  # the new shapes in the order they first come
        if known + len(fresh) > self.SHAPES:
            raise RuntimeError("more distinct shapes or tier splits than the key code can hold")
        ids = first.copy()
        ids[fresh] = known + np.arange(len(fresh))
        new = shapes[:, first[fresh] - known]
        self._shapes = np.concatenate([self._shapes, new], axis=1) if known else new
        return ids[inverse[known:]]

    def add_shapes(self, compute: dict[str, list[Num | None]], shapes: dict[str, Units]) -> None:
        """Store the compute-op times and lean kernel units of the shapes numbered since the last call."""
        n = self._shapes.shape[1] - self.shaped
        slots = self.shaped + np.arange(n)
        self.shapes = {rc: _stored(self.shapes[rc], slots, u) for rc, u in shapes.items()} if self.shaped else shapes
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
