"""An RL plan as OpenRLHF's command line (OpenRLHF 0.11.2, openrlhf/cli/train_ppo_ray.py: its argparse options, dotted
since 0.10). The test runs OpenRLHF's own parser and its argument checks (the ``__main__`` block of that file, up to
``train(args)``) on the emitted arguments.

OpenRLHF trains with DeepSpeed (ZeRO stages, ``--ds.tensor_parallel_size`` AutoTP, ring attention
``--ds.ring_attn_size`` for context parallelism; no pipeline or expert parallelism) and generates with vLLM engines of
``--vllm.tensor_parallel_size`` GPUs (no pipeline or data-parallel attention in its engines).

- colocated: ``--train.colocate_all`` with vLLM's sleep mode (``--vllm.enable_sleep``) and DeepSpeed's
  (``--ds.enable_sleep``: the model and optimizer to the host while vLLM generates, the plan's ``all`` offload);
- split: the engines on their own GPUs; staleness 1 is ``--train.async_enable`` (generation one step ahead);
- async: that with ``--train.partial_rollout_enable`` (vLLM paused and resumed around the weight transfer).
The reference runs on the trainer's GPUs (``--train.colocate_actor_ref``), as meshplan prices it.
"""

from __future__ import annotations

import shlex

from meshplan.rl.estimate import RLEstimate
from meshplan.rl.verl import nodes
from meshplan.specs.layouts import layout_of

_ESTIMATOR = {"ppo": "gae", "grpo": "group_norm", "dapo": "group_norm", "rloo": "rloo", "reinforce++": "reinforce"}
REWARD_URL = "http://localhost:5000/get_reward"  # a rule-based reward served over HTTP (OpenRLHF's remote_rm_url)


def openrlhf_refusal(e: RLEstimate) -> str | None:
    """Why OpenRLHF cannot run ``e`` as planned, or None."""
    t, g, p = e.update.plan, e.plan.engine, e.plan
    if t.pp > 1 or t.ep > 1 or not layout_of(t.tensor_layout).in_frameworks:
        return f"OpenRLHF trains with DeepSpeed: no pipeline or expert parallelism (plan pp={t.pp} ep={t.ep})"
    if g.pp > 1 or g.dpa > 1:
        return f"OpenRLHF's vLLM engines are tensor-parallel only (plan pp={g.pp} dpa={g.dpa})"
    if p.way.shared and p.offload not in ("none", "all"):
        return f"OpenRLHF's DeepSpeed sleep moves the model and the optimizer together (offload all), not {p.offload}"
    if nodes(p.train_gpus, e.cluster.nvlink_domain) is None:
        return f"OpenRLHF places the actor as nodes x GPUs per node: {p.train_gpus} GPUs fit no such grid"
    if not p.way.shared and e.job.staleness > 1:
        return f"OpenRLHF's asynchronous training runs one step ahead, not staleness={e.job.staleness}"
    if e.job.algo.dynamic_sampling and e.job.oversample > 1:
        return None  # dynamic filtering draws more batches itself
    return None


def _nodes(e: RLEstimate, gpus: int) -> tuple[int, int]:
    """The training pool as Ray's placement: nodes × GPUs per node (verl.nodes' grid)."""
    return nodes(gpus, e.cluster.nvlink_domain) or (1, gpus)


def openrlhf_args(e: RLEstimate, model_ref: str) -> list[str]:
    """The command line of ``e`` (module docstring); ``openrlhf_refusal`` first."""
    job, t, g, p = e.job, e.update.plan, e.plan.engine, e.plan
    tn, tg = _nodes(e, p.train_gpus)
    args = ["--actor.num_nodes", tn, "--actor.num_gpus_per_node", tg, "--ref.num_nodes", tn,
            "--ref.num_gpus_per_node", tg, "--vllm.num_engines", g.replicas, "--vllm.tensor_parallel_size", g.tp,
            "--vllm.gpu_memory_utilization", f"{e.engine.memory_utilization:.3f}", "--ds.zero_stage", t.zero,
            "--ds.tensor_parallel_size", t.tp, "--ds.ring_attn_size", t.cp, "--ds.packing_samples",
            "--rollout.batch_size", job.prompts, "--rollout.n_samples_per_prompt", job.samples_per_prompt,
            "--rollout.micro_batch_size", p.forward_micro_batch or t.micro_batch,
            "--train.micro_batch_size", t.micro_batch, "--train.batch_size", job.mini_batch,
            "--train.max_epochs", job.epochs, "--data.max_len", job.input_len + job.output_len,
            "--rollout.max_new_tokens", job.output_len, "--algo.advantage.estimator", _ESTIMATOR[job.algorithm],
            "--actor.model_name_or_path", model_ref]
    if p.way.shared:
        args += ["--train.colocate_all", "--vllm.enable_sleep"] + (["--ds.enable_sleep"] if p.offload == "all" else [])
    else:
        args += ["--train.colocate_actor_ref"]
        args += ["--train.async_enable"] if job.staleness >= 1 else []
        args += ["--train.partial_rollout_enable"] if p.way.streaming else []
    args += ["--ds.adam_offload"] if t.offload_optimizer else []
    args += ["--actor.gradient_checkpointing_enable"] if t.recompute != "none" else []
    if job.uses_reference and not job.uses_critic:
        args += ["--algo.kl.use_loss"]
    if not job.uses_reference:
        args += ["--algo.kl.init_coef", "0"]
    if job.reward_model is None:
        args += ["--reward.remote_url", REWARD_URL]
    else:
        args += ["--reward.model_name_or_path", job.reward_model.name]
    if job.algo.dynamic_sampling:
        args += ["--algo.dynamic_filtering_enable"]
    return [str(a) for a in args]


def openrlhf_script(e: RLEstimate, model_ref: str) -> str:
    """The launch as a shell command, one option a line."""
    args = openrlhf_args(e, model_ref)
    pairs, i = [], 0
    while i < len(args):
        take = 2 if i + 1 < len(args) and not args[i + 1].startswith("--") else 1
        pairs.append(" ".join(shlex.quote(a) for a in args[i:i + take]))
        i += take
    header = (f"# OpenRLHF: {e.plan.describe()}\n# predicted by meshplan: {e.iteration_time:.1f} s per iteration "
              f"(±{e.error_band:.0%})\n")
    return header + " \\\n    ".join(["python3 -m openrlhf.cli.train_ppo_ray", *pairs]) + "\n"
