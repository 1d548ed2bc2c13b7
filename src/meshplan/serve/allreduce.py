"""The tensor-parallel all-reduce of a decode or prefill step, inside one NVLink domain, as NCCL's own cost model
prices it: a ring over the g ranks in one of three protocols, each with its latency and its share of the bus bandwidth,
and the fastest of the three (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel and ncclTopoGetAlgoTime):

    time_p = baseLat_p + 2(g − 1)·hwLat_p + n / algbw_p,   algbw_p = busbw_p · g / (2(g − 1))
    LL:     baseLat 3.6 µs, hwLat 0.47 µs per step, busbw / 4 (8-byte stores carrying a 4-byte flag each)
    LL128:  baseLat 10 µs,  hwLat 1.9 µs,           busbw · 0.92 (120 of every 128 bytes are data)
    Simple: baseLat 8.4 µs, hwLat 3.4 µs,           busbw

busbw is the link's bandwidth at the mesh's NCCL efficiency (``Efficiency.link(0)``, as comm.py). Decode's all-reduces
carry B·h·2 bytes, tens of kilobytes to a few megabytes, where the low-latency protocols win and where the plain α-β
ring of comm.py (every step at the Simple latency, the full bus bandwidth from the first byte, and no base latency)
is off by the protocols' fixed costs: 10-40 µs against 20-45 µs per all-reduce at 8 GPUs, twice per layer. Training's
all-reduces are megabytes to gigabytes, where the two agree; they keep comm.py. TensorRT-LLM's and vLLM's custom
one-shot / two-shot kernels replace NCCL below a few megabytes on NVLink with costs of the LL protocol's order (a
launch, a flag barrier, the peers' bytes over NVLink); this model stands for them too. A group beyond the NVLink
domain is priced by comm.py.
"""

from __future__ import annotations

import numpy as np

from meshplan.comm import collective_time
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.xp import Num, minimum, where

# (baseLat µs, hwLat µs per step on NVLink, share of the bus bandwidth): ring all-reduce, NCCL src/graph/tuning.cc
PROTOCOLS = {"LL": (3.6, 0.47, 0.25), "LL128": (10.0, 1.9, 0.92), "Simple": (8.4, 3.4, 1.0)}


def ring_protocols(nbytes: Num, group: Num, busbw: float) -> Num:
    """The fastest protocol's time for an all-reduce of ``nbytes`` over ``group`` ranks at ``busbw`` bytes/s."""
    g = np.maximum(np.asarray(group, dtype=float), 2.0)
    steps = 2 * (g - 1)
    best = None
    for base, hop, share in PROTOCOLS.values():
        time = (base + steps * hop) * 1e-6 + nbytes * steps / g / (busbw * share)
        best = time if best is None else minimum(best, time)
    return best


def tp_all_reduce(nbytes: Num, group: Num, layout: Num, cluster: Cluster, eff: Efficiency) -> Num:
    """The tensor-parallel all-reduce (module docstring): NCCL's protocols inside tier 0, comm.py beyond it."""
    tier = cluster.tiers[0]
    inside = ring_protocols(nbytes, group, tier.bandwidth * eff.link(0))
    outside = collective_time("all_reduce", nbytes, group, layout, cluster, eff)
    out = where(np.asarray(group) <= 1, 0.0, where(np.asarray(group) <= tier.size, inside, outside))
    return float(out) if np.ndim(out) == 0 else out
