"""The cost of redistributing a tensor from one placement to another, by meshplan's collective model.

Per mesh dimension of g devices (``dim_step``), with n the bytes each device holds before the step (comm.py's
glossary for what each collective's ``nbytes`` means):

    Shard(a) -> Replicate      all-gather        output n·g        (each device ends with the whole group's tensor)
    Shard(a) -> Shard(b)       all-to-all        n per device      (each sends (g-1)/g of its shard)
    Partial  -> Replicate      all-reduce        n
    Partial  -> Shard(b)       reduce-scatter    input n           (each ends with n/g)
    Replicate -> Shard(b)      a local slice, no communication
    Replicate -> Partial       free (DTensor keeps the value on one rank and zeros elsewhere)
    Shard(a) -> Partial        an all-gather, then as Replicate -> Partial

This is the table of DTensor's ``redistribute`` (torch/distributed/tensor/_redistribute.py) and of Alpa's
resharding costs (Zheng et al. 2022, §4.1, Table 2), each collective timed by ``price.collective_time`` along that
mesh dimension. A move over several mesh dimensions runs one dimension at a time: first the gathers, reductions and
all-to-alls from the innermost dimension outwards (so each works on the data the others still keep sharded), then
the free slices. Memory of the temporary buffers is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from meshplan.autoshard.mesh import DeviceMesh
from meshplan.autoshard.placement import PARTIAL, REPLICATE, Placements, shards


@dataclass(frozen=True, slots=True)
class Comm:
    """One collective a move inserts: kind (comm.COLLECTIVES), the mesh dimension, its nbytes, its seconds."""

    kind: str
    dim: int
    nbytes: float
    seconds: float


def moves(src: Placements, dst: Placements, local_bytes: float, mesh: DeviceMesh) -> tuple[Comm, ...]:
    """The collectives that take a tensor held as ``src`` (``local_bytes`` on each device) to ``dst``."""
    return tuple(Comm(kind, i, nbytes, mesh.collective(kind, nbytes, i))
                 for kind, i, nbytes in _steps(src, dst, local_bytes, mesh.sizes))


def dim_step(s: int, d: int) -> tuple[str, int] | None:
    """The one collective that moves a tensor along one mesh dimension from placement ``s`` to ``d`` (the module
    docstring's table), and how the bytes each device holds change: +1 times the dimension's devices (a gather), -1
    divided by them (a reduce-scatter), 0 unchanged; None where no collective runs (the same placement, a slice from
    Replicate, a free Partial). The only statement of the decomposition: ``_steps`` walks it for one move,
    ``Resharder.table`` for a whole table (``_rule``)."""
    if s in (d, REPLICATE):
        return None
    if s >= 0:
        return ("all_to_all", 0) if d >= 0 else ("all_gather", 1)  # to Replicate or Partial: gather the shards
    return ("all_reduce", 0) if d == REPLICATE else ("reduce_scatter", -1)  # Partial -> Replicate, -> Shard


def _steps(src: Placements, dst: Placements, local_bytes: float, sizes: tuple[int, ...]
           ) -> list[tuple[str, int, float]]:
    """``moves``' collectives as (kind, mesh dimension, nbytes), in order, unpriced: ``dim_step`` on each mesh dimension
    from the innermost outwards, each on the bytes the steps before it leave (a gather's nbytes is its output)."""
    if src == dst:
        return []
    found: list[tuple[str, int, float]] = []
    local = float(local_bytes)
    for i in reversed(range(len(src))):
        taken = dim_step(src[i], dst[i])
        if taken is None:
            continue
        kind, grows = taken
        if grows > 0:
            local *= sizes[i]
        found.append((kind, i, local))
        if grows < 0:
            local /= sizes[i]
    return found


MOVE_KINDS = ("all_to_all", "all_gather", "all_reduce", "reduce_scatter")  # ``dim_step``'s collectives


@lru_cache(maxsize=16)
def _rule(codes: int) -> tuple[np.ndarray, np.ndarray]:
    """``dim_step`` as two lookup tables over placements PARTIAL .. codes - 1 + PARTIAL (source, destination): the
    collective (1 + its index in MOVE_KINDS, 0 none) and how the bytes change."""
    kind, grows = np.zeros((codes, codes), dtype=np.int64), np.zeros((codes, codes), dtype=np.int64)
    for s in range(codes):
        for d in range(codes):
            taken = dim_step(s + PARTIAL, d + PARTIAL)
            if taken is not None:
                kind[s, d], grows[s, d] = 1 + MOVE_KINDS.index(taken[0]), taken[1]
    kind.setflags(write=False)
    grows.setflags(write=False)
    return kind, grows


class Resharder:
    """Memoised move costs on one mesh: most edges of a graph repeat a few (placements, bytes) triples."""

    def __init__(self, mesh: DeviceMesh) -> None:
        self.mesh = mesh
        self._cache: dict[tuple[Placements, Placements, float], tuple[float, int]] = {}
        self.tables: dict[tuple, np.ndarray] = {}  # problem._move_matrix's tables of distinct placements

    def seconds(self, src: Placements, dst: Placements, local_bytes: float) -> float:
        """Seconds to move a tensor of ``local_bytes`` per device held as ``src`` to ``dst`` (0 when no collective)."""
        return self.move(src, dst, local_bytes)[0]

    def table(self, rows: list[Placements], cols: list[Placements], nbytes: float) -> np.ndarray:
        """(seconds, collectives) of ``move`` from each of ``rows`` (a tensor of ``nbytes`` in all, so each device
        holds ``nbytes / shards``) to each of ``cols``: a (2, rows + 1, cols + 1) array whose last row and column (no
        placement) are 0 (problem._move_matrix's table). ``_steps`` taken over the whole table at once: ``dim_step``
        (``_rule``) on each mesh dimension from the innermost, each collective priced once per distinct bytes, and
        the seconds added in ``_steps``' order, so each entry is ``move``'s to the bit
        (tests/test_autoshard_graph.py)."""
        ndim, out = len(self.mesh.sizes), np.zeros((2, len(rows) + 1, len(cols) + 1))
        if not rows or not cols:
            return out
        src = np.array(rows, dtype=np.int64).reshape(len(rows), 1, ndim) - PARTIAL  # ``_rule``'s indices
        dst = np.array(cols, dtype=np.int64).reshape(1, len(cols), ndim) - PARTIAL
        codes = int(max(src.max(initial=0), dst.max(initial=0))) + 1  # a 0-D mesh: none
        kinds, growth = _rule(codes)
        pair = src * codes + dst  # each cell's and mesh dimension's entry of the tables, flattened
        local = np.repeat(np.array([float(nbytes / shards(p, self.mesh.sizes)) for p in rows])[:, None], len(cols), 1)
        seconds, count = out[0, :-1, :-1], out[1, :-1, :-1]  # views: written in place
        for i in reversed(range(ndim)):
            g, taken, grows = self.mesh.sizes[i], kinds.take(pair[..., i]), growth.take(pair[..., i])
            local = np.where(grows > 0, local * g, local)
            for k, kind in enumerate(MOVE_KINDS, 1):
                mask = taken == k
                if mask.any():
                    found = local[mask].tolist()
                    price = {b: self.mesh.collective(kind, b, i) for b in set(found)}
                    seconds[mask] += np.fromiter(map(price.__getitem__, found), float, len(found))
                    count[mask] += 1
            local = np.where(grows < 0, local / g, local)
        return out

    def move(self, src: Placements, dst: Placements, local_bytes: float) -> tuple[float, int]:
        """(seconds, collectives) of the move: its collectives' time and how many calls the host makes for it."""
        key = (src, dst, local_bytes)
        hit = self._cache.get(key)
        if hit is None:
            steps, collective = _steps(src, dst, local_bytes, self.mesh.sizes), self.mesh.collective  # none: free
            hit = (float(sum(collective(kind, nbytes, i) for kind, i, nbytes in steps)), len(steps))
            self._cache[key] = hit
        return hit


def partial_dims(placements: Placements) -> tuple[int, ...]:
    return tuple(i for i, p in enumerate(placements) if p == PARTIAL)
