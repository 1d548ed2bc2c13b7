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

Around the experts, Megatron-Core (``stack.fusion = "fused"``) moves the R rows twice more on each side:
- ``local_sort``: the all-to-all dispatcher's "permutation 2" (megatron/core/transformer/moe/token_dispatcher.py
  @ core_v0.16.1, MoEAlltoAllTokenDispatcher.dispatch_postprocess / combine_preprocess): the rows arrive grouped by
  source rank and, with more than one local expert, ``sort_chunks_by_idxs`` regroups them by local expert (with
  their probabilities) before the experts and back to source-rank order before the combine; Transformer Engine's
  fused_sort_chunks_by_index(_with_probs) under --moe-permute-fusion, a split and a cat otherwise: each reads and
  writes the R rows (and the float32 probabilities), forward and, as the inverse sort of the gradient, backward.
  The all-gather dispatcher permutes straight into local-expert order, and the flex dispatcher permutes once after
  its exchange (the ``moe/permute`` record), so neither runs it.
- ``fp8_padding``: with fp8 / fp4 GEMMs TEGroupedMLP pads each local expert's rows to the GEMMs' alignment
  (megatron/core/transformer/moe/experts.py @ core_v0.16.1, TEGroupedMLP.forward: quantization_padding of the rows
  and of the probabilities, quantization_unpadding of the output), Transformer Engine's Fp8Padding / Fp8Unpadding
  (transformer_engine/pytorch/module/fp8_padding.py, fp8_unpadding.py @ v2.8: fused_multi_row_padding into a new
  tensor, 16 rows, 32 under MXFP8, skipped only when every expert's count is already aligned, which random or
  learned routing does not give: the benchmark's forced balance draws random logits, moe_utils.RandomSTE; a
  HybridEP dispatch pads inside and a token drop padded to an aligned capacity gives aligned counts: no copy).
  Megatron-Core's default moe_router_padding_for_fp8 = False, which the Megatron-Bridge Qwen3, DeepSeek and GPT-OSS
  recipes keep (src/megatron/bridge/recipes/qwen/qwen3_moe.py: False in v0.3.1 and v0.4.0, unset in v0.2.0 and
  v0.3.0); with it True the router pads the routing map instead and this copy does not run (not a stack field yet).
  Forward: the rows padded (read and write R·h), the output unpadded (the same); backward the reverse of each. The
  few padding rows are neglected.
  Not on a fused grouped MLP (``expert_gemm = "grouped"``: Transformer Engine's fused kernel reads the rows as they
  are) nor on eager stacks' experts.
"""

from __future__ import annotations

from meshplan.cost.blocks import collective, elementwise
from meshplan.cost.records import ACT_BYTES, FP32, LOW_PRECISION_BYTES, OpCost
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num, where


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


def local_sort(stack: Stack, rows: Num, h: Num, local: Num) -> list[OpCost]:
    """The all-to-all dispatcher's sort of ``rows`` received rows, h wide, by ``local`` experts and back (module
    docstring): per pass two sorts, each reading and writing the rows; the dispatch side's carries the float32
    probabilities too. None for one local expert (``local`` <= 1), other dispatchers or eager stacks."""
    mode = stack.moe_dispatcher_mode
    if not stack.fusion_mode.fused or mode.gathers_tokens or mode.forwards:
        return []
    moved = where(local > 1, 2 * (2 * rows * h * ACT_BYTES) + 2 * rows * FP32, 0.0)
    return [OpCost("moe/sort_chunks", "fwd", "memory", 0.0, moved),
            OpCost("moe/sort_chunks", "bwd_x", "memory", 0.0, moved)]


def quantization_align(precision: str) -> int:
    """The rows an fp8 / fp4 grouped GEMM's experts are padded to: 32 under MXFP8 and FP4, 16 under other fp8
    recipes (Megatron-LM core_v0.16.1 moe_utils.get_align_size_for_quantization, fp8_utils.get_fp8_align_size,
    fp4_utils.get_fp4_align_size)."""
    return 32 if precision in ("mxfp8", "fp4") else 16


def fp8_padding(stack: Stack, precision: str, rows: Num, h: Num, aligned: Num = False) -> list[OpCost]:
    """TEGroupedMLP's padding of ``rows`` routed rows, h wide, to the fp8 / fp4 GEMMs' alignment and the unpadding
    of its output (module docstring): per pass two copies, each reading and writing the rows, and the float32
    probabilities' padding forward and their gradient's unpadding backward. None where every expert's count is
    ``aligned`` already (Fp8Padding's "no padding needed": a HybridEP dispatch that pads, a token drop padded to an
    aligned capacity)."""
    if (aligned is True or precision not in LOW_PRECISION_BYTES or not stack.fusion_mode.fused
            or stack.expert_gemm_mode.grouped):
        return []
    moved = 2 * (2 * rows * h * ACT_BYTES) + 2 * rows * FP32
    if aligned is not False:  # aligned at some of a search's sizes only
        moved = where(aligned, 0.0, moved)
    return [OpCost("moe/experts/fp8_pad", "fwd", "memory", 0.0, moved),
            OpCost("moe/experts/fp8_pad", "bwd_x", "memory", 0.0, moved)]
