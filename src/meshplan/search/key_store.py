"""The units a search's per-key memo (keyed.KeyUnits) has computed: its shapes' kernel units and compute-op times
and the priced keys' units, packed by key code; shared by the searches of one model, system and settings whatever
their GPU count within ``shared_units`` (a strong-scaling plan, cli/plan.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields, replace
from typing import Any

import numpy as np

from meshplan.cost.records import OpCost, same_record
from meshplan.search.batch import PlanBatch, same_plans
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.stack import Stack
from meshplan.step.parts import twin_ops
from meshplan.step.passes import ZERO, PassTimes
from meshplan.step.units import Units, compute_times, plan_ops
from meshplan.xp import Num, distinct

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
        tail = y if type(y) is np.ndarray and y.dtype == np.float64 and y.shape == (len(slots),) else np.broadcast_to(
            np.asarray(0.0 if y is ZERO else y, dtype=np.float64), (len(slots),))  # copied or joined below either way
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


def shared() -> bool:
    """Whether searches share their stores here (within ``shared_units``)."""
    return bool(_SHARED)


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


# what the op shapes of every layer but a MoE layer's experts depend on (the experts' also on ep and etp): an op whose
# inputs are the same wherever these are is priced once per distinct value of them (``shape_compute_times``)
_OP_KEYS = ("tp", "tp2", "cp", "micro_batch")
# the last ``shape_compute_times`` call's context, rows' op keys, ops and times, and its model, rows and stack, within
# ``twin_times`` (else empty)
_LAST: list[tuple[tuple[Any, ...], np.ndarray, np.ndarray, dict[str, list[OpCost]], dict[str, list[Num | None]],
                  tuple[ModelSpec, PlanBatch, Stack]]] = []
_TWINS: list[bool] = []


@contextmanager
def twin_times() -> Iterator[None]:
    """Within: ``shape_compute_times`` takes the time of an op equal to one the previous call priced from that call
    (one task's searches, workers._evaluate_task: the expert-GEMM twins of search/variants.py, whose shapes' ops
    differ in the expert GEMMs alone); what it holds is let go on leaving."""
    _TWINS.append(True)
    try:
        yield
    finally:
        _TWINS.pop()
        if not _TWINS:
            _LAST.clear()


def shape_compute_times(model: ModelSpec, cluster: Cluster, shaped: PlanBatch, stack: Stack, eff: Efficiency,
                        ops: dict[str, list[OpCost]]) -> dict[str, list[Num | None]]:
    """``compute_times`` of ``ops`` (the op records of ``shaped``), each op whose inputs are a function of the rows'
    ``_OP_KEYS`` (checked bit for bit) priced on one row per distinct value of those and spread back: the same
    element-wise arithmetic on fewer elements (DeepSeek-V3's search: 93 of its 99 compute ops, 476 of 15,823 shapes;
    the expert GEMMs, whose inputs also read ep and etp, on every row). Within ``twin_times``, an op equal field for
    field, bit for bit, to the op at its place in the previous call's, on rows the op keys group the same way (the
    same first rows and inverse), the same accelerator, precision and efficiency, takes that call's times:
    roofline.op_time reads nothing else (DeepSeek-V3's per-expert twin: 91 of its 99 compute ops)."""
    first, inverse = distinct(np.stack([np.asarray(getattr(shaped, k), dtype=np.int64) for k in _OP_KEYS]))
    context = (cluster.accelerator, shaped.precision, eff)
    known = _known(ops, context, first, inverse)
    todo = {k: [op for i, op in enumerate(v) if (k, i) not in known] for k, v in ops.items()}
    fresh = {k: iter(v) for k, v in _priced_once(model, cluster, shaped, stack, eff, todo, (first, inverse)).items()}
    times = {k: [known[k, i] if (k, i) in known else next(fresh[k]) for i in range(len(v))] for k, v in ops.items()}
    if _TWINS:
        _LAST[:] = [(context, first, inverse, ops, times, (model, shaped, stack))]
    return times


def shape_ops(model: ModelSpec, shaped: PlanBatch, stack: Stack) -> dict[str, list[OpCost]]:
    """``plan_ops`` of ``shaped`` (the rows ``shape_compute_times`` then prices). Within ``twin_times``, where the
    previous call priced the ops of the same model and rows (every column equal) on a stack that differs from ``stack``
    in its expert GEMMs alone (the expert-GEMM twin's), the groups that do not read them are that call's records
    (step.parts.twin_ops), the same objects, so that ``_known`` meets them as such (DeepSeek-V3's twin: the dense
    layer, the ends and a send, ~9 ms of building)."""
    if _LAST:
        old_model, old_shaped, old_stack = _LAST[0][5]
        if (old_model is model or old_model == model) and stack.with_(expert_gemm=old_stack.expert_gemm) == old_stack \
                and same_plans(old_shaped, shaped):
            return twin_ops(model, shaped, stack, _LAST[0][3])
    return plan_ops(model, shaped, stack)


def _known(ops: dict[str, list[OpCost]], context: tuple[Any, ...], first: np.ndarray, inverse: np.ndarray
           ) -> dict[tuple[str, int], Num | None]:
    """The previous call's times (``_LAST``) of the ops equal to the op at their place in it (``records.same_record``),
    where its context and the rows' grouping by op keys are these."""
    if not _LAST:
        return {}
    (old_context, old_first, old_inverse, old_ops, old_times, _), = _LAST
    if any(a is not b and a != b for a, b in zip(context, old_context, strict=True)) or \
            not (np.array_equal(first, old_first) and np.array_equal(inverse, old_inverse)):
        return {}
    return {(k, i): old_times[k][i] for k, v in ops.items() for i, op in enumerate(v)
            if op.kind != "collective" and i < len(old_ops.get(k, ())) and (op is old_ops[k][i] or
                                                                             same_record(op, old_ops[k][i]))}


def _priced_once(model: ModelSpec, cluster: Cluster, shaped: PlanBatch, stack: Stack, eff: Efficiency,
                 ops: dict[str, list[OpCost]], rows: tuple[np.ndarray, np.ndarray]) -> dict[str, list[Num | None]]:
    """``compute_times`` of ``ops``, each op that ``_on_rows`` finds a function of the op keys priced at the rows
    ``first`` of each and spread back at ``inverse`` (``rows``); the others (the expert GEMMs) where their own values
    repeat (``_by_value``) on one row per distinct value, spread back alike."""
    first, inverse = rows
    seen = _all_at_first([op for v in ops.values() for op in v], first, inverse)  # by array: at ``first`` or None
    few = {k: [_on_rows(op, first, inverse, seen) for op in v] for k, v in ops.items()}
    alike, at = _by_value([op for k, v in ops.items() for op, f in zip(v, few[k], strict=True) if f is None],
                          len(inverse))
    priced = {k: [f if f is not None else alike.get(id(op), op) for op, f in zip(ops[k], v, strict=True)]
              for k, v in few.items()}
    times = compute_times(model, cluster, shaped, stack, eff, priced)
    how = {k: [inverse if f is not None else at if id(op) in alike else None for op, f in zip(ops[k], v, strict=True)]
           for k, v in few.items()}  # where each op's times spread from: the op keys' rows, its values', or none
    spread = [_spread_all([t for k, v in times.items() for h, t in zip(how[k], v, strict=True) if h is rows_of],
                          rows_of) for rows_of in (inverse, at)]
    return {k: [t if h is None else spread[h is at].get(id(t), t) for h, t in zip(how[k], v, strict=True)]
            for k, v in times.items()}


def _by_value(ops: list[OpCost], n: int) -> tuple[dict[int, OpCost], np.ndarray]:
    """Of ``ops``, those (no collective) whose per-row fields are all 8-byte numbers, one per row of ``n``: by id, each
    at the first row of each distinct value of all their fields together (the rows' bits hashed, then checked: each
    row holds its first row's, bit for bit), and each row's index among those; none where that is over half the rows
    (DeepSeek-V3's expert GEMMs: 920 distinct of 15,823 shapes)."""
    fit = [(op, arrays) for op in ops if op.kind != "collective" and (arrays := {
        f.name: v for f in fields(op) if isinstance(v := getattr(op, f.name), np.ndarray) and v.ndim}) and all(
        v.shape == (n,) and v.dtype.kind in "biuf" and v.dtype.itemsize == 8 for v in arrays.values())]
    if not fit:
        return {}, np.zeros(0, dtype=np.int64)
    matrix = np.stack([v.view(np.uint64) for v in {id(v): v for _, a in fit for v in a.values()}.values()])
    code = np.zeros(n, dtype=np.uint64)
    for row in matrix:  # FNV-1a's multiplier: a hash, its collisions caught by the check below
        code = (code ^ row) * np.uint64(0x100000001B3)
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    # each array's bits a row (arrays × rows, as ``_all_at_first``'s): read in order, gathered by columns at once
    if 2 * len(first) > n or not bool((np.take(matrix[:, first], inverse.reshape(-1), axis=1) == matrix).all()):
        return {}, np.zeros(0, dtype=np.int64)
    at_first: list[dict[str, Any]] = [{k: v[first] for k, v in a.items()} for _, a in fit]
    return {id(op): replace(op, **at) for (op, _), at in zip(fit, at_first, strict=True)}, inverse.reshape(-1)


def _on_rows(op: OpCost, first: np.ndarray, inverse: np.ndarray, seen: dict[int, np.ndarray | None]
             ) -> OpCost | None:
    """``op`` at the rows ``first`` where each of its per-row fields holds, bit for bit, its value at ``first`` on
    every row ``inverse`` maps there; None where one does not (or the op is a collective, or has no per-row field).
    ``seen``: the arrays met so far (by id: the ops hold them), at ``first`` or None."""
    if op.kind == "collective" or len(first) == len(inverse):
        return None
    rows: dict[str, Any] = {}
    for f in fields(op):
        value = getattr(op, f.name)
        if not isinstance(value, np.ndarray) or not value.ndim:
            continue
        if id(value) not in seen:
            seen[id(value)] = _at_first(value, first, inverse)
        few = seen[id(value)]
        if few is None:
            return None
        rows[f.name] = few
    return replace(op, **rows) if rows else None


def _at_first(value: np.ndarray, first: np.ndarray, inverse: np.ndarray) -> np.ndarray | None:
    """``value`` (one number per row) at the rows ``first``, where every row ``inverse`` maps to one of them holds its
    number bit for bit (-0.0 is not 0.0); else None."""
    if value.shape != inverse.shape or value.dtype.kind not in "biuf":
        return None
    few = value[first]
    bits = f"u{value.dtype.itemsize}"
    return few if bool((few[inverse].view(bits) == np.ascontiguousarray(value).view(bits)).all()) else None


def _all_at_first(ops: list[OpCost], first: np.ndarray, inverse: np.ndarray, width: int = 8
                  ) -> dict[int, np.ndarray | None]:
    """``_at_first`` of every per-row array of the ops ``_on_rows`` reads (by id), those of 8-byte numbers checked
    ``width`` at a time: their bits the rows of one matrix (arrays × rows), its columns at ``first`` taken back at
    ``inverse`` in one ``np.take`` (the same bits compared; each array's own bits contiguous, so that stacking them,
    the comparison and its reduction all read memory in order: 0.6x the time of the transposed matrix, whose
    stacking scatters every array with a stride, on DeepSeek-V3's 64 arrays of 15,823 shapes). Each array's values
    at ``first`` are a row of that matrix (a view, read as its own type). A few arrays at a time, so that a matrix
    and its temporaries (1 MiB each at 8 arrays of DeepSeek-V3's 15,823 shapes) stay in the cache: its 247 arrays
    checked in 20.6 ms at 8 (16: 21.5, 4: 25.7, 32: 30.2, 64: 35.1, one at a time 37.7; best of 5, in process), and
    37-41 ms against 124-127 ms at 64 over the search's 4 calls in its own run, 2026-11-30 (/tmp/ds16/width.py)."""
    if len(first) == len(inverse):  # no row shares its values: _on_rows reads none
        return {}
    arrays = {id(v): v for op in ops if op.kind != "collective" for f in fields(op)
              if isinstance(v := getattr(op, f.name), np.ndarray) and v.ndim}
    wide = [v for v in arrays.values() if v.shape == inverse.shape and v.dtype.kind in "biuf" and v.dtype.itemsize == 8]
    seen = {i: _at_first(v, first, inverse) for i, v in arrays.items() if v.dtype.itemsize != 8}
    for start in range(0, len(wide), width):
        some = wide[start:start + width]
        bits = np.stack([v.view(np.uint64) for v in some])
        few = np.take(bits, first, axis=1)
        same = (np.take(few, inverse, axis=1) == bits).all(axis=1)
        seen |= {id(v): few[j].view(v.dtype) if same[j] else None for j, v in enumerate(some)}
    return seen | {i: None for i in arrays.keys() - seen.keys()}  # not per row, or of no number kind


def _spread_all(times: list[Num | None], inverse: np.ndarray, width: int = 64) -> dict[int, np.ndarray]:
    """The times of ``_on_rows``'s ops (by id) spread back to every row (one number for all: left out, as it is):
    ``width`` at a time, the rows of one matrix (arrays × rows) whose columns are taken at ``inverse`` in one
    ``np.take``, each array's spread a row of the result (a view: contiguous, no copy out; the same numbers as
    gathering each time at ``inverse``, in 0.5x the time of the transposed matrix's row gather and column copies)."""
    arrays = list({id(t): t for t in times if isinstance(t, np.ndarray) and t.ndim}.values())
    out: dict[int, np.ndarray] = {}
    for start in range(0, len(arrays), width):
        some = arrays[start:start + width]
        if len({(t.shape, t.dtype) for t in some}) > 1:  # not one matrix: each on its own
            out |= {id(t): t[inverse] for t in some}
            continue
        rows = np.take(np.stack(some), inverse, axis=1)
        out |= {id(t): rows[j] for j, t in enumerate(some)}
    return out
