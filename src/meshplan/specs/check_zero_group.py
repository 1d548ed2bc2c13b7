"""The rules of a ZeRO group smaller than the data-parallel ranks (``Plan.distributed_optimizer_instances``,
cost/zero_group.py), for check.py.

I instances split the dp·cp ranks into I ZeRO groups of the inner dp/I data-parallel ranks (cp whole): I divides dp
(Megatron-Core 0.16.1 parallel_state.py asserts that I divides dp·cp, and the expert-data-parallel size alike). Only
ZeRO 1 and 2 shard within a group: stage 0 shards nothing (Megatron-Core: "Partial DistOpt cannot be used without
DistOpt", distributed_data_parallel.py), and ZeRO-3 within groups is FSDP's hybrid sharding, which no field prices;
nor a parameter server's exchange (step/param_server.ps_collectives) or an FSDP stack's.
"""

from __future__ import annotations

from meshplan.fields import MAX_GPUS
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


def zero_group_refusals(model: ModelSpec, plan: Plan, stack: Stack) -> list[str]:
    """Every rule of the module docstring that ``plan`` breaks, each with its numbers; [] for one instance."""
    i = plan.distributed_optimizer_instances
    if not isinstance(i, int) or isinstance(i, bool) or not 1 <= i <= MAX_GPUS:
        return [f"distributed_optimizer_instances={i!r} must be a positive integer of at most {MAX_GPUS}"]
    if i == 1:
        return []
    reasons = []
    if plan.dp % i:
        reasons.append(f"distributed_optimizer_instances={i} does not divide dp={plan.dp}")
    experts = plan.tp * plan.cp * plan.dp // (plan.ep * plan.etp)
    if model.is_moe and experts % i:
        reasons.append(f"distributed_optimizer_instances={i} does not divide the expert-data-parallel size "
                       f"tp*cp*dp/(ep*etp) = {experts}")
    if plan.zero not in (1, 2):
        reasons.append(f"distributed_optimizer_instances={i} needs ZeRO 1 or 2 (zero={plan.zero}: stage 0 shards "
                       "nothing, ZeRO-3 within groups is hybrid sharding, not modelled)")
    if plan.dp_mode != "allreduce" or stack.fsdp_mode.shards:
        reasons.append(f"distributed_optimizer_instances={i}: ZeRO groups are modelled for the collectives of a "
                       f"distributed optimizer (not dp_mode={plan.dp_mode}, fsdp={stack.fsdp})")
    return reasons
