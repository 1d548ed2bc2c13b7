"""The TP overlap a plan runs: a stack's ``overlap_tp`` (Megatron --tp-comm-overlap, Transformer Engine's userbuffers
overlap of the TP collectives with the GEMMs) as its framework runs it in one plan, the one place the pricing reads it.

Userbuffers overlaps the all-gather and reduce-scatter of sequence parallelism with the GEMMs they feed; a plan without
sequence parallelism has all-reduces instead, which it does not overlap. The frameworks built on Megatron-Core meet
such a plan in two ways:

- Megatron-LM refuses it (validate_args asserts sequence parallelism: specs/refusals.py ``tp_overlap_without_sp``);
- Megatron-Bridge and NeMo run it with the overlap turned off, a warning in the log (``Stack.overlap_tp_needs_sp``):
  Megatron-Bridge src/megatron/bridge/training/comm_overlap.py:439-445 @ v0.3.1 (9c9dd848) "Disabling tensor parallel
  communication overlap due to sequence_parallel=False"; NeMo 2 nemo/lightning/pytorch/callbacks/
  megatron_comm_overlap.py:122-128 @ v2.0.0 (e938df32), the same; NeMo 1 (the NeMo-Framework-Launcher recipes)
  nemo/collections/nlp/models/language_modeling/megatron_base_model.py:1002-1009 @ v2.0.0 "Setting
  `ub_tp_comm_overlap` to False".

So a Megatron-Bridge or NeMo plan with tp > 1 and sequence parallelism off has its TP collectives exposed. ``tp_hidden``
says so for a plan and for a search's batch alike (a batch shares its sequence parallelism: search/batch.py), and
``plan_host`` gives the host record (specs/host_cost.py ``hidden_tp``) that composes the plan's passes with it
(step/passes.py reads both: the overlap rules, selective recompute's re-run collectives, the host's segments).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from meshplan.specs.host_cost import HostCost


class Stack(Protocol):
    """What of a Stack (specs/stack.py, which reads this module) the TP overlap reads."""

    @property
    def overlap_tp(self) -> bool: ...

    @property
    def overlap_tp_needs_sp(self) -> bool: ...

    @property
    def host(self) -> HostCost: ...


def tp_hidden(stack: Stack, sequence_parallel: Any = None) -> bool:
    """Whether the TP collectives of a plan with ``sequence_parallel`` (Plan.sequence_parallel, one bool; None: no
    plan, the stack as stated) hide behind the GEMMs under ``stack``: its ``overlap_tp``, unless its framework turns
    the overlap off without sequence parallelism (``overlap_tp_needs_sp``)."""
    if not stack.overlap_tp:
        return False
    return sequence_parallel is None or not stack.overlap_tp_needs_sp or bool(sequence_parallel)


def plan_host(stack: Stack, sequence_parallel: Any) -> HostCost:
    """``stack.host`` for a plan with ``sequence_parallel``: its TP collectives hidden where ``tp_hidden`` says."""
    host = stack.host
    hidden = tp_hidden(stack, sequence_parallel)
    return host if host.hidden_tp == hidden else replace(host, hidden_tp=hidden)
