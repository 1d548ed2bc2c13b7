"""NCCL's protocol model of a collective whose group lies inside tier 0 (the NVLink domain): the one formula that
training, serving, the sharding planner and the search price every such all-reduce, all-gather, reduce-scatter,
broadcast and reduce with (comm.split_time calls it; allreduce.py adds the serving engines' own kernels on top).

NCCL prices each call of a collective per algorithm and protocol and runs the fastest (NVIDIA/nccl
src/graph/tuning.cc, ncclTopoTuneModel and ncclTopoGetAlgoTime; the constants of v2.12.12-1, tuning.cc:56-65 and
:111-150, the release allreduce.py has priced the tensor-parallel all-reduce with; v2.30.7-1 keeps Simple's 8.4 µs
and 3.4 µs and LL128's 1.9 µs, and moves LL to 6.6 µs + 0.6 µs per step and LL128's base to 14 µs, tuning.cc:149-160):

    time_p = baseLat_p + steps·hwLat_p + n / algbw_p,      algbw_p = share_p · busbw · g / steps (tuning.cc:135)
    ring steps: all-reduce 2(g − 1), all-gather / reduce-scatter g − 1, broadcast / reduce g (tuning.cc's nsteps)
    LL:     baseLat 3.6 µs, hwLat 0.47 µs per step, busbw / 4 for all-reduce and reduce, busbw / 3 for all-gather,
            reduce-scatter and broadcast on one node (8-byte stores carrying a 4-byte flag each)
    LL128:  baseLat 10 µs,  hwLat 1.9 µs,           busbw · 0.92 (120 of every 128 bytes are data)
    Simple: baseLat 8.4 µs, hwLat 3.4 µs,           busbw

and the collective takes min_p time_p. n / algbw_p = share_p⁻¹ · (steps / g) · n / busbw: steps / g is comm.py's
bus factor (2(g − 1)/g, (g − 1)/g, 1), so at large messages every protocol tends to the α-β ring's bandwidth term
and Simple, the one at the full bus bandwidth, wins (its fixed cost, 8.4 + 14 × 3.4 = 56 µs at 8 ranks, is under
1 % of a 1.75 × 1 GB / 360 GB/s all-reduce). busbw is tier 0's bandwidth at the mesh's NCCL efficiency
(``Efficiency.link(0)``, as comm.py).

What is left out, each a choice of NCCL's topology search rather than a number: the broadcast / reduce chain is
charged g steps at the ring's hwLat (NCCL charges one step when all its channels share one ring order and g steps
at the tree's Simple chunk latency otherwise, a placeholder "waiting for proper chunk modeling"); LL's and LL128's
per-channel caps (llMaxBw, 20 GB/s per channel), which bind only where those protocols have lost to Simple; NCCL's
tree inside one node (a chain of the g ranks, 2(g − 1) steps at up to 0.92 · 7/9 of the bus bandwidth) and NVLS
(NVLink SHARP, Hopper and later), whose single-node costs this model does not cite. Send / receive and the
all-to-all built from them have no entry in NCCL's tuner and keep comm.py's α per step.

A calibrated tier 0. ``meshplan calibrate`` fits t = steps·α + f·n / busbw to the collectives it times inside
mesh dimension 0 (calibrate/fit.py: no base latency there) and writes ``nccl_protocols = false`` beside the α it
fitted (calibrate/system.py). Such a cluster (``Cluster.nccl_protocols`` false) prices its tier-0 collectives with
one protocol whose base latency is 0, whose hwLat is the tier's calibrated ``latency`` and whose share is 1: the
line calibrate fitted, so the measured per-step latency is what the estimate pays, not NCCL's constants. A preset's
tier-0 ``latency`` (not measured) prices only tier 0's sends and all-to-alls, and each hop of a ring beyond it.

RCCL. AMD's GPUs run RCCL, which prices its collectives with its own tuner (ROCm/rccl src/graph/tuning.cc, the same
formula with its own constants) and runs what that tuner picks. For an 8-GPU MI300X node (gfx942, seven xGMI links a
GPU: three of the four such platforms of rome_models.cc take tuning=5, the fourth the default model, with the same LL
latencies) ROCm/rccl#1047 ("adding rccl tuning parameters for MI300X gfx942 with 8 GPUs single and multi-node",
January 2024) set tuning_model_5: the ring's base latency 12 µs for LL and 17 µs for Simple (tuning.cc baseLat, the
same for every RCCL platform), 0.8 µs per step over xGMI for LL and 2.1 µs for Simple (hwLat[NVLINK][RING]), LL at
0.08 of the bus bandwidth and LL128 off (bwRatio[0], one or two nodes, 0 for LL128). ``ARCH_LIBRARIES`` says which
architectures run RCCL with which table (``TUNERS``); the rest run NCCL's. Left out: RCCL's 1.65 times LL's bandwidth
for a broadcast or reduce on gfx94x, and the MSCCL all-pairs kernels that replace the ring for 8-rank all-reduces
where a platform enables them (RCCL tools/msccl-algorithms; rome_models.cc enables them on one MI300X platform,
without NICs).
"""

from __future__ import annotations

from functools import reduce

from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.mesh import group_bandwidth
from meshplan.xp import Num, minimum

# (baseLat s, hwLat s per step on NVLink, share of the bus bandwidth) of NCCL's ring: v2.12.12-1 src/graph/tuning.cc
# baseLat[RING] (line 56), hwLat[NVLINK][RING] (line 65), the busBw refinements for LL and LL128 (lines 127-128)
PROTOCOLS = {"LL": (3.6e-6, 0.47e-6, 0.25), "LL128": (10.0e-6, 1.9e-6, 0.92), "Simple": (8.4e-6, 3.4e-6, 1.0)}
# RCCL's ring on an 8-GPU MI300X node (ROCm/rccl src/graph/tuning.cc @ 0cbce2a7, October 2024: baseLat[RING] at
# lines 57-58, tuning_model_5's hwLat[NVLINK][RING] and bwRatio[0][RING] at lines 227 and 236; module docstring)
RCCL_GFX942 = {"LL": (12.0e-6, 0.8e-6, 0.08), "Simple": (17.0e-6, 2.1e-6, 1.0)}
TUNERS = {"nccl": PROTOCOLS, "rccl-gfx942": RCCL_GFX942}  # each library's ring protocols as its own tuner prices them
ARCH_LIBRARIES = {"cdna3": "rccl-gfx942"}  # Accelerator.architecture -> its collectives tuner; NCCL's otherwise
LL_ONE_NODE = 1 / 3  # LL's share for the all-gather, reduce-scatter and broadcast on one node (tuning.cc:127)
NCCL_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")  # what NCCL's tuner prices


def nccl_steps(kind: str, group: Num) -> Num:
    """The ring's steps of a ``kind`` over ``group`` ranks in NCCL's tuner (tuning.cc, nsteps)."""
    if kind == "all_reduce":
        return 2 * (group - 1)
    if kind in ("all_gather", "reduce_scatter"):
        return group - 1
    if kind in ("broadcast", "reduce"):
        return group
    raise ValueError(f"NCCL's tuner does not price {kind!r}")


def library(architecture: str) -> str:
    """The tuner (``TUNERS``) of the collective library an architecture's GPUs run: ``ARCH_LIBRARIES``, else NCCL's."""
    return ARCH_LIBRARIES.get(architecture, "nccl")


def protocol_table(kind: str, latency: float | None = None, tuner: str = "nccl") -> list[tuple[float, float, float]]:
    """(baseLat s, hwLat s per step, bandwidth share) of each protocol a ``kind`` inside tier 0 may run: those of the
    library's ``tuner`` (NCCL's three), or with ``latency`` (a calibrated tier 0, module docstring) one line at that
    α per step."""
    if latency is not None:
        return [(0.0, latency, 1.0)]
    table = list(TUNERS[tuner].values())
    if tuner == "nccl" and kind in ("all_gather", "reduce_scatter", "broadcast"):
        base, hop, _ = table[0]
        table[0] = (base, hop, LL_ONE_NODE)
    return table


def protocol_times(kind: str, nbytes: Num, group: Num, busbw: Num, latency: float | None = None,
                   tuner: str = "nccl") -> list[Num]:
    """Each protocol's seconds for a ``kind`` of ``nbytes`` over ``group`` ranks inside tier 0 at ``busbw`` bytes/s
    (``protocol_table``; 0 for a group of one)."""
    table = protocol_table(kind, latency, tuner)
    if type(group) in (int, float) and group <= 1:
        return [0.0 for _ in table]
    steps = nccl_steps(kind, group)
    times = [base + steps * hop + nbytes * steps / group / (busbw * share) for base, hop, share in table]
    if type(group) in (int, float):
        return times
    return [t * (group > 1) for t in times]


def nccl_time(kind: str, nbytes: Num, group: Num, busbw: Num, latency: float | None = None,
              tuner: str = "nccl") -> Num:
    """The fastest protocol's seconds (``protocol_times``)."""
    return reduce(minimum, protocol_times(kind, nbytes, group, busbw, latency, tuner))


def tier0_latency(cluster: Cluster) -> float | None:
    """The per-step latency that replaces NCCL's protocols inside tier 0: the calibrated one, or None (NCCL's)."""
    return None if cluster.nccl_protocols else cluster.tiers[0].latency


def tier0_busbw(cluster: Cluster, group: Num, eff: Efficiency) -> Num:
    """The bus bandwidth a ``group`` inside ``cluster``'s tier 0 runs at: the links it drives (mesh.group_bandwidth)
    at the mesh's NCCL efficiency."""
    return group_bandwidth(cluster.tiers[0], group) * eff.link(0)


def tier0_time(kind: str, nbytes: Num, group: Num, cluster: Cluster, eff: Efficiency) -> Num:
    """Seconds of a ``kind`` (NCCL_KINDS) whose ``group`` lies inside ``cluster``'s tier 0 (module docstring); an
    all-reduce of a group the cluster's measured table holds at its measurement (specs/allreduce_table.py)."""
    priced = nccl_time(kind, nbytes, group, tier0_busbw(cluster, group, eff), tier0_latency(cluster),
                       library(cluster.accelerator.architecture))
    if kind != "all_reduce" or cluster.allreduce_table is None:
        return priced
    from meshplan.specs.allreduce_table import measured_all_reduce  # only a cluster with rows (tests/test_startup.py)
    return measured_all_reduce(cluster.allreduce_table, nbytes, group, priced)
