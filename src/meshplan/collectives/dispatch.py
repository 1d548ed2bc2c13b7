"""Expert parallelism's token dispatch and combine with node-level forwarding: DeepEP's normal kernels.

A plain all-to-all (comm.py) sends each of a token's k copies to its expert's GPU, so a token whose experts sit on
other nodes crosses the network once per copy: k·(g − g_0)/g times on average over a group of g GPUs, g_0 of them
in each node (tier 0, the scale-up domain). DeepEP's normal kernels send it once to each other node that holds one
of its experts and fan it out over NVLink there (deepseek-ai/DeepEP README: "kernels optimized for
asymmetric-domain bandwidth forwarding, such as forwarding data from NVLink domain to RDMA domain", for "training
and inference prefilling"; DeepSeek-V3 technical report, arXiv 2412.19437 §3.2.2: tokens "are first transmitted via
IB to the GPUs with the same in-node index on their target nodes ... instantaneously forwarded via NVLink to
specific GPUs that host their target experts"); the combine sums a token's copies inside their node before sending
that sum back. The low-latency kernels (decode) send every copy over RDMA, as the plain all-to-all prices them.

Under uniform routing of k of E experts spread evenly over the g GPUs, a node holds m = E·g_0/g of them and a token
misses it with probability C(E − m, k)/C(E, k) = Π_{j<k} (E − m − j)/(E − j) (the hypergeometric zero term). The
traffic that leaves through tier i ≥ 1 is one token's bytes per node it hits among the (outer − inner)/g_0 nodes
inside its tier-i block but outside its tier-(i−1) block, where the plain all-to-all sends n·(outer − inner)/g, n the
bytes of all k copies; through tier 0 goes every copy that lands on another GPU of its node, the sender's node and
the forwarding ones alike: n·(g_0 − 1)/g_0. The tiers run concurrently (the slowest sets the time), with the
all-to-all's latency, Σ_i (g_i − 1)·α_i. Routing is taken as uniform, as serve/moe.py takes it: DeepSeek-V3's
group-limited routing (a token's experts in 4 of 8 groups) hits fewer nodes still.

Over the network the forwarded traffic runs at DeepEP's measured rate where that is below NCCL's share of the NIC
(``Efficiency.network``): ``NIC_SHARES``, its normal kernels' NIC throughput on H800s with one CX7 400 Gb/s NIC each
(~50 GB/s), DeepSeek-V3's shapes (4096 tokens, hidden 7168, top-8 of 256 experts in 4 node groups, FP8 dispatch,
BF16 combine): "bottleneck bandwidth" dispatch / combine 58 / 57 GB/s at EP 32 and 51 / 50 GB/s at EP 64
(deepseek-ai/DeepEP README.md @ 3b1045d, 2025-04-22, "Fix the performance data"; docs/legacy.md at dd758ca). Those
are logical rates: DeepEP/tests/test_internode.py @ 3b1045d (lines 39-43, 158-173) counts each node a token hits, its
own included, so the NIC carries 3/4 of them at EP 32 (4 nodes, all hit) and 3.5/4 at EP 64 (4 of 8 nodes hit, its own
among them half the time): 43.5 / 42.8 and 44.6 / 43.8 GB/s, 0.863 and 0.884 of the NIC (NCCL's share: 0.90). The
same table's EP 16 row, 2 nodes, reads 43 / 43 GB/s, of which the NIC carries half (both nodes hit, its own one of
them): 21.5 GB/s, 0.43 of the NIC. So the share is priced by the nodes the group spans (``nic_share``): 0.43, 0.863
and 0.884 at 2, 4 and 8 nodes, linear in log2(nodes) between them, 0.884 beyond 8. NVIDIA's HybridEP (the other flex
backend, deepseek-ai/DeepEP branch hybrid-ep @ 94a9f8f, docs/README_Hybrid-EP.md, H100, 4096 tokens, hidden 7168,
top-8, 8 local experts a rank, its logical "algorithm bandwidth" counting the sender's own node as DeepEP's:
DeepEP/tests/test_hybrid_ep.py, DeepEP/tests/utils.py count_rdma_send_from_routing_map) falls the same way at 2 nodes:
at Megatron-Core's 16 SMs (moe_hybridep_num_sms) its Torch API reads 48.3 / 54.5 / 53.4 GB/s (FP8 dispatch / BF16
dispatch / combine) over 16 ranks, 0.48 - 0.55 of the NIC, and 0.61 - 0.81 over 32 and 64; it is priced with DeepEP's
table.

Example: DeepSeek-V3 (E = 256, k = 8) over 32 H100s in 4 nodes: a token misses a given other node with probability
Π_{j<8} (192 − j)/(256 − j) = 0.0964, so it crosses the network 3 × 0.904 = 2.71 times, not 8 × 24/32 = 6.
"""

from __future__ import annotations

import math

import numpy as np

from meshplan.collectives.comm import Layout, split_group, split_time, tier_bandwidths
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.xp import Num, maximum, minimum, where

# DeepEP's normal kernels' NIC throughput / NIC peak by the nodes the group spans (module docstring: H800 + CX7,
# 400 Gb/s ~ 50 GB/s; EP 16, 32 and 64 over 2, 4 and 8 nodes, dispatch and combine averaged): (nodes, share)
NIC_SHARES: tuple[tuple[float, float], ...] = ((2.0, 0.43), (4.0, 0.863), (8.0, 0.884))


def nic_share(nodes: Num) -> Num:
    """DeepEP's share of the NIC over ``nodes`` scale-up domains (``NIC_SHARES``): linear in log2(nodes) between
    the measured points, the nearest one outside them."""
    if isinstance(nodes, np.ndarray):  # a search's plans
        return np.interp(np.log2(np.maximum(nodes, 1.0)), _LOG_NODES, _SHARES)
    x = math.log2(max(float(nodes), 1.0))
    if x <= _LOG_NODES[0]:
        return _SHARES[0]
    for x0, x1, s0, s1 in zip(_LOG_NODES, _LOG_NODES[1:], _SHARES, _SHARES[1:], strict=False):
        if x <= x1:
            return s0 + (s1 - s0) * (x - x0) / (x1 - x0)
    return _SHARES[-1]


_LOG_NODES = [math.log2(n) for n, _ in NIC_SHARES]
_SHARES = [s for _, s in NIC_SHARES]


def node_miss(experts: Num, copies: int, per_node: Num) -> Num:
    """Probability that a token's ``copies`` experts, drawn without replacement from ``experts``, all miss the
    ``per_node`` experts of one node: Π_{j<k} (E − m − j)/(E − j), 0 where the node holds more than E − k of them."""
    miss: Num = 1.0
    for j in range(copies):
        miss = miss * maximum(experts - per_node - j, 0.0) / (experts - j)
    return miss


def forwarded_time(nbytes: Num, copies: int, experts: Num, group: Num, layout: Layout, cluster: Cluster,
                   eff: Efficiency = DEFAULT) -> Num:
    """Seconds of a dispatch (or combine) whose tokens cross each tier beyond the node once per node they hit
    (module docstring). ``nbytes``: the bytes of every copy one GPU sends, as the plain all-to-all's."""
    return forwarded_split(nbytes, copies, experts, group, split_group(cluster, group, layout), cluster, eff)


def forwarded_split(nbytes: Num, copies: int, experts: Num, group: Num, parts: list[Num], cluster: Cluster,
                    eff: Efficiency = DEFAULT) -> Num:
    """``forwarded_time`` of a group already split over the tiers (``parts``: comm.split_group)."""
    tiers = cluster.tiers
    bandwidths = tier_bandwidths(parts, cluster, eff)
    node = parts[0]
    # DeepEP's rate on a NIC over the nodes the group spans, at most NCCL's
    forwarded = minimum(1.0, nic_share(group / node) / eff.network) if eff.network > 0 else 1.0
    token = nbytes / copies
    hit = 1.0 - node_miss(experts, copies, experts * node / group)
    slowest: Num = nbytes * (node - 1) / node / bandwidths[0]
    latency: Num = (node - 1) * tiers[0].latency
    inner: Num = node
    for g, b, tier in zip(parts[1:], bandwidths[1:], tiers[1:], strict=True):
        outer = inner * g
        slowest = maximum(slowest, token * (outer - inner) / node * hit / (b * forwarded))
        latency = latency + (g - 1) * tier.latency
        inner = outer
    return latency + slowest


def dispatch_time(nbytes: Num, copies: int, experts: Num, group: Num, layout: Layout, cluster: Cluster,
                  eff: Efficiency = DEFAULT) -> Num:
    """A MoE dispatch or combine of ``copies`` copies a token: forwarded through each node (``forwarded_time``)
    where ``experts`` > 0 (DeepEP's normal kernels; E, the routed experts), else the plain all-to-all of every
    copy (comm.split_time)."""
    return dispatch_split(nbytes, copies, experts, group, split_group(cluster, group, layout), cluster, eff)


def dispatch_split(nbytes: Num, copies: int, experts: Num, group: Num, parts: list[Num], cluster: Cluster,
                   eff: Efficiency = DEFAULT) -> Num:
    """``dispatch_time`` of a group already split over the tiers (``parts``: comm.split_group)."""
    forwarding = np.asarray(experts) > 0
    if forwarding.all():  # every plan forwards (one prompt iteration): no plain all-to-all to price
        return forwarded_split(nbytes, copies, experts, group, parts, cluster, eff)
    plain = split_time("all_to_all", nbytes, group, parts, cluster, eff)
    if not forwarding.any():
        return plain
    safe = where(forwarding, experts, float(copies))  # a plan without forwarding: any E ≥ k keeps the product finite
    return where(forwarding, forwarded_split(nbytes, copies, safe, group, parts, cluster, eff), plain)
