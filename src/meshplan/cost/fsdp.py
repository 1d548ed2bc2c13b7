"""PyTorch FSDP (``stack.fsdp``): the HBM traffic that prepares each micro-batch's gradients for their reduction
(flat-gradient cat, reduce-dtype cast, pre-divide), read from torch/distributed/fsdp (``fsdp_grad_bytes``)."""

from __future__ import annotations

from collections.abc import Callable

from meshplan.cost.params import end_params, kind_params, layer_params
from meshplan.cost.records import ACT_BYTES, OpCost
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num, maximum, minimum, where


def fsdp_grad_bytes(plan: Plan, stack: Stack) -> int:
    """HBM bytes per unsharded parameter that PyTorch FSDP reads and writes on the GPU, every micro-batch (FSDP
    reduces the gradients after each backward pass unless ``no_sync``), to turn the weight gradients into the
    reduction's input (g = ``plan.grad_bytes``, the reduce dtype; the weights and their gradients are bf16 under
    FSDP's mixed precision). The weight-gradient GEMMs' own write is in ``gemm``.

    ``fsdp1`` (FlatParameter FSDP, torch/distributed/fsdp, PyTorch 1.13-2.x): the unit's weights are views of one
    flat parameter, so autograd assembles its gradient by concatenating the weight gradients (the backward of the
    flat parameter's split, read + write: 2 + 2); ``_post_backward_hook`` casts it to the reduce dtype when that
    differs (``flat_param.grad.to(reduce_dtype)``: 2 + g) and ``_reduce_grad`` divides it in place by the
    pre-divide factor (``_div_if_needed``: g + g) before the reduce-scatter: 18 bytes with fp32 reduction, 8 with
    bf16. ``fsdp2`` (per-parameter FSDP, ``fully_shard``): ``foreach_reduce`` copies the gradients into the
    reduce-scatter buffer in the reduce dtype (``foreach_reduce_scatter_copy_in``: 2 + g) and, reducing in fp32 or
    bf16, lets NCCL average (``ReduceOp.AVG``): no divide. FSDP issues these kernels on its post-backward stream,
    beside the next unit's backward; they are counted at their full memory-bound time (they take the SMs and HBM
    they need either way).
    Neglected: the work on the 1/N shards (casting the fp32 shard to bf16 before each all-gather, accumulating the
    reduced gradient shard): 12 + 12 bytes per parameter / N, under 3 at N ≥ 8; and in the peak memory the
    unit's transient unsharded gradient and its reduce-dtype copy, (2 + g) bytes per parameter of one unit.
    """
    g, mode = plan.grad_bytes, stack.fsdp_mode
    if not mode.shards:
        return 0
    if mode.flat:
        return 2 * ACT_BYTES + (ACT_BYTES + g if g != ACT_BYTES else 0) + 2 * g
    return ACT_BYTES + g


def fsdp_grad_prep(name: str, params: Num, plan: Plan, stack: Stack) -> list[OpCost]:
    """The memory-bound op of ``fsdp_grad_bytes`` over ``params`` (this GPU's unsharded parameters of the unit) in
    the backward pass; nothing when no FSDP shards the model. Under LoRA the frozen weights have no gradient, and
    ``lora`` drops it with the other weight-gradient work."""
    per_param = fsdp_grad_bytes(plan, stack)
    return [OpCost(f"{name}/fsdp_grad", "bwd_w", "memory", 0.0, per_param * params)] if per_param else []


def layer_fsdp_grad(model: ModelSpec, plan: Plan, stack: Stack, kind: str) -> list[OpCost]:
    """``fsdp_grad_prep`` over one layer's parameters on this GPU (``cost.params.kind_params``: a MoE layer with its
    local experts)."""
    if not stack.fsdp_mode.shards:
        return []
    return fsdp_grad_prep("layer", kind_params(model, plan, kind).total, plan, stack)


def accumulation_bytes(plan: Plan, stack: Stack) -> Num:
    """HBM bytes per unsharded trainable parameter per weight update that FSDP2's gradient accumulation without
    communication (``stack.accumulate_unsharded``, ZeRO 2 / 3, m = ``plan.grad_accum`` > 1 micro-batches) adds to the
    m copies into the reduce-scatter buffer (a + g each) that ``fsdp_grad_bytes`` counts; a = 2, the 16-bit gradient
    autograd writes, g = ``plan.grad_bytes``, the reduce dtype (torch/distributed/fsdp/_fully_shard/_fsdp_param.py,
    torch 2.13.0 cf30153c). The first micro-batch's post_backward casts the gradient to the reduce dtype
    (``to_accumulated_grad_if_needed``, :802-813: a + g where g ≠ a); each later one adds its gradient into that
    whole one (``accumulate_unsharded_grad_if_needed``, :815-821: read a and g, write g); the last copies the
    reduce-dtype sum into the buffer (g + g, in place of a + g). In all, a + g (g ≠ a) + (m − 1)·(a + 2g) + 2g
    − m·(a + g) = (a + g)·[g ≠ a] + m·g − a: 36 bytes at m = 8, g = 4; none at m = 1, where the one micro-batch
    syncs. FSDP1's no_sync (FlatParameter), not read here, is taken alike."""
    if not (stack.accumulate_unsharded and stack.fsdp_mode.shards):
        return 0.0
    g, m = plan.grad_bytes, plan.grad_accum
    cast = ACT_BYTES + g if g != ACT_BYTES else 0
    return where((m > 1) & (plan.zero >= 2), cast + m * g - ACT_BYTES, 0.0)


def lead_params(model: ModelSpec, plan: Plan) -> tuple[Num, Num]:
    """Parameters on one GPU of the units that a pass starting from an empty queue (``stack.drained_passes``)
    all-gathers before its first kernel can run: (the root unit, a layer); a forward gathers both, a backward the
    layer. Per-parameter FSDP gathers a unit when its pre-forward or pre-backward hook runs, and prefetches the next
    unit beside the current one's compute (forward: implicitly, as the host runs ahead; backward:
    ``_backward_prefetch``), so in a steady pass each gather hides behind the unit before it (step/channels.py); the
    first has none. The forward's first are the root unit (the embedding, the final
    norm and the head that ``fully_shard(model)`` after the blocks takes: KempnerForge
    kempnerforge/distributed/parallel.py:288-297 @3ad9d9a) and the first layer; the backward's the last layer
    (torch/distributed/fsdp/_fully_shard/_fsdp_state.py, ``_pre_backward``, torch 2.13.0 cf30153c). A stage's own
    end (``end_params``: one stage holds both ends) for every pipeline rank, the mean layer (``layer_params``).
    Neglected: whether the root stays gathered into the backward (torch keeps it gathered where
    ``reshard_after_forward`` is left unset, _fsdp_state.py:203-207; KempnerForge sets it); taken as kept."""
    return end_params(model, plan.tp, plan.pp == 1, True), layer_params(model, plan).total


def lead_times(model: ModelSpec, plan: Plan, stack: Stack | None, gather: Num, seconds: Callable[[Num], Num]
               ) -> tuple[Num, Num]:
    """Seconds a drained forward and backward pass (``stack.drained_passes``: forward, or both or layers) gather alone:
    ``seconds`` (of one all-gather of so many parameters) of ``lead_params``' units, a call each (the root unit then
    the first layer; the last layer), never more than the whole ``gather``; (0, 0) for a stack that drains none.
    Where the stack does not overlap the weight all-gather (``stack.overlap_param_gather`` off, ZeRO-1 and 2: Megatron
    -Core's --overlap-param-gather left off) the first forward pass waits for all of it, drained or not:
    DistributedOptimizer.step_with_ready_grads (megatron/core/optimizer/distrib_optimizer.py @ core_v0.15.0) then
    calls every model chunk's start_param_sync right after the optimizer step, synchronously, and no forward starts
    before it returns. ZeRO-3 gathers beside every forward pass (zero_traffic), which the flag does not change here."""
    drained = stack.drained_passes if stack else "none"
    sync = stack is not None and not stack.overlap_param_gather
    whole = where((plan.zero == 1) | (plan.zero == 2), gather, 0.0) if sync else 0.0
    if drained == "none":
        return whole, 0.0
    root, layer = (seconds(n) for n in lead_params(model, plan))
    first = maximum(whole, minimum(gather, root + layer)) if sync else minimum(gather, root + layer)
    return first, (minimum(gather, layer) if drained in ("both", "layers") else 0.0)
