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
Python (scaled by the host CPU's Python speed) and whether it runs beside the GPU's step (``overlapped``)."""

from __future__ import annotations

from dataclasses import dataclass

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
    per_collective: float = 0.0  # each collective call where stated, else per_kernel (Stack.collective_host)
    per_region: float = 0.0  # each torch.compile region and pass beyond its launches (Stack.region_host)
    compiled: bool = False  # each layer is such a region (Stack.compiled)
    cuda_graphs: bool = False  # one graph launch per pass instead of each kernel
    blocking_collectives: bool = False  # the host waits out each exposed collective: a synchronisation
    blocking_launches: bool = False  # every launch waits for its kernel: host and GPU take turns
    drained_layers: bool = False  # every layer's pass starts from an empty queue (Stack.drained_passes "layers")
    hidden_tp: bool = False  # TP collectives hide behind the GEMMs (tp_overlap.tp_hidden): they close no segment
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
        """Host seconds per launch: a collective call at ``per_collective`` where stated, else ``per_kernel``."""
        return self.per_collective if collective and self.per_collective else self.per_kernel
