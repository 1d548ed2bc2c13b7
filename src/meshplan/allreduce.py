"""The tensor-parallel all-reduce inside one NVLink domain (the collective layer beside comm.py; serving prices its
decode and prefill all-reduces with it), as NCCL's own cost model prices it: a ring over the g ranks in one of three
protocols, each with its latency and its share of the bus bandwidth, and the fastest of the three (NVIDIA/nccl
src/graph/tuning.cc, ncclTopoTuneModel and ncclTopoGetAlgoTime):

    time_p = baseLat_p + 2(g − 1)·hwLat_p + n / algbw_p,   algbw_p = busbw_p · g / (2(g − 1))
    LL:     baseLat 3.6 µs, hwLat 0.47 µs per step, busbw / 4 (8-byte stores carrying a 4-byte flag each)
    LL128:  baseLat 10 µs,  hwLat 1.9 µs,           busbw · 0.92 (120 of every 128 bytes are data)
    Simple: baseLat 8.4 µs, hwLat 3.4 µs,           busbw

busbw is the link's bandwidth at the mesh's NCCL efficiency (``Efficiency.link(0)``, as comm.py). Decode's all-reduces
carry B·h·2 bytes, tens of kilobytes to a few megabytes, where the low-latency protocols win and where the plain α-β
ring of comm.py (every step at the Simple latency, the full bus bandwidth from the first byte, and no base latency)
is off by the protocols' fixed costs: 10-40 µs against 20-45 µs per all-reduce at 8 GPUs, twice per layer. A group
beyond the NVLink domain is priced by comm.py.

Training and serving price their tensor-parallel all-reduces with this one model (``tp_all_reduce``): inside tier 0
NCCL's protocols, beyond it comm.py's α-β ring. Training runs NCCL, never the engines' kernels below (``custom``
False); serving engines run their kernels where the accelerator's cost is measured. Training's all-reduces are
megabytes to gigabytes, where the protocols and comm.py's ring agree; pricing them with the protocols left the
accuracy summary where it was when measured (over the 403 published runs the median error stays 5.52 %, p90 22.0 %,
in-sample median 5.20 -> 5.27 %, out-of-sample 5.71 -> 5.69 %: benchmarks/accuracy.py, November 2026). Inside tier 0
the protocols' latencies are NCCL's constants, not the tier's ``latency`` (which calibrate fits and comm.py prices
beyond tier 0 and for the other collectives).

Serving engines replace NCCL below a few megabytes on NVLink with their own one-shot / two-shot kernels (a launch, a
flag barrier across the peers, their bytes read and written over NVLink: TensorRT-LLM's customAllReduceKernels.cu,
vLLM's and SGLang's custom all-reduce, up to an 8 MB workspace, 16 MB on two GPUs: TensorRT-LLM
tensorrt_llm/common/customAllReduceUtils.h getMaxRequiredWorkspaceSize). NCCL's tuning model underprices them on
Ampere: an A100 takes 12.6 µs + 2(g − 1)/g · n / 49 GB/s (TensorRT-LLM's two-shot kernel and vLLM's, 512 B to 2 MB
on 2 and 4 GPUs, SGLang PR #2688) where the protocols give 6.4 µs and about 28 µs at 1 MB on 4 GPUs. Where the
GPU's cost is measured (``Accelerator.allreduce_latency``, ``allreduce_bandwidth`` up to ``allreduce_measured``
bytes; the hardware presets cite the timings) an all-reduce of n bytes is priced as the slower of the protocols and
    measured(n) = allreduce_latency + 2(g − 1)/g · n / allreduce_bandwidth
up to the largest size measured, and past it as the protocols plus what the measurement added to each there
(``nvlink_all_reduce``; a line fitted to timings of one or two megabytes says nothing of the two-shot kernel's rate
at eight, where NCCL's ring wins).
"""

from __future__ import annotations

from functools import reduce

import numpy as np

from meshplan.comm import split_time
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Accelerator, Cluster
from meshplan.xp import Num, maximum, minimum, where

# (baseLat µs, hwLat µs per step on NVLink, share of the bus bandwidth): ring all-reduce, NCCL src/graph/tuning.cc
PROTOCOLS = {"LL": (3.6, 0.47, 0.25), "LL128": (10.0, 1.9, 0.92), "Simple": (8.4, 3.4, 1.0)}


def protocol_times(nbytes: Num, group: Num, busbw: float) -> list[Num]:
    """Each protocol's time for a ring all-reduce of ``nbytes`` over ``group`` ranks at ``busbw`` bytes/s (LL, LL128,
    Simple: module docstring)."""
    g = np.maximum(np.asarray(group, dtype=float), 2.0)
    steps = 2 * (g - 1)
    return [(base + steps * hop) * 1e-6 + nbytes * steps / g / (busbw * share) for base, hop, share in
            PROTOCOLS.values()]


def ring_protocols(nbytes: Num, group: Num, busbw: float) -> Num:
    """The fastest protocol's time for an all-reduce of ``nbytes`` over ``group`` ranks at ``busbw`` bytes/s."""
    return reduce(minimum, protocol_times(nbytes, group, busbw))


def custom_kernel(nbytes: Num, group: Num, latency: float, bandwidth: float) -> Num:
    """The engines' one- / two-shot all-reduce at its measured cost (module docstring)."""
    g = np.maximum(np.asarray(group, dtype=float), 2.0)
    return latency + 2 * (g - 1) / g * nbytes / bandwidth


def nvlink_all_reduce(nbytes: Num, group: Num, busbw: float, acc: Accelerator, custom: bool = True) -> Num:
    """An all-reduce inside tier 0: the fastest protocol, where the engines' kernel runs (``custom``) and is
    measured (``acc.allreduce_bandwidth`` > 0) at least the measured time, and past the largest size measured (m) each
    protocol plus what the measurement added to it at m:

        min_p [ P_p(n) + max(measured(min(n, m)) − P_p(min(n, m)), 0) ]

    which up to m is max(min_p P_p(n), measured(n)). Each term is taken with its own protocol p, so its excess
    P_p(n) − P_p(m) only shrinks with more bandwidth or less latency, and so does the minimum: more link bandwidth
    never slows it (the excess of the protocol that was best at m, subtracted from another protocol's time at n,
    grew with the bandwidth: megatron-3.6b on H200, tp 4, pp 4, batch 1024 under SGLang had its TPOT go from 4.445
    to 4.482 ms on an NVLink 10 % faster)."""
    times = protocol_times(nbytes, group, busbw)
    if not (custom and acc.allreduce_bandwidth > 0):
        return reduce(minimum, times)
    at = minimum(nbytes, acc.allreduce_measured)
    measured = custom_kernel(at, group, acc.allreduce_latency, acc.allreduce_bandwidth)
    return reduce(minimum, [t + maximum(measured - t_at, 0.0)
                            for t, t_at in zip(times, protocol_times(at, group, busbw), strict=True)])


def tp_all_reduce(nbytes: Num, group: Num, parts: list[Num], cluster: Cluster, eff: Efficiency,
                  custom: bool = True) -> Num:
    """The tensor-parallel all-reduce of training and serving (module docstring) over ``group`` ranks split over the
    tiers as ``parts`` (comm.split_group): inside tier 0 (no part beyond it) NCCL's protocols, with the engines'
    measured kernels where ``custom`` (``nvlink_all_reduce``); comm.py's ring beyond it."""
    tier = cluster.tiers[0]
    inside = nvlink_all_reduce(nbytes, group, tier.bandwidth * eff.link(0), cluster.accelerator, custom)
    outside = split_time("all_reduce", nbytes, group, parts, cluster, eff)
    spans = reduce(lambda a, b: a * b, [np.asarray(p) for p in parts[1:]], np.asarray(1.0))  # ranks beyond tier 0
    out = where(np.asarray(group) <= 1, 0.0, where(spans <= 1, inside, outside))
    return float(out) if np.ndim(out) == 0 else out
