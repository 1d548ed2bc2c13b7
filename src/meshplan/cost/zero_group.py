"""The ZeRO group: the data-parallel ranks over which ZeRO 1 / 2 shard the optimizer state (and, at stage 2, the
gradients), where it is smaller than the ranks that replicate the weights.

Symbols: N_d = dp·cp the ranks that replicate a dense weight (Megatron reduces gradients over the data- and
context-parallel ranks together), N_e = tp·cp·dp / (ep·etp) the expert-data-parallel ranks replicating an expert
weight, I = ``plan.distributed_optimizer_instances``. The ZeRO groups are g_d = N_d / I and g_e = N_e / I ranks.

- Megatron-Core ``--num-distributed-optimizer-instances I`` (megatron-core 0.16.1, megatron/core/parallel_state.py
  ``initialize_model_parallel``: the dp-cp group's ranks cut into I contiguous "intra partial data parallel" groups
  of dp·cp/I, the inner ones; the expert-data-parallel group alike): each instance of the distributed optimizer
  shards its state over its g ranks and the I instances hold copies. Its gradients
  (megatron/core/distributed/param_and_grad_buffer.py ``start_grad_sync``): a reduce-scatter of the n gradient bytes
  within the instance, then an all-reduce of the rank's n/g shard across the I instances, both on one communication
  stream, one after the other; its weights: an all-gather of the n weight bytes within the instance.
- InternEvo's hybrid ZeRO (InternLM/InternEvo @c628a8c87411, internlm/core/context/process_group_initializer.py
  ``Initializer_Zero1``: zero1 groups of the inner ``zero1`` data-parallel ranks, at stride tp): I = dp / zero1; its
  gradients are all-reduced over the whole data-parallel group whatever the ZeRO group (hybrid_zero_optim.py
  ``_reduce_and_copy``: reduce_tensor with dst_rank None over ParallelMode.DATA), its weights broadcast within the
  zero1 group (step/param_sync.py): ``Stack.grad_sync`` "all_reduce".

Memory (cost/model_states.py): the optimizer state (stage 1) and gradients (stage 2) divide by g, not by N:
K·Ψ / g, so a larger group (fewer instances) never holds more. I = 1 is the plain ZeRO of every data-parallel rank.
"""

from __future__ import annotations

from meshplan.specs.plan import Plan
from meshplan.xp import Num


def weight_replicas(plan: Plan) -> tuple[Num, Num]:
    """(N_d, N_e): the ranks that replicate a dense and an expert weight (module docstring)."""
    return plan.dp * plan.cp, plan.tp * plan.cp * plan.dp / (plan.ep * plan.etp)


def zero_groups(plan: Plan) -> tuple[Num, Num]:
    """(g_d, g_e) = (N_d / I, N_e / I): the ranks a dense and an expert weight's ZeRO shards are spread over."""
    dense, expert = weight_replicas(plan)
    instances = plan.distributed_optimizer_instances
    return dense / instances, expert / instances
