"""DTensor's placement vocabulary, one entry per mesh dimension, as small integers.

A tensor on an N-dimensional device mesh has one placement per mesh dimension (torch.distributed.tensor:
``Shard(d)``, ``Replicate()``, ``Partial()``): ``Shard(d)`` splits tensor dimension d evenly over that mesh
dimension's devices, ``Replicate()`` keeps a full copy on each, ``Partial()`` keeps on each a term of a sum that a
reduction (all-reduce or reduce-scatter) completes. Here a placement is an int: ``d >= 0`` is ``Shard(d)``,
``REPLICATE`` (-1) and ``PARTIAL`` (-2); a tensor's placements are a tuple with one int per mesh dimension.

Only even shards are used (a sharded dimension's size must divide by the devices it is split over; DTensor also
runs uneven ones, padded, which this planner leaves out).
"""

from __future__ import annotations

from functools import lru_cache

REPLICATE = -1
PARTIAL = -2

Placements = tuple[int, ...]


def name(p: int) -> str:
    """DTensor's spelling: ``Shard(0)``, ``Replicate()``, ``Partial()``."""
    if p == REPLICATE:
        return "Replicate()"
    if p == PARTIAL:
        return "Partial()"
    return f"Shard({p})"


def short(placements: Placements) -> str:
    """Compact form used in tables: ``S(0)R``, ``RP``; ``R`` per mesh dimension for a replicated tensor."""
    return "".join("R" if p == REPLICATE else "P" if p == PARTIAL else f"S({p})" for p in placements)


def describe(placements: Placements) -> str:
    """``[Shard(0), Replicate()]``: what ``DTensor.placements`` prints."""
    return "[" + ", ".join(name(p) for p in placements) + "]"


def replicated(ndim: int) -> Placements:
    return (REPLICATE,) * ndim


@lru_cache(maxsize=65536)
def shards(placements: Placements, sizes: tuple[int, ...]) -> int:
    """Devices a tensor is split over: the product of the mesh sizes of its Shard placements (memoised: asked of a
    few placements per mesh for every strategy, op and move)."""
    n = 1
    for p, size in zip(placements, sizes, strict=True):
        if p >= 0:
            n *= size
    return n


def dim_shards(placements: Placements, sizes: tuple[int, ...], dim: int) -> int:
    """Devices tensor dimension ``dim`` is split over (several mesh dimensions may shard one tensor dimension)."""
    n = 1
    for p, size in zip(placements, sizes, strict=True):
        if p == dim:
            n *= size
    return n


def local_shape(shape: tuple[int, ...], placements: Placements, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape each device holds."""
    return tuple(s // dim_shards(placements, sizes, d) for d, s in enumerate(shape))


@lru_cache(maxsize=65536)
def valid(shape: tuple[int, ...], placements: Placements, sizes: tuple[int, ...]) -> bool:
    """Every Shard names a dimension of the tensor and splits it evenly (memoised: a node's strategies ask it of the
    same few shapes and placements again and again)."""
    for p in placements:
        if p >= len(shape):
            return False
    return all(s % dim_shards(placements, sizes, d) == 0 for d, s in enumerate(shape) if s > 0)
