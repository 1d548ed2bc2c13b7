"""Memory per GPU: weights, gradients, optimizer state, activations, buffers, and what goes to host memory.

Symbols: Ψ parameters on a GPU before ZeRO sharding (cost/params.py), N_d = dp·cp the ranks that replicate them
(Megatron reduces gradients over the data- and context-parallel ranks together), N_e = tp·cp·dp / (ep·etp) the
expert-data-parallel ranks replicating expert weights, m micro-batches, p pipeline stages, v chunks per stage.

Model states (weights, gradients, optimizer state, old weight versions): cost/model_states.py, its names re-exported
here.

Activations: the bytes each op saves (cost/, Korthikanti et al. 2022) times the layers of the first stage
times the micro-batches in flight there: m for GPipe, min(p, m) for 1F1B, and for the interleaved schedule
min(v·m, 2(p-1) + (v-1)·p + 1) model chunks (Megatron-LM's warm-up count + 1), and p - r on rank r of the
asynchronous schedules (no flush: m does not bound it). Those also keep old weight versions (``weight_versions``:
PipeDream's stash, 2BW's second buffer) beside the current weights. Full recompute keeps only
each recomputed layer's input plus one layer's activations while it is recomputed (Korthikanti Table 2).
Beside them: the loss's transient workspace (``loss_workspace``), what the pipeline runtime keeps per micro-batch
(``pipeline_runtime_memory``) and the transient buffers of TP collectives and ZeRO-3 (``buffer_memory``). The loss's
transients and the layers' (the recomputed layer, the buffers) never coexist: the larger phase's count (step/memory.py).
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.model_states import (
    BNB_BLOCK,
    MASTER_BYTES,
    OPTIMIZER_STATE,
    RESIDENT_LAYERS,
    WEIGHT_BYTES,
    Memory,
    OptimizerState,
    chunk_gradient_share,
    lp_gradients,
    model_state_memory,
    model_states,
    offloaded_optimizer,
    optimizer_bytes,
    per_parameter_byte,
    resident_weights,
    weight_versions,
)
from meshplan.cost.params import (
    layer_params,
    layers_on_first,
    layers_on_last,
    layers_on_rank,
    layers_on_stage,
)
from meshplan.cost.records import ACT_BYTES, FP32, token_rows
from meshplan.pipeline.registry import schedule_of
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import head_vocab
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num, maximum, minimum

# cost/model_states.py's names are memory's too (re-exported: callers import them from here)
__all__ = ["BNB_BLOCK", "MASTER_BYTES", "OPTIMIZER_STATE", "RESIDENT_LAYERS", "WEIGHT_BYTES", "Memory",
           "OptimizerState", "chunk_gradient_share", "lp_gradients", "model_state_memory", "model_states",
           "offloaded_optimizer", "optimizer_bytes", "per_parameter_byte", "resident_weights", "weight_versions",
           "in_flight_chunks", "embedding_in_flight", "offloaded_layers", "layer_input_bytes", "activation_bytes",
           "loss_workspace", "pipeline_runtime_memory", "buffer_memory"]


def in_flight_chunks(plan: Plan, last: bool = False, rank: int | None = None) -> Num:
    """Model chunks whose activations the first (or last, or ``rank``) pipeline rank holds at its peak.

    Megatron-LM warm-up forwards on rank r: p - r - 1 (1F1B), 2(p - r - 1) + (v - 1)·p (interleaved);
    the peak is warm-up + 1. GPipe keeps all m. Each schedule's rule is its record's (meshplan.pipeline.rules).
    """
    if rank is None:
        rank = plan.pp - 1 if last else 0
    return schedule_of(plan.schedule).in_flight(plan.pp, plan.vpp, plan.grad_accum, rank)


def embedding_in_flight(plan: Plan) -> Num:
    """Micro-batches whose embedding activations the first pipeline rank holds at its peak: the embedding is in
    model chunk 0 only. Megatron-LM's interleaved schedule runs forwards in blocks of p micro-batches per chunk
    (chunk 0, 1, …, v-1, then chunk 0 again), so of the 2(p-1) + (v-1)·p + 1 forwards in flight at the first
    backward, p + (p - 1) = 2p - 1 are chunk 0's; ZB-V's rank 0 runs 2p chunk-0 forwards before its first chunk-0
    input gradient; 1F1B and GPipe hold one chunk, all of their in-flight ones (the records' rules)."""
    own = schedule_of(plan.schedule).embedding_in_flight
    return in_flight_chunks(plan) if own is None else own(plan.pp, plan.grad_accum)


def _rank_layers(model: ModelSpec, plan: Plan, last: bool, rank: int | None) -> Num:
    """Layers on the first or the last pipeline rank, or on ``rank`` where given (cost/params.layers_on_rank)."""
    if rank is not None:
        return layers_on_rank(model, plan, rank)
    return layers_on_last(model, plan) if last else layers_on_first(model, plan)


def offloaded_layers(model: ModelSpec, plan: Plan, last: bool = False, rank: int | None = None) -> Num:
    """Layers of the first (or the last, or ``rank``) pipeline rank whose saved activations go to host memory:
    ``plan.offload_layers`` of them (Megatron-Core ``cpu_offloading_num_layers``: the first ones), all when 0, none
    without ``plan.offload_activations``."""
    if not plan.offload_activations:
        return 0
    layers = _rank_layers(model, plan, last, rank)
    return layers if plan.offload_layers == 0 else minimum(plan.offload_layers, layers)


def layer_input_bytes(model: ModelSpec, plan: Plan) -> Num:
    """The bytes of a layer's input on one GPU: its rows of the residual stream (sharded under SP / SUMMA)."""
    return token_rows(model, plan)[1] * model.hidden_size * ACT_BYTES


def activation_bytes(model: ModelSpec, plan: Plan, layer_saved: Num, layer_input: Num, last: bool = False,
                     rank: int | None = None, working: Num = 0.0) -> Num:
    """Activations on the first pipeline rank (the last with ``last``, any one plan's ``rank`` where given: see the
    module docstring).

    ``layer_saved``: bytes one layer saves for one micro-batch; ``layer_input``: its input (kept by a
    fully recomputed layer); ``working``: what one layer's recompute holds beyond ``layer_saved`` while the backward
    pass reruns it under a selective policy over the whole layer (``Units.layer_working``), as full recompute holds
    one layer's activations.
    """
    layers = _rank_layers(model, plan, last, rank)
    chunk_layers = layers / plan.vpp
    chunks = in_flight_chunks(plan, last, rank)
    if plan.offload_activations:
        # what a layer keeps for one micro-batch (its input under full recompute, else what it saves), averaged over
        # the stage; the offloaded layers' share leaves the GPU but for a double buffer (the layer computing and the
        # one being copied: Megatron-Core cpu_offload.py's double-buffered group handler), one buffer when a single
        # layer's micro-batch is offloaded, none beyond what it would keep anyway when less. Full recompute's
        # one-layer working set (the recomputed layer's saved activations) stays on the GPU.
        working = layer_saved if plan.recompute == "full" else working
        stored = activation_bytes(model, replace(plan, offload_activations=False), layer_saved, layer_input,
                                  last, rank, working) - working
        per_layer = stored / maximum(chunks * chunk_layers, 1)  # ≥ 1 on a valid rank (0 on a middle of p ≤ 2)
        offloaded = chunks * offloaded_layers(model, plan, last, rank) / plan.vpp  # layer-micro-batches offloaded
        return stored - offloaded * per_layer + minimum(2.0, offloaded) * per_layer + working
    if plan.recompute == "full":
        recomputed = layers if plan.recompute_layers == 0 else minimum(plan.recompute_layers, layers)
        per_chunk = (recomputed * layer_input + (layers - recomputed) * layer_saved) / plan.vpp
        return chunks * per_chunk + layer_saved
    return chunks * chunk_layers * layer_saved + working


def loss_workspace(model: ModelSpec, plan: Plan, stack: Stack) -> Num:
    """Transient peak of the cross-entropy backward on the last stage, beyond the saved fp32 (log-)softmax of
    the logits (counted with the head's saved activations), per logit (T·V/t of them):
    ``stack.cross_entropy = "fused"`` (Megatron's vocab-parallel loss): the fp32 gradient of the logits, written
    over the saved softmax in place
    (Megatron-LM megatron/core/tensor_parallel/cross_entropy.py: the backward takes grad_input = softmax and
    updates it with in-place ops), so only the 16-bit copy autograd makes for the logits' dtype is new: 2 bytes.
    ``"pytorch"`` (``F.cross_entropy`` on upcast logits = log_softmax + nll_loss, eager autograd): nll_loss's
    backward materialises a dense fp32 gradient of the log-probabilities (``nll_loss_backward``: zeros with
    -1/N at the targets), and ``_log_softmax_backward_data`` writes a new fp32 gradient of the logits while
    that one and the saved output are alive: 4 + 4 bytes (the 16-bit cast follows once the first is freed).
    With tp > 1 the logits are a vocabulary-sharded DTensor and the loss runs under ``loss_parallel`` (torchtitan's
    default with TP): its nll_loss backward computes both gradients at once, in eager,
    ``(torch.zeros_like(x) + torch.exp(x)) * grad_output`` (torch/distributed/tensor/parallel/loss.py,
    ``_nll_loss_and_log_softmax_backward``), so three fp32 tensors (the zeros, the exponential or the sum, the
    product) are alive with the saved output: 4 + 4 + 4 bytes.
    ``"flash"`` (flash-attn's CrossEntropyLoss): the 16-bit gradient beside the saved 16-bit logits, 2 bytes;
    ``"fused_grad"`` (llm.c's fused classifier): the gradient overwrites the logits, none. Logits gathered to every
    TP rank (``Loss.gathered``, ``"gathered_bf16"``: two 16-bit gradients, 2 + 2) span the whole vocabulary there."""
    # numeric plan fields may be arrays (a PlanBatch): no branch on tp
    loss = stack.loss  # its gradient's bytes per logit (specs/stack_variants.py)
    per_logit = loss.grad_bytes + FP32 * (plan.tp > 1) if loss.eager else loss.grad_bytes
    return token_rows(model, plan)[0] * loss.rank_vocab(head_vocab(model), plan.tp) * per_logit


def pipeline_runtime_memory(model: ModelSpec, plan: Plan, stack: Stack) -> tuple[Num, Num]:
    """Bytes the pipeline runtime keeps per micro-batch for the whole step, on the first and on the last
    pipeline rank: none under Megatron-Core (``stack.pipeline_runtime = "megatron"``), which allocates its p2p
    buffers per transfer and frees a stage's output once it is sent and backpropagated.

    torch.distributed.pipelining (``"torch"``, torchtitan; torch/distributed/pipelining/stage.py of December 2024,
    the torch 1963fc8 of torchtitan's benchmarks; pytorch/pytorch#153383, May 2025, keeps the outputs of the last
    stage only) keeps, for each of the m micro-batches and each model chunk on the rank, until the next step clears
    them (``clear_runtime_states``): on a chunk that is not the pipeline's first, the activation receive buffer
    ``_prepare_forward_infra`` allocates up front and the input gradient autograd accumulates into it
    (``stage_backward`` reads ``.grad`` of the inputs); on a chunk that is not the last, the gradient receive buffer
    (``_prepare_backward_infra``) and the chunk's output (``forward_one_chunk`` appends it to ``output_chunks``);
    on the pipeline's last chunk, its output: the logits (fp32 where the loss upcasts them, torchtitan's
    ``self.output(h).float()``). Each boundary tensor is a layer input (``layer_input_bytes``). The first rank holds
    v chunks of which v − 1 are not the first and all v not the last; the last rank the reverse, plus the logits.
    These add to the rank's activation peak, which lasts to its last forward, when all m outputs exist. (A middle
    rank holds 4·m·v boundaries, but fewer micro-batches in flight than the first.)"""
    if not stack.pipeline_runtime_mode.keeps_microbatches:
        return 0.0, 0.0
    m, v, pipelined = plan.grad_accum, plan.vpp, plan.pp > 1
    boundaries = 2 * m * (2 * v - 1) * layer_input_bytes(model, plan) * pipelined
    logit_bytes = FP32 if stack.loss.eager else ACT_BYTES
    logits = m * token_rows(model, plan)[0] * stack.loss.rank_vocab(head_vocab(model), plan.tp) * pipelined
    return boundaries, boundaries + logits * logit_bytes


def buffer_memory(model: ModelSpec, plan: Plan) -> Num:
    """Transient buffers: the gathered activations of a TP collective (×2, in and out; none without tensor
    parallelism) and, with ZeRO-3, the unsharded weights of the layer in use and of the one being prefetched (one
    when the stage holds a single layer), and the layer's unsharded gradients on their way to the reduce-scatter:
    autograd's 16-bit gradients and the reduce-scatter input they are copied into in the reduce dtype
    (``plan.grad_bytes``; PyTorch FSDP2 ``foreach_reduce`` allocates that input, world size × the padded shard,
    before it copies the gradients in, and frees the previous layer's once its reduce-scatter has finished).

    A shard group of one (dp·cp = 1 for the dense parameters, tp·cp·dp / (ep·etp) = 1 for the experts) shards
    nothing: ZeRO-3 there gathers and reduce-scatters nothing (FSDP2 on a one-rank mesh keeps the parameter whole),
    so those parameters need no buffer (issue 48: ZeRO-3 at dp = 1 added 0.59 GiB of gather buffers to a plan it
    shards nothing of)."""
    params = layer_params(model, plan)  # the parameters a shard group of one leaves whole need no buffer
    layer = params.dense * (plan.dp * plan.cp > 1) + params.expert * (plan.tp * plan.cp * plan.dp > plan.ep * plan.etp)
    in_use = minimum(2, layers_on_stage(model, plan)) * WEIGHT_BYTES  # per parameter: this layer and the prefetched
    grads_in_transit = WEIGHT_BYTES + plan.grad_bytes  # per parameter: autograd's and the reduce-scatter input
    sharded = layer * (plan.zero == 3) * (grads_in_transit + in_use)
    gathered = 2 * token_rows(model, plan)[0] * model.hidden_size * ACT_BYTES
    return sharded + gathered * (plan.tp * plan.tp2 > 1)
