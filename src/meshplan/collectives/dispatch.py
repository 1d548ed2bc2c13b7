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
bytes of all k copies; through tier 0 goes one copy of a token to each other GPU of a node that holds one of its
experts, the sender's node and the forwarding ones alike: n·(D/k)·(g_0 − 1)/g_0, D = g·(1 − C(E − E/g, k)/C(E, k)) the
distinct ranks a token's k experts hit (rank_copies: each of the g ranks is missed with the same zero term over its
E/g experts; D = k only where no two of them share a rank). Both backends send one copy a rank, not one a (token,
expert) pair: DeepEP's get_dispatch_layout sets is_token_in_rank[token, rank] (and counts a token once per RDMA rank,
num_tokens_per_rdma_rank) from the top-k (csrc/kernels/internode.cu @ 3b1045d lines 78-100), which its intranode and
internode dispatch send by (deep_ep/buffer.py @ 3b1045d dispatch, internode_dispatch: over RDMA once per node, then
NVLink to each rank its SourceMeta's is_token_in_nvl_rank bits name); HybridEP sends a token once per node over RDMA
(branch hybrid-ep @ 94a9f8f DeepEP/tests/utils.py count_rdma_send_from_routing_map, a max over each node's experts)
and "multicast to all ranks within this node which need this token", one unicast a rank its sparse_to_dense_map names
(csrc/hybrid_ep/backend/hybrid_ep_backend.cuh @ 94a9f8f line 1619, the intra-node S2G loop). Megatron-Core's alltoall
dispatcher (MoEAlltoAllTokenDispatcher, megatron/core/transformer/moe/token_dispatcher.py @ core_v0.16.1 preprocess:
num_out_tokens = tokens x topk, input_splits the per-expert counts summed a rank) sends a row per (token, expert)
pair: every copy, the plain all-to-all (comm.split_time). The tiers run concurrently (the slowest sets the time), with
the all-to-all's latency, Σ_i (g_i − 1)·α_i. Routing is taken as uniform, as serve/moe.py takes it: DeepSeek-V3's
group-limited routing (a token's experts in 4 of 8 groups) hits fewer nodes still.

Over the network the forwarded traffic runs at the backend's measured rate (``Stack.flex_backend``, its registry
entry's tables and sources: specs/stack_variants.py) where that is below NCCL's share of the NIC
(``Efficiency.network``). Both backends' tables are logical rates that count each node a token hits, the sender's own
included (DeepEP/tests/test_internode.py @ 3b1045d lines 39-43, 158-173; DeepEP/tests/utils.py
count_rdma_send_from_routing_map on the hybrid-ep branch), so the NIC carries (n − 1)/n of them over n nodes that
are all hit. A point is one of two kinds. Where the NIC bound (DeepEP over 4 and 8 nodes: 0.863 and 0.884 of a CX7
400 Gb/s NIC, NCCL's 0.90 nearly) it is a share of the NIC, and a faster NIC runs faster. Where the kernel bound
(DeepEP over 2 nodes: 43 GB/s logical, 21.5 GB/s on the NIC, 0.43 of it, where a NIC-bound kernel would read ~87;
HybridEP's Torch API at Megatron-Core's 16 SMs over 2, 4 and 8 nodes: 0.54 - 0.77 of the NIC, below the 0.86 - 0.87
its kernels alone reach) it is a rate in absolute logical bytes/s, on the NIC K·(n − 1)/n, which a faster NIC does
not raise and a slower one caps at the NIC-bound share (``nic_share``): each point's share of this NIC, linear in
log2(nodes) between the points, the nearest one outside them. On 400 Gb/s (H100, H800, B200) DeepEP reads 0.43,
0.863 and 0.884 at 2, 4 and 8 nodes and HybridEP 0.539, 0.749 and 0.768; on 800 Gb/s (ConnectX-8) DeepEP over 2
nodes keeps its 21.5 GB/s on the NIC, 0.215. Faster NICs never slow it (the kernel part is fixed, the NIC part
grows).

Inside one NVLink domain a group's exchange runs at most at the backend's intra-node kernel rate (``nvlink_rate``,
its registry entry's ``nvlink`` points): logical bytes/s over the rows a rank receives, one a token and rank, its own
included (branch hybrid-ep @ 94a9f8f DeepEP/tests/test_hybrid_ep.py nvl_recv_bytes, dispatched_hidden's bytes;
docs/README_Hybrid-EP.md's B200 and GB200 tables). HybridEP at Megatron-Core's 16 SMs reads 544 GB/s over 8 GB200
ranks, 444 over 36 (B200's 8: 533); DeepEP at Megatron-Core's 20 SMs 391 over 8 B200 ranks (halfway between its
16- and 24-SM rows). On NVLink 5 (900 GB/s a GPU, 720 priced: 823 GB/s of rows over 8 ranks, 7/8 of them on the
link) the kernel binds. Every point is a Blackwell measurement, and a kernel's SM-bound copy rate is its GPU's (SM
count, clock, NVLink generation), so the points hold on the architectures they were measured on (``nvlink_on``)
only; elsewhere the link prices the exchange. On Hopper that is what DeepEP's README measures: H800's 8 ranks at 24
SMs run link-bound, 153 / 158 GB/s of rows (FP8 dispatch / combine) of its ~160 (README.md @ 3b1045d, "Normal
kernels"); an H100's link (360 priced, 411 GB/s of rows over 8) was not measured against DeepEP's kernels.
Past 36 ranks HybridEP's rate holds at its 36-rank point: its kernels run up to 72 ranks in one NVLink domain
(csrc/hybrid_ep/config.cuh @ 94a9f8f: MAX_NUM_OF_RANKS_PER_NODE 72, "up to 72(GB200) ranks per node"), which the
README does not measure. Across nodes the backends' network tables already time the whole exchange.

Example: DeepSeek-V3 (E = 256, k = 8) over 32 H100s in 4 nodes: a token misses a given other node with probability
Π_{j<8} (192 − j)/(256 − j) = 0.0964, so it crosses the network 3 × 0.904 = 2.71 times, not 8 × 24/32 = 6; it
misses a rank of 8 experts with probability Π_{j<8} (248 − j)/(256 − j) = 0.773, so NVLink carries
32 × 0.227 = 7.27 copies of it, not 8.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache

import numpy as np

from meshplan.collectives.comm import Collective, Layout, split_group, split_time, tier_bandwidths
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.stack_variants import choice_of
from meshplan.xp import Num, maximum, minimum, where


def nic_share(nodes: Num, nic: float, backend: str = "deepep") -> Num:
    """The flex ``backend``'s throughput on a NIC of ``nic`` bytes/s per GPU over ``nodes`` scale-up domains, as a
    share of that NIC (module docstring): linear in log2(nodes) between its measured points, the nearest outside."""
    log_nodes, shares = _points(backend, float(nic))
    if isinstance(nodes, np.ndarray):  # a search's plans
        return np.interp(np.log2(np.maximum(nodes, 1.0)), log_nodes, shares)
    return float(np.interp(math.log2(max(float(nodes), 1.0)), log_nodes, shares))


@cache
def _points(backend: str, nic: float) -> tuple[list[float], list[float]]:
    """The backend's points as (log2 nodes, share of a ``nic`` bytes/s NIC): a NIC-bound point its share, a kernel
    point K·(n − 1)/n / nic, at most the NIC-bound share there (its own table's, interpolated as ``nic_share``)."""
    record = choice_of("flex_backend", backend)
    bound = [math.log2(n) for n, _ in record.nic], [s for _, s in record.nic]
    share = {n: s for n, s in record.nic}
    for n, rate in record.kernel:
        cap = float(np.interp(math.log2(n), *bound))
        share[n] = min(rate * (n - 1) / n / nic, cap) if nic > 0 else cap
    nodes = sorted(share)
    return [math.log2(n) for n in nodes], [share[n] for n in nodes]


def nvlink_rate(ranks: Num, backend: str, architecture: str) -> Num:
    """The flex ``backend``'s intra-node kernels' logical bytes/s over ``ranks`` GPUs of one NVLink domain of
    ``architecture`` GPUs (its registry entry's ``nvlink`` points, linear in log2(ranks) between them, the nearest
    outside; inf where it has none or measured them on another architecture, ``nvlink_on``): the rate a dispatch
    inside one domain runs at where its NVLink would carry more (module docstring)."""
    record = choice_of("flex_backend", backend)
    points = record.nvlink
    if not points or architecture not in record.nvlink_on:
        return math.inf
    log_ranks, rates = [math.log2(n) for n, _ in points], [r for _, r in points]
    if isinstance(ranks, np.ndarray):
        return np.interp(np.log2(np.maximum(ranks, 1.0)), log_ranks, rates)
    return float(np.interp(math.log2(max(float(ranks), 1.0)), log_ranks, rates))


def node_miss(experts: Num, copies: int, per_node: Num) -> Num:
    """Probability that a token's ``copies`` experts, drawn without replacement from ``experts``, all miss the
    ``per_node`` experts of one node: Π_{j<k} (E − m − j)/(E − j), 0 where the node holds more than E − k of them."""
    miss: Num = 1.0
    for j in range(copies):
        miss = miss * maximum(experts - per_node - j, 0.0) / (experts - j)
    return miss


def node_hit(experts: Num, copies: int, per_node: Num, routing: str = "uniform") -> Num:
    """Probability that a token's ``copies`` experts hit one given node of ``per_node`` experts: uniform routing
    1 − node_miss; contiguous routing (k consecutive experts from a multiple of k: NeMo AutoModel's FakeBalancedGate,
    components/moe/layers.py @01926a5c, token i's experts (i·k + j) mod E) hits max(m, k)/m aligned nodes of the
    E/m, each with probability max(m, k)/E (one node where m ≥ k)."""
    if routing == "contiguous":
        return minimum(1.0, maximum(per_node, float(copies)) / experts)
    return 1.0 - node_miss(experts, copies, per_node)


def rank_copies(experts: Num, copies: int, per_rank: Num, routing: str = "uniform") -> Num:
    """The copies of a token NVLink carries: one to each distinct rank that holds one of its experts, the expected
    count of the R = E/r ranks of r experts each that its k experts hit, R · node_hit (linearity of expectation over
    the ranks, each missed with the hypergeometric zero term): uniform routing R·(1 − C(E − r, k)/C(E, k)) (≤ k,
    fewer where a token's experts share a rank), contiguous routing max(1, k/r) (module docstring: DeepEP's and
    HybridEP's one copy a rank)."""
    return experts / per_rank * node_hit(experts, copies, per_rank, routing)


def forwarded_time(c: Collective, layout: Layout, cluster: Cluster, eff: Efficiency = DEFAULT) -> Num:
    """Seconds of a dispatch (or combine) ``c`` whose tokens cross each tier beyond the node once per node they hit
    (module docstring): ``c.nbytes`` the bytes of every copy one GPU sends, as the plain all-to-all's, ``c.copies``
    each token's k, ``c.experts`` the routed experts E, over ``c.group`` ranks laid out as ``layout``, at the rate of
    its forwarding kernels (``c.backend``: Stack.flex_backend)."""
    return forwarded_split(c, split_group(cluster, c.group, layout), cluster, eff)


def forwarded_split(c: Collective, parts: list[Num], cluster: Cluster, eff: Efficiency = DEFAULT) -> Num:
    """``forwarded_time`` of a group already split over the tiers (``parts``: comm.split_group)."""
    tiers = cluster.tiers
    bandwidths = tier_bandwidths(parts, cluster, eff)
    nbytes, copies, experts, group = c.nbytes, c.copies, c.experts, c.group
    node = parts[0]
    token = nbytes / copies
    hit = node_hit(experts, copies, experts * node / group, c.routing)
    fanned = rank_copies(experts, copies, experts / group, c.routing) / copies  # of the k copies, over NVLink
    slowest: Num = nbytes * fanned * (node - 1) / node / bandwidths[0]
    # a group inside one NVLink domain: at most the backend's intra-node kernel rate, over every rank's rows
    inside = (node >= group) & (node > 1)
    inside = bool(inside) if isinstance(inside, np.bool_) else inside  # a scalar plan stays a float
    kernel = nvlink_rate(node, c.backend, cluster.accelerator.architecture)
    slowest = where(inside, maximum(slowest, nbytes * fanned / kernel), slowest)
    latency: Num = (node - 1) * tiers[0].latency
    inner: Num = node
    for g, b, tier in zip(parts[1:], bandwidths[1:], tiers[1:], strict=True):
        outer = inner * g
        # the backend's rate on this tier's NIC over the nodes the group spans, at most NCCL's
        share = nic_share(group / node, tier.bandwidth, c.backend)
        forwarded = minimum(1.0, share / eff.network) if eff.network > 0 else 1.0
        slowest = maximum(slowest, token * (outer - inner) / node * hit / (b * forwarded))
        latency = latency + (g - 1) * tier.latency
        inner = outer
    return latency + slowest


def dispatch_time(c: Collective, layout: Layout, cluster: Cluster, eff: Efficiency = DEFAULT) -> Num:
    """A MoE dispatch or combine ``c`` of ``c.copies`` copies a token: forwarded through each node
    (``forwarded_time``) where ``c.experts`` > 0 (DeepEP's normal kernels; E, the routed experts), else the plain
    all-to-all of every copy (comm.split_time)."""
    return dispatch_split(c, split_group(cluster, c.group, layout), cluster, eff)


def dispatch_split(c: Collective, parts: list[Num], cluster: Cluster, eff: Efficiency = DEFAULT) -> Num:
    """``dispatch_time`` of a group already split over the tiers (``parts``: comm.split_group)."""
    forwarding = np.asarray(c.experts) > 0
    if forwarding.all():  # every plan forwards (one prompt iteration): no plain all-to-all to price
        return forwarded_split(c, parts, cluster, eff)
    plain = split_time("all_to_all", c.nbytes, c.group, parts, cluster, eff)
    if not forwarding.any():
        return plain
    safe = where(forwarding, c.experts, float(c.copies))  # a plan without forwarding: any E ≥ k keeps it finite
    return where(forwarding, forwarded_split(replace(c, experts=safe), parts, cluster, eff), plain)
