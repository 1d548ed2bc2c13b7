"""The tensor-parallel all-reduce of training and serving (the collective layer beside comm.py): inside one NVLink
domain NCCL's protocol model (protocols.py, the one that prices every NCCL collective inside tier 0: the fastest of
LL, LL128 and Simple, each baseLat + 2(g − 1)·hwLat + n / algbw), with the serving engines' own kernels on top
where their cost is measured; beyond tier 0 comm.py's hierarchical ring. Decode's all-reduces carry B·h·2 bytes,
tens of kilobytes to a few megabytes, where the low-latency protocols win: 10-40 µs against 20-45 µs for a plain α-β
ring at 8 GPUs, twice per layer.

Training runs NCCL, never the engines' kernels below, and its tensor-parallel all-reduce is comm.split_time's like any
other all-reduce on the same ranks (price.py, the one dispatcher: an NVL72 group of more than 8 GPUs the faster of
NCCL's ring protocols and the α-β tree, as the data-parallel channel and the sharding planner price it); serving
engines run their kernels where the accelerator's cost is measured, and then price.py calls ``tp_all_reduce``. On a
calibrated tier 0 (``Cluster.nccl_protocols`` false) the protocols are the line calibrate fitted there
(protocols.py).

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

Left out, each for want of a measurement of its own (issue 79; benchmarks/measure/serving_residuals.py prints what the
runs leave out per all-reduce). The H100 line is SGLang's kernel, which copies its input inside the kernel. vLLM's own
kernel, out of a captured graph, first copies the input into its registered buffer with a cudaMemcpyAsync
(vllm-project/vllm csrc/custom_all_reduce.cu all_reduce_unreg); inside a graph it all-reduces the graph's registered
buffers without that copy (register_graph_buffers). SGLang PR #2904 times vLLM's eager path at 8.5-11.8 µs up to 32 KB
on 2-8 H100s, where SGLang's takes 3.7-7.8 µs; vLLM's in-graph path is not timed there. The eager difference would add
~4 µs a call to vLLM's prompt iterations and uncaptured batches only, nothing to its captured decode steps. TurboMind
v0.1 (LMDeploy) creates the custom all-reduce communicator but never hands it to LlamaV2 (InternLM/lmdeploy
src/turbomind/triton_backend/llama/LlamaTritonModel.cc @ 02ab71bd, createSharedModelInstance), whose layers all-reduce
with ftNcclAllReduceSum (src/turbomind/models/llama/LlamaContextAttentionLayer.cc). NCCL's tuning model prices a small
eager all-reduce below what nccl-tests times: LL's 4.5 µs on 2 GPUs against 10.1 µs measured for 32 bytes on 2
A100-SXM4s (NVIDIA/nccl#583, 2021). The engines' A100 line (12.6 µs) stands in for it until NCCL's own small-message
cost is measured per GPU.
"""

from __future__ import annotations

from functools import reduce

import numpy as np

from meshplan.collectives.comm import split_time
from meshplan.collectives.protocols import library, protocol_times, tier0_busbw, tier0_latency
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Accelerator, Cluster
from meshplan.xp import Num, maximum, minimum, where


def custom_kernel(nbytes: Num, group: Num, latency: float, bandwidth: float) -> Num:
    """The engines' one- / two-shot all-reduce at its measured cost (module docstring)."""
    g = np.maximum(np.asarray(group, dtype=float), 2.0)
    return latency + 2 * (g - 1) / g * nbytes / bandwidth


def nvlink_all_reduce(nbytes: Num, group: Num, busbw: Num, acc: Accelerator, custom: bool = True,
                      latency: float | None = None) -> Num:
    """An all-reduce inside tier 0: the fastest protocol, where the engines' kernel runs (``custom``) and is
    measured (``acc.allreduce_bandwidth`` > 0) at least the measured time, and past the largest size measured (m) each
    protocol plus what the measurement added to it at m:

        min_p [ P_p(n) + max(measured(min(n, m)) − P_p(min(n, m)), 0) ]

    which up to m is max(min_p P_p(n), measured(n)). Each term is taken with its own protocol p, so its excess
    P_p(n) − P_p(m) only shrinks with more bandwidth or less latency, and so does the minimum: more link bandwidth
    never slows it (the excess of the protocol that was best at m, subtracted from another protocol's time at n,
    grew with the bandwidth: megatron-3.6b on H200, tp 4, pp 4, batch 1024 under SGLang had its TPOT go from 4.445
    to 4.482 ms on an NVLink 10 % faster). ``latency``: a calibrated tier 0's α per step (protocols.protocol_table)."""
    g = np.maximum(np.asarray(group, dtype=float), 2.0)  # a group of one is tp_all_reduce's zero
    # the engine's own kernel: NCCL's protocols (and its cost where measured); the GPU's library's otherwise, RCCL's
    # tuner on AMD's GPUs (protocols.py)
    tuner = "nccl" if custom else library(acc.architecture)
    times = protocol_times("all_reduce", nbytes, g, busbw, latency, tuner)
    if not (custom and acc.allreduce_bandwidth > 0):
        return reduce(minimum, times)
    at = minimum(nbytes, acc.allreduce_measured)
    measured = custom_kernel(at, group, acc.allreduce_latency, acc.allreduce_bandwidth)
    at_m = protocol_times("all_reduce", at, g, busbw, latency, tuner)
    return reduce(minimum, [t + maximum(measured - t_at, 0.0) for t, t_at in zip(times, at_m, strict=True)])


def tp_all_reduce(nbytes: Num, group: Num, parts: list[Num], cluster: Cluster, eff: Efficiency,
                  custom: bool = True) -> Num:
    """The tensor-parallel all-reduce of training and serving (module docstring) over ``group`` ranks split over the
    tiers as ``parts`` (comm.split_group): inside tier 0 (no part beyond it) NCCL's protocols, with the engines'
    measured kernels where ``custom`` (``nvlink_all_reduce``); comm.py's ring beyond it."""
    inside = nvlink_all_reduce(nbytes, group, tier0_busbw(cluster, group, eff), cluster.accelerator, custom,
                               tier0_latency(cluster))
    outside = split_time("all_reduce", nbytes, group, parts, cluster, eff)
    spans = reduce(lambda a, b: a * b, [np.asarray(p) for p in parts[1:]], np.asarray(1.0))  # ranks beyond tier 0
    out = where(np.asarray(group) <= 1, 0.0, where(spans <= 1, inside, outside))
    return float(out) if np.ndim(out) == 0 else out
