"""The mesh of tiers a cluster is, and the tiers a system file states: any number of them.

A cluster is an N-dimensional device mesh whose dimensions each have their own latency and bandwidth (seed 000,
"Device Mesh Abstraction": time_i = latency_i + bytes / bandwidth_i along mesh dimension i). Tier 0 is the scale-up
domain (NVLink); each tier beyond it joins ``size`` blocks of the tier inside it: a rail-optimised leaf of 32 nodes,
a pod of 384, a spine over the pods. ``Tier`` is one dimension of a job's mesh (what comm.py prices);
``TierSpec`` is one tier as a system file states it, where the outermost may be "the rest" and a tier's bandwidth
is divided by the oversubscription of the switches that join its blocks (a fat tree tapered k:1 above a level
gives each GPU 1/k of its injection bandwidth across that level when all of them send: Leiserson 1985, "Fat-trees:
universal networks for hardware-efficient supercomputing", §II, channel capacities).

How a job of n GPUs is laid onto the tiers (``tier_sizes``), innermost first:
- tier 0 holds min(its size, n) GPUs; n must then be a multiple of it (a job takes whole NVLink domains or part
  of one, as the two-tier presets have always required);
- a middle tier holds the largest number of the blocks left that is at most its size and divides them: the job is
  spread evenly over the fewest blocks that split it evenly (2,048 nodes on pods of 384 nodes: 8 pods of 256,
  not 5⅓ pods; an uneven spread is no regular mesh);
- the outermost tier holds the rest, and at most its size when it states one (its capacity).
The ``--nvlink-domain`` what-if resizes tier 0 and keeps tier 1's GPUs per block (hardware.Network).

A tier without a switch (``peers`` > 0) links each GPU directly to ``peers`` others, its bandwidth split over those
links: an MI300X board's 7 Infinity Fabric links of 64 GB/s, one to each other GPU; a DGX-1's 6 NVLink2 links to 4
neighbours (hybrid cube-mesh). A group of g GPUs in one block then drives only the links to its other members, so its
bandwidth per GPU is B · min(g − 1, peers) / peers (``group_bandwidth``): a pair of MI300X shares one 64 GB/s link,
all eight reach 448. A collective over g fully connected GPUs can keep all g − 1 links busy at once: the complete
directed graph on g vertices splits into g − 1 edge-disjoint directed Hamiltonian cycles, one ring each (Tillson 1980,
"A Hamiltonian decomposition of K*_2m, 2m ≥ 8", J. Combin. Theory B 29; g = 4 and 6 excepted, where rings and
one-shot exchanges still fill the links), and an all-to-all sends to each member over its own link. On a partial mesh
(a DGX-1's 4 of 7) the links to the members are taken as an even share, an approximation of its NV1 / NV2 pairs.
Behind a switch (``peers`` 0: NVSwitch, InfiniBand) every group reaches the full bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import isqrt

from meshplan import ranges
from meshplan.errors import SpecError
from meshplan.fields import check_types
from meshplan.xp import Num, maximum, minimum

MAX_TIERS = 8  # an NVLink domain, a rack, a leaf, a pod, a spine, a building, a campus: deeper is a typo


@dataclass(frozen=True, kw_only=True)
class Tier:
    """One mesh dimension: ``size`` GPUs per group at this level, bandwidth per GPU per direction, latency."""

    name: str
    size: int
    bandwidth: float  # bytes/s per GPU per direction
    latency: float  # seconds per message step (α)
    peers: int = 0  # GPUs each GPU links to directly on a switchless tier (module docstring); 0: a switch

    def __post_init__(self) -> None:
        check_types(self, f"tier {self.name}: ")
        if self.size < 1:
            raise SpecError(f"tier {self.name}: size={self.size!r} must be a positive integer")
        if not self.bandwidth > 0:
            raise SpecError(f"tier {self.name}: bandwidth={self.bandwidth!r} must be positive")
        if not self.latency >= 0:
            raise SpecError(f"tier {self.name}: latency={self.latency!r} must be non-negative")
        ranges.check_spec(self, f"tier {self.name}: ")


@dataclass(frozen=True, kw_only=True)
class TierSpec:
    """One tier of a system's network as its file states it ([[network.tiers]], innermost first)."""

    name: str
    latency: float  # seconds per message step (α) across this tier
    size: int = 0  # blocks of the tier inside per block of this one (tier 0: GPUs); 0: the rest (outermost only)
    bandwidth: float = 0.0  # bytes/s per GPU per direction at full bisection; 0 on tier 0: nvlink_bandwidth
    oversubscription: float = 1.0  # k of a k:1 taper of the switches that join this tier's blocks
    peers: int = 0  # Tier.peers: direct links per GPU on a switchless tier; 0: a switch
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        prefix = f"tier {self.name}: " if isinstance(self.name, str) else ""
        check_types(self, prefix)
        if not self.name.strip():
            raise SpecError("tier name='' must name the tier (nvlink, leaf, spine …)")
        ranges.check_spec(self, prefix)  # size, bandwidth, latency and oversubscription in their ranges
        low = ranges.RANGES["bandwidth"].low
        if self.bandwidth and self.effective_bandwidth < low:
            raise SpecError(f"{prefix}bandwidth / oversubscription = {self.bandwidth:g} / {self.oversubscription:g} "
                            f"= {self.effective_bandwidth:g} B/s is below {low:g} B/s")

    @property
    def effective_bandwidth(self) -> float:
        """Bytes/s per GPU per direction when every GPU sends across this tier at once (0: tier 0's default)."""
        return self.bandwidth / self.oversubscription


def check_tiers(tiers: tuple[TierSpec, ...], prefix: str = "") -> None:
    """Raise SpecError for a list of tiers that is no mesh: too few or too many, a name twice, "the rest" before the
    outermost, a tier beyond the first without a bandwidth."""
    if not 2 <= len(tiers) <= MAX_TIERS:
        raise SpecError(f"{prefix}tiers has {len(tiers)} tier(s): give 2 to {MAX_TIERS}, innermost (NVLink) first")
    names: set[str] = set()
    for i, tier in enumerate(tiers):
        if not isinstance(tier, TierSpec):
            raise SpecError(f"{prefix}tiers[{i}]={tier!r} must be a table of name, size, bandwidth, latency")
        if tier.name in names:
            raise SpecError(f"{prefix}tiers[{i}]: name={tier.name!r} is given twice (each tier needs its own name)")
        names.add(tier.name)
        if tier.size == 0 and i < len(tiers) - 1:
            raise SpecError(f"{prefix}tier {tier.name}: size='rest' is for the outermost tier only (give its size)")
        if tier.bandwidth == 0 and i > 0:
            raise SpecError(f"{prefix}tier {tier.name}: bandwidth missing (only tier 0 takes the accelerator's "
                            "nvlink_bandwidth when it gives none)")


def largest_divisor(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is at most ``cap`` (≥ 1)."""
    best = 1
    for d in range(1, isqrt(n) + 1):
        if n % d == 0:
            for q in (d, n // d):
                if best < q <= cap:
                    best = q
    return best


def tier_sizes(tiers: tuple[TierSpec, ...], num_gpus: int) -> list[int]:
    """The mesh shape of ``num_gpus`` GPUs on ``tiers`` (the module docstring's rules)."""
    left, sizes, last = num_gpus, [], len(tiers) - 1
    for i, tier in enumerate(tiers):
        if i == last:
            if tier.size and left > tier.size:
                inner = num_gpus // left
                raise SpecError(f"gpus={num_gpus} spreads over {left:,} blocks of {inner:,} GPUs (the largest even "
                                f"split over the inner tiers), more than tier {tier.name}'s size {tier.size:,}")
            size = left
        elif i == 0:
            size = min(tier.size, left)
            if left % size:
                raise SpecError(f"gpus={num_gpus} is not a multiple of the {tier.name} domain size {size} (tier 0)")
        else:
            size = largest_divisor(left, tier.size)
        sizes.append(size)
        left //= size
    return sizes


def build_tiers(tiers: tuple[TierSpec, ...], nvlink_bandwidth: float, num_gpus: int) -> tuple[Tier, ...]:
    """The job's mesh dimensions: each tier at its share of ``num_gpus`` (``tier_sizes``), at its bandwidth over
    its oversubscription (tier 0 without a bandwidth: the accelerator's ``nvlink_bandwidth``)."""
    sizes = tier_sizes(tiers, num_gpus)
    return tuple(Tier(name=t.name, size=n, bandwidth=(t.bandwidth or nvlink_bandwidth) / t.oversubscription,
                      latency=t.latency, peers=t.peers) for t, n in zip(tiers, sizes, strict=True))


def group_bandwidth(tier: Tier, members: Num) -> Num:
    """Bytes/s per GPU per direction that a group with ``members`` GPUs in one block of ``tier`` reaches: the tier's
    bandwidth behind a switch, B · min(members − 1, peers) / peers on a switchless tier (module docstring). More
    members never lower it, nor does a larger B."""
    if not tier.peers:
        return tier.bandwidth
    return tier.bandwidth * minimum(maximum(members - 1, 1), tier.peers) / tier.peers
