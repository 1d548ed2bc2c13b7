"""Per-op cost records: the FLOPs, bytes and collectives of every op of a layer, forward and backward.

In data-flow order: records (OpCost, Dims, the symbol glossary), blocks (GEMM, element-wise op, collective, norm,
tensor-parallel entry and exit, residual), attention, mamba, mlp_moe, eager, casts, lora, fsdp, embed_head
(embedding, LM head, loss, multi-token prediction), pipeline (p2p), linear_2d (seed 001), summa (2D tensor
parallelism), layers (one layer of each kind: the dispatcher), recompute (what selective recompute re-runs and
frees). Shared with serving (serve/ops.py and moe.py compose them): shapes (the projections' GEMM shapes), kv_cache
(the KV cache's geometry), decode (inference's forward-only records), params (the weights per GPU)."""
