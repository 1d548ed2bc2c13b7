"""Inference: prefill, decode and the KV cache on the training model's per-op records, and the serving search
(docs/SERVING.md). Read in data-flow order: precision, engine, plan, kv, efficiency, ops, moe, iteration, memory,
metrics, check, estimate, space, search, curves."""
