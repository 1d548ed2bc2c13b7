"""Where a plan's parallel axes sit on a hierarchical mesh, as the reports name it: the mesh's shape, one column per
tier but the outermost ("in NVLink", "in pod"), the GPUs in one block of each, and the axes whose groups stay inside
one block of a tier and not inside one of the tier before (groups.py places the axes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshplan.estimate import Estimate


def mesh_text(cluster, sep: str) -> str:
    """The mesh shape, innermost first ("8 x 128"), with the tiers' names beyond two ("8 x 256 x 8 (nvlink, pod,
    aggregation)")."""
    shape = sep.join(map(str, cluster.mesh_shape))
    return shape if len(cluster.tiers) <= 2 else f"{shape} ({', '.join(t.name for t in cluster.tiers)})"


def tier_headers(cluster) -> list[str]:
    """One column per mesh tier but the outermost: "in NVLink" for tier 0, "in <name>" for each tier beyond it."""
    return ["in NVLink"] + [f"in {t.name}" for t in cluster.tiers[1:-1]]


def tier_blocks(cluster) -> dict[str, int]:
    """GPUs per block of each ``tier_headers`` column's tier (tier 0: the nominal NVLink domain)."""
    blocks, span = {}, 1
    for header, tier in zip(tier_headers(cluster), cluster.tiers, strict=False):
        span *= tier.size
        blocks[header] = span
    return blocks


def tier_axes(est: Estimate) -> list[str]:
    """For each ``tier_headers`` column, the parallel axes whose groups stay inside one block of that tier and not
    inside one of the tier before (on two tiers: those inside the NVLink domain)."""
    spans = list(tier_blocks(est.cluster).values())
    inside: list[list[str]] = [[] for _ in spans]
    stride = 1
    for axis in est.plan.placement:
        size = getattr(est.plan, axis)
        tier = next((i for i, span in enumerate(spans) if stride * size <= span), None)
        if size > 1 and tier is not None:
            inside[tier].append(f"{axis}={size}")
        stride *= size
    return ["+".join(axes) or "-" for axes in inside]
