"""Mesh discovery: which ranks share a fast domain, from the bandwidth each pair of ranks measured.

Ranks joined by links much faster than the rest (an NVLink / NVSwitch domain, the GPUs under one PCIe switch)
form a tier. The method is single-linkage clustering on the rank×rank bandwidth matrix cut at its large gaps:
sort the distinct pairwise bandwidths from high to low; wherever two neighbours differ by at least ``gap``×,
keep the pairs at or above the cut as edges and take connected components. A cut is a tier boundary when its
components all have one size s (a mesh needs equal groups) strictly between the previous tier's size and the
world size; cuts that would give unequal groups are skipped, so the answer is always a valid mesh whose
product is the world size (one tier, ``(world,)``, when nothing stands out). Single linkage makes the
partitions nested: each tier's groups are unions of the inner tier's.

Per tier, α and bandwidth are the medians over the pairs whose innermost common group is that tier.
Matrices are made symmetric first ((B + Bᵀ) / 2): a ping-pong measures both directions at once.

meshplan's Cluster (hardware.py) places tier-0 groups on consecutive ranks; ``order`` lists the ranks group by
group, so a machine whose domains are not blocks of consecutive ranks still maps onto the mesh (``contiguous``
says whether it had to be reordered).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from meshplan.calibrate.fit import linear_fit
from meshplan.calibrate.records import PairSample
from meshplan.errors import SpecError


@dataclass(frozen=True, kw_only=True)
class DiscoveredTier:
    """One tier: ``size`` groups of the inner tier per group of this one, with its median link figures."""

    size: int
    bandwidth: float  # bytes/s per direction, median over the tier's pairs
    latency: float  # seconds, median over the tier's pairs
    pairs: int


@dataclass(frozen=True, kw_only=True)
class MeshGuess:
    """The inferred mesh: tier sizes innermost first (product = world size), tier-0 groups, rank order."""

    shape: tuple[int, ...]
    tiers: tuple[DiscoveredTier, ...]
    domains: tuple[tuple[int, ...], ...]
    order: tuple[int, ...]

    @property
    def world_size(self) -> int:
        return len(self.order)

    @property
    def domain_size(self) -> int:
        return self.shape[0]

    @property
    def num_domains(self) -> int:
        return self.world_size // self.shape[0]

    @property
    def contiguous(self) -> bool:
        return self.order == tuple(range(len(self.order)))


def discover_mesh(bandwidth: np.ndarray | list[list[float]], latency: np.ndarray | list[list[float]] | None = None,
                  *, gap: float = 2.0) -> MeshGuess:
    """Tiers of a world from its rank×rank bandwidth matrix (diagonal ignored); see the module docstring."""
    bw = _symmetric(bandwidth, "bandwidth")
    world = bw.shape[0]
    lat = np.zeros_like(bw) if latency is None else _symmetric(latency, "latency")
    if lat.shape != bw.shape:
        raise SpecError(f"latency matrix is {lat.shape[0]}x{lat.shape[1]}, bandwidth matrix {world}x{world}")
    if gap <= 1:
        raise SpecError(f"gap={gap!r} must be greater than 1")
    off = ~np.eye(world, dtype=bool)
    if world > 1 and not np.all(bw[off] > 0):
        raise SpecError(f"bandwidth matrix needs positive off-diagonal entries, got min {bw[off].min()!r}")
    levels: list[np.ndarray] = []  # component label (lowest rank of the component) per rank, innermost first
    size = 1
    values = np.unique(bw[off])[::-1]
    for hi, lo in zip(values[:-1], values[1:], strict=True):
        if hi / lo < gap:
            continue
        labels = _components(bw >= np.sqrt(hi * lo))
        counts = np.unique(labels, return_counts=True)[1]
        s = int(counts[0])
        if np.all(counts == s) and size < s < world and s % size == 0:
            levels.append(labels)
            size = s
    levels.append(np.zeros(world, dtype=int))  # the outermost tier: everyone
    sizes = [int(np.unique(lv, return_counts=True)[1][0]) for lv in levels]
    shape = tuple([sizes[0]] + [b // a for a, b in zip(sizes[:-1], sizes[1:], strict=True)])
    tier_of = np.full((world, world), -1)
    for t in reversed(range(len(levels))):  # innermost common group wins
        same = levels[t][:, None] == levels[t][None, :]
        tier_of[same & off] = t
    tiers = []
    for t, s in enumerate(shape):
        mask = np.triu(tier_of == t, 1)
        if mask.any():
            tiers.append(DiscoveredTier(size=s, bandwidth=float(np.median(bw[mask])),
                                        latency=float(np.median(lat[mask])), pairs=int(mask.sum())))
    order = tuple(sorted(range(world), key=lambda r: (*(int(lv[r]) for lv in reversed(levels)), r)))
    inner = levels[0]
    domains = tuple(tuple(r for r in order if inner[r] == label) for label in dict.fromkeys(inner[list(order)]))
    return MeshGuess(shape=shape, tiers=tuple(tiers), domains=domains, order=order)


def pair_matrices(samples: Iterable[PairSample], world: int) -> tuple[np.ndarray, np.ndarray]:
    """Per pair, fit t = α + n·β over its message sizes (fit.linear_fit): (bandwidth 1/β, latency α) matrices.

    A pair whose fit has no positive slope (latency-bound sizes only) gets its best observed n / t, a lower
    bound. The diagonal is zero.
    """
    series: dict[tuple[int, int], list[PairSample]] = {}
    for s in samples:
        if not (0 <= s.src < world and 0 <= s.dst < world) or s.src == s.dst:
            raise SpecError(f"pair ({s.src}, {s.dst}) is not two distinct ranks of world_size={world}")
        series.setdefault((min(s.src, s.dst), max(s.src, s.dst)), []).append(s)
    bw, lat = np.zeros((world, world)), np.zeros((world, world))
    for (i, j), points in series.items():
        fit = linear_fit([p.nbytes for p in points], [p.seconds for p in points])
        best = max(p.nbytes / p.seconds for p in points)
        bw[i, j] = bw[j, i] = 1.0 / fit.slope if fit.slope > 0 else best
        lat[i, j] = lat[j, i] = max(fit.intercept, 0.0)
    missing = [(i, j) for i in range(world) for j in range(i + 1, world) if (i, j) not in series]
    if missing:
        raise SpecError(f"no measurement for rank pair {missing[0]} (of {len(missing)} missing)")
    return bw, lat


def _symmetric(matrix: np.ndarray | list[list[float]], name: str) -> np.ndarray:
    m = np.asarray(matrix, dtype=float)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] < 1:
        raise SpecError(f"{name} matrix must be square, got shape {m.shape}")
    return (m + m.T) / 2


def _components(adjacency: np.ndarray) -> np.ndarray:
    """Connected components; each rank labelled with the lowest rank of its component."""
    n = adjacency.shape[0]
    labels = np.full(n, -1)
    for start in range(n):
        if labels[start] >= 0:
            continue
        stack = [start]
        labels[start] = start
        while stack:
            node = stack.pop()
            for nxt in np.flatnonzero(adjacency[node]):
                if labels[nxt] < 0:
                    labels[nxt] = start
                    stack.append(int(nxt))
    return labels
