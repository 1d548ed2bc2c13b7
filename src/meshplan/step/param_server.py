"""The data-parallel exchange of a parameter server (``plan.dp_mode`` "ps"; seed 004): what stands for ZeRO's
collectives where workers push gradients to and pull weights from server shards (step/channels.dp_collectives)."""

from __future__ import annotations

from meshplan.memory import WEIGHT_BYTES
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.plan import Plan
from meshplan.xp import Num, maximum


def ps_push(cluster: Cluster, plan: Plan, nbytes: Num, eff: Efficiency) -> Num:
    """Seconds for every GPU to push ``nbytes`` to (or pull them from) the parameter servers (seed 004's parameter
    server; Li et al. 2014, "Scaling distributed machine learning with the parameter server", OSDI, §3: the keys are
    sharded over the servers, each worker exchanges each shard with the server that holds it). Over the network tier
    (the outermost: latency α, bandwidth B per GPU and per server, at the mesh's NCCL efficiency), N GPUs each send n
    bytes, S server shards each take N·n/S; the exchange runs at the slower of a worker's link and a server's:
        t = α + n/B · max(1, N/S)
    S = ``plan.servers``, 0: one per GPU (N/S = 1, every link at full rate)."""
    tiers = cluster.tiers
    last = len(tiers) - 1
    workers = plan.num_gpus
    load = workers / (plan.servers or workers)
    return (tiers[last].latency + nbytes / (tiers[last].bandwidth * eff.link(last)) * maximum(1.0, load)) * (nbytes > 0)


def ps_collectives(cluster: Cluster, plan: Plan, params: Num, eff: Efficiency) -> tuple[Num, Num, Num]:
    """The data-parallel exchange of a parameter server for the ``params`` this GPU exchanges (``ps_push``), as
    channels.Collectives' (all_reduce, gather, scatter): the push
    of the gradients stands for the reduce-scatter, the pull of the updated bf16 weights for the all-gather, and the
    two in turn for the all-reduce; so the ZeRO stages keep their schedule of ``ZERO_TRAFFIC`` (stage 0: push and
    pull after the last backward; 1: the pull beside the next step's first forward, as a parameter server's workers
    prefetch; 3: a pull per pass, the workers holding no weights between passes)."""
    push = ps_push(cluster, plan, params * plan.grad_bytes, eff)
    pull = ps_push(cluster, plan, params * WEIGHT_BYTES, eff)
    return push + pull, pull, push
