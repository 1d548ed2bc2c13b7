"""Pipeline parallelism's point-to-point traffic: a stage's activations forward, their gradients back."""

from __future__ import annotations

from meshplan.cost.blocks import collective
from meshplan.cost.records import ACT_BYTES, OpCost, dims
from meshplan.specs.layouts import layout_of
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


def pipeline_p2p(model: ModelSpec, plan: Plan, stack: Stack) -> list[OpCost]:
    """Activations to the next stage forward and their gradients back, once per micro-batch and model chunk.

    Each tensor-parallel rank sends 1/t of the tensor over its own NIC: the sequence-parallel shard, or
    without sequence parallelism Megatron's scatter/gather optimisation (Narayanan et al. 2021 §4.1: split
    the replicated activation t ways, send the slices in parallel, all-gather them over NVLink on arrival).

    A pipeline runtime that sends whole (``PipelineRuntime.sends_whole``: Megatron-LM before its scatter/gather)
    sends the replicated tensor whole from every tensor-parallel rank and gathers nothing.
    """
    d = dims(model, plan, stack)
    full = d.tokens * model.hidden_size * ACT_BYTES
    sharded = plan.sequence_parallel or layout_of(plan.tensor_layout).sends_sharded
    if stack.pipeline_runtime_mode.sends_whole and not sharded:
        return [collective("pp/send_act", "fwd", "p2p", full, "pp", 2),
                collective("pp/send_grad", "bwd_x", "p2p", full, "pp", 2)]
    msg = full / d.tp
    ops = [collective("pp/send_act", "fwd", "p2p", msg, "pp", 2),  # between two neighbours; estimate.py
           collective("pp/send_grad", "bwd_x", "p2p", msg, "pp", 2)]  # counts it only when p > 1
    if not sharded:
        ops += [collective("pp/gather_act", "fwd", "all_gather", full, "tp", plan.tp),
                collective("pp/gather_grad", "bwd_x", "all_gather", full, "tp", plan.tp)]
    return ops
