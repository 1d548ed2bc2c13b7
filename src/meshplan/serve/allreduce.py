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
all-reduces are megabytes to gigabytes, where the two agree; they keep comm.py. A group beyond the NVLink domain is
priced by comm.py.

Serving engines replace NCCL below a few megabytes on NVLink with their own one-shot / two-shot kernels (a launch, a
flag barrier across the peers, their bytes read and written over NVLink: TensorRT-LLM's customAllReduceKernels.cu,
vLLM's and SGLang's custom all-reduce, up to an 8 MB workspace, 16 MB on two GPUs: TensorRT-LLM
tensorrt_llm/common/customAllReduceUtils.h getMaxRequiredWorkspaceSize). NCCL's tuning model underprices them on
Ampere: an A100 takes 12.6 µs + 2(g − 1)/g · n / 49 GB/s (TensorRT-LLM's two-shot kernel and vLLM's, 512 B to 2 MB
on 2 and 4 GPUs, SGLang PR #2688) where the protocols give 6.4 µs and about 28 µs at 1 MB on 4 GPUs. Where the
GPU's cost is measured (``Accelerator.allreduce_latency``, ``allreduce_bandwidth`` up to ``allreduce_measured``
bytes; the hardware presets cite the timings) an all-reduce of n bytes is priced as the slower of the protocols and
    measured(n) = allreduce_latency + 2(g − 1)/g · n / allreduce_bandwidth
up to the largest size measured, and past it as the protocols plus what the measurement added there (a line fitted
to timings of one or two megabytes says nothing of the two-shot kernel's rate at eight, where NCCL's ring wins).
"""

from __future__ import annotations

import numpy as np

from meshplan.comm import collective_time
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.xp import Num, maximum, minimum, where

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
    assert best is not None  # PROTOCOLS has three
    return best


def custom_kernel(nbytes: Num, group: Num, latency: float, bandwidth: float) -> Num:
    """The engines' one- / two-shot all-reduce at its measured cost (module docstring)."""
    g = np.maximum(np.asarray(group, dtype=float), 2.0)
    return latency + 2 * (g - 1) / g * nbytes / bandwidth


def tp_all_reduce(nbytes: Num, group: Num, layout: Num, cluster: Cluster, eff: Efficiency) -> Num:
    """The tensor-parallel all-reduce (module docstring): the engines' measured kernels or NCCL's protocols inside
    tier 0, comm.py beyond it."""
    tier, acc = cluster.tiers[0], cluster.accelerator
    busbw = tier.bandwidth * eff.link(0)
    inside = ring_protocols(nbytes, group, busbw)
    if acc.allreduce_bandwidth > 0:
        top = acc.allreduce_measured
        measured = custom_kernel(minimum(nbytes, top), group, acc.allreduce_latency, acc.allreduce_bandwidth)
        excess = maximum(measured - ring_protocols(minimum(nbytes, top), group, busbw), 0.0)
        inside = inside + excess
    outside = collective_time("all_reduce", nbytes, group, layout, cluster, eff)
    out = where(np.asarray(group) <= 1, 0.0, where(np.asarray(group) <= tier.size, inside, outside))
    return float(out) if np.ndim(out) == 0 else out
