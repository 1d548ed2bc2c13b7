"""The optimizer wrapper DeepSpeed's engine picks per plan (cost/wrappers.py; deepspeed/runtime/engine.py
_do_optimizer_sanity_check, 0.19.8) and what its per-parameter loops add to a step."""

from __future__ import annotations

import math

import pytest

from meshplan.cost.wrappers import DEEPSPEED_BF16, DEEPSPEED_FP16, DEEPSPEED_ZERO, deepspeed_wrapper, wrapped
from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack


@pytest.mark.parametrize("zero, precision, grad_bytes, offload, pipeline, expected", [
    (1, "bf16", 4, False, False, "bf16"),   # stage 1, bf16 weights, fp32 accumulation: BF16_Optimizer
    (1, "bf16", 4, True, False, "zero"),    # ... but not with the optimizer on the CPU
    (1, "bf16", 2, False, False, "zero"),   # bf16 accumulation: the ZeRO optimizer
    (2, "bf16", 4, False, True, "zero"),    # stage 2 always
    (3, "fp16", 2, False, False, "zero"),
    (1, "fp16", 4, False, False, "zero"),   # fp16 under ZeRO: the ZeRO optimizer
    (0, "fp16", 2, False, True, "fp16"),    # no ZeRO, fp16: FP16_Optimizer (fused)
    (0, "bf16", 4, False, True, "bf16"),    # no ZeRO, bf16 under the pipeline engine: BF16_Optimizer
    (0, "bf16", 2, False, False, "fp16"),   # no ZeRO, bf16 outside it: FP16_Optimizer's class in bf16 (DDP_BFLOAT16)
    (0, "fp32", 4, False, False, "none"),   # fp32 weights: no wrapper
])
def test_the_wrapper_is_deepspeeds_choice(zero, precision, grad_bytes, offload, pipeline, expected):
    plan = Plan(dp=8, zero=zero, precision=precision, grad_bytes=grad_bytes, offload_optimizer=offload)
    assert deepspeed_wrapper(plan, pipeline) == expected


def test_a_stated_stack_keeps_its_own_loops():
    stack = Stack(tensor_host=40e-6, tensor_sharded=True)
    assert wrapped(stack, Plan(dp=8, zero=0, precision="fp16")) is stack


@pytest.mark.parametrize("preset, zero, precision, per_tensor, tensors", [
    # GPT-2 (148 tensors) on 8 DGX A100 GPUs (python_host 1.55), dp 8
    ("megatron-deepspeed", 0, "fp16", DEEPSPEED_FP16, 148),   # FP16_Optimizer over every tensor
    ("megatron-deepspeed", 0, "bf16", DEEPSPEED_BF16, 148),   # BF16_Optimizer under the pipeline engine
    ("megatron-deepspeed", 1, "fp16", DEEPSPEED_ZERO, 18.5),  # the ZeRO-1 optimizer over its shard: 148 / 8
    ("deepspeed", 0, "bf16", DEEPSPEED_FP16, 148),            # outside the pipeline engine: FP16_Optimizer's class
    ("deepspeed", 3, "bf16", DEEPSPEED_ZERO, 148),            # ZeRO-3 checks every tensor's partition
])
def test_the_step_pays_the_wrapper_the_plan_runs(preset, zero, precision, per_tensor, tensors):
    """optimizer/host = tensors walked x the wrapper's cost x 1.55, and the step grows by as much as the optimizer."""
    model, cluster = load_model("gpt2"), load_system("a100").cluster(8)
    plan = Plan(dp=8, micro_batch=4, global_batch=32, recompute="none", zero=zero, precision=precision,
                grad_bytes=4 if zero == 1 and precision == "bf16" else 2)
    stack = load_stack(preset)
    est = estimate(model, cluster, plan, stack)
    row = {r.name: r for r in est.ops}["optimizer/host"]
    assert math.isclose(row.seconds, tensors * per_tensor * 1.55, rel_tol=1e-9)
    bare = estimate(model, cluster, plan, stack.with_(optimizer_wrapper="stated", tensor_host=0.0))
    assert math.isclose(est.step_time - bare.step_time, row.seconds, rel_tol=1e-6)


def test_a_stated_tensor_host_on_the_command_line_overrides_the_picked_wrapper():
    """--tensor-host on a DeepSpeed preset states the wrapper's cost (optimizer_wrapper becomes "stated") unless
    --optimizer-wrapper is given too."""
    from meshplan.cli.options import stack_with

    stack = load_stack("deepspeed")
    assert stack_with(stack, {"tensor_host": 1e-5}).optimizer_wrapper == "stated"
    assert stack_with(stack, {"tensor_host": 1e-5, "optimizer_wrapper": "deepspeed"}).optimizer_wrapper == "deepspeed"
    assert stack_with(stack, {"fusion": "eager"}).optimizer_wrapper == "deepspeed"
