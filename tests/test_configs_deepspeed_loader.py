"""DeepSpeed's own config class loads what meshplan emits: for the plans a DeepSpeed search returns, the ds_config
goes through ``deepspeed.runtime.config.DeepSpeedConfig`` (with its batch-size assertion: train_batch_size =
micro-batch x accumulation x data-parallel size) and reads back the plan's batch, ZeRO stage and offload."""

from __future__ import annotations

import json

from meshplan.configs import emit
from meshplan.search import Space, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
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
