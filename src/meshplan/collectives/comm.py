"""Collectives on a hierarchical mesh under the α-β model.

Symbols: g group size, n message bytes (the full buffer: the all-reduce input, the all-gather *output*, the
reduce-scatter *input*, the bytes one rank sends in an all-to-all), α latency per step, B bandwidth per GPU
per direction, g_i the part of the group inside tier i.

Single tier (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication operations in
MPICH"; Chan et al. 2007; NCCL's ring and double-binary-tree algorithms):
    ring all-reduce       2(g-1)·α + 2(g-1)/g · n/B
    tree all-reduce       2⌈log2 g⌉·α + 2 · n/B            (pipelined double binary tree; NCCL picks the faster)
    reduce-scatter / all-gather   (g-1)·α + (g-1)/g · n/B
    all-to-all            (g-1)·α + (g-1)/g · n/B
    broadcast / reduce    (g-1)·α + n/B                    (pipelined chain; across tiers NCCL's ring)
    p2p                   α + n/B

Hierarchical (the group spans tiers 0..T): reduce-scatter inside each tier from the innermost outwards, each
tier working on what the inner tiers left (n / Π_{j<i} g_j), then all-gather back; this is how NCCL's
NVLS/tree and Megatron's hierarchical schemes use the NVLink domain, and it is seed 003's observation that the
effective scale-out bandwidth grows with the NICs per NVLink domain (each of the g_0 GPUs drives its own NIC).
An all-gather, reduce-scatter, broadcast or reduce moves its bytes that way too (NCCL's ring channels each leave a
node through a different NIC), but on one ring over all g ranks: its latency is that ring's g-1 hops, each at the
outermost tier's it crosses (``ring_hops``; NCCL src/graph/tuning.cc), not Σ_i (g_i-1)·α_i.

NCCL's base latency (``base_latency``): NCCL prices every call of a collective its tuner models as baseLat + steps ×
hwLat + bytes / algbw (src/graph/tuning.cc, ncclTopoTuneModel and ncclTopoGetAlgoTime); the tiers' ``latency`` is the
per-step hwLat, and a group that leaves tier 0 (an all-reduce, all-gather, reduce-scatter, broadcast or reduce across
nodes) pays the Simple protocol's base latency, 8.4 µs, once per call: an 8-byte all-reduce over 2 × 8 A100s reads
18 + 2 × 5 + 8.4 = 36.4 µs on the a100 preset, 36.5 µs measured (RoCE, oci-hpc-oke; hardware/h100.toml),
28 µs without it. A group inside tier 0 is priced by NCCL's protocol model itself (protocols.py: the fastest of LL,
LL128 and Simple, each with its base latency, hwLat per step and share of the bus bandwidth; an 8-byte all-reduce
over 8 H100s: LL's 3.6 + 14 × 0.47 = 10.2 µs, 13.67 µs measured, where the α-β tree at the preset's 3 µs per step
read 18 µs), or, on a tier 0 that `meshplan calibrate` measured, by the line it fitted there (steps × its α + bytes /
busbw). NCCL's tuner does not price send / receive or the all-to-all built from them (no p2p entry in tuning.cc,
v2.12.12-1 to v2.30.7-1): those keep their per-step α only, inside tier 0 as beyond it.

Bus bandwidth vs algorithm bandwidth (NCCL ``PERFORMANCE.md``): algbw = n / t; busbw = algbw · factor with
factor 2(g-1)/g for all-reduce, (g-1)/g for all-gather / reduce-scatter / all-to-all, 1 for broadcast / reduce /
p2p. Link bandwidths in meshplan are bus bandwidths (what the link sustains), so t = factor · n / busbw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from meshplan.collectives.protocols import NCCL_KINDS, PROTOCOLS, tier0_time
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.mesh import group_bandwidth
from meshplan.xp import Num, ceil_log2, maximum, minimum, where

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "p2p")


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective of an op: kind, bytes (see the module glossary), the plan axis and its group size."""

    kind: str
    nbytes: Num
    axis: str  # tp | cp | ep | etp | dp | edp | pp | tp_in | tp_out
    group: Num
    # a MoE dispatch or combine (all_to_all) forwarded through each node, once per node a token hits, where the routed
    # experts E > 0 (DeepEP's normal kernels: dispatch.py); ``copies``: each token's k copies in ``nbytes``
    copies: int = 1
    experts: Num = 0.0
    backend: str = "deepep"  # the forwarding kernels, each priced at its own measured rate (Stack.flex_backend)
    routing: str = "uniform"  # how the router spreads a token's k experts (Stack.moe_routing; dispatch.node_hit)


@overload
def bus_factor(kind: str, group: float) -> float: ...
@overload
def bus_factor(kind: str, group: Num) -> Num: ...
def bus_factor(kind: str, group: Num) -> Num:
    """busbw / algbw for a collective of ``group`` ranks (NCCL PERFORMANCE.md)."""
    if kind == "all_reduce":
        return 2.0 * (group - 1) / group
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (group - 1) / group
    return 1.0


def latency_steps(kind: str, group: int) -> int:
    """Latency steps a ring collective of ``group`` ranks is charged here (its α multiplier; calibrate fits α
    per step with it)."""
    if kind == "all_reduce":
        return 2 * (group - 1)
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return group - 1
    return 1


def tier_members(group: Num, stride: Num, span: int) -> Num:
    """Members of a group (``group`` ranks ``stride`` apart) that the worst-placed group has inside one block of
    ``span`` consecutive ranks: gcd(group·stride, span) / stride, at least 1 and at most ``group``.

    Groups are laid out at multiples of their extent e = group·stride and blocks at multiples of ``span``, so a
    block boundary falls inside a group at offsets that are multiples of gcd(e, span). When e divides the span
    every group sits inside one block (gcd = e: all members); when the span divides the stride every member is
    in a block of its own (1). Otherwise some group straddles a boundary, and the collective, which all groups
    run in step, is paced by it: tensor parallelism of 16 on 72-GPU NVLink racks puts ranks 64–79 in two racks,
    8 + 8 (gcd(16, 72) = 8), not 16 on NVLink. A pipeline send's fractional stride s·p/2 (``send_stride``) has
    the integral extent s·p.
    """
    extent: Num = group * stride
    if isinstance(extent, np.ndarray):
        if extent.dtype.kind == "f":
            extent = np.rint(extent).astype(np.int64)
        # span = 2^k: gcd(e, 2^k) is e's lowest set bit, at most 2^k (five times np.gcd's speed)
        power_of_two = span & (span - 1) == 0
        common = np.minimum(extent & -extent, span) if power_of_two else np.gcd(extent, span)
        shared: Num = np.floor_divide(common, stride)
    else:
        shared = math.gcd(round(extent), span) // stride
    return minimum(group, maximum(1, shared))


Layout = Num | tuple[tuple[Num, Num], ...]  # a stride, or the (members, stride) factors of a group not evenly strided


def block_members(group: Num, layout: Layout, span: int) -> Num:
    """``tier_members`` of a group given as one stride, or as factors ((g_1, s_1), (g_2, s_2), …) whose
    product is the group (the dp·cp gradient group when dp and cp are not adjacent in the placement; an expert
    group that steps over the pipeline axis): each factor's members in a block, multiplied. A factor whose
    extent is within the block counts whole, one whose stride exceeds it counts 1, so nested factors multiply
    to the members of the union."""
    if not isinstance(layout, tuple):
        return tier_members(group, layout, span)
    members: Num = 1
    for g, stride in layout:
        members = members * tier_members(g, stride, span)
    return members


# split_group's answers for one plan's groups (Python numbers: a stride, or strided factors), by the cluster's identity
# (held here, so that its id is not reused) and the numbers' values (each answer a list of Python floats, the same
# for 2 as for 2.0): the refinements and the estimates of a search's winners split the same groups again and again
# (the 8-count strong-scaling plan: 5,693 calls, 153 distinct)
_SPLITS: dict[tuple[int, Num, Layout], tuple[Cluster, tuple[Num, ...]]] = {}
_SPLITS_KEPT = 4096


def split_group(cluster: Cluster, group: Num, layout: Layout) -> list[Num]:
    """How many members of a group (``group`` ranks laid out as ``layout``: a stride, or strided factors)
    share each tier: [g_0, g_1, …].

    A tier-i block spans Π_{j≤i} n_j consecutive ranks and holds ``block_members`` of the worst-placed group;
    g_i is that count divided by the inner tiers' count. The product of the g_i is ``group``.
    """
    if type(group) not in _PLAIN or not _plain(layout):  # arrays (a search's)
        return _split(cluster, group, layout)
    key = (id(cluster), group, layout)
    kept = _SPLITS.get(key)
    if kept is None or kept[0] is not cluster:
        if len(_SPLITS) >= _SPLITS_KEPT:
            _SPLITS.clear()
        kept = _SPLITS[key] = (cluster, tuple(_split(cluster, group, layout)))
    return list(kept[1])


_PLAIN = (int, float)


def _plain(layout: Layout) -> bool:
    """A stride, or factors, of Python numbers only (whose answers ``_SPLITS`` may keep)."""
    if type(layout) in _PLAIN:
        return True
    return type(layout) is tuple and all(type(g) in _PLAIN and type(s) in _PLAIN for g, s in layout)


def _split(cluster: Cluster, group: Num, layout: Layout) -> list[Num]:
    """``split_group`` computed."""
    parts: list[Num] = []
    inner: Num = 1
    span = 1
    for i, tier in enumerate(cluster.tiers):
        span = span * tier.size
        last = i == len(cluster.tiers) - 1
        members = group if last else block_members(group, layout, span)
        parts.append(members / inner)
        inner = members
    return parts


def split_time(kind: str, nbytes: Num, group: Num, parts: list[Num], cluster: Cluster,
               eff: Efficiency = DEFAULT) -> Num:
    """Seconds for one collective over ``group`` ranks split over the tiers as ``parts`` (``split_group``), under
    NCCL's algorithms (the module docstring); zero for a group of one. Engines price collectives through the one
    dispatcher, price.py, which picks this or another model."""
    if kind in NCCL_KINDS:  # inside tier 0 NCCL's protocols (protocols.py), beyond it the hierarchical α-β model
        inside = _beyond(parts) <= 1
        if isinstance(inside, np.ndarray) and inside.all() != inside.any():  # some plans' groups inside, some not
            return where(inside, _tier0(kind, nbytes, group, parts, cluster, eff),
                         _alpha_beta(kind, nbytes, group, parts, cluster, eff))
        if inside.all() if isinstance(inside, np.ndarray) else inside:
            return _tier0(kind, nbytes, group, parts, cluster, eff)
    return _alpha_beta(kind, nbytes, group, parts, cluster, eff)


ONE_HOST = 8  # GPUs of one HGX board, the ring NCCL's tuning.cc constants price inside a node (protocols.py)


def _tier0(kind: str, nbytes: Num, group: Num, parts: list[Num], cluster: Cluster, eff: Efficiency) -> Num:
    """A group inside tier 0: NCCL's protocols on its ring (protocols.py); a group of more than one host's GPUs in a
    multi-node NVLink domain (NVL72) the faster of that and the α-β model's ring or double-binary tree (NCCL runs
    its tree or NVLS there, whose ring's 2(g − 1) steps would otherwise price 142 hops at g = 72), so a group
    moved into a larger NVLink domain is never priced above the α-β model it left."""
    ring = tier0_time(kind, nbytes, group, cluster, eff)
    big = np.asarray(group) > ONE_HOST
    if not big.any():
        return ring
    return where(big, minimum(ring, _alpha_beta(kind, nbytes, group, parts, cluster, eff)), ring)


def tier_bandwidths(parts: Sequence[Num], cluster: Cluster, eff: Efficiency) -> list[Num]:
    """The bus bandwidth per GPU of each tier for a group split over them as ``parts`` (``split_group``): the tier's
    bandwidth for that many members (``group_bandwidth``) at NCCL's share of it (``Efficiency.link``)."""
    return [group_bandwidth(t, g) * eff.link(i) for i, (t, g) in enumerate(zip(cluster.tiers, parts, strict=True))]


def _alpha_beta(kind: str, nbytes: Num, group: Num, parts: list[Num], cluster: Cluster, eff: Efficiency) -> Num:
    """``split_time`` under the α-β model (the module docstring's formulas)."""
    bandwidths = tier_bandwidths(parts, cluster, eff)
    latencies = [t.latency for t in cluster.tiers]
    if kind == "all_reduce":
        return _all_reduce(nbytes, parts, bandwidths, latencies) + base_latency(kind, parts)
    if kind in ("all_gather", "reduce_scatter"):
        return _scatter_gather(nbytes, parts, bandwidths, latencies) + base_latency(kind, parts)
    if kind == "all_to_all":
        return _all_to_all(nbytes, group, parts, bandwidths, latencies)
    if kind in ("broadcast", "reduce"):
        return _scatter_gather(nbytes, parts, bandwidths, latencies, whole=True) + base_latency(kind, parts)
    if kind == "p2p":
        return _chain(nbytes, parts, bandwidths, latencies) * (group > 1)
    raise ValueError(f"unknown collective {kind!r}")


# NCCL's base latency per call of a ring collective (ncclTopoTuneModel: latency = baseLat + steps × hwLat), the Simple
# protocol's, which carries the bandwidth-bound messages comm.py prices: 8.4 µs in every release from v2.12.12-1
# (NVIDIA/nccl src/graph/tuning.cc:56, ring) to v2.30.7-1 (tuning.cc:149-151, ring and tree). Charged where a group
# leaves tier 0 (module docstring)
SIMPLE_BASE = PROTOCOLS["Simple"][0]
BASE_LATENCY_KINDS = NCCL_KINDS  # what NCCL's tuner prices


def _beyond(parts: Sequence[Num]) -> Num:
    """Π_{i≥1} g_i: the blocks of tier 0 a group split as ``parts`` spans (1: it lies inside tier 0)."""
    spans: Num = 1.0
    for p in parts[1:]:
        spans = spans * p
    return spans


def base_latency(kind: str, parts: Sequence[Num]) -> Num:
    """NCCL's base latency of one ``kind`` call over a group split over the tiers as ``parts``: ``SIMPLE_BASE`` when
    the group leaves tier 0 and NCCL's tuner prices the kind (``BASE_LATENCY_KINDS``), else 0."""
    if kind not in BASE_LATENCY_KINDS:
        return 0.0
    spans = _beyond(parts)
    if isinstance(spans, np.ndarray):
        return np.where(spans > 1, SIMPLE_BASE, 0.0)
    return SIMPLE_BASE if spans > 1 else 0.0


def ring_hops(parts: Sequence[Num]) -> list[Num]:
    """The g-1 hops of a ring over a group that spans tiers, by the outermost tier each hop crosses: the ring
    visits the g_0 members of a tier-0 block in turn, so only Π_{j≥i} g_j - Π_{j>i} g_j of its hops leave a
    tier-i block (NCCL src/graph/tuning.cc, ring latency: (nsteps - nInterSteps)·intraLat + nInterSteps·interLat
    with nInterSteps = nNodes - 1 for an all-gather or reduce-scatter)."""
    outer: list[Num] = [1.0] * (len(parts) + 1)
    for i in range(len(parts) - 1, -1, -1):
        outer[i] = outer[i + 1] * parts[i]
    return [outer[i] - outer[i + 1] for i in range(len(parts))]


def _scatter_gather(n: Num, parts: Sequence[Num], bw: Sequence[Num], lat: Sequence[float], whole: bool = False) -> Num:
    """Σ_i h_i·α_i + (g_i-1)/g_i · n_i / B_i, with n_i = n / Π_{j<i} g_j and h_i the ring's hops across tier i
    (``ring_hops``): NCCL runs these as one ring over all g ranks, whose channels each leave a node through a
    different NIC, so the bytes split by tier as in the hierarchical scheme but every member is a latency step.
    ``whole``: every tier that has more than one member carries all of n_i (bus factor 1: NCCL's ring broadcast and
    reduce, a pipelined chain around the same ring)."""
    total: Num = 0.0
    remaining = n
    for g, b, a, h in zip(parts, bw, lat, ring_hops(parts), strict=True):
        total = total + h * a + ((g > 1) if whole else (g - 1) / g) * remaining / b
        remaining = remaining / g
    return total


def _all_reduce(n: Num, parts: Sequence[Num], bw: Sequence[Num], lat: Sequence[float]) -> Num:
    """Per tier the faster of ring (2× scatter-gather) and tree; tiers compose hierarchically."""
    total: Num = 0.0
    remaining = n
    for g, b, a in zip(parts, bw, lat, strict=True):
        ring = 2 * ((g - 1) * a + (g - 1) / g * remaining / b)
        tree = (2 * ceil_log2(g) * a + 2 * remaining / b) * (g > 1)
        total = total + minimum(ring, tree)
        remaining = remaining / g
    return total


def _all_to_all(n: Num, group: Num, parts: Sequence[Num], bw: Sequence[Num], lat: Sequence[float]) -> Num:
    """Traffic to peers beyond tier i-1 leaves through tier i; the tiers run concurrently (max)."""
    slowest: Num = 0.0
    latency: Num = 0.0
    inner: Num = 1
    for g, b, a in zip(parts, bw, lat, strict=True):
        outer = inner * g
        slowest = maximum(slowest, n * (outer - inner) / group / b)
        latency = latency + (g - 1) * a
        inner = outer
    return latency + slowest


def _chain(n: Num, parts: Sequence[Num], bw: Sequence[Num], lat: Sequence[float]) -> Num:
    """A pipelined chain runs at the slowest tier it crosses."""
    latency: Num = 0.0
    slowest: Num = 0.0
    for g, b, a in zip(parts, bw, lat, strict=True):
        latency = latency + (g - 1) * a
        slowest = maximum(slowest, (g > 1) * n / b)
    return latency + slowest


def all_reduce_traffic(nbytes: Num, group: Num, algorithm: str = "ring") -> Num:
    """Bytes one rank moves (sent + received) in an all-reduce of ``nbytes``.

    ``ring``: reduce-scatter + all-gather, each rank sends and receives 2(g-1)/g · n, i.e. 4(g-1)/g · n moved;
    ``multicast``: seed 001's bandwidth-optimal pattern: send g-1 parts of n/g, receive g-1 copies of one's
    own part, reduce, multicast the result (free), receive g-1 reduced parts: 3(g-1)/g · n.
    """
    if algorithm == "ring":
        return 4 * (group - 1) / group * nbytes
    if algorithm == "multicast":
        return 3 * (group - 1) / group * nbytes
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r}")


# Minimum-spanning-tree (binomial-tree) collectives, seed 004's "MST algorithm for small messages": each node talks
# to one other at a time, so a broadcast reaches g ranks in ⌈log2 g⌉ rounds of the whole message (Chan, Heimlich,
# Purkayastha & van de Geijn 2007, "Collective communication: theory, practice, and experience", §5.1 Table 2;
# Thakur, Rabenseifner & Gropp 2005, §4.1 (binomial-tree broadcast for short messages, MPICH), §4.4 (binomial reduce)):
#     broadcast / reduce                   ⌈log2 g⌉·(α + n/B)
#     scatter / gather                     ⌈log2 g⌉·α + (g-1)/g · n/B          (halving the data each round)
#     all-gather = gather + broadcast      2⌈log2 g⌉·α + (g-1)/g · n/B + ⌈log2 g⌉ · n/B
#     reduce-scatter = reduce + scatter    2⌈log2 g⌉·α + ⌈log2 g⌉ · n/B + (g-1)/g · n/B
#     all-reduce = reduce + broadcast      2⌈log2 g⌉·(α + n/B)
# (the reduction arithmetic γ of Chan et al. is below this model's resolution, as in the ring formulas above). Over a
# group that spans tiers the tree runs on each tier in turn, innermost first, on the whole message (a reduction or a
# broadcast does not shrink it), so the rounds of tier i cost its α_i and B_i; gathers move the bytes of the ranks
# inside tier i at once. MPICH picks, per message, the faster of the tree and the bandwidth-optimal algorithm
# (Thakur et al. 2005 §4: binomial tree below 12 KB or under 8 ranks): ``fastest_time``.
MST_KINDS = ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")


def mst_time(kind: str, nbytes: Num, parts: Sequence[Num], cluster: Cluster, eff: Efficiency = DEFAULT) -> Num:
    """Seconds of the minimum-spanning-tree ``kind`` (MST_KINDS) of ``nbytes`` over a group split over the tiers as
    ``parts`` (``split_group``); infinity for a kind the tree does not serve (all-to-all, p2p)."""
    if kind not in MST_KINDS:
        return math.inf
    total: Num = 0.0
    inner: Num = 1
    whole: Num = 1
    for g in parts:
        whole = whole * g
    for i, (g, tier) in enumerate(zip(parts, cluster.tiers, strict=True)):
        rounds, step = ceil_log2(g), nbytes / (group_bandwidth(tier, g) * eff.link(i))
        outer = inner * g
        spread = (outer - inner) / whole * step  # scatter / gather: the shares of the ranks beyond tier i-1's block
        if kind in ("broadcast", "reduce"):
            total = total + rounds * (tier.latency + step)
        elif kind == "all_reduce":
            total = total + 2 * rounds * (tier.latency + step)
        else:
            total = total + 2 * rounds * tier.latency + rounds * step + spread
        inner = outer
    return total


def fastest_time(kind: str, nbytes: Num, group: Num, parts: list[Num], cluster: Cluster,
                 eff: Efficiency = DEFAULT) -> Num:
    """MPICH's per-message choice (Thakur et al. 2005 §4): the faster of the α-β model's algorithm (ring, double
    binary tree, chain: ``split_time`` without NCCL's protocols inside tier 0, which are NCCL's, not MPICH's) and the
    minimum spanning tree (``mst_time``); zero for a group of one."""
    return minimum(_alpha_beta(kind, nbytes, group, parts, cluster, eff), mst_time(kind, nbytes, parts, cluster, eff))
