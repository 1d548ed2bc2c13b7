"""The device mesh the planner shards over, built from the cluster's tiers, and the collectives along its dimensions.

Seed 000's device-mesh abstraction: the GPU network hierarchy mapped into an N-dimensional mesh whose devices along
one dimension share a latency and a bandwidth. DTensor's ``init_device_mesh(shape)`` numbers the ranks row-major, the
last mesh dimension fastest, so the innermost tier (the NVLink domain) is the last mesh dimension: a cluster with
tiers (nvlink 8, network 8) is the mesh (8, 8) whose dimension 1 has stride 1 and dimension 0 stride 8. Any number
of tiers gives as many dimensions (tiers of one GPU are dropped); ``shape`` may refactor the GPUs into another mesh
(e.g. 4 x 16 on 8 x 8), each dimension then a group of ``size`` ranks ``stride`` apart.

A collective along dimension i is priced by ``price.collective_time`` for that group and stride on the cluster, so
a dimension that spans tiers is priced hierarchically, and the α-β constants are the cluster's (datasheet or
calibrated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from math import prod

from meshplan.collectives.price import collective_time
from meshplan.errors import SpecError
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster


@dataclass(frozen=True, kw_only=True)
class MeshDim:
    name: str
    size: int
    stride: int  # rank distance between neighbours along this dimension


@dataclass(frozen=True, kw_only=True)
class DeviceMesh:
    """A mesh of ``cluster``'s GPUs (or of a sub-mesh of them, for a pipeline stage)."""

    cluster: Cluster
    dims: tuple[MeshDim, ...]
    efficiency: Efficiency = field(default=DEFAULT, compare=False)
    _seconds: dict = field(default_factory=dict, compare=False, repr=False)  # collective() memo

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    @property
    def devices(self) -> int:
        return prod(self.sizes)

    def collective(self, kind: str, nbytes: float, dim: int) -> float:
        """Seconds for one collective of ``nbytes`` (comm.py's glossary) among the devices along ``dim``."""
        key = (kind, nbytes, dim)
        hit = self._seconds.get(key)
        if hit is None:
            d = self.dims[dim]
            hit = self._seconds[key] = float(collective_time(kind, nbytes, d.size, d.stride, self.cluster,
                                                             self.efficiency))
        return hit

    def describe(self) -> str:
        return " x ".join(f"{d.name} {d.size}" for d in self.dims) if self.dims else "1 device"


def device_mesh(cluster: Cluster, shape: tuple[int, ...] | None = None, eff: Efficiency = DEFAULT) -> DeviceMesh:
    """The mesh of all of ``cluster``'s GPUs: one dimension per tier of more than one GPU, outermost first, or
    ``shape`` (row-major over the ranks) when given."""
    if shape is None:
        tiers = [t for t in cluster.tiers if t.size > 1]
        dims, stride = [], 1
        for tier in tiers:
            dims.append(MeshDim(name=tier.name, size=tier.size, stride=stride))
            stride *= tier.size
        return DeviceMesh(cluster=cluster, dims=tuple(reversed(dims)), efficiency=eff)
    if not shape or min(shape) < 1 or prod(shape) != cluster.num_gpus:
        raise SpecError(f"mesh={'x'.join(map(str, shape))} must be positive sizes whose product is the "
                        f"gpus={cluster.num_gpus}")
    return sub_mesh(cluster, shape, eff=eff)


def sub_mesh(cluster: Cluster, shape: tuple[int, ...], eff: Efficiency = DEFAULT) -> DeviceMesh:
    """A mesh of ``prod(shape)`` consecutive ranks (a pipeline stage's devices), row-major; size-1 dimensions are
    dropped. Dimensions are named after the tier their stride falls in (``nvlink``, ``network`` …)."""
    found, stride = [], 1
    for size in reversed(shape):
        if size > 1:
            found.append((_tier_name(cluster, stride), size, stride))
        stride *= size
    found.reverse()
    names = [n for n, _, _ in found]
    dims = tuple(MeshDim(name=n if names.count(n) == 1 else f"{n}{names[:i].count(n)}", size=size, stride=st)
                 for i, (n, size, st) in enumerate(found))
    return DeviceMesh(cluster=cluster, dims=dims, efficiency=eff)


def _tier_name(cluster: Cluster, stride: int) -> str:
    """The tier whose blocks a step of ``stride`` ranks first leaves."""
    span = 1
    for tier in cluster.tiers:
        span *= tier.size
        if stride < span:
            return tier.name
    return cluster.tiers[-1].name
