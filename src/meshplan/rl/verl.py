"""An RL plan as verl's launch: its entry point, its Hydra config and the command-line overrides of its keys (verl
0.9.1: verl/trainer/config/ppo_megatron_trainer.yaml and ppo_trainer.yaml, the one-step-off and fully-async recipes'
configs under verl/experimental/). Every verl example is such a list of ``key=value`` overrides; the test composes
them with verl's own config files through Hydra and runs verl's ``validate_config`` on the result.

- set-up: colocated is verl's hybrid engine (``verl.trainer.main_ppo``); split is the one-step-off-policy recipe
  (``verl.experimental.one_step_off_policy.main_ppo``: ``rollout.nnodes`` / ``rollout.n_gpus_per_node`` its pool,
  NCCL weight transfer); async is the fully-async recipe (``verl.experimental.fully_async_policy.fully_async_main``,
  ``async_training.partial_rollout``).
- the trainer: Megatron-Core (``actor.megatron.*``: tensor / pipeline / virtual pipeline / context / expert /
  expert-tensor parallel sizes, sequence parallelism, the distributed optimizer, recompute through
  ``override_transformer_config``) or, for an FSDP stack, FSDP2 (``actor.strategy=fsdp2``, no tensor or pipeline
  parallelism: refused).
- the batch: ``data.train_batch_size`` prompts, ``rollout.n`` samples, ``actor.ppo_mini_batch_size`` in prompts
  (verl multiplies it by n), ``ppo_micro_batch_size_per_gpu`` the trainer's micro-batch, ``ppo_epochs``.
- the engine: ``rollout.tensor_model_parallel_size``, ``pipeline_model_parallel_size``, ``data_parallel_size`` (vLLM's
  data-parallel attention), ``expert_parallel_size``, ``max_num_seqs`` (the running limit per instance),
  ``gpu_memory_utilization`` (the share the plan gives it).
- colocated switches: ``param_offload`` / ``optimizer_offload`` from the plan's offload (verl's Megatron engine
  offloads gradients with its parameters).
"""

from __future__ import annotations

from meshplan.pipeline.registry import MEGATRON_CORE, in_framework
from meshplan.rl.estimate import RLEstimate
from meshplan.specs.layouts import layout_of

ENTRY = {"colocated": ("verl.trainer.main_ppo", "ppo_megatron_trainer", "ppo_trainer"),
         "split": ("verl.experimental.one_step_off_policy.main_ppo", "one_step_off_ppo_megatron_trainer",
                   "one_step_off_ppo_trainer"),
         "async": ("verl.experimental.fully_async_policy.fully_async_main", "fully_async_ppo_megatron_trainer",
                   "fully_async_ppo_trainer")}
# verl's rollout.name for the engine preset that priced the rollout: SGLang's own; every other engine (vLLM's
# versions, TensorRT-LLM, LMDeploy, generic) as vLLM, verl's default rollout
_ROLLOUT = {"sglang": "sglang"}
_ESTIMATOR = {"ppo": "gae", "grpo": "grpo", "dapo": "grpo", "rloo": "rloo", "reinforce++": "reinforce_plus_plus"}


def verl_refusal(e: RLEstimate) -> str | None:
    """Why verl cannot run ``e`` as planned, or None."""
    t, job = e.update.plan, e.job
    fsdp = e.stack.fsdp_mode.shards
    if job.prompts % job.mini_batches:
        return (f"verl counts ppo_mini_batch_size in prompts: mini_batches={job.mini_batches} must divide "
                f"prompts={job.prompts}")
    if fsdp and (t.tp > 1 or t.pp > 1 or t.ep > 1):
        return f"verl's FSDP trainer has no tensor, pipeline or expert parallelism (plan tp={t.tp} pp={t.pp} ep={t.ep})"
    if not fsdp and t.zero > 1:
        return f"verl's Megatron trainer shards the optimizer (ZeRO-1, the distributed optimizer), not zero={t.zero}"
    if not layout_of(t.tensor_layout).in_frameworks or t.schedule not in in_framework(MEGATRON_CORE):
        return f"verl's Megatron runs 1D tensor parallelism and 1F1B (plan: {t.tensor_layout}, {t.schedule})"
    if e.plan.sync_method != e.plan.way.sync:
        return f"verl moves weights by its set-up's own transfer, not {e.plan.sync_method}"
    for gpus in {e.plan.train_gpus, e.plan.rollout_gpus}:
        if nodes(gpus, e.cluster.nvlink_domain) is None:
            return (f"verl places a pool as nnodes x n_gpus_per_node: {gpus} GPUs on nodes of "
                    f"{e.cluster.nvlink_domain} fit no such grid")
    return None


def _trainer(e: RLEstimate, role: str) -> list[str]:
    """The trainer's layout under ``role`` (the actor, the reference: its weights loaded for its pass, the critic)."""
    t, offload = e.update.plan, ("all" if role.endswith(".ref") else e.plan.offload)
    if e.stack.fsdp_mode.shards:
        engine = "fsdp" if role == "critic" else "fsdp_config"  # verl's critic keeps its FSDP engine under "fsdp"
        return [f"{role}.strategy=fsdp2", f"{role}.{engine}.param_offload={offload == 'all'}",
                f"{role}.{engine}.optimizer_offload={offload != 'none' or t.offload_optimizer}",
                f"{role}.ulysses_sequence_parallel_size={t.cp}"]
    out = [f"{role}.megatron.tensor_model_parallel_size={t.tp}", f"{role}.megatron.pipeline_model_parallel_size={t.pp}",
           f"{role}.megatron.context_parallel_size={t.cp}", f"{role}.megatron.expert_model_parallel_size={t.ep}",
           f"{role}.megatron.expert_tensor_parallel_size={t.etp or t.tp}",
           f"{role}.megatron.sequence_parallel={bool(t.sequence_parallel) and t.tp > 1}",
           f"{role}.megatron.use_distributed_optimizer={t.zero >= 1}",
           f"{role}.megatron.param_offload={offload == 'all'}",
           f"{role}.megatron.optimizer_offload={offload != 'none' or t.offload_optimizer}"]
    if t.vpp > 1:
        out.append(f"{role}.megatron.virtual_pipeline_model_parallel_size={t.vpp}")
    if t.recompute != "none":
        out.append(f"++{role}.megatron.override_transformer_config.recompute_granularity={t.recompute}")
        if t.recompute == "full":
            out += [f"++{role}.megatron.override_transformer_config.recompute_method=uniform",
                    f"++{role}.megatron.override_transformer_config.recompute_num_layers=1"]
    return out


def _rollout(e: RLEstimate) -> list[str]:
    g, job = e.plan.engine, e.job
    micro = e.plan.forward_micro_batch or e.update.plan.micro_batch
    r = "actor_rollout_ref.rollout"
    out = [f"{r}.name={_ROLLOUT.get(e.engine.name, 'vllm')}",
           f"{r}.n={job.samples_per_prompt}", f"{r}.tensor_model_parallel_size={g.tp}",
           f"{r}.pipeline_model_parallel_size={g.pp}", f"{r}.data_parallel_size={g.dpa}",
           f"{r}.expert_parallel_size={g.ep}", f"{r}.max_num_seqs={g.batch}",
           f"{r}.max_num_batched_tokens={e.engine.max_batched_tokens}",
           f"{r}.gpu_memory_utilization={e.engine.memory_utilization:.3f}",
           f"{r}.log_prob_micro_batch_size_per_gpu={micro}",
           f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}"]
    if e.plan.way.shared:
        out.append(f"{r}.free_cache_engine=True")
    return out


def nodes(gpus: int, domain: int) -> tuple[int, int] | None:
    """A pool as verl's resource pools place it, nnodes × n_gpus_per_node on nodes of ``domain`` GPUs; None where no
    such grid holds it."""
    count = -(-gpus // domain)
    return (count, gpus // count) if gpus % count == 0 else None


def _pools(e: RLEstimate) -> list[str]:
    domain = e.cluster.nvlink_domain
    p = e.plan
    tn, tg = nodes(p.train_gpus, domain) or (1, p.train_gpus)
    out = [f"trainer.nnodes={tn}", f"trainer.n_gpus_per_node={tg}"]
    if not p.way.shared:
        rn, rg = nodes(p.rollout_gpus, domain) or (1, p.rollout_gpus)
        out += [f"rollout.nnodes={rn}", f"rollout.n_gpus_per_node={rg}"]
    if p.way.streaming:
        out += ["async_training.partial_rollout=True",
                f"async_training.trigger_parameter_sync_step={e.job.mini_batches}"]
    return out


def verl_launch(e: RLEstimate, model_ref: str) -> tuple[str, str, list[str]]:
    """(the module to run, the config name, the overrides) of ``e`` (module docstring); ``verl_refusal`` first."""
    job, t = e.job, e.update.plan
    entry, megatron, fsdp = ENTRY[e.plan.setup]
    config = fsdp if e.stack.fsdp_mode.shards else megatron
    a = "actor_rollout_ref.actor"
    overrides = [f"algorithm.adv_estimator={_ESTIMATOR[job.algorithm]}", f"data.train_batch_size={job.prompts}",
                 f"data.max_prompt_length={job.input_len}", f"data.max_response_length={job.output_len}",
                 f"actor_rollout_ref.model.path={model_ref}",
                 f"{a}.ppo_mini_batch_size={job.prompts // job.mini_batches}",
                 f"{a}.ppo_micro_batch_size_per_gpu={t.micro_batch}", f"{a}.ppo_epochs={job.epochs}",
                 f"{a}.use_kl_loss={job.uses_reference and not job.uses_critic}",
                 f"algorithm.use_kl_in_reward={job.uses_reference and job.uses_critic}",
                 *_trainer(e, a), *_trainer(e, "actor_rollout_ref.ref"), *_rollout(e), *_pools(e)]
    if job.algo.dynamic_sampling:
        overrides.append("algorithm.filter_groups.enable=True")
    if job.uses_critic:
        overrides += [f"critic.ppo_micro_batch_size_per_gpu={t.micro_batch}", *_trainer(e, "critic"),
                      f"critic.model.path={model_ref}"]
    return entry, config, overrides


def verl_script(e: RLEstimate, model_ref: str) -> str:
    """The launch as a shell command (one override a line)."""
    entry, config, overrides = verl_launch(e, model_ref)
    lines = [f"python3 -m {entry} --config-name {config}", *overrides]
    header = (f"# verl: {e.plan.describe()}\n# predicted by meshplan: {e.iteration_time:.1f} s per iteration "
              f"(±{e.error_band:.0%})\n")
    return header + " \\\n    ".join(lines) + "\n"
