"""Candidates as NumPy columns: the size combinations (``combos``) crossed with their micro-batch, interleaving and
expert options (size rows), each row with its distinct placements (``placements``).

The search keeps a size row's placements apart (``Sized``): memory and the lower bound on the step time do not
depend on the placement, so it builds a row's plans (``expand``) only if it may time them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from meshplan.cost.wrapper_work import by_work
from meshplan.search.batch import NUMERIC, PlanBatch
from meshplan.search.combos import Combo, valid_combos
from meshplan.search.placements import PLACEMENTS, distinct_placements
from meshplan.search.space import Space
from meshplan.search.tally import Tally
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import DENSE_AXES, LAYOUTS


def candidates(model: ModelSpec, cluster: Cluster, space: Space) -> tuple[dict[str, np.ndarray], Tally]:
    """Numeric columns of every structurally valid candidate, and the tally of the invalid ones: micro-batch ×
    (interleaving, stage split) × experts × placements, in that nesting order (placements innermost), built for all size
    combinations at once.

    An invalid numeric combination is counted once per categorical setting it would have been paired with.
    """
    valid, tally = valid_combos(model, cluster, space)
    sized = size_rows(valid, cluster, space, tally)
    return ({} if sized is None else expand(sized, np.arange(len(sized.count)))), tally


@dataclass(frozen=True)
class Sized:
    """Candidates before their placements: one row per size combination (every numeric plan field but the
    placement; ``placement_id`` holds its first placement), and each row's distinct placements, ``count`` of them
    from ``start`` in ``pids``. Memory and the lower bound do not depend on the placement: the search builds a
    combination's plans only if it may time them."""

    columns: dict[str, np.ndarray]
    pids: np.ndarray
    start: np.ndarray
    count: np.ndarray

    def select(self, rows: np.ndarray | slice) -> Sized:
        return Sized({k: v[rows] for k, v in self.columns.items()}, self.pids, self.start[rows], self.count[rows])


def size_rows(combos: list[Combo], cluster: Cluster, space: Space, tally: Tally) -> Sized | None:
    """The size combinations of these (tp, tp2, cp, pp, dp) combinations: micro-batch × (interleaving, stage split) ×
    experts, in that nesting order, with their distinct placements; the interleaved ones whose micro-batches pp does
    not divide tallied (once per placement and setting they would have had)."""
    if not combos:
        return None
    if space.all_placements:
        sizes = np.array([[getattr(c, a) for a in DENSE_AXES] for c in combos], dtype=np.int64)
        placements = distinct_placements(sizes, cluster.mesh_shape)
    else:
        placements = [[0]] * len(combos)
    micro, n_micro = _ragged([c.micro for c in combos])
    stages, n_vpp = _ragged([[v * 1_000_000 + last for v, last in c.stages] for c in combos])  # (vpp, last) packed
    experts, n_exp = _ragged([[e * 1_000_000 + t for e, t in c.experts] for c in combos])  # (ep, etp) packed
    (pids, pid_start), n_pid = _ragged(placements)
    per_combo = n_micro * n_vpp * n_exp

    def each(values: np.ndarray, times: np.ndarray = per_combo) -> np.ndarray:  # a combination's value per row
        return np.repeat(values, times)  # = values[combo]: the same numbers, copied rather than gathered

    local = np.arange(int(per_combo.sum())) - each(np.cumsum(per_combo) - per_combo)
    local, i_exp = np.divmod(local, each(n_exp))
    i_micro, i_vpp = np.divmod(local, each(n_vpp))
    mbs = micro[0][each(micro[1]) + i_micro]
    vpp, last = np.divmod(stages[0][each(stages[1]) + i_vpp], 1_000_000)
    pair = experts[0][each(experts[1]) + i_exp]
    field = {name: np.array([getattr(c, name) for c in combos], dtype=np.int64)
             for name in ("dp", "tp", "pp", "cp", "tp2", "panel", "mult")}
    layout = np.array([LAYOUTS.index(c.layout) for c in combos], dtype=np.int64)
    bad = (vpp > 1) & ((space.global_batch // (each(field["dp"]) * mbs)) % each(field["pp"]) != 0)
    kept = per_combo
    if bad.any():
        bad_rows = np.bincount(each(np.arange(len(combos)))[bad], minlength=len(combos))
        bad_per_combo = bad_rows * n_pid
        if bad_per_combo.any():
            first = combos[int(np.flatnonzero(bad_per_combo)[0])]
            tally.add("interleaved: pp does not divide the micro-batches", f"pp={first.pp}, dp={first.dp}",
                      int((bad_per_combo * field["mult"]).sum()))
        keep = ~bad
        kept, vpp, last, mbs, pair = per_combo - bad_rows, vpp[keep], last[keep], mbs[keep], pair[keep]
    columns = {name: each(field[name], kept) for name in ("dp", "tp", "pp", "cp", "tp2")}
    ep, etp = np.divmod(pair, 1_000_000)
    columns |= {"ep": ep, "etp": etp, "vpp": vpp, "last_stage_layers": last, "micro_batch": mbs,
                "global_batch": np.full(len(mbs), space.global_batch, dtype=np.int64),
                "summa_panels": each(field["panel"], kept), "placement_id": each(pids[pid_start], kept),
                "layout": each(layout, kept)}
    return Sized(columns, pids, each(pid_start, kept), each(n_pid, kept))


def expand(sized: Sized, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The plans of size rows ``rows``: each row once per distinct placement (placements innermost)."""
    count = sized.count[rows]
    row = np.repeat(rows, count)
    offset = np.arange(len(row)) - np.repeat(np.cumsum(count) - count, count)
    if len(row) == len(rows) and (count == 1).all():  # one plan per row: row is rows
        columns = {k: v[rows] for k, v in sized.columns.items()}
    else:  # each row's values gathered once, then repeated: the same numbers as gathering them at ``row``
        columns = {k: np.repeat(v[rows], count) for k, v in sized.columns.items()}
    return columns | {"placement_id": sized.pids[sized.start[row] + offset]}


def _ragged(lists: list[list[int]]) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """A list of int lists as (concatenated values, start of each list) and the lengths."""
    lengths = np.array([len(x) for x in lists], dtype=np.int64)
    values = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=int(lengths.sum()))
    return (values, np.cumsum(lengths) - lengths), lengths


# within search/shapes_ahead.shapes_ahead: what it built for the searches (their valid combinations, their pools) by
# what each was built from, until a search takes it
AHEAD: list[dict[tuple[Any, ...], Any]] = []


def taken(key: tuple[Any, ...]) -> Any:
    """What ``shapes_ahead`` built under ``key``, taken (once: a second ask finds nothing), or None."""
    return AHEAD[-1].pop(key, None) if AHEAD else None


def pool_key(mode: tuple[str, bool], combos: list[Combo], cluster: Cluster, space: Space) -> tuple[Any, ...]:
    """What a pool is built from: the combinations by identity (the entry built ahead holds them, so that their ids
    stay theirs), the rest by value."""
    return "pool", mode, tuple(id(c) for c in combos), cluster, space


# memory_pass.left_out's answer: the rows to search (the pool's, its size rows', and each group's refusal codes of
# them), None where none is; the refusals of the others; the plans those count as evaluated
LeftOut = tuple[tuple[PlanBatch, Sized, list[np.ndarray]] | None, Tally, int]


@dataclass(frozen=True)
class Made:
    """What one job of a search made, kept for its twin search (search/variants.py: another expert-GEMM choice, the
    stack the only difference; workers._evaluate_task evaluates them one after the other): ``mode_pool``'s answer
    (``pool``) for what it was built from (``key``) with its build rejections (``rejected``), and once found,
    memory_pass.left_out's answer for that pool (``left_out``) with the model and space it was found for."""

    key: tuple[Any, ...]
    pool: tuple[PlanBatch, Sized] | None
    rejected: Tally
    model: ModelSpec | None = None
    space: Space | None = None
    left_out: LeftOut | None = None


@dataclass
class Twin:
    """One job's holder (workers._evaluate_task, evaluate.Start.twin): what it last made, for its twin search."""

    made: Made | None = None


def mode_pool(mode: tuple[str, bool], combos: list[Combo], cluster: Cluster, space: Space, tally: Tally,
              twin: Twin | None = None) -> tuple[PlanBatch, Sized] | None:
    """The size rows of ``combos`` under the tensor ``mode`` (layout, sequence parallelism: its rows have tp > 1) as
    a batch, one row per size combination (its first placement: the search's pool), with their ``Sized`` rows
    (without the layout column); None where there are none. Build rejections are tallied in ``tally``. Where
    ``shapes_ahead`` built the layout's rows of the same, they are taken, and its build rejections added. ``twin``
    (one job's, workers._evaluate_task) holds what the job last made (``Made``), whose pool a twin search of the job
    (search/variants.py: another expert-GEMM choice, the stack the only difference) takes as it is, its rejections
    counted again: neither reads the stack (``size_rows`` reads the space's placements and global batch, the pool
    its plan ``settings``, which hold none of the stack's); a pool built anew replaces it. DeepSeek-V3 on 2,048
    H100: 21-25 ms a twin, 2026-11-30."""
    key = (mode, combos, cluster, space.all_placements, space.global_batch, space.settings)
    ahead = taken(pool_key(mode, combos, cluster, space))  # taken first, so that none is left behind
    made = None if twin is None else twin.made
    if ahead is None and made is not None and all(a is b or a == b for a, b in zip(made.key, key, strict=True)):
        tally.merge(made.rejected)
        return made.pool
    rejected = Tally()
    if ahead is None:
        rows = _kept_rows(combos, cluster, space, rejected)
    else:
        rows, built, _ = ahead
        rejected.merge(built)
    found = None if rows is None else mode_rows(mode, *rows)
    tally.merge(rejected)
    if twin is not None:
        twin.made = Made(key, found, rejected)
    return found


# within ``rows_kept``: the size rows ``layout_rows`` last built (what they were built from, the rows, the tally of
# their build rejections), for the next tensor mode of the layout
_ROWS: list[list[tuple[tuple[Any, ...], tuple[PlanBatch, Sized] | None, Tally]]] = []


@contextmanager
def rows_kept() -> Iterator[None]:
    """Within (the tasks one process evaluates, workers._evaluated): a layout's size rows built for one tensor mode are
    kept for the next mode's job of the same combinations (``_kept_rows``), let go on leaving."""
    _ROWS.append([])
    try:
        yield
    finally:
        _ROWS.pop()


def _kept_rows(combos: list[Combo], cluster: Cluster, space: Space, tally: Tally) -> tuple[PlanBatch, Sized] | None:
    """``layout_rows``; within ``rows_kept``, those last built from the same (the combinations by identity, the
    cluster, the space's placements, global batch and settings: all that ``layout_rows`` reads) taken as they are,
    their build rejections tallied again, once: DeepSeek-V3's two tensor modes (sequence parallelism off and on) of
    one layout, in one process, build them once (each mode selects its rows, ``mode_rows``)."""
    key = (cluster, space.all_placements, space.global_batch, space.settings)
    if _ROWS and _ROWS[-1]:
        (old_combos, *old), rows, built = _ROWS[-1][0]
        if len(old_combos) == len(combos) and all(a is b for a, b in zip(old_combos, combos, strict=True)) and \
                all(a is b or a == b for a, b in zip(old, key, strict=True)):
            tally.merge(built)
            _ROWS[-1].clear()  # taken once: let go as the mode's rows are selected (held, they cost the later
            return rows  # passes fresh pages: left_out 17 -> 36 ms)
    built = Tally()
    rows = layout_rows(combos, cluster, space, built)
    tally.merge(built)
    if _ROWS:
        _ROWS[-1][:] = [((list(combos), *key), rows, built)]
    return rows


def layout_rows(combos: list[Combo], cluster: Cluster, space: Space, tally: Tally) -> tuple[PlanBatch, Sized] | None:
    """The size rows of ``combos`` (of one layout) as a batch and as ``Sized`` rows, without the layout column, that
    each tensor mode of the layout selects from (``mode_rows``); None where there are none. Build rejections are
    tallied in ``tally``."""
    sized = size_rows(combos, cluster, space, tally)
    if sized is None:
        return None
    columns = {k: v for k, v in sized.columns.items() if k != "layout"}
    return PlanBatch(**columns, placements=PLACEMENTS, **space.settings), replace(sized, columns=columns)


def mode_rows(mode: tuple[str, bool], base: PlanBatch, sized: Sized) -> tuple[PlanBatch, Sized] | None:
    """The rows of ``layout_rows`` a tensor ``mode`` runs (with sequence parallelism, those of tp > 1), with the mode's
    settings; None where there are none. The batch's columns are the ``Sized`` rows' (``layout_rows``): each is
    gathered once, for both."""
    layout, sp = mode
    rows = every(np.flatnonzero(base.tp > 1), len(base)) if sp else slice(None)
    if not isinstance(rows, slice) and not len(rows):
        return None
    picked = sized.select(rows)
    batch = base.select(rows, sequence_parallel=sp, tensor_layout=layout, **{
        n: picked.columns[n] for n in (*NUMERIC, "placement_id") if getattr(base, n) is sized.columns.get(n)})
    return batch, picked


def pool_works(pool: PlanBatch, space: Space) -> tuple[str, ...]:
    """The kinds of per-micro-batch wrapper work the grid's settings run on ``pool`` (cost/wrapper_work.py)."""
    return tuple(w for w, _ in by_work(pool, space.stack, space.zero, space.offload_optimizer) if w)


def every(rows: np.ndarray, n: int) -> np.ndarray | slice:
    """``rows`` (increasing, of ``n``), or where they are all n the slice of them all: what is selected with it is
    the columns' views, not a gathered copy of each (the same numbers)."""
    return slice(None) if len(rows) == n else rows
