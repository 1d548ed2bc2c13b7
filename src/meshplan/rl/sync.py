"""Weight synchronisation: the trainer's new weights into the rollout engine before it samples again, as a registry
of methods (DESIGN.md example 16), priced on the collectives model (comm.py) and the roofline's streaming rate.

Every method but ``reshard`` starts from the trainer's layout: each tensor's shards gathered whole over the trainer's
model-parallel group (tensor- and pipeline-parallel ranks, the expert-parallel ones for the routed experts, the
data-parallel ones too where the weights are sharded there: ZeRO-3 / FSDP), one all-gather per tensor (verl's
``per_tensor_generator`` for Megatron, FSDP's ``summon_full_params``; Megatron's pipeline stages broadcast theirs),
the routed experts of a layer in one all-gather per weight (the generator gathers a layer's local experts over the
expert-parallel group together).
The tensors are the checkpoint's, one per Hugging Face name (q_proj, k_proj, v_proj, gate_proj, up_proj and down_proj
apart, three per routed expert): the engine loads by those names (vLLM's ``load_weights``), then each engine GPU keeps
its own shard of the engine's layout.

- ``local`` (colocated: verl's hybrid engine, NeMo-RL's colocated refit): each GPU copies the gathered tensors into a
  shared bucket (CUDA IPC, ``update_weights_bucket_megabytes``) that the engine's worker on the same GPU reads into
  its shard: the full weights written and read once more in HBM.
- ``broadcast`` (split pools: OpenRLHF's ``_broadcast_to_vllm``, NeMo-RL's ``update_weights_from_collective``,
  verl's one-step-off NCCL group, slime's ``update_weights_from_distributed``): the first rank of each of the
  trainer's pipeline stages broadcasts its stage's tensors, one NCCL broadcast each, to every engine GPU over the
  tiers that join the pools (the chain broadcast of comm.py: a sender's NIC sets the rate), then the engine loads
  them as ``local`` does.
- ``reshard`` (NeMo-RL's NCCL reshard refit, docs/design-docs/nccl-reshard-refit.md: the exact overlap of the
  source and destination shards moved once by batched point-to-point, fanned out to the engine's replicas): no
  gather; each engine GPU receives its own shard (W over the engine's tp·pp, the experts over its ep) and the
  trainer's copies of each shard (its data-parallel ranks) share the sending to the engine's instances, both over
  the tier that joins the pools (within an NVLink domain, NVLink; else the NICs), in buckets of ``RESHARD_BUCKET``.
- ``storage`` (a reload: a checkpoint written by the trainer, read by every engine instance): the full weights over
  the storage fabric, at ``RLPlan.storage_bandwidth`` per node.

Host time: per tensor, the trainer's side issues the gather, the cast to the engine's dtype and the bucket copy, the
engine's side the loader's narrowing copy and the name lookup: ``LAUNCHES`` launches at the trainer stack's
``host_dispatch`` each (specs/stack.py; its Python's speed, Cluster.python_host).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from meshplan.collectives.comm import Layout
from meshplan.collectives.price import collective_time
from meshplan.cost.tensors import tensors_on_rank
from meshplan.roofline import stream_bandwidth
from meshplan.serve.memory import weight_bytes
from meshplan.serve.plan import ServePlan
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

LAUNCHES = 5  # per tensor: gather, cast, bucket copy (trainer); narrow and copy into the shard (engine)
RESHARD_BUCKET = 4 * 2**30  # bytes per batched transfer: NeMo-RL's checkpoint-engine benchmark's 4096 MiB bucket
HF_PER_EXPERT = 3  # gate_proj, up_proj, down_proj: Megatron's fc1 (gate and up fused) counts as two


@dataclass(frozen=True)
class SyncMethod:
    name: str
    transfer: str  # local | broadcast | storage (module docstring)
    source: str


SYNC_METHODS: dict[str, SyncMethod] = {m.name: m for m in (
    SyncMethod("local", "local", "verl workers/rollout/vllm_rollout/vllm_rollout.py update_weights (CUDA IPC "
                                 "buckets); NeMo-RL colocated refit"),
    SyncMethod("broadcast", "broadcast", "OpenRLHF _broadcast_to_vllm; NeMo-RL update_weights_from_collective; "
                                         "verl one_step_off_policy NCCL sync; slime update_weights_from_distributed"),
    SyncMethod("reshard", "reshard", "NeMo-RL docs/design-docs/nccl-reshard-refit.md (XferDTensor, nccl m2n)"),
    SyncMethod("storage", "storage", "a checkpoint saved and loaded (the engine restarted on new weights)"),
)}


@dataclass(frozen=True)
class SyncTime:
    """Seconds of one weight synchronisation by part, and what was moved."""

    gather: float  # the trainer's shards gathered whole (per tensor)
    transfer: float  # into the engine: the bucket copies, the broadcast or the storage round trip
    host: float  # the per-tensor host work on both sides
    weight_bytes: float  # the full model in the engine's weight format
    tensors: int

    @property
    def seconds(self) -> float:
        return self.gather + self.transfer + self.host


def checkpoint_tensors(model: ModelSpec) -> int:
    """Tensors of the Hugging Face checkpoint (module docstring): cost/tensors.py's count under separate
    projections, three per routed expert."""
    named = tensors_on_rank(model, Plan(), replace(Stack(), projections="separate"), 0)
    return int(round(float(named.dense) + float(named.expert) * HF_PER_EXPERT / 2))


def expert_share(model: ModelSpec, total: float) -> tuple[float, float]:
    """(the dense bytes, the routed experts' bytes) of ``total`` 16-bit weight bytes."""
    experts = float(model.num_moe_layers * model.num_experts * model.expert_params()) * 2 if model.is_moe else 0.0
    return max(total - experts, 0.0), min(experts, total)


def _gathered(model: ModelSpec, pool: Cluster, plan: Plan, sharded_dp: bool, total: float, tensors: int,
              eff: Efficiency) -> float:
    """Every tensor gathered whole over the ranks that hold its shards (module docstring), per tensor."""
    dense, experts = expert_share(model, total)
    dense_tensors = max(tensors - model.num_moe_layers * model.num_experts * HF_PER_EXPERT, 1)
    expert_tensors = model.num_moe_layers * HF_PER_EXPERT if model.is_moe else 0  # a layer's experts in one call
    pp: tuple[tuple[int, int], ...] = ((plan.pp, plan.stride("pp")),)
    data = ((plan.dp, plan.stride("dp")), (plan.cp, plan.stride("cp"))) if sharded_dp else ()
    dense_layout: Layout = ((plan.tp, plan.stride("tp")), *data, *pp)
    expert_ranks = plan.ep * (plan.etp or plan.tp)
    expert_layout: Layout = ((expert_ranks, 1), *pp)
    seconds = 0.0
    for nbytes, count, group, layout in ((dense, dense_tensors, plan.tp * plan.pp * (plan.dp * plan.cp if sharded_dp
                                                                                     else 1), dense_layout),
                                         (experts, expert_tensors, expert_ranks * plan.pp, expert_layout)):
        if count and group > 1:
            seconds += count * float(collective_time("all_gather", nbytes / count, group, layout, pool, eff))
    return seconds


def sync_time(model: ModelSpec, cluster: Cluster, trainer: tuple[Cluster, Plan, Stack], engine: ServePlan,
              method: str, storage_bandwidth: float = 40e9, eff: Efficiency = DEFAULT) -> SyncTime:
    """One weight synchronisation from the trainer's ``(pool, plan, stack)`` to ``engine`` by ``method``
    (module docstring); ``cluster``: the whole job's GPUs, the rollout pool placed after the trainer's."""
    pool, plan, stack = trainer
    kind = SYNC_METHODS[method].transfer
    total = float(weight_bytes(model, 1, 1, 1, engine.quant))
    tensors = checkpoint_tensors(model)
    shard = float(weight_bytes(model, engine.tp, engine.pp, engine.ep, engine.quant))
    if kind == "reshard":
        return _resharded(model, cluster, (plan, stack), engine, (total, shard, tensors), eff)
    gather = _gathered(model, pool, plan, plan.zero == 3 or stack.fsdp_mode.shards, total, tensors, eff)
    # the engine reads the tensors and writes its shard
    load = (total + shard) / stream_bandwidth(cluster.accelerator, eff)
    if kind == "local":
        transfer = 2 * total / stream_bandwidth(cluster.accelerator, eff) + load  # the bucket written and read
    elif kind == "broadcast":
        group = engine.num_gpus + 1
        per_sender = max(1, math.ceil(tensors / plan.pp))
        one = collective_time("broadcast", total / plan.pp / per_sender, group, 1, cluster, eff)
        transfer = per_sender * float(one) + load
    else:
        writers = max(1, pool.num_gpus // cluster.nvlink_domain)  # nodes that write their shards, read by each
        readers = max(1, engine.num_gpus // cluster.nvlink_domain)  # instance's nodes
        transfer = (total / writers + total * engine.replicas / readers) / storage_bandwidth + load
    host = tensors * LAUNCHES * stack.host_dispatch * cluster.python_host
    return SyncTime(gather=gather, transfer=transfer, host=host, weight_bytes=total, tensors=tensors)


def _resharded(model: ModelSpec, cluster: Cluster, trainer: tuple[Plan, Stack], engine: ServePlan,
               sizes: tuple[float, float, int], eff: Efficiency) -> SyncTime:
    """The ``reshard`` method (module docstring): each engine GPU's shard in, each trainer GPU's share of the sends
    out (its dense shard over tp·pp, its experts over ep·etp·pp, sent to every engine instance, the trainer's
    data-parallel copies sharing the sending), in buckets, over the tier that joins the pools; the engine loads its
    shard as the other methods do."""
    plan, stack = trainer
    total, shard, tensors = sizes
    dense, experts = expert_share(model, total)
    held = dense / (plan.tp * plan.pp) + experts / (plan.ep * (plan.etp or plan.tp) * plan.pp)
    sent = held * engine.replicas * engine.dpa / max(plan.dp * plan.cp, 1)
    moved = max(shard, sent)
    span = cluster.nvlink_domain if cluster.num_gpus > cluster.nvlink_domain else 1
    buckets = max(1, math.ceil(moved / RESHARD_BUCKET))
    one = collective_time("p2p", moved / buckets, 2, span, cluster, eff)
    load = 2 * shard / stream_bandwidth(cluster.accelerator, eff)  # the engine reads the bucket, writes its shard
    host = tensors * LAUNCHES * stack.host_dispatch * cluster.python_host / max(engine.tp * engine.pp, 1)
    return SyncTime(gather=0.0, transfer=buckets * float(one) + load, host=host, weight_bytes=total, tensors=tensors)
