"""DeepSeek Sparse Attention's per-op costs, one micro-batch, one GPU: the lightning indexer (its projections, the
index scores of every query against every earlier key, the top-k selection) and the keys each query then attends
(``selected_keys``, which attention.core_attention prices the main attention over) (symbols: records.py; the
indexer's weights: model.py ``indexer_params``; n_i indexer heads of d_i, k = ``index_topk``).

Sources: DeepSeek-AI 2025, "DeepSeek-V3.2: Pushing the Frontier of Open Large Language Models" (arXiv 2512.02556),
§2.1 (DeepSeek-V3.2-Exp's DSA): the index score I_{t,s} = Σ_j w_{t,j}·ReLU(q_{t,j}·k_s) over n_i heads, each query
keeps the k keys of the highest scores (k = 2,048), "reducing the core attention complexity of the main model from
O(L²) to O(L·k)", the indexer itself O(L²) but light (few heads, FP8); in the sparse training stage the indexer is
trained by a KL loss over the selected keys only, its input detached from the main model's graph. The modules are
transformers' DeepseekV32Indexer (models/deepseek_v32/modeling_deepseek_v32.py) and Megatron-Core's DSAIndexer
(megatron/core/transformer/experimental_attention_variant/dsa.py: its linears ``parallel_mode="duplicated"``, every
tensor-parallel rank computing the whole indexer on the gathered sequence; x and the query latent ``detach()``-ed;
``_compute_index_scores`` the BF16 form of DeepSeek's fp8_index kernel: q·kᵀ, ReLU, the per-head weights, the sum
over heads, as FP32 logits, then ``topk``).
Not modelled: the FP8 of DeepSeek's indexer kernel (priced in 16 bits, as Megatron-Core runs it), the main
attention's distribution over the selected keys that the KL loss reads (a by-product of the sparse kernel), and
the MQA form of MLA DeepSeek's sparse kernel runs (the core is priced in MLA's per-head form, as
``attention.core_attention`` prices MLA and transformers computes it).
"""

from __future__ import annotations

from meshplan.cost.blocks import elementwise, gemm
from meshplan.cost.records import ACT_BYTES, FP32, Dims, OpCost
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan

INDEX_BYTES = 4  # an int32 key index (DeepseekV32Indexer returns ``.to(torch.int32)``)


def selected_keys(model: ModelSpec) -> float:
    """Keys a query attends on average: min(i + 1, k) over the positions i = 0 … s − 1, the count a causal sliding
    window of k keys gives (``ModelSpec.window_keys``): k − k·(k − 1)/(2s) with k = min(index_topk, s)."""
    k, s = min(model.index_topk, model.seq_length), model.seq_length
    return k - k * (k - 1) / (2 * s)


def indexer_flops_per_token(model: ModelSpec) -> float:
    """Training FLOPs per token of one indexer beyond 6 per weight (flops.model_flops_per_token counts its weights
    among the matmul parameters): its scores as ``indexer_ops`` runs them, (2·d_i + 3)·n_i·s/2 forward (the causal
    half: counting the masked half too, as PaLM's convention does for attention, would put MFU above the GEMM rate
    the scores run at, the indexer being most of a long sequence's attention work) and 6·d_i·n_i·k̄ backward
    (``selected_keys``), less 2 per indexer weight (its detached inputs get no gradient)."""
    if not model.index_topk:
        return 0.0
    heads, dim = model.index_heads, model.index_head_dim
    scores = (2.0 * dim + 3.0) * heads * model.seq_length / 2 + 6.0 * dim * heads * selected_keys(model)
    return scores - 2.0 * model.indexer_params()


def indexer_ops(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """The lightning indexer on the T tokens of this GPU's micro-batch, whole on every tensor-parallel rank:
    - wq_b r_q → n_i·d_i on the query latent, wk H → d_i and weights_proj H → n_i: GEMMs whose inputs are detached,
      so their backward computes weight gradients only; they keep the query latent and the whole sequence's x (the
      indexer gathers it under sequence parallelism) for those;
    - k_norm, a LayerNorm over d_i (5 FLOPs an element, as the pre-norms');
    - the scores, (T·n_i × d_i)·(d_i × s) with the causal half of the keys skipped, and ReLU, weight and sum over
      the heads (3 FLOPs a head and key): reads q, k and the weights, writes T·s FP32 logits;
    - top-k: reads the logits, writes T·k int32 indices, kept for the backward of the sparse attention;
    - backward (the KL loss over the selected keys): the scores over a query's selected keys recomputed and their
      gradients to q and k, three (T·n_i × d_i)·(d_i × k̄) products, k̄ = ``selected_keys``."""
    if not model.index_topk:
        return []
    t, s, a = d.tokens, d.seq, ACT_BYTES
    heads, dim, kept = model.index_heads, model.index_head_dim, selected_keys(model)
    ops: list[OpCost] = []
    for name, k, n, saved in (("dsa/wq_b", model.q_lora_rank, heads * dim, None),
                              ("dsa/wk", model.hidden_size, dim, None),  # x, gathered: saved once for both
                              ("dsa/weights_proj", model.hidden_size, heads, 0.0)):
        ops += [op for op in gemm(name, t, k, n, d, saved=saved) if op.phase != "bwd_x"]
    ops += [op for op in elementwise("dsa/k_norm", t * dim, t * dim, 5.0) if op.phase == "fwd"]
    q_bytes, k_bytes, logits = t * heads * dim * a, t * dim * a, t * s * FP32
    score_flops = (2.0 * dim + 3.0) * heads * t * s / 2
    ops.append(OpCost("dsa/scores", "fwd", "gemm", score_flops, q_bytes + k_bytes + t * heads * FP32 + logits,
                      m=t * heads, n=s / 2, k=dim))
    ops.append(OpCost("dsa/topk", "fwd", "memory", 0.0, logits + t * kept * INDEX_BYTES,
                      saved=t * model.index_topk * INDEX_BYTES))
    ops.append(OpCost("dsa/scores", "bwd_x", "gemm", 3 * 2.0 * dim * heads * t * kept,
                      2 * (q_bytes + k_bytes) + t * kept * INDEX_BYTES, m=t * heads, n=kept, k=dim))
    return ops
