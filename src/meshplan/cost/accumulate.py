"""DeepSpeed's BF16_Optimizer accumulating each micro-batch's gradients in fp32, one tensor at a time (issue 46:
fixed costs per micro-batch).

Where DeepSpeed's engine runs a BF16_Optimizer (cost/wrappers.deepspeed_wrapper: bf16 weights under its pipeline
engine without ZeRO, or with fp32 gradients at ZeRO 1 without optimizer offload; Megatron-DeepSpeed's bf16 runs),
every micro-batch's backward is wrapped (DeepSpeed 0.19.8 runtime/engine.py ``_backward_prologue`` /
``_backward_epilogue``, runtime/pipe/engine.py ``_exec_backward_pass``; runtime/bf16_optimizer.py
``clear_lp_grads``, ``update_hp_grads``, unless ``bf16.immediate_grad_update``, default false): the bf16 gradients
are zeroed by one ``torch._foreach_zero_`` before it, and after it a Python loop casts each to fp32 and adds it into
its fp32 gradient, ``hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype).view(hp_grad.shape))``. Per parameter: the
zeroing writes 2 bytes, the cast reads 2 and writes 4, the add reads 4 + 4 and writes 4: 20 bytes; per tensor two
kernels, each issued by the host (the foreach call's few launches for the whole model not counted). Counted on a
CPU (data/measured/2026-11-27-bf16-microbatch-host-ops.md: the cast and the add launch, a view and two detaches do
not) and measured on a lent H200 (docs/SMALL_WORK_GPU.md, "DeepSpeed's BF16_Optimizer, per micro-batch": 0.45-1.4 ms
a GPT layer of 12 tensors where the host sets the pace, 24 launches, about what the megatron-deepspeed preset's
50 us a launch prices).

The records go with the backward pass of the layer and the ends whose gradients they accumulate, so that each
pass's max(host, GPU) (step/passes.py, step/host.py) hides them where the GPU sets the pace. Whether a plan pays
them depends on its ZeRO stage and optimizer offload, which the search varies over one set of per-key units: so the
units carry the accumulated twin of each pass (step/units.Units.accumulated, built from ``accumulation_ops``) and the
step picks the one its setting's wrapper runs (``accumulates_fp32``; step/assemble.compose, step/ranks.py).
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.params import kind_params
from meshplan.cost.records import OpCost
from meshplan.cost.tensors import kind_tensors, norm_tensors
from meshplan.cost.wrappers import deepspeed_wrapper
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num

ACCUMULATE_BYTES = 20.0  # per parameter and micro-batch (module docstring)
ACCUMULATE_KERNELS = 2.0  # per parameter tensor and micro-batch: the cast and the add


def _wrapped(plan: Plan, stack: Stack) -> bool:
    """Whether DeepSpeed's engine picks the wrapper (not a stated one) for gradients the model trains itself (under
    LoRA the frozen weights have none; the adapters' are left out)."""
    return stack.optimizer_wrapper != "stated" and plan.finetune != "lora"


def accumulates_fp32(plan: Plan, stack: Stack) -> bool:
    """Whether the wrapper ``plan`` runs under its own ZeRO stage and offload (cost/wrappers.py) is DeepSpeed's
    BF16_Optimizer, which accumulates every micro-batch so."""
    return _wrapped(plan, stack) and deepspeed_wrapper(plan, stack.optimizer_wrapper == "deepspeed-pipeline") == "bf16"


def by_accumulation(plan: Plan, stack: Stack, zeros: tuple[int, ...], offloads: tuple[bool, ...]
                    ) -> list[tuple[bool, list[tuple[int, int, int, bool]]]]:
    """The (ZeRO stage, optimizer offload) settings of a grid, each as (index, stage, index, offload), grouped by
    whether the wrapper it runs accumulates so (``accumulates_fp32``), which changes the backward passes."""
    groups: dict[bool, list[tuple[int, int, int, bool]]] = {}
    for z, zero in enumerate(zeros):
        for o, offload in enumerate(offloads):
            setting = plan if (plan.zero, plan.offload_optimizer) == (zero, offload) else replace(
                plan, zero=zero, offload_optimizer=offload)
            groups.setdefault(accumulates_fp32(setting, stack), []).append((z, zero, o, offload))
    return list(groups.items())


def may_accumulate(plan: Plan, stack: Stack) -> bool:
    """Whether some ZeRO stage and optimizer offload setting of ``plan`` runs BF16_Optimizer: bf16 weights (the fp8
    and fp4 recipes keep them) under the pipeline engine, or with fp32 gradients (at ZeRO 1)."""
    pipeline = stack.optimizer_wrapper == "deepspeed-pipeline"
    return (_wrapped(plan, stack) and plan.precision not in ("fp16", "fp32", "tf32")
            and (pipeline or plan.grad_bytes == 4))


def fp32_accumulation(name: str, params: Num, tensors: Num) -> list[OpCost]:
    """The accumulation of ``params`` parameters in ``tensors`` tensors on this GPU, one micro-batch, in the
    backward pass."""
    return [OpCost(f"{name}/bf16_accumulate", "bwd_w", "memory", 0.0, ACCUMULATE_BYTES * params,
                   kernels=ACCUMULATE_KERNELS * tensors)]


def accumulation_ops(model: ModelSpec, plan: Plan, stack: Stack, kinds: tuple[str, ...]) -> dict[str, list[OpCost]]:
    """The accumulation of one layer of each of ``kinds`` (its parameters and tensors on this GPU, a MoE layer's
    local experts included), of the embedding (the word table and a learned position table) and of the head (the
    final norm and an untied output layer), the ends split over tp; none where no setting of the plan runs
    BF16_Optimizer (``may_accumulate``)."""
    if not may_accumulate(plan, stack):
        return {}
    ops = {}
    for kind in kinds:
        tensors = kind_tensors(model, plan, stack, kind)
        ops[kind] = fp32_accumulation("layer", kind_params(model, plan, kind).total, tensors.dense + tensors.expert)
    ops["embed"] = fp32_accumulation("embed", model.embedding_params() / plan.tp,
                                     1 + int(model.position_embedding == "learned"))
    head = int(model.final_norm) * norm_tensors(model) + int(not model.tied_embeddings)
    ops["head"] = fp32_accumulation("head", model.head_params() / plan.tp, head)
    return ops
