"""Activation bytes of a step's pipeline ranks from its units (memory.py's formulas with ``Units``' saved bytes), by
phase (``Phases``: what the whole step keeps, the loss phase's and the layer phase's transients; ``Ends``: the units
FSDP2 leaves gathered): on the first and the last rank with the loss workspace and what the pipeline runtime keeps,
on the middle rank that holds the most micro-batches in flight (rank 1: p − 1 under 1F1B), and what activation
offload moves to host memory. A rank's peak is its states, what it keeps and the larger phase (``Phases.peak``), not
their sum.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from meshplan.cost.params import (
    end_params,
    layer_params,
    layers_on_first,
    layers_on_last,
    layers_on_rank,
    middle_or_first,
)
from meshplan.cost.records import token_rows
from meshplan.memory import (
    WEIGHT_BYTES,
    Memory,
    activation_bytes,
    embedding_in_flight,
    layer_input_bytes,
    loss_workspace,
    offloaded_layers,
    pipeline_runtime_memory,
)
from meshplan.pipeline.registry import schedule_of
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import head_vocab
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.units import Saved, Units
from meshplan.xp import Num, maximum, minimum, where


class Ends(NamedTuple):
    """The units FSDP2 leaves gathered on the rank that computes the loss (``gathered_ends``), by how long: ``root``,
    the root unit (token embedding, final norm, output head), from the forward's start to the backward's end, so
    through every phase; ``block``, the last transformer block, from its forward through the loss phase into its own
    backward, where it is the layer phase's gathered layer in use (memory.buffer_memory) and so counted there."""

    root: Num = 0.0
    block: Num = 0.0


NO_ENDS = Ends()  # a stack that reshards every unit after its forward, or a rank without the loss


class Phases(NamedTuple):
    """A pipeline rank's activation bytes by when they live. ``kept``: what every phase of the step holds at its
    peak (the in-flight micro-batches' saved activations or recomputed layers' inputs, the embedding's, what the
    pipeline runtime keeps). ``loss``: the loss phase's transients, after the last layer's forward and before its
    backward, on the rank that computes the loss (the head's saved logits and the loss's backward workspace,
    memory.loss_workspace). ``working``: the layer phase's own, while the backward pass reruns a layer (full
    recompute's one layer of activations, a per-op policy's ``Units.layer_working``); the layer phase also holds
    memory.buffer_memory's gathered weights and gradients (ZeRO-3) and TP buffers, priced per ZeRO stage apart."""

    kept: Num
    loss: Num
    working: Num
    hole: Num = 0.0  # reserved beyond the loss phase's live blocks on the rank that computes it (``logits_hole``)

    def peak(self, buffers: Num, ends: Ends = NO_ENDS) -> Num:
        """Bytes at the rank's activation peak with ``buffers``: ``kept`` and the gathered root (``ends.root``, held
        through both phases on the rank that computes the loss), plus the larger phase, the loss's (with the last
        block gathered, ``ends.block``) or the layer's (``working`` + ``buffers``). The two never coexist. The loss
        phase runs between the last layer's forward and its backward. The layer-phase buffers of the forward are freed
        by then: FSDP2 reshards each unit after its forward (reshard_after_forward,
        torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py post_forward; but ``ends``), and a layer's
        recompute begins only when its backward does. The logits, their gradients and the loss workspace are freed
        before the last layer's backward begins. The allocated peak is this maximum: a block freed is reusable by a
        later request (c10/cuda/CUDACachingAllocator.cpp, free_block /
        get_free_block), and torch.cuda.max_memory_allocated counts live blocks only."""
        return self.kept + self.on_loss_rank(ends.root) + maximum(self.loss_phase(ends), self.working + buffers)

    def on_loss_rank(self, gathered: Num) -> Num:
        """``gathered`` on the rank that computes the loss (``loss`` > 0), none elsewhere."""
        return where(self.loss > 0, gathered, 0.0)

    def loss_phase(self, ends: Ends = NO_ENDS) -> Num:
        """The loss phase's bytes: its transients and, where the rank computes the loss, the last block FSDP2 left
        gathered (``ends.block``; the root is held through every phase, ``peak``)."""
        return self.loss + self.on_loss_rank(ends.block)

    def stranded(self, buffers: Num, ends: Ends = NO_ENDS) -> Num:
        """What the caching allocator keeps reserved beyond ``peak``: the smaller phase's blocks. The forward's
        layer-phase blocks (gathered weights, TP buffers, a layer's activations between saves) are freed and cached
        before the loss; the loss's logits and their gradients are larger than any of them, so the allocator maps a
        new segment for those (CUDACachingAllocator.cpp malloc: a cached block serves a request only when at least
        as large, else alloc_block), and keeps every segment until empty_cache or a failed allocation
        (release_cached_blocks). Its reserved peak (torch.cuda.max_memory_reserved, torchtitan's logged "memory",
        torchtitan/metrics.py get_peak_stats reserved_bytes.all.peak @021137a) is therefore ``peak`` + this. The
        last block's gather (``ends.block``) is one of the forward's two layer buffers in use (memory.buffer_memory),
        allocated in the layer phase's segments and never freed before its backward: the loss phase's new segment
        holds the loss's transients alone, so the block is reserved once, not in both phases. Where the loss phase
        binds, its segment also holds ``hole``, which none of its requests can reuse (logits_hole). Where the layer
        phase binds the hole is not added: a choice, not a rule read from the allocator. Its derivation assumes the
        loss's requests find no cached block large enough, which holds where the loss's transients dwarf the layer
        phase's (every measured row with a hole: torchtitan's 8B at tp 1, 23.7 or 47.4 GiB of loss transients
        against 3.2 or 6.3 GiB); where the layer phase is the larger, the merged free blocks of expandable segments
        may serve part of the loss, so the loss's transients, all counted stranded there, are already an upper
        reading."""
        loss = self.loss_phase(ends)
        hole = where(loss > self.working + buffers, self.hole, 0.0)
        return minimum(loss, self.working + buffers) - self.on_loss_rank(ends.block) + hole


def memory_at_peak(states: tuple[Num, Num, Num], phases: Phases, buffers: Num, ends: Ends = NO_ENDS) -> Memory:
    """The rank's memory by part at its peak instant (``Phases.peak``): the model states, ``kept`` with the binding
    phase's activations, and the gathered weights: the root FSDP2 left gathered (``ends.root``) with the layer
    phase's buffers where that phase binds, else with the last block (``ends.block``)."""
    loss = phases.loss_phase(ends)
    loss_binds = loss > phases.working + buffers
    return Memory(*states, phases.kept + where(loss_binds, phases.loss, phases.working),
                  phases.on_loss_rank(ends.root) + where(loss_binds, loss - phases.loss, buffers),
                  phases.stranded(buffers, ends))


def gathered_ends(model: ModelSpec, plan: Plan, stack: Stack) -> Ends:
    """Bytes per GPU of the units FSDP2 leaves gathered from their forward (``stack.gathered_ends``; ``Ends``), on
    the rank that computes the loss: the root unit (``fully_shard(model)``: the token embedding, the final norm and
    the output head; cost/params.end_params' share on one GPU) and the last transformer block, each in the compute
    dtype (the MixedPrecisionPolicy's bf16 param_dtype). torchtitan (parallelize_llama.py:331-339 @9dec370, its
    December 2024 benchmarks' commit) builds the last block with ``reshard_after_forward=False`` ("do not reshard
    after forward for the last transformer block since FSDP would prefetch it immediately"): it stays gathered into
    its backward, whose post-backward reshards it (torch/distributed/_composable/fsdp/_fsdp_param_group.py
    post_backward). It builds the root with ``reshard_after_forward=not pp_enabled``; the torch of those benchmarks
    (1963fc8, 2024-12-23) keeps the root gathered whatever it is given (FSDPState._lazy_init: "For the root, do not
    reshard after forward", post_forward_mesh_info = None; torch/distributed/_composable/fsdp/_fsdp_state.py,
    pytorch/pytorch#131965; respected from pytorch/pytorch#154704, 2025-05-30), until the root's post-backward at
    the backward's end: through the layer phase too. Only ZeRO-3 (reshard after forward) adds them: ZeRO 0 / 2 hold
    every weight whole (memory.model_states), and a shard group of one keeps its parameters whole
    (memory.buffer_memory). Neglected: a pipelined first rank's embedding."""
    if not stack.gathered_ends:
        return NO_ENDS
    block = layer_params(model, plan)
    gathers = (plan.zero == 3) * WEIGHT_BYTES
    root = end_params(model, plan.tp, plan.pp == 1, False) * (plan.dp * plan.cp > 1) * gathers
    last = block.dense * (plan.dp * plan.cp > 1) + block.expert * (plan.tp * plan.cp * plan.dp > plan.ep * plan.etp)
    return Ends(root, last * gathers)


def logits_hole(model: ModelSpec, plan: Plan, stack: Stack, layer_saved: Num) -> Num:
    """Bytes the eager PyTorch loss on upcast logits leaves reserved and unusable at its peak, on the rank that
    computes it: 2 a logit (N = T·V logits), less the layer phase's free tail the new pages merge with.

    torchtitan's loop (pytorch/torchtitan train.py:131-138, 301-308 @9dec370): ``pred`` (16-bit, 2N), then in the
    loss ``pred.float()`` (4N) and log_softmax's output (4N, the one tensor its backward keeps); the upcast is freed
    when the loss returns and ``pred`` at ``del pred``: one free 6N block below the saved output. The backward's
    nll_loss gradient (4N) best-fits into it, leaving 2N; _log_softmax_backward_data's output (4N) fits no cached
    block, so new pages are mapped for it: 14N reserved where 12N are live (memory.loss_workspace's 8N and the saved
    4N), the 2N block serving the 16-bit input gradient later. A cached block serves a request only when at least as
    large (c10/cuda/CUDACachingAllocator.cpp get_free_block), else new memory; under torchtitan's expandable segments
    (run_llama_train.sh:22, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) the new pages extend the segment after
    its last block and merge a free last block into it (find_expandable_block, try_allocate_expandable_block), so a
    free tail of the layer phase below ``pred`` is absorbed: none under a per-op policy, whose block's last
    allocation is a kept output; one layer's recomputed activations under full recompute, whose checkpointed block
    saves only its input and frees its transients last (at most 2N). Not measured on a GPU: the allocator's rules
    read, the torchtitan rows' reserved peaks fit (eager 8B at FSDP 8: 82.4 GiB read, 12N alone 5.7 GiB short).
    Over the vocabulary-sharded logits of loss_parallel (tp > 1) the sequence differs and is not priced.

    Priced only for a stack whose loop and allocator are those read (``Stack.expandable_segments``: torchtitan's).
    The other stacks on this loss (deepspeed: the Hugging Face Trainer's; pytorch-fsdp) free their logits and set
    their allocator as their own loops do, which no source here states: none, rather than torchtitan's 2N."""
    loss = stack.loss  # the upcast F.cross_entropy: its Loss.hole, 2 (memory.loss_workspace's 4 + 4 beside it)
    if not (stack.expandable_segments and loss.hole):
        return 0.0
    two_n = token_rows(model, plan)[0] * loss.rank_vocab(head_vocab(model), plan.tp) * loss.hole
    tail = minimum(two_n, layer_saved) if plan.recompute == "full" else 0.0
    return where(plan.tp > 1, 0.0, two_n - tail)


def recompute_working(plan: Plan, layer_saved: Num, working: Num) -> Num:
    """What memory.activation_bytes adds for the layer the backward pass reruns: one layer's saved activations
    under full recompute (Korthikanti et al. 2022 Table 2), ``working`` under a per-op policy over the layer."""
    return layer_saved if plan.recompute == "full" else working


def activation_memory(model: ModelSpec, plan: Plan, stack: Stack, u: Units | Saved, middle: bool = False
                      ) -> tuple[Phases, ...]:
    """``Phases`` of the first, of the last and (``middle``) of the middle pipeline rank 1 (memory.py; the first's
    where p ≤ 2): the loss's on the rank that computes the loss, and what the pipeline runtime keeps per
    micro-batch: torch.distributed.pipelining's 4·m·v boundaries on a middle rank against the first's 2·m·(2v − 1)
    (memory.pipeline_runtime_memory)."""
    single, layer_input = plan.pp == 1, layer_input_bytes(model, plan)
    loss = u.head_saved + loss_workspace(model, plan, stack)
    embed = u.embed_saved * embedding_in_flight(plan)
    kept_first, kept_last = pipeline_runtime_memory(model, plan, stack)
    # ZB-V: the head on the first rank (its V); Chimera: both ends run an embedding and a head (the records)
    record = schedule_of(plan.schedule)
    head_first = True if record.head_first else single
    head_last, embed_last = record.head_last, True if record.embed_last else single
    work = u.layer_working
    redo = recompute_working(plan, u.layer_saved, work)
    first = activation_bytes(model, plan, u.layer_saved, layer_input, working=work) - redo + embed + kept_first
    last = activation_bytes(model, plan, u.layer_saved, layer_input, last=True, working=work) - redo + (
        embed * embed_last + kept_last)
    hole = logits_hole(model, plan, stack, u.layer_saved)
    ends = (Phases(first, loss * head_first, redo, hole * head_first),
            Phases(last, loss * head_last, redo, hole * head_last))
    if not middle:
        return ends
    rank1 = activation_bytes(model, plan, u.layer_saved, layer_input, rank=1, working=work) - redo + (
        kept_first * 2 * plan.vpp / (2 * plan.vpp - 1))
    return (*ends, Phases(*(middle_or_first(plan, x, y) for x, y in zip(Phases(rank1, 0.0, redo), ends[0],
                                                                        strict=True))))


def offloaded_activations(model: ModelSpec, plan: Plan, u: Units | Saved, middle: bool = False) -> Num:
    """Host bytes of offloaded activations: what the first (or, if more, the last or, with ``middle``, the middle
    rank 1) rank would otherwise hold for its in-flight micro-batches."""
    if not plan.offload_activations:
        return 0.0
    kept, layer_input = replace(plan, offload_activations=False), layer_input_bytes(model, plan)
    first = activation_bytes(model, kept, u.layer_saved, layer_input) * offloaded_layers(model, plan) / (
        layers_on_first(model, plan))
    last = activation_bytes(model, kept, u.layer_saved, layer_input, last=True) * offloaded_layers(
        model, plan, last=True) / layers_on_last(model, plan)
    if not middle:
        return maximum(first, last)
    rank1 = activation_bytes(model, kept, u.layer_saved, layer_input, rank=1) * offloaded_layers(
        model, plan, rank=1) / layers_on_rank(model, plan, 1)
    return maximum(maximum(first, last), middle_or_first(plan, rank1, first))
