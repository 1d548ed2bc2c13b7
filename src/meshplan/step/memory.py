"""Activation bytes of a step's pipeline ranks from its units (memory.py's formulas with ``Units``' saved bytes):
on the first and the last rank with the loss workspace and what the pipeline runtime keeps, on the middle rank that
holds the most micro-batches in flight (rank 1: p − 1 under 1F1B), and what activation offload moves to host memory.
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.params import layers_on_first, layers_on_last, layers_on_rank, middle_or_first
from meshplan.memory import (
    activation_bytes,
    embedding_in_flight,
    layer_input_bytes,
    loss_workspace,
    offloaded_layers,
    pipeline_runtime_memory,
)
from meshplan.pipeline.registry import schedule_of
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.units import Saved, Units
from meshplan.xp import Num, maximum


def activation_memory(model: ModelSpec, plan: Plan, stack: Stack, u: Units | Saved, middle: bool = False
                      ) -> tuple[Num, ...]:
    """Saved activations on the first, on the last and (``middle``) on the middle pipeline rank 1 (memory.py; the
    first's where p ≤ 2), with the loss's transient workspace on the rank that computes the loss and what the
    pipeline runtime keeps per micro-batch: torch.distributed.pipelining's 4·m·v boundaries on a middle rank against
    the first's 2·m·(2v − 1) (memory.pipeline_runtime_memory)."""
    single, layer_input = plan.pp == 1, layer_input_bytes(model, plan)
    loss = loss_workspace(model, plan, stack)
    embed = u.embed_saved * embedding_in_flight(plan)
    kept_first, kept_last = pipeline_runtime_memory(model, plan, stack)
    # ZB-V: the head on the first rank (its V); Chimera: both ends run an embedding and a head (the records)
    record = schedule_of(plan.schedule)
    head_first = True if record.head_first else single
    head_last, embed_last = record.head_last, True if record.embed_last else single
    work = u.layer_working
    first = activation_bytes(model, plan, u.layer_saved, layer_input, working=work) + embed + (
        u.head_saved + loss) * head_first
    last = activation_bytes(model, plan, u.layer_saved, layer_input, last=True, working=work) + (
        u.head_saved + loss) * head_last + embed * embed_last
    if not middle:
        return first + kept_first, last + kept_last
    rank1 = activation_bytes(model, plan, u.layer_saved, layer_input, rank=1, working=work) + (
        kept_first * 2 * plan.vpp / (2 * plan.vpp - 1))
    return first + kept_first, last + kept_last, middle_or_first(plan, rank1, first + kept_first)


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
