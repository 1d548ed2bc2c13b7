"""The GEMM shapes of a layer's projections, defined once for training's op records (attention.py, mlp_moe.py) and
serving's (serve/ops.py, serve/moe.py), as (name, k, n) on one GPU: its input width and its output width there
(symbols: records.py; MLA's: DeepSeek-V2 §2.1, r_q and r_kv the query and key-value latent ranks, d_R the decoupled
RoPE key's width).

- The query, key and value projections (Shoeybi et al. 2019, §3: column-parallel, split by heads): one fused linear
  H → A/t·d + 2·K_g·d (+ A/t·d for an attention output gate, which the query projection emits: ModelSpec.gate_dim),
  K_g the KV heads a rank keeps (K/t; an inference engine keeps a whole head past K ranks,
  cost/kv_cache.kv_heads_per_gpu). MLA: the down-projections H → r_q and H → r_kv + d_R whole on every rank
  (cost/params.mla_down_params cites Megatron-Core and vLLM), the query's up-projection r_q → A/t·(d_nope + d_R)
  split by heads (or one H → A/t·(d_nope + d_R) without a query latent); the keys' and values' up-projection
  r_kv → A/t·(d_nope + d_v) (``kv_up_shape``), which serving runs over the cached latents.
- The MLP's fc1: H → 2F for a gated (SwiGLU) MLP, gate and up in one GEMM, else H → F (``fc1_width``).
"""

from __future__ import annotations

from meshplan.specs.model import ModelSpec
from meshplan.xp import Num


def qkv_shapes(model: ModelSpec, tp: Num, kv_heads: Num | None = None) -> list[tuple[str, Num, Num]]:
    """(name, k, n) of the input projections on one GPU (module docstring); ``kv_heads``: the KV heads a rank keeps
    when not K/t."""
    h = model.hidden_size
    if not model.is_mla:
        if kv_heads is None:
            return [("attn/qkv", h, qkv_width(model, tp))]
        qg = model.q_dim + model.gate_dim
        return [("attn/qkv", h, qg / tp + kv_heads * (model.head_dim + (model.v_head_dim or model.head_dim)))]
    q_out = model.num_heads * (model.qk_nope_head_dim + model.qk_rope_head_dim) / tp
    q: list[tuple[str, Num, Num]] = [("attn/q", h, q_out)]
    if model.q_lora_rank:
        q = [("attn/q_down", h, model.q_lora_rank), ("attn/q_up", model.q_lora_rank, q_out)]
    return q + [("attn/kv_down", h, model.kv_lora_rank + model.qk_rope_head_dim)]


def qkv_width(model: ModelSpec, tp: Num = 1) -> Num:
    """The fused QKV projection's output width on one GPU (standard attention): (A·d + gate + K·d + K·d_v) / t."""
    return (model.q_dim + model.gate_dim + model.kv_dim + model.v_dim) / tp


def kv_up_shape(model: ModelSpec, tp: Num) -> tuple[int, Num]:
    """(k, n) of MLA's key and value up-projection on one GPU: r_kv → A/t·(d_nope + d_v)."""
    return model.kv_lora_rank, model.num_heads * (model.qk_nope_head_dim + model.v_head_dim) / tp


def fc1_width(model: ModelSpec, ffn: Num) -> Num:
    """fc1's output width for an MLP of (local) width ``ffn``: 2·F gated (gate and up), else F."""
    return 2 * ffn if model.gated else ffn
