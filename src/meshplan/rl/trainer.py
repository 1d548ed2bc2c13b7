"""The trainer's phases on training's physics (estimate.py): the policy (and critic) update, and the forward-only
passes that score the rollouts: the behaviour policy's log-probabilities, the reference's, the critic's values and a
reward model's scores.

- Update: ``RLJob.updates`` optimizer steps (epochs × mini-batches), each a training step of the mini-batch's
  sequences at the packed mean length (``RLJob.train_seq``) under the trainer's plan: ``estimate(...).step_time``,
  its micro-batches, pipeline bubble, gradient reduction and optimizer step as training prices them.
- A forward-only pass over the batch (Megatron's ``forward_backward_func(forward_only=True)``, verl's
  ``compute_log_prob``): m micro-batches of ``forward_micro_batch`` sequences per data-parallel rank through the
  pipeline, a flow shop of identical jobs: (m − 1)·max_r t_f(r) + Σ_r t_f(r), t_f(r) rank r's forward of one
  micro-batch with its exposed communication (step/assemble.StepCosts.ranks: the first, a middle and the last rank).
  A value model's head has one output where the policy's has the vocabulary: its pass is priced as the policy's
  (an overestimate of its head, a stated simplification).
- The reference model's weights wait in host memory between its passes and are loaded for them (verl's reference
  ``param_offload``, NeMo-RL's reference state dict kept on the CPU): twice its weight shard over the host link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from meshplan.cost.records import ACT_BYTES, FP32, token_rows
from meshplan.estimate import Estimate, estimate
from meshplan.memory import layer_input_bytes
from meshplan.pipeline.registry import one_chunk
from meshplan.rl.job import RLJob
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import head_vocab
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

WORKING_COPIES = 4  # a forward's live residual-stream-sized tensors of one layer: input, norm out, attention, MLP


@dataclass(frozen=True)
class Forward:
    """One forward-only pass over the batch: its seconds, and the bytes per GPU of its working set."""

    seconds: float
    working: float


@dataclass(frozen=True)
class TrainerPhases:
    """Seconds per iteration of the trainer's phases (0 for a phase the job does not run) and what they stand on."""

    update: Estimate  # one optimizer step of the policy
    phases: dict[str, float]  # actor_update, critic_update, old_log_prob, reference, critic_values, reward, ref_load
    working: dict[str, float]  # bytes per GPU of each forward pass's working set


PAD = 128  # packed sequences padded to a multiple of this (NeMo-RL's make_sequence_length_divisible_by; Megatron's
# context parallelism splits a sequence into 2·cp chunks, so 2·cp must divide it: 128 holds up to cp = 64)


def trained_model(model: ModelSpec, job: RLJob) -> ModelSpec:
    """The model at the trainer's sequence: prompt and mean response, packed (``RLJob.train_seq``), padded to a
    multiple of ``PAD``."""
    return model.with_seq_length(-(-job.train_seq // PAD) * PAD)


def update_step(model: ModelSpec, pool: Cluster, plan: Plan, stack: Stack, job: RLJob) -> Estimate:
    """One optimizer step of ``plan`` (global batch: the mini-batch) on ``pool``."""
    return estimate(trained_model(model, job), pool, replace(plan, global_batch=job.mini_batch), stack)


def forward_pass(model: ModelSpec, pool: Cluster, plan: Plan, stack: Stack, job: RLJob, micro: int) -> Forward:
    """A forward-only pass over the job's batch under ``plan``'s layout with ``micro`` sequences per micro-batch
    (module docstring)."""
    m_model = trained_model(model, job)
    one = replace(plan, micro_batch=micro, global_batch=plan.dp * micro, recompute="none", stage_recompute=(),
                  offload_activations=False, offload_layers=0, stage_offload=(), vpp=1, schedule=one_chunk())
    est = estimate(m_model, pool, one, stack)
    assert est.detail is not None
    ranks = [float(f) for f, _ in est.detail.costs.ranks]  # first, middle, last
    first, middle, last = ranks[0], ranks[1], ranks[-1]
    through = first if plan.pp == 1 else first + last + (plan.pp - 2) * middle
    m = math.ceil(job.sequences / (plan.dp * micro))
    seconds = (m - 1) * max(ranks) + through
    rows = token_rows(m_model, one)[0]
    # log-probabilities are taken from fp32 logits (verl's logprobs_from_logits, NeMo-RL's upcast): FP32 bytes each
    working = rows * head_vocab(m_model) / one.tp * FP32 + WORKING_COPIES * float(layer_input_bytes(m_model, one))
    return Forward(seconds=seconds, working=float(working + rows * ACT_BYTES))


def trainer_phases(model: ModelSpec, pool: Cluster, plan: Plan, stack: Stack, job: RLJob,
                   forward_micro: int = 0) -> TrainerPhases:
    """The trainer's phases of one iteration (module docstring); ``forward_micro``: sequences per forward
    micro-batch (0: the plan's micro-batch)."""
    micro = forward_micro or plan.micro_batch
    step = update_step(model, pool, plan, stack, job)
    policy = forward_pass(model, pool, plan, stack, job, micro)
    phases = {"old_log_prob": 0.0 if job.rollout_logprobs else policy.seconds,
              "reference": policy.seconds if job.uses_reference else 0.0,
              "ref_load": 2 * step.memory["weights"] / pool.host_bandwidth if job.uses_reference else 0.0,
              "reward": 0.0, "critic_values": 0.0, "critic_update": 0.0,
              "actor_update": job.updates * step.step_time}
    working = {"old_log_prob": policy.working, "reference": policy.working}
    critic_model = job.reward_model or model
    if job.reward_model is not None:
        scored = forward_pass(job.reward_model, pool, plan, stack, job, micro)
        phases["reward"], working["reward"] = scored.seconds, scored.working
    if job.uses_critic:
        values = forward_pass(critic_model, pool, plan, stack, job, micro)
        phases["critic_values"], working["critic_values"] = values.seconds, values.working
        phases["critic_update"] = job.updates * update_step(critic_model, pool, plan, stack, job).step_time
    return TrainerPhases(update=step, phases=phases, working=working)
