"""The MoE layer in inference, one iteration, one GPU: the router, the experts the batch touches, the token
dispatch and combine, the shared experts (symbols: cost/decode.py).

Under uniform top-k routing a token picks k of the E experts, so an expert is missed by one token with probability
1 − k/E and by T independent tokens with (1 − k/E)^T: the batch touches E·(1 − (1 − k/E)^T) distinct experts in
expectation (the occupancy problem, Feller 1968, "An Introduction to Probability Theory and Its Applications" I,
§II.11; MoE-CAP, Jiang et al. 2024, arXiv 2412.07067, §4 counts the activated experts' bytes the same way for its
sparse memory-bandwidth utilisation). A decode step reads only those experts' weights: few at batch 1 (k per layer),
all of them from a few hundred tokens on (DeepSeek-V3: 256 experts, top-8, all but 1 % touched from 150 tokens).
Routing is taken as uniform (balanced); real routers favour some experts and touch fewer.

Placement (plan.py): expert-parallel, ep = t·dpa GPUs each holding E/ep whole experts and seeing all T = R·dpa
tokens of the stage's attention groups, k/ep of them each; with dpa > 1 the tokens are dispatched to their experts'
GPUs and combined back by all-to-alls over the ep group (each GPU sends its 1/t share of its group's tokens, k
copies each: DeepEP's low-latency kernels, and its normal kernels inside a node; the dispatch at the activations'
precision, the combine in 16 bits), then gathered across the t ranks of the group (an engine that runs DeepEP's
normal kernels for its iterations with prompt tokens, ``moe_comm = "deepep"``, sends a token once to each other node
it hits there and forwards it over NVLink: dispatch.py); with dpa = 1 every rank of the group already has every token,
runs its experts on them and the partial sums meet in the tensor-parallel all-reduce (vLLM's expert parallelism
with tensor-parallel attention). Tensor-parallel experts (ep = 1): every GPU holds 1/t of every expert (Fe/t wide)
and runs all R·k routed rows through it; the all-reduce combines them.
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.decode import Shape, activation, collective, gemm, norm, sixteen_bit, stream
from meshplan.cost.records import ACT_BYTES, OpCost
from meshplan.cost.shapes import fc1_width
from meshplan.serve.ops import mlp_ops
from meshplan.specs.model import ModelSpec
from meshplan.xp import Num, where


def touched_experts(experts: Num, topk: Num, tokens: Num) -> Num:
    """Expected distinct experts T tokens touch under uniform top-k routing: E·(1 − (1 − k/E)^T)."""
    return experts * (1 - (1 - topk / experts) ** tokens)


def moe_ops(model: ModelSpec, sh: Shape) -> list[OpCost]:
    h, E, k = model.hidden_size, model.num_experts, model.moe_topk
    R, ep, t = sh.rows, sh.ep, sh.tp
    expert_parallel = ep > 1
    tokens = R * sh.dpa  # the stage's tokens, every attention group's
    local = where(expert_parallel, E / ep, E)  # experts on this GPU (whole, or their 1/t slices)
    rows = where(expert_parallel, tokens * k / ep, R * k)
    ffn = where(expert_parallel, model.moe_ffn_hidden_size, model.moe_ffn_hidden_size / t)
    touched = touched_experts(E, k, tokens) * (local / E)  # of this GPU's share
    width_in = fc1_width(model, ffn)
    ops = [norm("moe/norm", model, sh), sixteen_bit(gemm("moe/router", R, h, E, ACT_BYTES, ACT_BYTES))]
    ops += [gemm("moe/experts/fc1", rows, h, width_in, sh.w_bytes, sh.a_bytes, groups=touched),
            activation("moe/experts/act", rows, width_in, ffn),
            gemm("moe/experts/fc2", rows, ffn, h, sh.w_bytes, sh.a_bytes, groups=touched),
            stream("moe/permute", 2 * ACT_BYTES * rows * h * 2)]  # gather the routed rows, scatter-add them back
    if model.shared_expert_ffn_size:
        ops += mlp_ops(model, sh, model.shared_expert_ffn_size / t, "moe/shared")
    return ops + moe_comm(model, sh)


def moe_comm(model: ModelSpec, sh: Shape) -> list[OpCost]:
    """Dispatch and combine (data-parallel attention) or the tensor-parallel all-reduce (module docstring). Under
    data-parallel attention by all-to-alls of each token's k copies, or (``sh.gather``, TensorRT-LLM's default) by an
    all-gather of every token of the stage to every GPU of the ep group and a reduce-scatter of the experts' sums."""
    h, k, t, R = model.hidden_size, model.moe_topk, sh.tp, sh.rows
    many = sh.dpa > 1  # a collective not run is priced over a group of one: no time, no latency
    sent = R / t * k * h  # elements a GPU sends to the experts' GPUs
    ep = where(many, sh.ep, 1)
    if sh.gather:
        every = R * sh.dpa * h  # the stage's tokens, gathered to each GPU
        return [collective("moe/dispatch", "all_gather", every * sh.a_bytes, "ep", ep),
                collective("moe/combine", "reduce_scatter", every * ACT_BYTES, "ep", ep),
                collective("moe/tp", "all_reduce", R * h * ACT_BYTES, "tp", where(many, 1, t))]
    exchange = [collective("moe/dispatch", "all_to_all", sent * sh.a_bytes, "ep", ep),
                collective("moe/combine", "all_to_all", sent * ACT_BYTES, "ep", ep)]
    if sh.forwarded:  # DeepEP: its normal kernels where the iteration carries prompt tokens (dispatch.py)
        routed = where(sh.prefill > 0, model.num_experts, 0.0)
        exchange = [replace(op, collective=replace(c, copies=int(k), experts=routed))
                    for op in exchange if (c := op.collective) is not None]
    return [*exchange,
            collective("moe/tp_gather", "all_gather", R * h * ACT_BYTES, "tp", where(many, t, 1)),
            collective("moe/tp", "all_reduce", R * h * ACT_BYTES, "tp", where(many, 1, t))]
