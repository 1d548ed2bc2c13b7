"""The host's cost of issuing work, as one small record (issue 82, deliverable 3): what a pass's composition with the
host (step/host.py: its segments between synchronisations) needs of a stack, and nothing else of it, so the
per-kernel cost does not travel inside the whole ``Stack``.

The unit is seconds of host CPU per kernel launched (``per_kernel``; a stack's 12-15 µs measured on an x86 DGX host,
each preset beside its source), with the few other host costs a step pays in their own units (per collective call,
per compiled region, per parameter tensor, per micro-batch, per step) and how the host meets the GPU (one graph per
pass, a host that waits for each exposed collective, launches that block). ``source``: the stack and version whose
measurement these are (the preset's ``name``, ``version`` and ``source``).

A serving engine's host (serve/engine.py ``Engine.host``) is the same record: its per-kernel cost as a layer's eager
launches (``per_layer``), and its loop's costs per iteration and per running sequence, with whether the loop is
Python (scaled by the host CPU's Python speed) and whether it runs beside the GPU's step (``overlapped``).

The TP overlap a plan runs (``tp_hidden``, ``plan_host``): a stack's ``overlap_tp`` (Megatron --tp-comm-overlap,
Transformer Engine's userbuffers overlap of the TP collectives with the GEMMs) as its framework runs it in one plan,
the one place the pricing reads it (``hidden_tp``).

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
``plan_host`` gives the host record (``HostCost.hidden_tp``) that composes the plan's passes with it
(step/passes.py reads both: the overlap rules, selective recompute's re-run collectives, the host's segments)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

# One eager PyTorch op that launches a kernel, on an x86 DGX H100 host: the Python call, the dispatcher and the launch,
# 14.5 us, the middle of the 11.3-17.7 us per eager op that NVIDIA's dgxc-benchmarking measures
# (microbenchmarks/cpu_overhead, "Kernel launch test"). The one price of a host dispatch that the stacks' and engines'
# counts of such ops share: DeepSpeed's optimizer wrappers per tensor (cost/wrappers.py), a Megatron TP collective's
# call (presets/stacks/megatron-deepspeed.toml collective_host), vLLM V0's input broadcast per tensor on each receiving
# worker (serve/engine.py tp_broadcast_dispatches).
EAGER_OP_HOST = 14.5e-6


@dataclass(frozen=True, kw_only=True, slots=True)
class HostCost:
    """Host seconds per unit of work issued on an x86 DGX host, and how the host meets the GPU (module docstring)."""

    per_kernel: float = 0.0  # each launched kernel (Stack.host_dispatch)
    per_collective: float | None = None  # each collective call as stated, 0 too; None: per_kernel (Stack.host)
    per_region: float = 0.0  # each torch.compile region and pass beyond its launches (Stack.region_host)
    compiled: bool = False  # each layer is such a region (Stack.compiled)
    cuda_graphs: bool = False  # one graph launch per pass instead of each kernel
    blocking_collectives: bool = False  # the host waits out each exposed collective: a synchronisation
    blocking_launches: bool = False  # every launch waits for its kernel: host and GPU take turns
    drained_layers: bool = False  # every layer's pass starts from an empty queue (Stack.drained_passes "layers")
    hidden_tp: bool = False  # TP collectives hide behind the GEMMs (tp_hidden): they close no segment
    # serving (Engine.host): the engine loop's seconds per iteration and per running sequence the GPU waits on, per
    # running sequence beside the GPU's step, and one eager layer's launches
    per_iteration: float = 0.0  # Engine.iteration_overhead
    per_sequence: float = 0.0  # Engine.sequence_overhead
    hidden_per_sequence: float = 0.0  # Engine.hidden_sequence_overhead
    per_layer: float = 0.0  # Engine.eager_layer_overhead
    per_layer_tp: float = 0.0  # and more per eager layer at tp > 1, its all-reduces (Engine.eager_layer_tp_overhead)
    in_python: bool = False  # the loop's time scales with the host CPU's Python speed (Engine.host_in_python)
    overlapped: bool = False  # the host prepares iteration n + 1 while the GPU runs n (Engine.host_overlap)
    source: str = ""

    def per_call(self, collective: bool) -> float:
        """Host seconds per launch: a collective call at ``per_collective`` where stated (0: the host issues no such
        call), else ``per_kernel``."""
        return self.per_collective if collective and self.per_collective is not None else self.per_kernel


class OverlapStack(Protocol):
    """What of a Stack (specs/stack.py, which reads this module) the TP overlap reads."""

    @property
    def overlap_tp(self) -> bool: ...

    @property
    def overlap_tp_needs_sp(self) -> bool: ...

    @property
    def host(self) -> HostCost: ...


def tp_hidden(stack: OverlapStack, sequence_parallel: Any = None) -> bool:
    """Whether the TP collectives of a plan with ``sequence_parallel`` (Plan.sequence_parallel, one bool; None: no
    plan, the stack as stated) hide behind the GEMMs under ``stack``: its ``overlap_tp``, unless its framework turns
    the overlap off without sequence parallelism (``overlap_tp_needs_sp``)."""
    if not stack.overlap_tp:
        return False
    return sequence_parallel is None or not stack.overlap_tp_needs_sp or bool(sequence_parallel)


def plan_host(stack: OverlapStack, sequence_parallel: Any) -> HostCost:
    """``stack.host`` for a plan with ``sequence_parallel``: its TP collectives hidden where ``tp_hidden`` says."""
    host = stack.host
    hidden = tp_hidden(stack, sequence_parallel)
    return host if host.hidden_tp == hidden else replace(host, hidden_tp=hidden)
