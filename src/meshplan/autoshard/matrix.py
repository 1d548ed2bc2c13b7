"""The constraint matrix of ilp.py's program as HiGHS reads it: column-wise, its rows in linprog's order (the rows with
lo < hi, then those with lo == hi, each in its order), built in that order from the program's parts, with no sort of
its entries but the few memory rows' (``constraints``); or any sparse matrix as its entries (``Coo``), sorted into
those arrays.

The program's rows: one per node (Σ_a s_k[a] = 1), each edge's marginals (its merged rows', then its merged
columns'), then the memory rows (the only inequalities, which linprog's order puts first). Its columns: the nodes'
strategies, then each edge's variables row class by row class. So a node strategy's column holds its memory rows,
its node's row, then one marginal row of each edge of its node, in the edges' order; an edge variable's column its
two marginal rows: each column's rows ascend as they are made, and the arrays are scipy's canonical CSC (as
``Coo.csc`` sorts them) without the sort (Llama-3-8B on 64 H100s, a first request: 14 programs of 44 000-60 000
columns and 92 000-125 000 entries, built with their CSC in a quarter to a third of the CPU of making the entries
and sorting them; the request 1.5 % fewer instructions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from meshplan.autoshard.reduce import Pairwise


@dataclass(frozen=True, kw_only=True)
class Coo:
    """A sparse matrix as its entries (row, column, value; no two at one place), made into the arrays HiGHS reads
    without scipy.sparse (whose import is a tenth of a second or more), or into scipy's CSR where linprog asks."""

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    shape: tuple[int, int]

    def csc(self, position: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Column pointers, row indices (ascending in each column, as scipy's canonical CSC) and values; rows moved
        to ``position`` first where given."""
        rows = self.rows if position is None else position[self.rows]
        order = np.argsort(self.cols.astype(np.int64) * max(self.shape[0], 1) + rows, kind="stable")  # by (column, row)
        ptr = np.concatenate(([0], np.cumsum(np.bincount(self.cols, minlength=self.shape[1]))))
        return ptr.astype(np.int32), rows[order].astype(np.int32), self.vals[order].astype(float)

    def scipy(self) -> Any:
        from scipy.sparse import coo_matrix

        return coo_matrix((self.vals, (self.rows, self.cols)), shape=self.shape).tocsr()


@dataclass(frozen=True, kw_only=True)
class Csc:
    """A sparse matrix column-wise as ``Coo.csc`` gives it with rows moved to ``position`` (row r at position[r]),
    made so by its maker (``constraints``)."""

    ptr: np.ndarray  # int32, the columns' starts
    rows: np.ndarray  # int32, the entries' moved rows, ascending in each column
    vals: np.ndarray
    position: np.ndarray
    shape: tuple[int, int]

    def csc(self, position: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``Coo.csc``'s arrays: these where ``position`` is this matrix's (None: each row in its place)."""
        if np.array_equal(self.position, np.arange(self.shape[0]) if position is None else position):
            return self.ptr, self.rows, self.vals
        return self.coo().csc(position)

    def coo(self) -> Coo:
        original = np.empty(len(self.position), dtype=np.int64)
        original[self.position] = np.arange(len(self.position))
        cols = np.repeat(np.arange(self.shape[1]), np.diff(self.ptr))
        return Coo(rows=original[self.rows], cols=cols, vals=self.vals, shape=self.shape)

    def scipy(self) -> Any:
        return self.coo().scipy()


def constraints(pw: Pairwise, keys: list[int], offset: dict[int, int], edges: list, e_offset: list[int], n: int,
                memory_rows: list[tuple[dict[int, np.ndarray], float]]) -> tuple[Csc, np.ndarray, np.ndarray]:
    """One strategy per node; each edge's marginals (per merged row and column: ``edges``' (key, merged matrix, each
    u strategy's row class, each v strategy's column class), the edge's variables from ``e_offset``) equal the sums of
    its nodes' strategies (node k's from ``offset[k]``); the memory rows. The matrix in linprog's row order (module
    docstring), the bounds in the rows' own."""
    count, mem_count = len(keys), len(memory_rows)
    sizes = np.array([len(pw.costs[k]) for k in keys], dtype=np.int64)
    start = np.array([offset[k] for k in keys], dtype=np.int64)
    su = np.array([m.shape[0] for _, m, _, _ in edges], dtype=np.int64)
    sv = np.array([m.shape[1] for _, m, _, _ in edges], dtype=np.int64)
    first = count + np.cumsum(su + sv) - su - sv  # each edge's first marginal row
    equalities = count + int((su + sv).sum())
    mem_cols, mem_rows, mem_vals = _memory_entries(pw, offset, memory_rows)
    in_column = np.bincount(mem_cols, minlength=n)  # each column's memory entries
    # each node's edges in the edges' order: the incidences (edge j's u side 2j, its v side 2j + 1) sorted by node
    place = {k: i for i, k in enumerate(keys)}
    ends = np.array([place[k] for key, *_ in edges for k in key], dtype=np.int64)
    by_node = np.argsort(ends, kind="stable")
    degree = np.bincount(ends, minlength=count)
    nth = np.arange(len(ends)) - np.repeat(np.cumsum(degree) - degree, degree)  # its place among its node's edges
    edge, side = by_node // 2, by_node % 2
    nodes = int(sizes.sum())
    size = su * sv
    if not (np.array_equal(start, np.cumsum(sizes) - sizes) and np.array_equal(
            np.asarray(e_offset, dtype=np.int64), nodes + np.cumsum(size) - size) and n == nodes + int(size.sum())):
        raise ValueError("constraints: the nodes' columns first, in the keys' order, then each edge's in order")
    per_column = in_column.copy()
    per_column[:nodes] += 1 + np.repeat(degree, sizes)
    per_column[nodes:] += 2
    ptr = np.concatenate(([0], np.cumsum(per_column)))
    rows = np.empty(int(ptr[-1]), dtype=np.int32)  # HiGHS reads 32-bit indices
    vals = np.empty(int(ptr[-1]))
    order = np.argsort(mem_cols, kind="stable")  # by column, then row
    at = mem_cols[order]
    dest = ptr[at] + np.arange(len(at)) - (np.cumsum(in_column) - in_column)[at]
    rows[dest], vals[dest] = mem_rows[order], mem_vals[order]
    after = ptr[:nodes] + in_column[:nodes]  # a node strategy's own row, then its edges' marginal rows
    rows[after], vals[after] = mem_count + np.repeat(np.arange(count), sizes), 1.0
    node = ends[by_node]
    which, index = spans(sizes[node])
    if mem_count:
        dest = after[start[node][which] + index] + 1 + nth[which]
    else:  # every column of a node as long: its edges' rows one column after another
        dest = (after[start[node]] + 1 + nth)[which] + index * (1 + degree[node])[which]
    classes = [edges[j][2 + s] for j, s in zip(edge.tolist(), side.tolist(), strict=True)]
    rows[dest] = mem_count + (first[edge] + side * su[edge])[which] + np.concatenate([np.zeros(0, dtype=np.int64),
                                                                                     *classes])
    vals[dest] = -1.0
    rowlen, column = row_runs(su, sv)  # an edge variable: its row class's marginal row, then its column class's
    pairs = rows[int(ptr[nodes]):].reshape(-1, 2)  # each edge variable's two entries, the columns in order
    pairs[:, 0] = mem_count + np.repeat(np.repeat(first, su) + spans(su)[1], rowlen)
    pairs[:, 1] = mem_count + np.repeat(np.repeat(first + su, su), rowlen) + column
    vals[int(ptr[nodes]):] = 1.0
    position = np.concatenate((mem_count + np.arange(equalities), np.arange(mem_count)))
    lo = np.concatenate((np.ones(count), np.zeros(equalities - count), np.full(mem_count, -np.inf)))
    hi = np.concatenate((np.ones(count), np.zeros(equalities - count), [limit for _, limit in memory_rows]))
    shape = (equalities + mem_count, n)
    return Csc(ptr=ptr.astype(np.int32), rows=rows, vals=vals, position=position, shape=shape), lo, hi


def _memory_entries(pw: Pairwise, offset: dict[int, int], memory_rows: list[tuple[dict[int, np.ndarray], float]]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The memory rows' entries (column, row, bytes): each node strategy's nonzero bytes, row by row (a row's index:
    its position, the inequalities first)."""
    cols, rows, vals = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)], [np.zeros(0)]
    for m, (coef, _) in enumerate(memory_rows):
        for k, vec in coef.items():
            if k in offset:
                held = np.asarray(vec)[pw.ids[k]]
                nonzero = np.flatnonzero(held)
                cols.append(offset[k] + nonzero)
                rows.append(np.full(len(nonzero), m, dtype=np.int64))
                vals.append(held[nonzero].astype(float))
    return np.concatenate(cols), np.concatenate(rows), np.concatenate(vals)


def edge_rows(matrix: Csc, first: int) -> np.ndarray:
    """Each column's two rows (their own indices, not their positions) from column ``first`` on: ``constraints``' edge
    variables, each its u-marginal row, then its v-marginal row."""
    original = np.empty(len(matrix.position), dtype=np.int64)
    original[matrix.position] = np.arange(len(matrix.position))
    return original[matrix.rows[int(matrix.ptr[first]):]].reshape(-1, 2)


def row_runs(su: np.ndarray, sv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges of su x sv classes, their entries row by row one edge after another: each row's length (its edge's sv)
    and each entry's place in its row (the column class)."""
    rowlen = np.repeat(sv, su)
    return rowlen, np.arange(int(rowlen.sum())) - np.repeat(np.cumsum(rowlen) - rowlen, rowlen)


def spans(size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For runs of ``size`` items one after another: each item's run and its place in the run."""
    eid = np.repeat(np.arange(len(size)), size)
    return eid, np.arange(int(size.sum())) - np.repeat(np.cumsum(size) - size, size)
