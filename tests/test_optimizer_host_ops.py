"""The stack presets' host time per parameter tensor (Stack.tensor_host) against the calls the frameworks' own
optimizers make per tensor, counted by benchmarks/measure/optimizer_host_ops.py on CPU: torch.optim.AdamW's
implementations, and DeepSpeed's ZeRO-2 optimizer and BF16_Optimizer run on DeepSpeed's CPU accelerator."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from meshplan.cost.wrappers import DEEPSPEED_BF16, DEEPSPEED_ZERO, deepspeed_wrapper
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

pytest.importorskip("torch")
_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "measure" / "optimizer_host_ops.py"
_SPEC = importlib.util.spec_from_file_location("optimizer_host_ops", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
ops = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ops)
# every DeepSpeed count below in one process of its own (ops.deepspeed_batch: DeepSpeed sets its accelerator and
# process group up at import, and its optimizer check imports torch's compiler, seconds of CPU a process), which the
# tests read their answers from (a child that fails fails every test that reads it)
MICROBATCH = ((1, "fp32"), (1, "bf16"), (2, "bf16"), (2, "fp32"), (3, "bf16"), (3, "fp32"))


@pytest.fixture(scope="module")
def deepspeed_found() -> dict:
    pytest.importorskip("deepspeed")
    keys = ["wrappers", "pipeline", *MICROBATCH]
    requests = [["zero", [[2, None, True], [1, "fp32", True]]], ["pipeline"],
                *(["microbatch", *setting] for setting in MICROBATCH)]
    return dict(zip(keys, ops.deepspeed_batch(requests), strict=True))


def test_torch_adamw_launches_per_tensor_only_in_its_loop_implementation():
    """foreach and fused launch a kernel per group of tensors, none per tensor (foreach reads its CPU step counters,
    2 scalar reads a tensor); the per-parameter loop launches lerp_, mul_ x2, addcmul_, sqrt, div, add_ x2, addcdiv_
    (9) and clip_grad_norm_'s norm and scale (2): 11 x 14.5 + 1 x 0.6 = 160.1 us a tensor on a DGX H100 host."""
    counts = ops.torch_counts()
    assert ops.split(counts["torch AdamW foreach + clip"]) == (0, 2)
    assert ops.split(counts["torch AdamW fused + clip"]) == (0, 0)
    loop = counts["torch AdamW for-loop + clip"]
    assert ops.split(loop) == (11, 1)
    assert ops.price(loop) == pytest.approx(11 * 14.5e-6 + 0.6e-6)


def test_deepspeed_wrappers_price_the_calls_deepspeed_makes(deepspeed_found):
    """ZeRO-2 (stage_1_and_2.py): 15 launching calls a tensor (the inf / nan check, the accumulated flag, the norm's
    cast and vector_norm) + 7 views -> 221.7 us, cost/wrappers.py's 220 us; BF16_Optimizer (bf16 with fp32 gradients
    at stage 1): 2 + 2 -> 30.2 us, its 30 us; each the wrapper DeepSpeed's engine itself picked for those settings,
    as cost/wrappers.deepspeed_wrapper picks it; both DeepSpeed presets take the wrapper per plan."""
    (zero2, calls2), (bf16, calls1) = ((found["optimizer"], found["calls"]) for found in deepspeed_found["wrappers"])
    assert (zero2, bf16) == ("DeepSpeedZeroOptimizer", "BF16_Optimizer")
    assert ops.split(calls2) == (15, 7) and ops.split(calls1) == (2, 2)
    assert ops.price(calls2) == pytest.approx(DEEPSPEED_ZERO, rel=0.02)
    assert ops.price(calls1) == pytest.approx(DEEPSPEED_BF16, rel=0.02)
    assert deepspeed_wrapper(Plan(dp=8, zero=2, precision="bf16", grad_bytes=4), pipeline=False) == "zero"
    assert deepspeed_wrapper(Plan(dp=8, zero=1, precision="bf16", grad_bytes=4), pipeline=False) == "bf16"
    assert load_stack("deepspeed").optimizer_wrapper == "deepspeed"
    assert load_stack("megatron-deepspeed").optimizer_wrapper == "deepspeed-pipeline"


def test_deepspeeds_bf16_optimizer_accumulates_each_gradient_every_micro_batch(deepspeed_found):
    """BF16_Optimizer (bf16 weights, fp32 gradient accumulation, ZeRO-1) adds to every micro-batch's backward, per
    parameter tensor, the cast of its bf16 gradient to fp32 and the add into the fp32 gradient (runtime/
    bf16_optimizer.py _update_hp_grad: _to_copy, add_, a view and two .data detaches): 2 x 14.5 + 3 x 0.6 = 30.8 us a
    tensor a micro-batch on a DGX H100 host, beyond the module's own backward. cost/wrappers.py prices the wrapper's
    per-step loops; this per-micro-batch cost, counted here (data/measured/2026-11-27-bf16-microbatch-host-ops.md),
    is cost/wrapper_work.py's "bf16" work (2 kernels a tensor)."""
    found = deepspeed_found[1, "fp32"]  # ops.microbatch_counts()'s default
    assert found["optimizer"] == "BF16_Optimizer"
    assert found["extra"] == {"_to_copy": 1.0, "add_": 1.0, "detach": 2.0, "view": 1.0}
    assert ops.split(found["extra"]) == (2, 3)
    assert ops.price(found["extra"]) == pytest.approx(30.8e-6)


def test_deepspeeds_pipeline_engine_accumulates_bf16_gradients_with_one_kernel_a_tensor(deepspeed_found):
    """Without ZeRO, in bf16 with bf16 gradient accumulation, DeepSpeed's pipeline engine runs BF16_Optimizer with a
    bf16 gradient buffer: each micro-batch adds each bf16 gradient into it (add_, a view, two .data detaches; the cast
    to the buffer's dtype is a no-op): 1 x 14.5 + 3 x 0.6 = 16.3 us a tensor a micro-batch on a DGX H100 host, one
    kernel, cost/wrapper_work.py's "bf16-bf16" work (data/measured/2026-11-27-bf16-pipeline-microbatch-host-ops.md)."""
    from meshplan.cost.wrapper_work import WORK

    found = deepspeed_found["pipeline"]
    assert found["optimizer"] == "BF16_Optimizer"
    assert found["extra"] == {"add_": 1.0, "detach": 2.0, "view": 1.0}
    assert ops.split(found["extra"]) == (WORK["bf16-bf16"][1], 3)
    assert ops.price(found["extra"]) == pytest.approx(16.3e-6)


def test_deepspeeds_zero_optimizer_works_on_every_micro_batch_at_stages_2_and_3(deepspeed_found):
    """DeepSpeed's ZeRO optimizer per micro-batch (not the step's last), per parameter tensor beyond the module's own
    backward: at stage 1 a view only (the gradients wait in autograd's buffers for the step's last micro-batch); at
    stage 2 the gradient hook copies each gradient into the reduction bucket and out to its partition, 2 copy_
    kernels, and a cast to fp32 first with fp32 accumulation (data/measured/2026-11-27-zero-microbatch-host-ops.md;
    cost/wrapper_work.WORK prices 2 and 3 kernels a tensor): 2 x 14.5 + 11 x 0.6 = 35.6 us and 3 x 14.5 + 11 x 0.6 =
    50.1 us a tensor on a DGX H100 host."""
    from meshplan.cost.wrapper_work import WORK

    one = deepspeed_found[1, "bf16"]
    assert (one["optimizer"], one["extra"]) == ("DeepSpeedZeroOptimizer", {"view": 1.0})
    two = deepspeed_found[2, "bf16"]
    assert two["extra"] == {"copy_": 2.0, "detach": 3.0, "slice": 2.0, "view": 6.0}
    assert ops.split(two["extra"]) == (WORK["zero2"][1], 11)
    assert ops.price(two["extra"]) == pytest.approx(35.6e-6)
    fp32 = deepspeed_found[2, "fp32"]
    assert fp32["extra"] == {"_to_copy": 1.0, "copy_": 2.0, "detach": 2.0, "slice": 4.0, "view": 5.0}
    assert ops.split(fp32["extra"]) == (WORK["zero2-fp32"][1], 11)
    assert ops.price(fp32["extra"]) == pytest.approx(50.1e-6)
    # stage 3: one copy into the bucket, and the cast first with fp32 accumulation
    three = deepspeed_found[3, "bf16"]
    assert (three["optimizer"], three["extra"]) == ("DeepSpeedZeroOptimizer_Stage3", {"copy_": 1.0, "detach": 1.0,
                                                                                      "slice": 4.0, "view": 4.0})
    assert ops.split(three["extra"]) == (WORK["zero3"][1], 9)
    assert ops.split(deepspeed_found[3, "fp32"]["extra"]) == (WORK["zero3-fp32"][1], 9)
