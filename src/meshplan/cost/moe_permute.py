"""The MoE token permutation, one micro-batch, one GPU: the permute that groups the routed rows by expert, the
unpermute that weights the experts' rows by their routing probabilities and sums each token's k rows back, as the
stack runs them (``stack.moe_permute``), and the tokens they see under the stack's dispatcher (``moe_dispatcher``)
(symbols: records.py; Tg tokens the permutation reads and the unpermutation writes, R routed rows the permutation
writes, each row h elements of ``a`` = 2 bytes, f = 4 bytes in float32).

Sources:
- ``fused``: Transformer Engine's permute and unpermute kernels (Megatron-Core --moe-permute-fusion,
  moe_utils.permute / unpermute with fused=True): one gather of the R rows, one weighted scatter-add.
- ``gather_scatter``: the same functions unfused (megatron/core/transformer/moe/moe_utils.py): permute is
  ``tokens.index_select(0, sorted_indices)``; unpermute multiplies the rows by their probabilities, then
  ``scatter_add_`` into zeros of the tokens' shape. Autograd's backward: the gather's is zeros and an index_put
  (accumulate); the scatter-add's an index_select of the tokens' gradient; the product's two products, dy·p for the
  rows and dy·y summed over h for the probabilities. Bytes as meshplan's trace counts an aten op (trace/cost.py:
  every input read once, every output written): per h-wide row of a bytes, permute forward Tg + R, backward 3Tg + R;
  unpermute forward 3Tg + 3R, backward Tg + 7R (meshplan's Megatron-order MoE module, autoshard/torch_models.py,
  runs exactly these aten ops).
- ``sort_gather``: transformers' grouped_mm experts (integrations/moe.py, grouped_mm_experts_forward): the rows
  gathered by the sorted order, the experts' rows weighted in float32 (the routing weights' dtype), put back in
  token order by a gather with the inverse permutation, summed over k in float32 ("reshape+sum accumulates in
  fp32") and cast back. Forward: permute (Tg + R)·a, unpermute R·(a + 4f) + Tg·(2f + a); backward: permute
  (3Tg + R)·a, unpermute Tg·(a + f) + R·(12f + 2a) (the cast's and the sum's backward, the inverse gather's zeros and
  index_put, the two products, the cast of the rows' gradient, the probabilities' row sums).

Dispatchers (Megatron-Core --moe-token-dispatcher-type; its TransformerConfig default is allgather): ``alltoall``
permutes the Tg = T/t tokens this GPU routes before the all-to-all, so R = k·Tg; ``allgather`` gathers the tokens of
the whole etp·ep group first and permutes those, Tg = etp·ep·T/t, keeping the rows of its own experts,
R = k·etp·T/t (balanced routing).
"""

from __future__ import annotations

from meshplan.cost.blocks import collective, elementwise
from meshplan.cost.records import ACT_BYTES, FP32, OpCost
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num


def rows_seen(plan: Plan, stack: Stack, routed: Num, topk: int) -> tuple[Num, Num]:
    """(Tg, R): the tokens the permutation reads and the routed rows it writes (module docstring)."""
    if stack.moe_dispatcher_mode.gathers_tokens:
        return routed * plan.etp * plan.ep, routed * topk * plan.etp
    return routed, routed * topk


def permutation(stack: Stack, tokens: Num, rows: Num, h: Num) -> list[OpCost]:
    """Permute and unpermute of ``tokens`` tokens into ``rows`` routed rows, h wide (module docstring)."""
    a, f = ACT_BYTES, FP32
    permute = stack.moe_permute_mode  # its record (specs/stack_variants.py)
    if permute.fused:
        return (elementwise("moe/permute", rows * h, rows * h, 0.0)
                + elementwise("moe/unpermute", rows * h, tokens * h, 2.0))
    if not permute.fp32_unpermute:  # gather_scatter
        fwd_p, bwd_p = (tokens + rows) * a, (3 * tokens + rows) * a
        fwd_u, bwd_u = (3 * tokens + 3 * rows) * a, (tokens + 7 * rows) * a
    else:  # sort_gather
        fwd_p, bwd_p = (tokens + rows) * a, (3 * tokens + rows) * a
        fwd_u, bwd_u = rows * (a + 4 * f) + tokens * (2 * f + a), tokens * (a + f) + rows * (12 * f + 2 * a)
    return [OpCost("moe/permute", "fwd", "memory", 0.0, fwd_p * h),
            OpCost("moe/permute", "bwd_x", "memory", 0.0, bwd_p * h),
            OpCost("moe/unpermute", "fwd", "memory", 2.0 * rows * h, fwd_u * h),
            OpCost("moe/unpermute", "bwd_x", "memory", 4.0 * rows * h, bwd_u * h)]


def gather_dispatch(plan: Plan, tokens: Num, h: Num) -> list[OpCost]:
    """The all-gather dispatcher's collectives over the etp·ep group: the ``tokens`` (Tg, every rank's) gathered
    before the permutation and reduce-scattered after the unpermutation, and the reverse backward
    (Megatron-Core MoEAllGatherTokenDispatcher: gather_from_sequence_parallel_region over the tensor- and
    expert-parallel group, reduce_scatter_to_sequence_parallel_region back)."""
    group = plan.etp * plan.ep
    size = tokens * h * ACT_BYTES
    return [collective("moe/dispatch", "fwd", "all_gather", size, "etp_ep", group),
            collective("moe/combine", "fwd", "reduce_scatter", size, "etp_ep", group),
            collective("moe/combine", "bwd_x", "all_gather", size, "etp_ep", group),
            collective("moe/dispatch", "bwd_x", "reduce_scatter", size, "etp_ep", group)]
