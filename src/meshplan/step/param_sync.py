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
Left out: InternEvo's gradient side, an all-reduce per bucket (reduce_tensor with dst_rank None, the same file's
_reduce_and_copy), which the plan's ZeRO-1 prices as a reduce-scatter.
"""

from __future__ import annotations

from collections.abc import Callable

from meshplan.xp import Num, maximum

PARAM_SYNCS = ("all_gather", "shard_broadcasts")  # Stack.param_sync's choices


def weight_sync(kind: str, nbytes: Num, group: Num, price: Callable[[str, Num, Num], Num]) -> Num:
    """Seconds for the collective ``kind`` of ``nbytes`` over ``group`` ranks, ``price(kind, nbytes, group)``, where
    ``kind`` may also be a ``Stack.param_sync``: shard_broadcasts is ``group`` broadcasts of nbytes/group each, one
    after the other (module docstring); every other kind is ``price``'s own."""
    if kind != "shard_broadcasts":
        return price(kind, nbytes, group)
    g = maximum(group, 1)
    return g * price("broadcast", nbytes / g, group)
