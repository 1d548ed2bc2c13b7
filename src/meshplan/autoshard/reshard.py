"""The cost of redistributing a tensor from one placement to another, by meshplan's collective model.

Per mesh dimension of g devices, with n the bytes each device holds before the step (comm.py's glossary for what
each collective's ``nbytes`` means):

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


def _steps(src: Placements, dst: Placements, local_bytes: float, sizes: tuple[int, ...]
           ) -> list[tuple[str, int, float]]:
    """``moves``' collectives as (kind, mesh dimension, nbytes), in order, unpriced."""
    if src == dst:
        return []
    found: list[tuple[str, int, float]] = []
    local = float(local_bytes)
    for i in reversed(range(len(src))):
        s, d, g = src[i], dst[i], sizes[i]
        if s in (d, REPLICATE):
            continue
        if s >= 0 and d >= 0:
            found.append(("all_to_all", i, local))
        elif s >= 0:  # to Replicate or Partial: gather the shards
            found.append(("all_gather", i, local * g))
            local *= g
        elif d == REPLICATE:  # Partial -> Replicate
            found.append(("all_reduce", i, local))
        elif d >= 0:  # Partial -> Shard
            found.append(("reduce_scatter", i, local))
            local /= g
    return found


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
        placement) are 0 (problem._move_matrix's table). ``_steps`` taken over the whole table at once, one mesh
        dimension at a time from the innermost, each collective priced once per distinct bytes, and the seconds
        added in ``_steps``' order: each entry is ``move``'s to the bit (tests/test_autoshard_graph.py)."""
        ndim, out = len(self.mesh.sizes), np.zeros((2, len(rows) + 1, len(cols) + 1))
        if not rows or not cols:
            return out
        src = np.array(rows, dtype=np.int64).reshape(len(rows), 1, ndim)
        dst = np.array(cols, dtype=np.int64).reshape(1, len(cols), ndim)
        local = np.repeat(np.array([float(nbytes / shards(p, self.mesh.sizes)) for p in rows])[:, None], len(cols), 1)
        seconds, count = out[0, :-1, :-1], out[1, :-1, :-1]  # views: written in place
        for i in reversed(range(ndim)):
            s, d, g = src[..., i], dst[..., i], self.mesh.sizes[i]
            moving = (s != d) & (s != REPLICATE)
            gather = moving & (s >= 0) & (d < 0)
            scatter = moving & (s == PARTIAL) & (d >= 0)
            for kind, mask, moved in (("all_to_all", moving & (s >= 0) & (d >= 0), local),
                                      ("all_gather", gather, local * g),
                                      ("all_reduce", moving & (s == PARTIAL) & (d == REPLICATE), local),
                                      ("reduce_scatter", scatter, local)):
                if mask.any():
                    found = moved[mask].tolist()
                    price = {b: self.mesh.collective(kind, b, i) for b in set(found)}
                    seconds[mask] += np.fromiter(map(price.__getitem__, found), float, len(found))
                    count[mask] += 1
            local = np.where(gather, local * g, np.where(scatter, local / g, local))
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
