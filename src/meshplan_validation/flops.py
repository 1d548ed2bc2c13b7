"""The sources' FLOP formulas, used only to convert a published TFLOP/s or MFU to meshplan's step time and back (never
meshplan's own FLOP count), and which one a record's ``flops_accounting`` text names.

Symbols: B global batch (sequences), s sequence length, l layers, h hidden, V vocabulary, A heads, K kv-heads,
d head size, F FFN hidden, k experts per token, N matmul parameters.

- Narayanan et al. 2021, eq. 3 (counts the recomputed forward pass, 4 passes): 96·B·s·l·h²·(1 + s/6h + V/16lh).
  Used by the Megatron-LM README tables of 2021 and by BLOOM's "hardware TFLOPs".
- Megatron-LM ``num_floating_point_operations`` (model FLOPs, 3 passes; equal to NeMo's ``flops_formulas``
  for Llama/GPT and to Korthikanti et al. 2022's 72·B·s·l·h²·(1 + s/6h + V/12lh) for GPT):
  12·B·s·l·h²·[(1 + K/A + s/h)·(A·d/h) + (F/h)·k·g + (F_shared/h)·g + V/(2lh)], g = 3/2 for SwiGLU else 1.
- PaLM (Chowdhery et al. 2022, App. B): (6·N + 12·l·h·s) per token, as torchtitan / nanotron count.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from meshplan.specs.model import ModelSpec
from meshplan_validation.patterns import FLOPS_BASIS_TEXT


def eq3_flops(model: ModelSpec, batch: int) -> float:
    """Narayanan et al. 2021 eq. 3, FLOPs per iteration counting the recomputed forward pass:
    96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    b, s, n_l, h, v = batch, model.seq_length, model.num_layers, model.hidden_size, model.vocab_size
    return 96.0 * b * s * n_l * h * h * (1 + s / (6 * h) + v / (16 * n_l * h))


def megatron_model_flops(model: ModelSpec, batch: int) -> float:
    """Megatron-LM ``num_floating_point_operations`` (model FLOPs, forward + backward, no recompute):
    12·B·s·l·h²·[(1 + K/A + s/h)·(A·d/h) + (F/h)·k·g + (F_sh/h)·g + V/(2·l·h)], g = 3/2 for SwiGLU.
    For a GPT (K = A, A·d = h, F = 4h) this is Korthikanti et al. 2022's 72·B·s·l·h²·(1 + s/6h + V/12lh).
    Multi-latent attention (DeepSeek-V3) uses the formula's MLA branch instead of the first bracket:
    6·[q_lora·(h + A·d_qk + 1) + kv_lora·(h + A·(d_nope + d_v) + 1) + h·d_rope + A·d_v·h + s·A·(d_qk + d_v)/2]
    per token and layer (Megatron-LM training.py ``num_floating_point_operations``, multi_latent_attention)."""
    b, s, n_l, h, v = batch, model.seq_length, model.num_layers, model.hidden_size, model.vocab_size
    g = 1.5 if model.gated else 1.0
    ffn = model.moe_ffn_hidden_size * model.moe_topk if model.is_moe else model.ffn_hidden_size
    attn = _mla_attention(model) if model.is_mla else (
        (1 + model.num_kv_heads / model.num_heads + s / h) * (model.num_heads * model.head_dim / h))
    body = attn + ffn / h * g + model.shared_expert_ffn_size / h * g + v / (2 * n_l * h)
    return 12.0 * b * s * n_l * h * h * body


def _mla_attention(model: ModelSpec) -> float:
    """The formula's multi-latent-attention branch, per token in units of 12·h² (causal: /2)."""
    s, h = model.seq_length, model.hidden_size
    a, d_nope, d_rope, d_v = model.num_heads, model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    q_term = (model.q_lora_rank * (h + a * (d_nope + d_rope) + 1) if model.q_lora_rank
              else h * a * (d_nope + d_rope))
    per_token = (q_term + model.kv_lora_rank * (h + a * (d_nope + d_v) + 1) + h * d_rope + a * d_v * h
                 + s * a * (d_nope + d_rope) / 2 + s * a * d_v / 2)
    return per_token / (2 * h * h)  # 6·per_token = 12·h²·attn


def palm_flops(model: ModelSpec, batch: int) -> float:
    """PaLM's model FLOPs (Chowdhery et al. 2022, App. B): (6·N + 12·l·h·s) per token, N the matmul parameters; the
    formula knows no sliding window, so every layer counts all s keys."""
    from meshplan.cost.flops import model_flops_per_token

    return model_flops_per_token(unwindowed(model)) * batch * model.seq_length


def unwindowed(model: ModelSpec) -> ModelSpec:
    """The model without its sliding window: the sources' FLOP formulas count every layer's s keys."""
    return replace(model, sliding_window=0, window_layers=0) if model.sliding_window else model


BASES = {"eq3": eq3_flops, "model": megatron_model_flops, "palm": palm_flops}


def flops_basis(record: dict[str, Any]) -> str:
    """``eq3`` (counts recompute, Narayanan eq. 3), ``model`` (Megatron / NeMo model FLOPs) or ``palm``
    (6·N + 12·l·h·s per token, PaLM App. B, as torchtitan / nanotron count) from the record's
    ``flops_accounting`` text (patterns.FLOPS_BASIS_TEXT, first match); ``unknown`` otherwise."""
    text = str(record.get("flops_accounting") or "")
    return next((basis for pattern, basis in FLOPS_BASIS_TEXT if pattern.search(text)), "unknown")
