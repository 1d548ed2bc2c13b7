"""Every plan the search returns for a framework is one its config expresses: emitted in the framework's own
format it reads back to the same plan and the same step time (the frameworks with a config format of meshplan's:
configs/)."""

from __future__ import annotations

import pytest

from meshplan.configs import emit, read
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.stack import load_stack

FORMATS = [("megatron-core", "megatron"), ("megatron-bridge", "nemo"), ("nemo", "nemo"),
           ("torchtitan", "torchtitan"), ("deepspeed", "deepspeed")]


@pytest.mark.parametrize(("framework", "fmt"), FORMATS)
@pytest.mark.parametrize(("model_name", "gpus", "batch"), [("llama3-8b", 32, 256), ("qwen3-30b-a3b", 16, 128)])
def test_the_searched_plans_of_a_framework_emit_and_read_back(framework, fmt, model_name, gpus, batch):
    model, cluster, stack = load_model(model_name), load_system("h100").cluster(gpus), load_stack(framework)
    # no headroom, by time alone (the plans this test has always read back: with Space's defaults, torchtitan's top 12
    # for qwen3-30b-a3b holds a tp > 1 plan without sequence parallelism, which its TP cannot express)
    result = search(model, cluster, Space(global_batch=batch, stack=stack, headroom=0.0, prefer_simple=False), top_k=12)
    assert result.plans
    for est in result.plans:
        text = emit(fmt, model, est.plan, est.stack)
        plan, again = read(fmt, model, gpus, text=text)
        assert plan == est.plan, (framework, est.plan.describe(), plan.describe())
        assert estimate(model, cluster, plan, again).step_time == est.step_time
