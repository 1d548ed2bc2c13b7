"""What DeepSpeed's optimizer wrappers do to every micro-batch's gradients, beyond autograd's own accumulation (issue
46: fixed costs per micro-batch). The wrapper is the one DeepSpeed's engine picks for the plan (cost/wrappers.py);
each kind of work is per parameter tensor (kernels the host issues) and per parameter (bytes the GPU moves), on the
tensors of this GPU's layers and ends, in their backward pass:

- "bf16", DeepSpeed's BF16_Optimizer with fp32 gradients (bf16 weights at ZeRO 1 without optimizer offload, as
  Megatron-DeepSpeed's bf16 runs take it; its pipeline engine runs it at ZeRO 0 too): every micro-batch's backward is
  wrapped (DeepSpeed 0.19.8
  runtime/engine.py ``_backward_prologue`` / ``_backward_epilogue``, runtime/pipe/engine.py
  ``_exec_backward_pass``; runtime/bf16_optimizer.py ``clear_lp_grads``, ``update_hp_grads``, unless
  ``bf16.immediate_grad_update``, default false): the bf16 gradients are zeroed by one ``torch._foreach_zero_``
  before it, and after it a Python loop casts each to fp32 and adds it into its fp32 gradient,
  ``hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype).view(hp_grad.shape))``. Per parameter: the zeroing writes 2
  bytes, the cast reads 2 and writes 4, the add reads 4 + 4 and writes 4: 20 bytes; per tensor two kernels (the
  foreach call's few launches for the whole model not counted). Counted on a CPU
  (data/measured/2026-11-27-bf16-microbatch-host-ops.md) and measured on a lent H200 (docs/SMALL_WORK_GPU.md,
  "DeepSpeed's BF16_Optimizer, per micro-batch": 0.45-1.4 ms a GPT layer of 12 tensors where the host sets the pace).
  "bf16-bf16": the same wrapper with bf16 gradient accumulation, which only the pipeline engine runs without ZeRO
  (runtime/engine.py ``_do_optimizer_sanity_check``): its gradient buffer is bf16, so the cast is a no-op that
  launches nothing, and the add reads 2 + 2 and writes 2 bytes: with the zeroing 8 bytes a parameter, one kernel a
  tensor (counted in the pipeline engine on a CPU: data/measured/2026-11-27-bf16-pipeline-microbatch-host-ops.md).
- "zero2", "zero2-fp32", DeepSpeed's ZeRO optimizer at stage 2 (runtime/zero/stage_1_and_2.py): its gradient hook
  (``create_gradient_handling_hooks``) reduces every micro-batch's gradients as they come, each copied into the
  contiguous reduction bucket (``reduce_independent_p_g_buckets_and_remove_grads``: ``new_grad_tensor.copy_``) and
  from the reduced bucket into its partition. Counted on a CPU (data/measured/2026-11-27-zero-microbatch-host-ops.md,
  DeepSpeed 0.19.8 over gloo): per tensor and micro-batch beyond the module's own, 2 ``copy_`` kernels with bf16
  gradients (the bucket in bf16: read 2 and write 2 bytes a parameter each, 8 bytes), 3 with fp32 gradient
  accumulation (a cast to fp32, then the two copies in fp32: 2 + 4 + 2 x (4 + 4) = 22 bytes), and 11 calls that
  launch nothing. Measured on a lent H200 (run F of docs/SMALL_WORK_GPU.md): a layer of 12 tensors took about
  0.8 ms more a micro-batch at stage 2 than the plain loop, against 0.9 ms priced (3 launches x 12 at the deepspeed
  preset's 25 us and the bytes, as each pass's max(host, GPU) takes them).
- "zero3", "zero3-fp32", its stage-3 optimizer (runtime/zero/stage3.py): its gradient hook copies each gradient into
  its reduction bucket every micro-batch (``reduce_ready_partitions_and_remove_grads``). Counted alike: 1 ``copy_``
  kernel a tensor with bf16 gradients (4 bytes a parameter), 2 with fp32 accumulation (the cast, 2 + 4, and the
  copy, 4 + 4: 14 bytes), and 9 calls that launch nothing, beyond the module's own; the count's module is one module
  of many tensors, so ZeRO 3's per-module parameter hooks (fetch and release) are not in it: the next item's.
- ZeRO 3's module hooks ("zero3", "zero3-fp32" alike; runtime/zero/parameter_offload.py, partitioned_param_
  coordinator.py): before each module's forward and backward its parameters are fetched (all-gathered, traced,
  prefetched), after them released, every micro-batch: Python per module and per parameter tensor, which launches
  nothing a GPU counts (the gathers' collectives are channels.py's). Measured on this project's CPU in DeepSpeed
  0.19.8's engine and scaled to the DGX host by the plain-PyTorch layer's own time
  (benchmarks/measure/deepspeed_hooks_cpu.py, data/measured/2026-11-27-deepspeed-zero3-hooks-cpu.json): ``ZERO3_HOOKS``
  seconds per module, per tensor and per micro-batch, half in each pass (``OpCost.host``, on the host's timeline only;
  full recompute runs the forward's again, as its modules fetch again). The modules are the layer's tensors less their
  biases (a bias shares its weight's module) and ``LAYER_CONTAINERS``; at the ends their tables, norm and head and the
  model itself. The lent H200 measured the engine at ZeRO 3 (run F of docs/SMALL_WORK_GPU.md): 7.8-13 ms more a GPT
  layer (7 modules, 12 tensors) a micro-batch than the plain loop, against 7.8 ms priced (median); its steps' median
  |error| went from 74 % to 19 %.
ZeRO 1 gradients accumulate in autograd's own buffers between steps (the hook reduces them at the step's last
micro-batch only): nothing launches per micro-batch but the hook's Python, which is not priced.

The records go with the backward pass of the layer and the ends whose gradients they touch (ZeRO 3's hooks with both
passes of the modules they fetch), so that each pass's max(host, GPU) (step/passes.py, step/host.py) hides them where
the GPU sets the pace. Which work a plan pays depends on its ZeRO stage and optimizer offload, which the search varies
over one set of per-key units: the units carry a twin per kind of work some setting of theirs runs
(step/units.Units.wrapped, built from ``work_ops``) and the step picks the one its setting runs (``work_of``,
``by_work``; step/assemble.compose, step/ranks.py).
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.params import end_params, kind_params
from meshplan.cost.records import OpCost
from meshplan.cost.tensors import end_tensors, kind_tensors
from meshplan.cost.wrappers import deepspeed_wrapper
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num

# work -> (bytes per parameter, kernels per parameter tensor), per micro-batch (module docstring)
WORK = {"bf16": (20.0, 2.0), "bf16-bf16": (8.0, 1.0), "zero2": (8.0, 2.0), "zero2-fp32": (22.0, 3.0),
        "zero3": (4.0, 1.0), "zero3-fp32": (14.0, 2.0)}
BF16_OPTIMIZER_WORK = ("bf16", "bf16-bf16")  # BF16_Optimizer's, whose bf16 gradients live beside its buffer
RECORD_NAMES = {"bf16": "bf16_accumulate", "bf16-bf16": "bf16_accumulate", "zero2": "zero2_bucket",
                "zero2-fp32": "zero2_bucket", "zero3": "zero3_bucket", "zero3-fp32": "zero3_bucket"}
# DeepSpeed 0.19.8 ZeRO-3's hooks every micro-batch, seconds on the DGX host (Cluster.python_host 1): per module, per
# parameter tensor, and per micro-batch beyond its modules (module docstring; benchmarks/measure/deepspeed_hooks_cpu.py)
ZERO3_HOOKS = {"module": 535e-6, "tensor": 151e-6, "microbatch": 0.791e-3}
# a layer's modules that hold no parameter of their own and that ZeRO-3 hooks as it does every module: the layer, its
# attention and its MLP (transformers' decoder layers, Megatron's TransformerLayer); activation and dropout modules,
# where a model makes them modules, are left out
LAYER_CONTAINERS = 3


def _plans_wrapper(stack: Stack) -> bool:
    """Whether ``stack``'s wrapper is the plan's (``stack.wrapper.per_plan``), whose work follows the plan's ZeRO
    stage and offload; a stated wrapper (Megatron-Core, the generic stack) does none under any (``work_of``,
    ``by_work``: one rule for both)."""
    return bool(stack.wrapper.per_plan)


def work_of(plan: Plan, stack: Stack) -> str:
    """The per-micro-batch work of the wrapper ``plan`` runs under its own ZeRO stage and offload (a ``WORK`` key),
    or "": none beyond autograd's, a stated wrapper's (the stack's own), or under LoRA (the frozen weights have no
    gradients; the adapters' are left out)."""
    if not _plans_wrapper(stack) or plan.finetune == "lora":
        return ""
    wrapper = deepspeed_wrapper(plan, stack.wrapper.pipeline_engine)
    if wrapper == "bf16":  # its gradient buffer in the plan's gradient dtype (fp32, or bf16 without ZeRO)
        return "bf16" if plan.grad_bytes == 4 else "bf16-bf16"
    if wrapper in ("zero", "zero-fp32") and plan.zero >= 2:
        return f"zero{plan.zero}" + ("-fp32" if plan.grad_bytes == 4 else "")
    return ""


def possible_work(plan: Plan, stack: Stack) -> tuple[str, ...]:
    """The kinds of work some ZeRO stage and optimizer offload setting of ``plan`` runs (the search's grids vary
    both over one set of units): ``work_of`` over every setting."""
    found = {work_of(replace(plan, zero=zero, offload_optimizer=offload), stack)
             for zero in range(4) for offload in (False, True)}
    return tuple(sorted(found - {""}))


def by_work(plan: Plan, stack: Stack, zeros: tuple[int, ...], offloads: tuple[bool, ...]
            ) -> list[tuple[str, list[tuple[int, int, int, bool]]]]:
    """The (ZeRO stage, optimizer offload) settings of a grid, each as (index, stage, index, offload), grouped by
    the work their wrapper does every micro-batch (``work_of``), which changes the backward passes. A stack whose
    wrapper is not the plan's (``stack.wrapper.per_plan`` false: Megatron-Core, the generic stack) does none under
    any setting (``work_of`` answers "" before it reads the plan): one group, without the plan of each setting (a
    search batch's ``replace`` copies every column's reference: 14 % of the 8-count strong-scaling plan's
    ``grid_times``, three times a chunk)."""
    if not _plans_wrapper(stack):
        every = [(z, zero, o, offload) for z, zero in enumerate(zeros) for o, offload in enumerate(offloads)]
        return [("", every)] if every else []
    groups: dict[str, list[tuple[int, int, int, bool]]] = {}
    for z, zero in enumerate(zeros):
        for o, offload in enumerate(offloads):
            setting = plan if (plan.zero, plan.offload_optimizer) == (zero, offload) else replace(
                plan, zero=zero, offload_optimizer=offload)
            groups.setdefault(work_of(setting, stack), []).append((z, zero, o, offload))
    return list(groups.items())


def _records(work: str, name: str, params: Num, tensors: Num, modules: Num = 0.0, python_host: float = 1.0,
             extra: float = 0.0) -> list[OpCost]:
    """``work`` on ``params`` parameters in ``tensors`` tensors on this GPU, one micro-batch, in the backward pass;
    at ZeRO 3 also its hooks around ``modules`` modules (and ``extra`` seconds of the micro-batch's own), half in
    each pass, at ``python_host`` times the DGX host's time."""
    per_param, per_tensor = WORK[work]
    out = [OpCost(f"{name}/{RECORD_NAMES[work]}", "bwd_w", "memory", 0.0, per_param * params,
                  kernels=per_tensor * tensors)]
    if work.startswith("zero3"):
        hooks = (ZERO3_HOOKS["module"] * modules + ZERO3_HOOKS["tensor"] * tensors + extra) * python_host
        out += [OpCost(f"{name}/zero3_hooks", phase, "memory", kernels=0.0, host=hooks / 2)
                for phase in ("fwd", "bwd_x")]
    return out


def _unbiased(model: ModelSpec) -> ModelSpec:
    """``model`` without its biases: its tensors then count its parameter-holding modules (a bias shares its
    weight's)."""
    return replace(model, qkv_bias=False, linear_bias=False, out_bias=False, mlp_bias=False, norm_bias=False)


def work_ops(model: ModelSpec, plan: Plan, stack: Stack, kinds: tuple[str, ...], works: tuple[str, ...] | None = None,
             python_host: float = 1.0) -> dict[str, dict[str, list[OpCost]]]:
    """Per kind of work in ``works`` (default: every kind some setting of the plan runs, ``possible_work``): its
    records for one layer of each of ``kinds`` (its parameters and tensors on this GPU, a MoE layer's local experts
    included), for the embedding and for the head on their stages (cost/params.end_params, cost/tensors.end_tensors:
    the word table and a learned position table; the final norm and an untied output layer, or a tied one's copy on
    the last of several stages). ZeRO 3's hooks (``ZERO3_HOOKS``) at ``python_host`` times the DGX host's time, the
    micro-batch's own with the embedding."""
    single = plan.pp == 1  # one stage holds both ends: the head's own, without the embedding's
    embed, embed_tensors = end_params(model, plan.tp, 0, True), end_tensors(model, plan, True, 0)
    head = end_params(model, plan.tp, single, False) - embed * single
    head_tensors = end_tensors(model, plan, False, single) - embed_tensors * single
    works = possible_work(plan, stack) if works is None else works
    bare = _unbiased(model) if any(w.startswith("zero3") for w in works) else model  # modules: ZeRO 3's hooks only
    bare_embed = end_tensors(bare, plan, True, 0)
    embed_modules = bare_embed + 1  # the model itself
    head_modules = end_tensors(bare, plan, False, single) - bare_embed * single
    out = {}
    for work in works:
        ops = {}
        for kind in kinds:
            tensors, weights = kind_tensors(model, plan, stack, kind), kind_tensors(bare, plan, stack, kind)
            ops[kind] = _records(work, "layer", kind_params(model, plan, kind).total, tensors.dense + tensors.expert,
                                 weights.dense + weights.expert + LAYER_CONTAINERS, python_host)
        ops["embed"] = _records(work, "embed", embed, embed_tensors, embed_modules, python_host,
                                ZERO3_HOOKS["microbatch"])
        ops["head"] = _records(work, "head", head, head_tensors, head_modules, python_host)
        out[work] = ops
    return out
