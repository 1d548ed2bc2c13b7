"""The dominance tests of reduce.py on one node's profile (a row per strategy: its cost, then the rest: its edge
blocks side by side and its bytes): which strategies plain dominance keeps (``kept``) and which Goldstein's criterion
keeps (``goldstein``), the module docstring of reduce.py says when each applies. The rest is a ``Rest``, remembered by
reduce.py apart from the cost, which a Lagrangian round reprices while the rest stays."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from meshplan.xp import unique_rows


class Rest:
    """A profile's columns but the cost (its edge blocks side by side, then ``held`` columns of bytes: reduce._profiled)
    and what the tests read of them, each made when first asked: which row costs no more than which on all of them
    (``no_more``), which holds no more bytes (``holds_no_more``), and the rows' lexicographic rank (equal rows one
    rank), so that ``np.lexsort((rank, cost))`` orders the whole profile as ``np.lexsort`` of it does (the cost
    first, ties in the rest's order, equal rows in index order: both sorts are stable)."""

    def __init__(self, columns: np.ndarray, held: int) -> None:
        self.columns = columns
        self.held = held

    @cached_property
    def no_more(self) -> np.ndarray:
        """[i, a]: i costs no more than a on every column (to within 1e-15)."""
        c = self.columns
        return np.all(c[:, None, :] <= c[None, :, :] + 1e-15, axis=2)

    @cached_property
    def holds_no_more(self) -> np.ndarray | None:
        """[a, b]: b holds no more bytes than a (to within 1e-15); None where the profile has no bytes."""
        c, held = self.columns, self.held
        return np.all(c[None, :, -held:] <= c[:, None, -held:] + 1e-15, axis=2) if held else None

    @cached_property
    def rank(self) -> np.ndarray:
        """Each row's place among the distinct rows in lexicographic order (xp.unique_rows' inverse: a NaN, unequal
        to itself, gives rows the sort finds equal ranks in their index order, the order the sort keeps them in)."""
        rows = self.columns
        return unique_rows(rows)[1] if rows.shape[1] else np.zeros(len(rows), dtype=np.intp)

    def order(self, cost: np.ndarray) -> np.ndarray:
        """The profile's rows in lexicographic order: ``np.lexsort`` of [cost, columns] (its columns reversed)."""
        return np.lexsort((self.rank, cost))


def goldstein(cost: np.ndarray, rest: Rest, worst: list[np.ndarray]) -> np.ndarray:
    """Indices of the strategies (a profile's rows: ``cost``, then ``rest``: the edge blocks side by side and the
    bytes) that Goldstein's criterion keeps (reduce.py's module docstring): b beats a where c_b − c_a + Σ_edges max_j
    (R[b, j] − R[a, j]) <= 1e-15 (``worst``: each edge's max_j, reduce._worst) and b holds no more bytes (to within
    1e-15). Each is dropped in turn, the last in lexicographic order of the profiles first, where one not dropped
    beats it. It subsumes plain dominance (b no dearer anywhere beats a)."""
    gain = cost[None, :] - cost[:, None]  # gain[a, b]: c_b - c_a, then each edge's worst change
    for w in worst:
        gain = gain + w
    beats = gain <= 1e-15  # beats[a, b]: b beats a
    if rest.holds_no_more is not None:
        beats &= rest.holds_no_more
    np.fill_diagonal(beats, False)
    beaten = beats.any(axis=1)
    if not beaten.any():  # nothing beats anything: all stay (no order needed)
        return np.arange(len(cost))
    alive = np.ones(len(cost), dtype=bool)
    order = rest.order(cost)[::-1]
    for a in order[beaten[order]]:  # one that nothing beats stays, whatever goes before it
        if (beats[a] & alive).any():
            alive[a] = False
    return np.flatnonzero(alive)


def kept(cost: np.ndarray, rest: Rest, no_more: np.ndarray) -> np.ndarray:
    """reduce._dominated's test on one profile (a row per strategy: ``cost``, then ``rest``'s columns);
    ``no_more[i, a]``: i costs no more than a everywhere (to within 1e-15)."""
    if np.count_nonzero(no_more) == np.count_nonzero(no_more.diagonal()):  # none costs no more than another: all stay
        return np.arange(len(cost))
    order = rest.order(cost)
    rank = np.empty(len(order), dtype=int)
    rank[order] = np.arange(len(order))
    earlier: np.ndarray = no_more & (rank[:, None] < rank[None, :])  # i comes before a in the order and costs no more
    beaten = np.asarray(earlier.any(axis=0))
    stays = ~beaten  # beaten by nothing before it: kept whatever else is
    for a in order[beaten[order]]:
        stays[a] = not stays[earlier[:, a]].any()
    return np.flatnonzero(stays)
