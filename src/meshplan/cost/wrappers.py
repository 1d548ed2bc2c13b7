"""The mixed-precision optimizer wrapper a framework runs for a plan (issue 46): its host seconds per parameter tensor
per optimizer step and whether its loops walk the tensors of its own ZeRO shard (cost/tensors.stepped,
step/host.step_host). ``Stack.optimizer_wrapper``:

- "stated": the stack's own ``tensor_host`` and ``tensor_sharded``;
- "deepspeed", "deepspeed-pipeline": DeepSpeed's engine picks the wrapper from the plan
  (deepspeed/runtime/engine.py ``_do_optimizer_sanity_check`` and ``_configure_optimizer``, 0.19.8): under ZeRO 1-3
  its ZeRO optimizer (stage_1_and_2.py, stage3.py), except bf16 weights with fp32 gradient accumulation at stage 1
  without CPU offload, which get BF16_Optimizer; without ZeRO, fp16 weights get FP16_Optimizer (fused when the
  inner optimizer is a FusedAdam, as Megatron-DeepSpeed's and the DeepSpeed JSON meshplan writes name it), bf16
  weights BF16_Optimizer under the pipeline engine ("deepspeed-pipeline": Megatron-DeepSpeed runs it even at pp 1
  unless --no-pipeline-parallel) and otherwise the same FP16_Optimizer class in bf16 (DDP_BFLOAT16); fp32 weights no
  wrapper without ZeRO, and under ZeRO 1-2 the ZeRO optimizer without its overflow check (engine.py sets
  check_grad_overflow only for fp16 or bf16). 16-bit weights with fp32 gradient accumulation without ZeRO raise
  (NotImplementedError "unsupported mix"): the presets refuse those plans (specs/refusals.py
  fp32_grads_without_zero), priced here as the 16-bit wrapper of their weights.

The per-tensor costs are the dispatcher calls each wrapper makes per tensor, counted in DeepSpeed's own code on CPU
(data/measured/2026-11-26-optimizer-host-ops.md §4; benchmarks/measure/optimizer_host_ops.py re-counts the first two), a
kernel-launching call at 14.5 us (specs/host_cost.py ``EAGER_OP_HOST``, its source there) and a view at 0.6 us on a DGX
H100 host, plus ~1 us per Python pass:
- ZeRO optimizer: 15 launching calls a tensor of its partition (the inf / nan check of runtime/utils.py: amax, amin,
  isfinite's 4 ops twice, logical and / not; the accumulated flag; the gradient norm's cast and vector_norm) + 7 views
  + ~5 passes: 15 x 14.5 + 7 x 0.6 + 5 ~ 220 us, over its shard at stages 1-2 (``params_in_partition``); stage3.py
  checks and norms every parameter's partition alike: taken at the same cost, over every tensor;
- BF16_Optimizer: 2 launching calls (the gradient norm, the clip) + 2 views + ~4 passes ~ 30 us, over the whole
  16-bit model on every rank (its get_grads_for_norm and clip loop over bf16_groups);
- FP16_Optimizer: 14 launching calls (the inf / nan check, the cast, the copy back) + 6 views: 14 x 14.5 + 6 x 0.6 =
  206.6 us over every tensor; its per-tensor overflow read (has_overflow_serial, one device sync a tensor) not priced;
- the ZeRO-1/2 optimizer with fp32 weights: 2 launching calls (the norm's cast and vector_norm) + 7 views = 33.2 us,
  counted alike (benchmarks/measure/optimizer_host_ops.py). meshplan's plans run 16-bit or narrower (specs/plan.py): the
  fp32 branches complete DeepSpeed's rule (tests/test_wrappers.py runs it on every setting) but no estimate reaches
  them.
"""

from __future__ import annotations

import copy

from meshplan.specs.host_cost import EAGER_OP_HOST
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

VIEW_HOST = 0.6e-6  # a view or detach op: no launch
DEEPSPEED_ZERO = 220e-6
DEEPSPEED_BF16 = 30e-6
DEEPSPEED_FP16 = 14 * EAGER_OP_HOST + 6 * VIEW_HOST  # 206.6 us
DEEPSPEED_ZERO_FP32 = 2 * EAGER_OP_HOST + 7 * VIEW_HOST  # 33.2 us
# wrapper -> (host seconds per tensor, walks its own shard at ZeRO 1-2)
DEEPSPEED_WRAPPERS = {"zero": (DEEPSPEED_ZERO, True), "zero-fp32": (DEEPSPEED_ZERO_FP32, True),
                      "bf16": (DEEPSPEED_BF16, False), "fp16": (DEEPSPEED_FP16, False), "none": (0.0, False)}


def deepspeed_wrapper(plan: Plan, pipeline: bool) -> str:
    """The wrapper DeepSpeed's engine runs for ``plan`` (module docstring): "zero", "zero-fp32", "bf16", "fp16" or
    "none"."""
    if plan.precision in ("fp32", "tf32"):
        return "none" if plan.zero == 0 else "zero-fp32" if plan.zero < 3 else "zero"
    bf16 = plan.precision != "fp16"  # fp8 / fp4 recipes keep bf16 weights
    if plan.zero >= 1:
        fp32_grads = plan.grad_bytes == 4
        return "bf16" if bf16 and fp32_grads and plan.zero == 1 and not plan.offload_optimizer else "zero"
    return "bf16" if bf16 and pipeline else "fp16"


def partitioned_zero(plan: Plan, stack: Stack) -> int:
    """The ZeRO stage whose partitioning and data-parallel traffic ``plan``'s optimizer wrapper runs: the plan's own,
    except without ZeRO under DeepSpeed's pipeline engine, whose BF16_Optimizer (``deepspeed_wrapper``) partitions its
    fp32 weights and optimizer states over the data-parallel ranks and all-gathers its bf16 partitions after each step
    whatever the stage (deepspeed 0.19.8 runtime/bf16_optimizer.py ``_setup_for_real_optimizer``, ``update_lp_params``):
    ZeRO 1's. Its fp32 gradient buffer stays whole, as at stage 1 (memory.model_states)."""
    if plan.zero == 0 and stack.wrapper.pipeline_engine and deepspeed_wrapper(plan, True) == "bf16":
        return 1
    return int(plan.zero)


def wrapped(stack: Stack, plan: Plan) -> Stack:
    """``stack`` with the per-tensor host cost and sharding of the wrapper it runs for ``plan`` (one ZeRO stage and
    optimizer offload setting: the search's batches share them)."""
    if not stack.wrapper.per_plan:
        return stack
    host, sharded = DEEPSPEED_WRAPPERS[deepspeed_wrapper(plan, stack.wrapper.pipeline_engine)]
    # a derived stack, not user input (as step/host.on_host's)
    out = copy.copy(stack)
    object.__setattr__(out, "tensor_host", host)
    object.__setattr__(out, "tensor_sharded", sharded)
    return out
