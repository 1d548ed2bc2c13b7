"""DeepSpeed's own config class loads what meshplan emits: for the plans a DeepSpeed search returns, the ds_config
goes through ``deepspeed.runtime.config.DeepSpeedConfig`` (with its batch-size assertion: train_batch_size =
micro-batch x accumulation x data-parallel size) and reads back the plan's batch, ZeRO stage and offload."""

from __future__ import annotations

import json

import pytest

from meshplan.configs import emit
from meshplan.search import Space, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack


class _DataParallel:
    """The model-parallel unit DeepSpeedConfig asks for the data-parallel size (no process group needed)."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def test_deepspeed_loads_the_emitted_configs(monkeypatch):
    from deepspeed.runtime import config as ds

    monkeypatch.setattr(ds.dist, "get_rank", lambda *args, **kwargs: 0)  # as rank 0 of an initialised job
    model = load_model("llama3-8b")
    result = search(model, load_system("h100").cluster(32), Space(global_batch=256, stack=load_stack("deepspeed")),
                    top_k=8)
    assert len(result.plans) >= 4
    for est in result.plans:
        plan = est.plan
        loaded = ds.DeepSpeedConfig(json.loads(emit("deepspeed", model, plan, est.stack)), mpu=_DataParallel(plan.dp))
        assert (loaded.train_batch_size, loaded.train_micro_batch_size_per_gpu, loaded.gradient_accumulation_steps) \
            == (plan.global_batch, plan.micro_batch, plan.grad_accum)
        assert loaded.zero_optimization_stage == plan.zero
        assert (loaded.zero_config.offload_optimizer is not None) == plan.offload_optimizer


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3"])
def test_deepspeed_config_says_what_the_model_must_do(monkeypatch, name):
    """DeepSpeed's config holds no model: the training script builds it (Hugging Face's, whose parameter count is
    meshplan's: tests/test_hf_config.py builds llama-3-8b, mixtral-8x7b and deepseek-v3 from their config.json).
    The emitted file loads in DeepSpeedConfig and says the priced parameters, that the model itself must
    checkpoint its layers (recompute full: DeepSpeed's activation_checkpointing section turns nothing on by itself)
    and the launcher line."""
    from deepspeed.runtime import config as ds

    monkeypatch.setattr(ds.dist, "get_rank", lambda *args, **kwargs: 0)
    model = load_model(name)
    plan = Plan(dp=64, zero=3, recompute="full", global_batch=128)
    cfg = json.loads(emit("deepspeed", model, plan, load_stack("deepspeed")))
    loaded = ds.DeepSpeedConfig(cfg, mpu=_DataParallel(plan.dp))
    assert (loaded.train_batch_size, loaded.zero_optimization_stage) == (128, 3)
    notes = "\n".join(cfg["meshplan_notes"])
    assert f"{model.params():,} parameters" in notes and "gradient_checkpointing_enable()" in notes
    assert "deepspeed --hostfile HOSTFILE --num_nodes 8 --num_gpus 8" in notes
