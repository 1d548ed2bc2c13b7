"""search/placements.py: one placement per distinct tier split of the communicating groups, none lost."""

from __future__ import annotations

import functools
import math
import random

import numpy as np

from meshplan.collectives.comm import split_group
from meshplan.collectives.groups import expert_factors, send_stride
from meshplan.search.placements import PLACEMENTS, distinct_placements
from meshplan.specs.hardware import Cluster, Tier, load_system
from meshplan.specs.plan import DENSE_AXES


@functools.lru_cache
def _mesh(tiers: tuple[int, ...]):
    """A mesh of these tier sizes (two or more): the split of a group depends on the sizes only."""
    return Cluster(name="m", accelerator=load_system("h100").accelerator, num_gpus=math.prod(tiers),
                   tiers=tuple(Tier(name=f"t{i}", size=s, bandwidth=1e9, latency=1e-6) for i, s in enumerate(tiers)))


def _members(tiers: tuple[int, ...], group: int, layout) -> tuple[int, ...]:
    """comm.split_group on the mesh, as integers."""
    return tuple(round(g) for g in split_group(_mesh(tiers), group, layout))


def placement_key(order: tuple[str, ...], sizes: dict[str, int], tiers: tuple[int, ...],
                  experts: tuple[tuple[int, int], ...] = ()) -> tuple:
    """The scalar reference for distinct_placements: everything a placement changes in the cost model, the
    tier split of each collective's group (tp, tp2, cp, the pipeline neighbours, the dp·cp gradient group and,
    for an MoE model's ``experts`` (ep, etp) pairs, the expert-parallel and expert-data-parallel groups;
    groups.axis_layout)."""
    stride, strides = 1, {}
    for axis in order:
        strides[axis] = stride
        stride *= sizes[axis]
    # no sends when pp = 1
    neighbours = _members(tiers, 2, send_stride(strides["pp"], sizes["pp"])) if sizes["pp"] > 1 else ()
    dp_layout = ((sizes["cp"], strides["cp"]), (sizes["dp"], strides["dp"]))
    key = (tuple(_members(tiers, sizes[a], strides[a]) for a in ("tp", "tp2", "cp"))
           + (neighbours, _members(tiers, sizes["dp"] * sizes["cp"], dp_layout)))
    bounds = (strides["pp"], strides["pp"] * sizes["pp"])
    domain = sizes["tp"] * sizes["cp"] * sizes["dp"]
    for ep, etp in experts:
        key += (_members(tiers, ep, expert_factors(ep, etp, *bounds)),
                _members(tiers, domain // (ep * etp), expert_factors(domain // (ep * etp), ep * etp, *bounds)))
    return key


def test_deduplicated_placements_cover_every_distinct_cost():
    """The placements kept are one per distinct tier split of the groups, and no distinct split is lost."""
    def _placements(sizes, tiers):
        return distinct_placements(np.array([[sizes[a] for a in DENSE_AXES]], dtype=np.int64), tiers)[0]

    rng = random.Random(1)
    for tiers in ((8, 512), (4, 64), (72, 16), (8, 4, 32), (2, 2, 2, 64), (4, 6, 32)):  # two, three and four tiers
        for _ in range(150):
            sizes = {a: rng.choice([1, 1, 2, 3, 4, 8, 16]) for a in DENSE_AXES}
            kept = _placements(sizes, tiers)
            keys = [placement_key(PLACEMENTS[i], sizes, tiers) for i in kept]
            assert len(set(keys)) == len(keys)
            assert set(keys) == {placement_key(order, sizes, tiers) for order in PLACEMENTS}


def test_the_expert_groups_split_as_the_dense_key_says():
    """The placement dedupe keys on the dense groups only. That is exact for MoE models too when orders with
    equal dense keys also split every expert-parallel and expert-data-parallel group alike (their layout
    depends on where pp sits: groups.expert_layout): checked here over random sizes, meshes and (ep, etp)."""
    rng = random.Random(5)
    for tiers in ((8, 512), (72, 16), (4, 64), (8, 4, 32)):
        seen: set[tuple] = set()
        for _ in range(150):
            sizes = {a: rng.choice([1, 2, 4, 8, 16]) for a in DENSE_AXES} | {"tp2": 1}
            if tuple(sizes.values()) in seen:  # drawn before on this mesh: the same check again (55 of the 600 draws)
                continue
            seen.add(tuple(sizes.values()))
            domain = sizes["tp"] * sizes["cp"] * sizes["dp"]
            experts = tuple((ep, etp) for ep in (1, 2, 4, 8, 16, 32) for etp in (1, sizes["tp"])
                            if domain % (ep * etp) == 0)
            full: dict[tuple, set] = {}
            for order in PLACEMENTS:
                full.setdefault(placement_key(order, sizes, tiers), set()).add(
                    placement_key(order, sizes, tiers, experts))
            assert all(len(keys) == 1 for keys in full.values()), (tiers, sizes)


def test_a_third_tier_tells_more_placements_apart():
    """dp = tp = pp = 2 on 8 GPUs. On two tiers (2, 4) only the axis placed innermost matters: 3 distinct
    placements (tp, dp or pp on NVLink). On three tiers (2, 2, 2) each axis lands on a tier of its own, and each of
    the 3! = 6 orders splits the groups differently: tp first, then dp, puts tp on tier 0, dp on tier 1 and the
    pipeline's sends (stride s_pp·p/2 = 4·2/2 = 4) on tier 2."""
    sizes = {"tp": 2, "tp2": 1, "cp": 1, "dp": 2, "pp": 2}
    row = np.array([[sizes[a] for a in DENSE_AXES]], dtype=np.int64)
    two, three = (distinct_placements(row, tiers)[0] for tiers in ((2, 4), (2, 2, 2)))
    assert len(two) == 3 and len(three) == 6
    assert {next(a for a in PLACEMENTS[i] if sizes[a] > 1) for i in two} == {"tp", "dp", "pp"}  # on NVLink
    order = ("tp", "dp", "pp", "tp2", "cp")
    assert placement_key(order, sizes, (2, 2, 2)) == (
        (2, 1, 1), (1, 1, 1), (1, 1, 1),  # tp on tier 0; tp2 and cp are 1
        (1, 1, 2),  # pipeline neighbours 4 ranks apart: across tier 2
        (1, 2, 1))  # the dp·cp gradient group on tier 1
