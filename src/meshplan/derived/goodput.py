"""Goodput under failures: a training run on N GPUs is interrupted at a rate that grows with N, loses the work since
its last checkpoint at each interruption, pays a restart, and pays each checkpoint it writes. The expected wall time
per unit of useful time, at the best checkpoint interval, is what a plan's step time is multiplied by.

- Failures: independent, exponential, one per ``mtbf_gpu_hours`` per GPU, so the job's mean time between
  interruptions is M = mtbf_gpu / N (a synchronous job stops when any of its GPUs does). Llama 3's 405B run (Dubey et
  al. 2024, "The Llama 3 Herd of Models", §3.3.4 and Table 5): 419 unexpected interruptions in a 54-day snapshot on
  16,384 H100s, so 16,384 × 54 × 24 / 419 = 50,679 GPU-hours per interruption (``LLAMA3_MTBF_GPU_HOURS``), M = 3.09 h
  for that job; the interruptions count every cause (GPU, HBM, network, host), not GPUs alone.
- A checkpoint holds the training state, weights and optimizer state (the trainable parameters' master copy and
  moments: memory.OPTIMIZER_STATE) of the whole model, written by all ranks at once at the storage's aggregate
  bandwidth: δ = bytes / bandwidth. Llama 3's Tectonic storage sustains 2 TB/s (7 TB/s peak; §3.3.1).
- A restart costs ``restart_s`` (rescheduling, process start, communicator set-up: a stated assumption, 10 min by
  default) plus reading the checkpoint back at the same bandwidth.
- Interval and expected time: Daly 2006 ("A higher order estimate of the optimum checkpoint interval for restart
  dumps", Future Generation Computer Systems 22(3): 303-312), eq. 20 for the optimum τ (δ < 2M; else τ = M) and
  eq. 13 for the expected wall time of T_s of useful work, T_w = M·e^{R/M}·(e^{(τ+δ)/M} − 1)·T_s / τ. Young 1974's
  τ = sqrt(2δM) is its first term. Goodput = T_s / T_w.

Llama 3 405B on 16,384 H100s at these figures: 5.7 TB a checkpoint, δ = 2.8 s, τ ≈ 4.2 min, goodput 92.6 %, against
the paper's "higher than 90 %" effective training time (tests/test_goodput.py shows the arithmetic).

What a plan changes (issue 84 item 3; ``plan_goodput``, which the search ranks by: search/by_goodput.py):

- The write: every rank sends its share through its own host link (Cluster.host_bandwidth), so δ is also at least the
  largest share over that link. Frameworks that shard the checkpoint over every rank (Megatron's dist_checkpointing
  fully_parallel_save, torch.distributed.checkpoint's deduplicated plan: Supports.sharded_checkpoint) give each
  1/N of it; DeepSpeed's save_checkpoint has the first data-parallel replica write the weights (mp_rank_*_model_states)
  beside every rank's optimizer partition, so its writers hold weights / (tp·pp·cp) each.
- Recovery by replicas (``Reliability.recovery = "replica"``; TorchFT's per-step fault tolerance, pytorch/torchft:
  a failed replica group drops out of the step, the others train on, and it rejoins healing its state from a healthy
  peer): no whole-job restart and no lost work beyond the failed replica's step. Failures still arrive at N/M_gpu; each
  takes one replica of G = N/R GPUs out for the restart R_s plus its heal, its state (weights and optimizer, the plan's
  bytes per replica) fetched over its GPUs' network links, and loses half a step of that replica on average. The share
  of replica-time lost is λ·(R_s + heal + t_step/2)/R, so factor = 1 / (1 − that): a plan of more, smaller replicas
  loses less. Replicas hold whole copies of the model state only without ZeRO sharding over data parallelism (zero=0);
  a plan that shards it restarts as above.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meshplan.errors import SpecError
from meshplan.memory import OPTIMIZER_STATE, WEIGHT_BYTES, optimizer_bytes
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

if TYPE_CHECKING:  # the serving report imports goodput's terms without the training step's assembly
    from meshplan.estimate import Estimate
    from meshplan.specs.hardware import Cluster

LLAMA3_MTBF_GPU_HOURS = 16_384 * 54 * 24 / 419  # GPU-hours per unexpected interruption (module docstring)
LLAMA3_STORAGE_BYTES_S = 2e12  # Tectonic's sustained throughput for Llama 3's checkpoints (module docstring)
RESTART_S = 600.0  # an assumption, said wherever it is used: rescheduling, start-up, communicators
RECOVERIES = ("restart", "replica")  # the whole job from its last checkpoint, or the failed replica alone (TorchFT)


@dataclass(frozen=True)
class Reliability:
    """How often a GPU interrupts the job and what a checkpoint and a restart cost."""

    mtbf_gpu_hours: float = LLAMA3_MTBF_GPU_HOURS
    checkpoint_bandwidth: float = LLAMA3_STORAGE_BYTES_S  # bytes/s, aggregate over the job's ranks
    restart_s: float = RESTART_S
    recovery: str = "restart"  # RECOVERIES

    def __post_init__(self) -> None:
        if self.recovery not in RECOVERIES:
            raise SpecError(f"recovery={self.recovery!r} must be one of {', '.join(RECOVERIES)}")
        for name, low, high in (("mtbf_gpu_hours", 1.0, 1e9), ("checkpoint_bandwidth", 1e6, 1e15),
                                ("restart_s", 0.0, 1e6)):
            value = getattr(self, name)
            if not low <= value <= high:  # also refuses NaN
                raise SpecError(f"{name}={value!r} must be a number from {low:g} to {high:g}")


@dataclass(frozen=True)
class Goodput:
    """One job's failure accounting (seconds, bytes); ``factor`` multiplies its step time."""

    job_mtbf_s: float
    checkpoint_bytes: float
    checkpoint_s: float
    restart_s: float  # the restart and the checkpoint read back
    interval_s: float  # useful work between checkpoints (Daly's τ)
    factor: float  # expected wall time / useful time, ≥ 1
    recovery: str = "restart"  # how the job recovers (RECOVERIES)
    heal_s: float = 0.0  # under replica recovery: a replica's state fetched from a peer

    @property
    def goodput(self) -> float:
        return 1.0 / self.factor

    @property
    def stalls(self) -> bool:
        """Whether the job makes no progress: interrupted so often (against its restart and checkpoint times) that
        its expected wall time per useful second overflows (wall_factor)."""
        return math.isinf(self.factor)

    def as_dict(self) -> dict[str, float | str | None]:
        """The figures as JSON holds them: a stalled job's factor is null (JSON has no infinity)."""
        return {"job_mtbf_s": self.job_mtbf_s, "checkpoint_bytes": self.checkpoint_bytes,
                "checkpoint_s": self.checkpoint_s, "restart_s": self.restart_s, "interval_s": self.interval_s,
                "factor": None if self.stalls else self.factor, "goodput": self.goodput, "recovery": self.recovery,
                "heal_s": self.heal_s}


def checkpoint_bytes(model: ModelSpec, plan: Plan, stack: Stack | None = None) -> float:
    """The training state of the whole model: every weight (WEIGHT_BYTES) and the optimizer state of the trainable
    ones (``saved_state_bytes``); under LoRA the adapters and their state only (the frozen base is not saved again,
    as PEFT saves)."""
    if plan.finetune == "lora":
        from meshplan.cost.params import adapter_params

        # adapter_params is per layer on one GPU (split over tp·tp2): the whole model's
        adapters = adapter_params(model, plan) * model.num_layers * plan.tp * plan.tp2
        return adapters * (WEIGHT_BYTES + saved_state_bytes(plan, stack))
    return model.params() * (WEIGHT_BYTES + saved_state_bytes(plan, stack))


def saved_state_bytes(plan: Plan, stack: Stack | None) -> float:
    """The optimizer state a checkpoint holds per trainable parameter: memory.optimizer_bytes' (the fp32 master and
    the moments, K = 12 for Adam; without a master copy, ``stack.master_weights`` false, the moments in the weights'
    16 bits, 4: KempnerForge's DCP save of its bf16 model's torch.optim state)."""
    return OPTIMIZER_STATE[plan.optimizer].state if stack is None else optimizer_bytes(plan, stack)[0]


def optimum_interval(delta: float, mtbf: float) -> float:
    """Daly 2006 eq. 20: τ = sqrt(2δM)·[1 + (1/3)·sqrt(δ/2M) + (1/9)·(δ/2M)] − δ for δ < 2M, else M."""
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


# the largest factor a float holds: beyond it a job expects to spend more than e^709 times its useful time
_LOG_MAX = math.log(sys.float_info.max)


def wall_factor(interval: float, delta: float, restart: float, mtbf: float) -> float:
    """Daly 2006 eq. 13 per unit of useful work: M·e^{R/M}·(e^{(τ+δ)/M} − 1) / τ, summed in logarithms so that no
    MTBF overflows it: ln M + R/M + ln(e^x − 1) − ln τ with x = (τ+δ)/M, ln(e^x − 1) = x + ln(1 − e^{−x}) for large
    x. A job interrupted far more often than it can restart makes no progress: its factor is infinite (``stalls``)."""
    x = (interval + delta) / mtbf
    log_expm1 = math.log(math.expm1(x)) if x < 30 else x + math.log1p(-math.exp(-x))
    log_factor = math.log(mtbf) + restart / mtbf + log_expm1 - math.log(interval)
    return math.exp(log_factor) if log_factor < _LOG_MAX else math.inf


def writer_share(model: ModelSpec, plan: Plan, gpus: int, sharded: bool, stack: Stack | None = None) -> float:
    """The bytes of the checkpoint the busiest rank writes (module docstring): 1/N of it where the framework shards
    it over every rank, else the first replica's weights over tp·tp2·pp·cp beside its optimizer partition."""
    size = checkpoint_bytes(model, plan, stack)
    if sharded:
        return size / gpus
    weights = size * WEIGHT_BYTES / (WEIGHT_BYTES + saved_state_bytes(plan, stack))
    model_parallel = plan.tp * plan.tp2 * plan.pp * plan.cp
    return weights / model_parallel + (size - weights) / (gpus if plan.zero else model_parallel)


def goodput(model: ModelSpec, plan: Plan, gpus: int, rel: Reliability, writer_bytes: float = 0.0,
            host_bandwidth: float = 0.0, stack: Stack | None = None) -> Goodput:
    """The failure accounting of ``plan`` on ``gpus`` GPUs (module docstring); ``writer_bytes``: what the busiest rank
    writes through its ``host_bandwidth`` (0: no per-rank limit); ``stack``: whose optimizer state the checkpoint
    holds (``saved_state_bytes``)."""
    mtbf = rel.mtbf_gpu_hours * 3600 / gpus
    size = checkpoint_bytes(model, plan, stack)
    delta = size / rel.checkpoint_bandwidth
    if writer_bytes and host_bandwidth:
        delta = max(delta, writer_bytes / host_bandwidth)
    restart = rel.restart_s + delta  # the checkpoint is read back at the bandwidth it was written at
    tau = optimum_interval(delta, mtbf)
    return Goodput(job_mtbf_s=mtbf, checkpoint_bytes=size, checkpoint_s=delta, restart_s=restart, interval_s=tau,
                   factor=wall_factor(tau, delta, restart, mtbf))


def replica_goodput(model: ModelSpec, plan: Plan, gpus: int, rel: Reliability, step_time: float,
                    link_bandwidth: float, stack: Stack | None = None) -> Goodput:
    """Recovery by replicas (module docstring): each failure costs one of the plan's dp replicas its restart, its heal
    (its GPUs' share of a replica's state over ``link_bandwidth`` each) and half a step."""
    mtbf = rel.mtbf_gpu_hours * 3600 / gpus
    size = checkpoint_bytes(model, plan, stack)
    heal = size / (gpus // plan.dp) / link_bandwidth
    lost = (rel.restart_s + heal + step_time / 2) / mtbf / plan.dp
    factor = 1.0 / (1.0 - lost) if lost < 1 else math.inf
    return Goodput(job_mtbf_s=mtbf, checkpoint_bytes=size, checkpoint_s=0.0, restart_s=rel.restart_s,
                   interval_s=0.0, factor=factor, recovery="replica", heal_s=heal)


def holds_copies(plan: Plan) -> bool:
    """Whether ``plan``'s data-parallel replicas each hold a whole copy of the model state (dp ≥ 2, zero 0)."""
    return plan.dp >= 2 and plan.zero == 0


def plan_goodput(est: Estimate, rel: Reliability) -> Goodput:
    """``est``'s plan under ``rel`` (module docstring): recovered by replicas where asked for, the framework runs it
    (Supports.replica_recovery) and the plan's replicas hold whole copies; else restarted from checkpoints written as
    its framework writes them (Supports.sharded_checkpoint) through each rank's host link."""
    can, gpus = est.stack.supports, est.cluster.num_gpus
    if rel.recovery == "replica" and can.replica_recovery and holds_copies(est.plan):
        link = est.cluster.tiers[min(1, len(est.cluster.tiers) - 1)].bandwidth
        return replica_goodput(est.model, est.plan, gpus, rel, est.step_time, link, est.stack)
    return restart_goodput(est.model, est.cluster, est.plan, can.sharded_checkpoint, rel, est.stack)


def restart_goodput(model: ModelSpec, cluster: Cluster, plan: Plan, sharded: bool, rel: Reliability,
                    stack: Stack | None = None) -> Goodput:
    """``plan`` restarted from checkpoints written as its framework writes them (``sharded``: over every rank) through
    each rank's host link: no step time read (search/by_goodput.py ranks unestimated plans by it)."""
    share = writer_share(model, plan, cluster.num_gpus, sharded, stack)
    return goodput(model, plan, cluster.num_gpus, rel, share, cluster.host_bandwidth, stack)
