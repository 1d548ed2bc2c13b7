"""The optimizer wrapper DeepSpeed's engine picks per plan (cost/wrappers.py; deepspeed/runtime/engine.py
_do_optimizer_sanity_check, 0.19.8) and what its per-parameter loops add to a step."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from meshplan.cost.wrapper_work import work_of
from meshplan.cost.wrappers import (
    DEEPSPEED_BF16,
    DEEPSPEED_FP16,
    DEEPSPEED_ZERO,
    deepspeed_wrapper,
    partitioned_zero,
    wrapped,
)
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
    # GPT-2 (148 tensors) on 8 DGX A100 GPUs (python_host 1.34), dp 8
    ("megatron-deepspeed", 0, "fp16", DEEPSPEED_FP16, 148),   # FP16_Optimizer over every tensor
    ("megatron-deepspeed", 0, "bf16", DEEPSPEED_BF16, 148),   # BF16_Optimizer under the pipeline engine
    ("megatron-deepspeed", 1, "fp16", DEEPSPEED_ZERO, 18.5),  # the ZeRO-1 optimizer over its shard: 148 / 8
    ("deepspeed", 0, "bf16", DEEPSPEED_FP16, 148),            # outside the pipeline engine: FP16_Optimizer's class
    ("deepspeed", 3, "bf16", DEEPSPEED_ZERO, 148),            # ZeRO-3 checks every tensor's partition
])
def test_the_step_pays_the_wrapper_the_plan_runs(preset, zero, precision, per_tensor, tensors):
    """optimizer/host = tensors walked x the wrapper's cost x 1.34, and the step grows by as much as the optimizer
    (and, where the wrapper works on every micro-batch, BF16_Optimizer or ZeRO 2, by that besides:
    cost/wrapper_work.py)."""
    model, cluster = load_model("gpt2"), load_system("a100").cluster(8)
    plan = Plan(dp=8, micro_batch=4, global_batch=32, recompute="none", zero=zero, precision=precision,
                grad_bytes=4 if zero == 1 and precision == "bf16" else 2)
    stack = load_stack(preset)
    est = estimate(model, cluster, plan, stack)
    row = {r.name: r for r in est.ops}["optimizer/host"]
    assert math.isclose(row.seconds, tensors * per_tensor * 1.34, rel_tol=1e-9)
    bare = estimate(model, cluster, plan, stack.with_(optimizer_wrapper="stated", tensor_host=0.0))
    if work_of(plan, stack):
        assert est.step_time - bare.step_time > row.seconds * (1 + 1e-6)
    else:
        assert math.isclose(est.step_time - bare.step_time, row.seconds, rel_tol=1e-6)


def test_a_stated_tensor_host_on_the_command_line_overrides_the_picked_wrapper():
    """--tensor-host on a DeepSpeed preset states the wrapper's cost (optimizer_wrapper becomes "stated"); with
    --optimizer-wrapper deepspeed too, or --tensor-sharded alone, the stack refuses what it would drop."""
    from meshplan.cli.options import stack_with
    from meshplan.errors import SpecError

    stack = load_stack("deepspeed")
    assert stack_with(stack, {"tensor_host": 1e-5}).optimizer_wrapper == "stated"
    assert stack_with(stack, {"fusion": "eager"}).optimizer_wrapper == "deepspeed"
    for given in ({"tensor_host": 1e-5, "optimizer_wrapper": "deepspeed"}, {"tensor_sharded": True}):
        with pytest.raises(SpecError, match="picks per plan"):
            stack_with(stack, given)


def _deepspeeds_choice(precision: str, grad_bytes: int, zero: int, offload: bool, pipeline: bool) -> str:
    """DeepSpeed 0.19.8's own rule (runtime/engine.py DeepSpeedEngine._do_optimizer_sanity_check), run on an object
    that answers its questions as an engine with these settings would; its wrapper names as cost/wrappers.py's."""
    import torch
    from deepspeed.runtime import engine as ds

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[precision]

    class Settings:
        global_rank, pipeline_parallelism = 0, pipeline

        def get_data_types(self):
            return dtype, torch.float32 if grad_bytes == 4 else dtype

        def zero_optimization(self):
            return zero > 0

        def zero_optimization_stage(self):
            return zero

        def zero_cpu_offload(self):
            return offload

        def zero_compute_grad_norm(self):
            return True

        def zero_allow_untested_optimizer(self):
            return True

    try:
        picked = ds.DeepSpeedEngine._do_optimizer_sanity_check(Settings(), torch.optim.AdamW([torch.zeros(1)]))
    except NotImplementedError:
        return "refused"
    names = {ds.ZERO_OPTIMIZATION: "zero", ds.BFLOAT16: "bf16", ds.FP16: "fp16", ds.DDP_BFLOAT16: "fp16", None: "none"}
    name = names[picked]
    return "zero-fp32" if name == "zero" and precision == "fp32" and zero < 3 else name


def test_the_rule_agrees_with_deepspeeds_own_code_on_every_setting(monkeypatch):
    """Every precision x gradient bytes x ZeRO stage x offload x pipeline engine that DeepSpeed's engine accepts picks
    the wrapper deepspeed_wrapper picks (fp32 under ZeRO 1-2: the ZeRO optimizer without its overflow check, engine.py
    check_grad_overflow); the ones it refuses are the refusal fp32_grads_without_zero's."""
    pytest.importorskip("deepspeed")
    import deepspeed.comm

    from meshplan.specs.model_load import load_model
    from meshplan.specs.refusals import REFUSALS

    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda *args, **kwargs: 0)  # its check logs on rank 0 only

    rule, model, stack = REFUSALS["fp32_grads_without_zero"], load_model("gpt2"), load_stack("deepspeed")
    seen = set()
    for precision in ("fp16", "bf16", "fp32"):
        for grad_bytes in (2, 4):
            if precision == "fp32" and grad_bytes == 2:
                continue
            for zero in (0, 1, 2, 3):
                for offload in (False, True):
                    for pipeline in (False, True):
                        plan = Plan(dp=8, zero=zero, precision=precision, grad_bytes=grad_bytes,
                                    offload_optimizer=offload)
                        theirs = _deepspeeds_choice(precision, grad_bytes, zero, offload, pipeline)
                        seen.add(theirs)
                        assert bool(rule.test(plan, model, stack)) is (theirs == "refused"), (plan, pipeline)
                        if theirs != "refused":
                            assert deepspeed_wrapper(plan, pipeline) == theirs, (plan, pipeline)
    assert seen == {"zero", "zero-fp32", "bf16", "fp16", "none", "refused"}


@pytest.mark.parametrize("zero, offload, extra", [
    (1, False, 2),  # BF16_Optimizer: the model's bf16 .grad kept beside the fp32 buffer, 2 B a parameter unsharded
    (1, True, 0),   # the optimizer on the CPU: the ZeRO optimizer, no fp32 buffer of its own
    (2, False, 0),  # stage 2: the ZeRO optimizer
])
def test_bf16_optimizer_keeps_the_bf16_gradients_beside_its_fp32_buffer(zero, offload, extra):
    """Llama-3-8B on 8 H100s, dp 8, fp32 gradients: under DeepSpeed at ZeRO 1 the gradients a GPU holds are the fp32
    buffer's 4 B a parameter (counted as every stack's) plus the bf16 gradients autograd writes and BF16_Optimizer
    zeroes instead of freeing, 2 B: 6 B; the same plan under a stack that states its wrapper holds 4 B."""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(8)
    plan = Plan(dp=8, global_batch=8, zero=zero, grad_bytes=4, offload_optimizer=offload)
    ds = estimate(model, cluster, plan, load_stack("deepspeed"))
    plain = estimate(model, cluster, plan, Stack())
    params = ds.memory["weights"] / 2  # bf16 weights, unsharded below ZeRO 3
    assert ds.memory["grads"] - plain.memory["grads"] == pytest.approx(extra * params, rel=1e-9)
    assert ds.memory["optimizer"] == pytest.approx(plain.memory["optimizer"], rel=1e-9)


def test_bf16_optimizer_partitions_its_states_without_zero_too():
    """Megatron-DeepSpeed's pipeline engine runs BF16_Optimizer for bf16 weights at ZeRO 0 (engine.py
    _do_optimizer_sanity_check: bf16 model and accumulation dtypes under pipeline parallelism), which partitions its
    fp32 weights and Adam states over the data-parallel ranks and all-gathers its bf16 partitions after the step, as
    ZeRO 1 does: Llama-3-8B on 16 H100s, dp 8, pp 2, 16-bit gradients. Its optimizer state is a GPU's 12 B a parameter
    over 8, its step's DP traffic and update ZeRO 1's (reduce-scatter and all-gather, the update over its partition);
    DeepSpeed's engine without the pipeline engine runs the unpartitioned FP16_Optimizer class in bf16 there. (ZeRO 1
    with 16-bit gradients runs the ZeRO optimizer instead, without BF16_Optimizer's accumulation buffer.)"""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(16)
    plan = Plan(dp=8, pp=2, global_batch=64, micro_batch=2, zero=0, grad_bytes=2)
    mds = load_stack("megatron-deepspeed")
    assert partitioned_zero(plan, mds) == 1 and partitioned_zero(plan, load_stack("deepspeed")) == 0
    assert partitioned_zero(replace(plan, precision="fp16"), mds) == 0  # FP16_Optimizer: unpartitioned
    zero0, zero1 = estimate(model, cluster, plan, mds), estimate(model, cluster, replace(plan, zero=1), mds)
    unsharded = estimate(model, cluster, plan, load_stack("deepspeed").with_(overlap_dp=False))
    assert zero0.memory["optimizer"] == pytest.approx(unsharded.memory["optimizer"] / 8, rel=1e-9)
    assert zero0.memory["optimizer"] == pytest.approx(zero1.memory["optimizer"], rel=1e-12)
    rows0, rows1 = ({r.name: r.seconds for r in e.ops if r.phase == "step"} for e in (zero0, zero1))
    assert {"dp/grad_reduce_scatter", "dp/param_all_gather"} <= set(rows0) and "dp/grad_all_reduce" not in rows0
    for name in ("dp/grad_reduce_scatter", "dp/param_all_gather", "optimizer/adam"):
        assert rows0[name] == pytest.approx(rows1[name], rel=1e-12), name
