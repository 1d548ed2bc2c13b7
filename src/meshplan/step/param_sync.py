"""How ZeRO 1 / 2 puts the updated weights back on every data-parallel rank (``Stack.param_sync``).

After the optimizer has updated its shard, each of the g ranks of the ZeRO group holds n/g of the n bytes of 16-bit
weights and every rank needs all n:
- all_gather (the default; Megatron-Core's distributed optimizer, DeepSpeed's ZeRO-1 / 2): one all-gather of the n
  bytes over the g ranks, t = AG(n, g);
- shard_broadcasts (InternEvo's HybridZeroOptimizer, InternLM/InternEvo
  internlm/solver/optimizer/hybrid_zero_optim.py @c628a8c87411, ``broadcast_params``, lines 809-837): one
  ``dist.broadcast`` per ZeRO rank, each of that rank's flat shard from that rank (src = g_rank), all with
  async_op=True on the same process group, so on one NCCL communicator's stream, which runs them one after the other:
  their times add,
      t = g · BC(n/g, g)
  each broadcast priced as any other (collectives/price.py; beyond the node comm._scatter_gather, NCCL's ring over all g
  ranks: g − 1 hops of latency and the all-gather's bytes at bus factor 1; inside it tuning.cc's g steps), so each
  pays the ring's latency and g of them pay it g times: the latency term grows as g², the all-gather's as g.
  Its config (configs/7B_sft.py @c628a8c: hybrid_zero_optimizer overlap_sync_param=False) issues them after the
  step, before the next forward, and waits (``handle.wait()``): the validation maps that as overlap_param_gather false.

Monotone: BC is non-increasing in every bandwidth and non-decreasing in every latency, and t is g of it; so t is.

And how ZeRO 1 / 2 reduces the gradients (``Stack.grad_sync``), for n gradient bytes a rank, its N data-parallel
replicas and its ZeRO group of g = N / I ranks (I instances: cost/zero_group.py, collectives/groups.zero_layouts):
- reduce_scatter (the default; Megatron-Core's distributed optimizer, megatron/core/distributed/
  param_and_grad_buffer.py ``start_grad_sync``, megatron-core 0.16.1): a reduce-scatter within the ZeRO group, then,
  with I > 1, an all-reduce of the rank's n/g shard across the I instances, on the same stream after it:
      t = RS(n, g) + AR(n/g, I)        (I = 1: RS(n, N), the plain ZeRO)
- all_reduce (InternEvo's HybridZeroOptimizer @c628a8c87411, ``_reduce_and_copy``: reduce_tensor with dst_rank None,
  an all-reduce of each bucket over ParallelMode.DATA whatever its zero1 size): t = AR(n, N); each rank keeps its
  shard of the result.
The weights come back within the ZeRO group: AG(n_w, g), or the g broadcasts above.
"""

from __future__ import annotations

from collections.abc import Callable

from meshplan.collectives.comm import Layout
from meshplan.collectives.groups import axis_layout, zero_layouts
from meshplan.cost.zero_group import weight_replicas, zero_groups
from meshplan.specs.plan import Plan
from meshplan.xp import Num, maximum

PARAM_SYNCS = ("all_gather", "shard_broadcasts")  # Stack.param_sync's choices
GRAD_SYNCS = ("reduce_scatter", "all_reduce")  # Stack.grad_sync's choices
# where a data-parallel collective runs: over every replica, within the ZeRO group, across the instances
WHERE = ("whole", "zero", "across")


def weight_sync(kind: str, nbytes: Num, group: Num, price: Callable[[str, Num, Num], Num]) -> Num:
    """Seconds for the collective ``kind`` of ``nbytes`` over ``group`` ranks, ``price(kind, nbytes, group)``, where
    ``kind`` may also be a ``Stack.param_sync``: shard_broadcasts is ``group`` broadcasts of nbytes/group each, one
    after the other (module docstring); every other kind is ``price``'s own."""
    if kind != "shard_broadcasts":
        return price(kind, nbytes, group)
    g = maximum(group, 1)
    return g * price("broadcast", nbytes / g, group)


def gradient_sync(kind: str, plan: Plan, coll: Callable[[str, int, str], Num]) -> Num:
    """Seconds of ZeRO 1 / 2's gradient reduction by ``Stack.grad_sync`` ``kind`` (module docstring) of ``plan``'s
    gradient bytes, from ``coll(collective, bytes per parameter, where)``: the collective over the rank's parameters,
    ``where`` one of WHERE (``dp_groups``); nothing across a single instance."""
    if kind == "all_reduce":
        return coll("all_reduce", plan.grad_bytes, "whole")
    within = coll("reduce_scatter", plan.grad_bytes, "zero")
    if plan.distributed_optimizer_instances == 1:
        return within
    return within + coll("all_reduce", plan.grad_bytes, "across")


def dp_groups(plan: Plan) -> dict[str, tuple[tuple[Num, Layout, Num], tuple[Num, Layout, Num]]]:
    """For each of WHERE: (ranks, layout, share of the rank's parameters it carries) of a dense and of an expert
    weight's collective: every replica (N, the dp·cp or edp layout, 1), the ZeRO group (g, its layout, 1), the
    instances (I, their layout, 1/g: each rank's shard)."""
    (n_d, n_e), i = weight_replicas(plan), plan.distributed_optimizer_instances
    whole = ((n_d, axis_layout(plan, "dp"), 1.0), (n_e, axis_layout(plan, "edp"), 1.0))
    if isinstance(i, int) and i == 1:  # one instance (every plan the search makes): the ZeRO group is every replica,
        # the same objects (price.priced_on splits a group once, by identity), the instances one rank each
        return {"whole": whole, "zero": whole, "across": ((1, 1, 1 / n_d), (1, 1, 1 / n_e))}
    (g_d, g_e), (zero_d, across_d, zero_e, across_e) = zero_groups(plan), zero_layouts(plan)
    return {"whole": whole, "zero": ((g_d, zero_d, 1.0), (g_e, zero_e, 1.0)),
            "across": ((i, across_d, 1 / g_d), (i, across_e, 1 / g_e))}
