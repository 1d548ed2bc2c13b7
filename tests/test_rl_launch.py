"""RL launches checked by the frameworks' own config code (DESIGN.md example 18): verl's Hydra configs composed with the
emitted overrides and verl's ``validate_config`` run on them (its actor, reference and rollout dataclasses built from
them); OpenRLHF's own argparse parser and argument checks (the ``__main__`` block of openrlhf/cli/train_ppo_ray.py up to
``train(args)``) run on the emitted command line. verl 0.9.1 and OpenRLHF 0.11.2 are installed without their
dependencies (.ci/install-extras.sh: their pins of transformers conflict with the dev extra's), with the few they
import to load their configs (the ``rl`` extra)."""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from meshplan import Plan, load_model, load_system
from meshplan.errors import SpecError
from meshplan.rl import RLJob, RLPlan, rl_estimate
from meshplan.rl.launch import rl_launch_text
from meshplan.rl.openrlhf import openrlhf_args, openrlhf_refusal
from meshplan.rl.verl import verl_launch, verl_refusal
from meshplan.serve.plan import ServePlan
from meshplan.specs.stack import load_stack

H100 = load_system("h100")
QWEN = load_model("qwen3-30b-a3b")
LLAMA = load_model("llama3-8b")
JOB = RLJob(prompts=512, samples_per_prompt=8, input_len=1024, output_len=4096, mini_batches=4)


def _root(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"{package} is not installed (the rl extra)"
    return Path(spec.submodule_search_locations[0])


@pytest.fixture(scope="module")
def colocated_moe():
    plan = RLPlan(setup="colocated", trainer=Plan(dp=8, pp=2, ep=8, micro_batch=2, global_batch=1024,
                                                  offload_optimizer=True),
                  engine=ServePlan(tp=1, dpa=8, ep=8, batch=1536, replicas=2), train_gpus=16, rollout_gpus=16,
                  offload="all")
    return rl_estimate(QWEN, H100, JOB, plan, load_stack("megatron-core"))


@pytest.fixture(scope="module")
def split_moe():
    plan = RLPlan(setup="split", trainer=Plan(dp=8, ep=8, micro_batch=1, global_batch=1024),
                  engine=ServePlan(tp=1, dpa=8, ep=8, batch=1024, replicas=1), train_gpus=8, rollout_gpus=8)
    return rl_estimate(QWEN, H100, JOB, plan, load_stack("megatron-core"))


def compose_verl(entry: str, config: str, overrides: list[str], monkeypatch):
    """verl's config of ``entry`` composed with ``overrides`` by Hydra (the recipes' configs find the trainer's
    through their ``hydra.searchpath``, relative to the directory that holds the verl package)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    root = _root("verl")
    folder = {"verl.trainer.main_ppo": root / "trainer" / "config"}.get(
        entry, root / "experimental" / entry.split(".")[2] / "config")
    monkeypatch.chdir(root.parent)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(folder), version_base=None):
        return compose(config_name=config, overrides=overrides)


@pytest.mark.parametrize("which", ["colocated_moe", "split_moe"])
def test_verl_validates_the_launch(which, request, monkeypatch):
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    e = request.getfixturevalue(which)
    assert verl_refusal(e) is None
    entry, config, overrides = verl_launch(e, "Qwen/Qwen3-30B-A3B")
    cfg = compose_verl(entry, config, overrides, monkeypatch)
    validate_config(cfg, use_reference_policy=e.job.uses_reference, use_critic=e.job.uses_critic)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    t, g = e.update.plan, e.plan.engine
    megatron = cfg.actor_rollout_ref.actor.megatron
    assert (megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size,
            megatron.expert_model_parallel_size) == (t.tp, t.pp, t.ep)
    assert (rollout.tensor_model_parallel_size, rollout.data_parallel_size, rollout.max_num_seqs) == \
        (g.tp, g.dpa, g.batch)
    assert cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n == e.job.sequences  # 512 x 8
    gpus = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    assert gpus == e.plan.train_gpus
    if not e.plan.way.shared:
        assert cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node == e.plan.rollout_gpus


def test_verl_refuses_a_layout_it_cannot_run(colocated_moe):
    fsdp = rl_estimate(LLAMA, H100, RLJob(prompts=64, samples_per_prompt=4, input_len=256, output_len=256),
                       RLPlan(setup="colocated", trainer=Plan(dp=4, tp=2, micro_batch=4, global_batch=256, zero=3),
                              engine=ServePlan(tp=1, replicas=8, batch=256), train_gpus=8, rollout_gpus=8),
                       load_stack("pytorch-fsdp"))
    assert "no tensor, pipeline or expert parallelism" in verl_refusal(fsdp)


def openrlhf_parse(args: list[str], monkeypatch):
    """OpenRLHF's own parser and checks on ``args`` (module docstring): the statements of its ``__main__`` block up to
    ``train(args)``, with the standard-library imports of its module."""
    path = _root("openrlhf") / "cli" / "train_ppo_ray.py"
    tree = ast.parse(path.read_text())
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    body = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
            and (getattr(n, "module", None) or n.names[0].name).split(".")[0] in ("argparse", "os", "datetime")]
    for stmt in main.body:
        if "train(args)" in ast.unparse(stmt):
            break
        body.append(stmt)
    assert any("parse_args" in ast.unparse(s) for s in body)  # the parser really is run
    monkeypatch.setattr(sys, "argv", ["train_ppo_ray", *args])
    space: dict = {"__name__": "openrlhf_check"}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), space)  # noqa: S102
    return space["args"]


@pytest.mark.parametrize("setup", ["colocated", "split", "async"])
def test_openrlhf_parses_the_launch(setup, monkeypatch):
    job = RLJob(prompts=128, samples_per_prompt=8, input_len=1024, output_len=1024, mini_batches=4)
    shared = setup == "colocated"
    plan = RLPlan(setup=setup, trainer=Plan(dp=8 if shared else 4, micro_batch=2, global_batch=256, zero=3),
                  engine=ServePlan(tp=2, batch=256, replicas=4 if shared else 2), train_gpus=8 if shared else 4,
                  rollout_gpus=8 if shared else 4, offload="all" if shared else "none")
    e = rl_estimate(LLAMA, H100, job, plan, load_stack("deepspeed"))
    assert openrlhf_refusal(e) is None
    args = openrlhf_parse(openrlhf_args(e, "meta-llama/Llama-3.1-8B"), monkeypatch)
    assert (args.vllm.num_engines, args.vllm.tensor_parallel_size) == (plan.engine.replicas, 2)
    assert (args.ds.zero_stage, args.train.micro_batch_size, args.train.batch_size) == (3, 2, 256)
    assert args.rollout.batch_size * args.rollout.n_samples_per_prompt == job.sequences
    assert args.train.colocate_all == shared and args.train.async_enable == (not shared)
    assert args.train.partial_rollout_enable == (setup == "async")


def test_openrlhf_refuses_pipelines(split_moe):
    assert "no pipeline or expert parallelism" in openrlhf_refusal(split_moe)
    with pytest.raises(SpecError, match="--emit openrlhf: OpenRLHF trains with DeepSpeed"):
        rl_launch_text((split_moe,), "openrlhf", "Qwen/Qwen3-30B-A3B")


def test_the_launch_names_its_plan(colocated_moe):
    text, rank = rl_launch_text((colocated_moe,), "verl", "Qwen/Qwen3-30B-A3B")
    assert rank == 1 and text.startswith("# verl: colocated (16 GPUs)")
    assert "python3 -m verl.trainer.main_ppo --config-name ppo_megatron_trainer" in text
    assert os.linesep not in text.split("\n", 1)[0]


def test_verl_takes_an_fsdp_ppo_launch(monkeypatch):
    """An FSDP trainer (verl's fsdp2 strategy) with PPO's critic: the overrides compose (Hydra refuses an unknown key)
    and the actor, reference and rollout validate; the critic's keys compose too (its validation would load the
    model's files from the Hub)."""
    from verl.utils.config import validate_config

    job = RLJob(prompts=64, samples_per_prompt=4, input_len=256, output_len=256, mini_batches=2, algorithm="ppo")
    plan = RLPlan(setup="colocated", trainer=Plan(dp=8, micro_batch=4, global_batch=128, zero=3),
                  engine=ServePlan(tp=1, batch=256, replicas=8), train_gpus=8, rollout_gpus=8, offload="all")
    e = rl_estimate(LLAMA, H100, job, plan, load_stack("pytorch-fsdp"))
    assert verl_refusal(e) is None
    cfg = compose_verl(*verl_launch(e, "meta-llama/Llama-3.1-8B"), monkeypatch)
    validate_config(cfg, use_reference_policy=True, use_critic=False)
    assert cfg.actor_rollout_ref.actor.strategy == cfg.critic.strategy == "fsdp2"
    assert cfg.actor_rollout_ref.actor.fsdp_config.param_offload and cfg.critic.fsdp.param_offload
    assert cfg.algorithm.adv_estimator == "gae"
