"""ModelSpec's validation: every rule a model's fields must meet, checked on creation, each error naming the
numbers (``hidden_size=0 must be a positive integer``, ``num_kv_heads=3 does not divide num_heads=8``).

``check_fields`` runs before ModelSpec fills in its defaults (types, signs, the hybrid pattern, MTP, the sliding
window, every size in its range), ``check_structure`` after (head and KV-head counts, the choices, MoE, MLA, a
learned position table), ``check_params`` last (the parameter count stays within ``ranges.MAX_PARAMS``).
"""

from __future__ import annotations

from typing import Any

from meshplan import ranges
from meshplan.errors import SpecError
from meshplan.fields import check_types
from meshplan.specs.model_extras import check_extras

MLP_KINDS = ("gelu", "swiglu", "relu2")  # relu2 (Nemotron-H): squared ReLU, up → act → down like gelu
# layer_pattern letters (Nemotron-H; Qwen3-Next's Gated DeltaNet)
BLOCK_KINDS = {"M": "mamba", "S": "mamba1", "G": "deltanet", "K": "kda", "L": "lightning", "*": "attention",
               "W": "window", "P": "parallel", "R": "rglru", "C": "shortconv", "-": "mlp", "E": "moe"}
NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_KINDS = ("rope", "learned", "none")
_POSITIVE = ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size", "seq_length")
_NON_NEGATIVE = ("num_kv_heads", "head_dim", "num_experts", "moe_topk", "moe_ffn_hidden_size",
                 "shared_expert_ffn_size", "first_k_dense_layers", "q_lora_rank", "kv_lora_rank",
                 "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "max_position_embeddings",
                 "mamba_heads", "mamba_head_dim", "mamba_state", "moe_latent_size", "mtp_layers",
                 "sliding_window", "window_layers", "gdn_key_heads", "gdn_key_dim", "gdn_value_heads", "gdn_value_dim",
                 "ssm_inner", "ssm_dt_rank", "act_params", "head_vocab_size", "attention_experts", "index_heads",
                 "index_head_dim", "index_topk", "kda_gate_rank", "window_head_dim", "window_kv_heads", "lru_width",
                 "lru_heads", "short_conv")
# The sizes a parameter count grows with, named when it is out of range (check_params)
_SIZES = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "ffn_hidden_size", "vocab_size",
          "max_position_embeddings", "num_experts", "moe_ffn_hidden_size", "shared_expert_ffn_size", "q_lora_rank",
          "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "mamba_heads", "mamba_head_dim",
          "mamba_state", "mamba_groups", "mamba_conv", "moe_latent_size", "mtp_layers", "gdn_key_heads",
          "gdn_key_dim", "gdn_value_heads", "gdn_value_dim", "ssm_inner", "ssm_dt_rank", "index_heads",
          "index_head_dim")
_EXPERT_FIELDS = ("moe_topk", "moe_ffn_hidden_size", "shared_expert_ffn_size", "first_k_dense_layers", "router_bias",
                  "shared_expert_gate", "moe_latent_size")
_MLA_FIELDS = ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "rope_key_norm")


def check_fields(spec: Any) -> None:
    """The fields as given: their types and signs, the hybrid pattern, MTP and the sliding window, every size in
    its range (ranges.RANGES)."""
    check_types(spec)
    for name in _POSITIVE:
        _positive(spec, name)
    for name in _NON_NEGATIVE:
        _non_negative(spec, name)
    for name in ("mamba_groups", "mamba_conv", "mamba_chunk", "gdn_conv", "gdn_chunk", "lightning_block", "lru_conv"):
        _positive(spec, name)
    _positive(spec, "moe_layer_freq")
    _check_pattern(spec)
    _check_windowed(spec)
    _check_mtp(spec)
    _check_window(spec)
    ranges.check_spec(spec)


def check_structure(spec: Any) -> None:
    """With num_kv_heads and head_dim filled in: the KV heads divide the heads, each choice is a known kind, MoE
    and MLA settings only where the model has experts / latent attention, a learned position table long enough."""
    if spec.num_heads % spec.num_kv_heads:
        raise SpecError(f"num_kv_heads={spec.num_kv_heads} does not divide num_heads={spec.num_heads}")
    _choice(spec, "mlp", MLP_KINDS)
    _choice(spec, "norm", NORM_KINDS)
    _choice(spec, "position_embedding", POSITION_KINDS)
    if spec.num_experts:
        if not 0 < spec.moe_topk <= spec.num_experts:
            raise SpecError(f"moe_topk={spec.moe_topk} must be in 1..num_experts={spec.num_experts}")
        if spec.first_k_dense_layers >= spec.num_layers and not spec.is_hybrid:
            raise SpecError(f"first_k_dense_layers={spec.first_k_dense_layers} leaves no MoE layer of "
                            f"num_layers={spec.num_layers}")
    else:
        _dense_has_no_expert_fields(spec)
    if spec.is_mla and not (spec.qk_nope_head_dim and spec.qk_rope_head_dim and spec.v_head_dim):
        raise SpecError("MLA (kv_lora_rank > 0) needs qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
    for name in _MLA_FIELDS:
        if getattr(spec, name) and not spec.is_mla:
            raise SpecError(f"{name}={getattr(spec, name)} needs kv_lora_rank > 0 (multi-head latent attention)")
    check_extras(spec)
    if spec.attn_output_gate and spec.is_mla:
        raise SpecError("attn_output_gate=true with MLA (kv_lora_rank > 0) is not modelled: the gate comes from a "
                        "standard query projection (Qwen3-Next)")
    _check_indexer(spec)
    if spec.v_head_dim and not spec.is_mla and not spec.layer_pattern:
        raise SpecError(f"v_head_dim={spec.v_head_dim} needs MLA (kv_lora_rank > 0) or a hybrid layer_pattern (values "
                        "of their own width in standard attention are costed in hybrids only)")
    if spec.gate_bias and not spec.attn_output_gate:
        raise SpecError("gate_bias=true needs attn_output_gate=true (the gate it biases)")
    if spec.shared_expert_gate and not spec.shared_expert_ffn_size:
        raise SpecError("shared_expert_gate=true needs shared_expert_ffn_size > 0 (the expert it gates)")
    if spec.position_embedding == "learned" and 0 < spec.max_position_embeddings < spec.seq_length:
        raise SpecError(f"max_position_embeddings={spec.max_position_embeddings} is shorter than "
                        f"seq_length={spec.seq_length} (a learned position table has a row per position)")


def _check_indexer(spec: Any) -> None:
    """DeepSeek Sparse Attention: an indexer (its heads and head width) exactly where index_topk is set, on MLA
    with a compressed query (the indexer's query is projected from the query latent)."""
    given = [n for n in ("index_heads", "index_head_dim") if getattr(spec, n)]
    if spec.index_topk and (len(given) < 2 or not spec.q_lora_rank):
        raise SpecError(f"index_topk={spec.index_topk} (DeepSeek Sparse Attention) needs index_heads, index_head_dim "
                        "and MLA with q_lora_rank > 0 (the indexer's query comes from the query latent)")
    if spec.index_topk and spec.sliding_window:
        raise SpecError(f"index_topk={spec.index_topk} with sliding_window={spec.sliding_window}: DeepSeek Sparse "
                        "Attention in a sliding window is not modelled")
    if given and not spec.index_topk:
        raise SpecError(f"{given[0]}={getattr(spec, given[0])} needs index_topk > 0 (DeepSeek Sparse Attention)")


def check_params(spec: Any) -> None:
    """The parameters (with the MTP layers) at most ranges.MAX_PARAMS: each size in its range can still multiply
    into a model whose FLOP counts overflow; the message names the sizes that make it."""
    total = spec.params() + spec.mtp_params()
    if total > ranges.MAX_PARAMS:
        sizes = ", ".join(f"{name}={getattr(spec, name)}" for name in _SIZES if getattr(spec, name))
        raise SpecError(f"parameters={total:.4g} is outside 1 … {ranges.MAX_PARAMS:.0e} (500x the largest model "
                        f"trained): {sizes}")


def _positive(spec: Any, name: str) -> None:
    value = getattr(spec, name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecError(f"{name}={value!r} must be a positive integer")


def _non_negative(spec: Any, name: str) -> None:
    value = getattr(spec, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SpecError(f"{name}={value!r} must be a non-negative integer")


def _check_pattern(spec: Any) -> None:
    """A hybrid's layer_pattern: one known letter per layer, experts exactly where "E" blocks are, the Mamba sizes
    where "M" blocks are."""
    pattern = spec.layer_pattern
    if not isinstance(pattern, str):
        raise SpecError(f"layer_pattern={pattern!r} must be a string of {''.join(BLOCK_KINDS)}")
    if not pattern:
        for name in ("mamba_heads", "mamba_head_dim", "mamba_state"):
            if getattr(spec, name):
                raise SpecError(f"{name}={getattr(spec, name)} needs a hybrid layer_pattern with Mamba (M) blocks")
        if spec.short_conv:
            raise SpecError(f"short_conv={spec.short_conv} needs a layer_pattern with short-convolution (C) blocks")
        return
    bad = sorted(set(pattern) - set(BLOCK_KINDS))
    if bad:
        raise SpecError(f"layer_pattern has {bad[0]!r}: its letters are M (Mamba-2), S (Mamba-1), G (Gated DeltaNet), "
                        "K (Kimi Delta Attention), L (lightning attention), * (attention), W (windowed attention), "
                        "P (attention and Mamba-2 side by side), R (RG-LRU), C (short convolution), - (MLP), "
                        "E (MoE)")
    if len(pattern) != spec.num_layers:
        raise SpecError(f"layer_pattern has {len(pattern)} letters but num_layers={spec.num_layers}")
    if ("E" in pattern) != (spec.num_experts > 0):
        raise SpecError(f"layer_pattern {'has' if 'E' in pattern else 'has no'} E (MoE) blocks but "
                        f"num_experts={spec.num_experts}")
    if spec.first_k_dense_layers or spec.moe_layer_freq != 1:
        raise SpecError("first_k_dense_layers / moe_layer_freq do not apply to a layer_pattern (its E blocks are MoE)")
    if "M" in pattern or "P" in pattern:
        for name in ("mamba_heads", "mamba_head_dim", "mamba_state"):
            if getattr(spec, name) < 1:
                raise SpecError(f"{name}={getattr(spec, name)} must be positive: layer_pattern has Mamba (M, P) "
                                "blocks")
        if spec.mamba_heads % spec.mamba_groups:
            raise SpecError(f"mamba_groups={spec.mamba_groups} does not divide mamba_heads={spec.mamba_heads}")
    gdn = ("gdn_key_heads", "gdn_key_dim", "gdn_value_heads", "gdn_value_dim", "gdn_conv", "gdn_chunk")
    for name in gdn[:4] if "G" in pattern else ():
        if getattr(spec, name) < 1:
            raise SpecError(f"{name}={getattr(spec, name)} must be positive: layer_pattern has Gated DeltaNet (G) "
                            "blocks")
    for name in ("ssm_inner", "ssm_dt_rank", "mamba_state") if "S" in pattern else ():
        if getattr(spec, name) < 1:
            raise SpecError(f"{name}={getattr(spec, name)} must be positive: layer_pattern has Mamba-1 (S) blocks")
    if "G" in pattern and spec.gdn_value_heads % spec.gdn_key_heads:
        raise SpecError(f"gdn_key_heads={spec.gdn_key_heads} does not divide gdn_value_heads={spec.gdn_value_heads}")
    _check_linear(spec, pattern)


def _check_windowed(spec: Any) -> None:
    """Windowed attention blocks ("W"): a sliding window, every "W" block windowed (window_layers 0) and the "*"
    ones full; their own sizes and norms per block only in a hybrid with "W" blocks."""
    pattern, windowed = spec.layer_pattern, "W" in spec.layer_pattern
    if windowed and (not spec.sliding_window or spec.window_layers):
        raise SpecError(f"layer_pattern has W (windowed attention) blocks: it needs sliding_window > 0 (it is "
                        f"{spec.sliding_window}) and window_layers = 0 (it is {spec.window_layers})")
    given = [n for n in ("window_head_dim", "window_kv_heads", "window_sinks") if getattr(spec, n)]
    if given and not windowed:
        raise SpecError(f"{given[0]}={getattr(spec, given[0])} needs W (windowed attention) blocks in layer_pattern")
    if spec.window_kv_heads and spec.num_heads % spec.window_kv_heads:
        raise SpecError(f"window_kv_heads={spec.window_kv_heads} does not divide num_heads={spec.num_heads}")
    if spec.block_norms not in (1, 2) or (spec.block_norms == 2 and not pattern):
        raise SpecError(f"block_norms={spec.block_norms} must be 1 or 2 (a hybrid block's pre-norm, and post-norm)")


def _check_linear(spec: Any, pattern: str) -> None:
    """Kimi Delta Attention ("K"): its heads and width in the Gated DeltaNet fields, keys as many and as wide as the
    values (KimiLinearDeltaAttention's q, k and v are n·d each)."""
    if "R" in pattern and (spec.lru_width < 1 or spec.lru_heads < 1 or spec.lru_width % spec.lru_heads):
        raise SpecError(f"lru_width={spec.lru_width}, lru_heads={spec.lru_heads}: layer_pattern has RG-LRU (R) blocks, "
                        "which need a width the gate blocks divide")
    if ("C" in pattern) != (spec.short_conv > 0):
        raise SpecError(f"short_conv={spec.short_conv}: the kernel of the short-convolution (C) blocks, > 0 exactly "
                        f"when layer_pattern has them ({pattern!r})")
    if "K" not in pattern:
        return
    if spec.gdn_value_heads < 1 or spec.gdn_value_dim < 1:
        raise SpecError("gdn_value_heads and gdn_value_dim must be positive: layer_pattern has Kimi Delta Attention "
                        "(K) blocks")
    if (spec.gdn_key_heads, spec.gdn_key_dim) != (spec.gdn_value_heads, spec.gdn_value_dim):
        raise SpecError(f"gdn_key_heads={spec.gdn_key_heads}, gdn_key_dim={spec.gdn_key_dim}: Kimi Delta Attention (K) "
                        f"has as many and as wide keys as values ({spec.gdn_value_heads}, {spec.gdn_value_dim})")


def _check_mtp(spec: Any) -> None:
    """An MTP pattern only for a hybrid with MTP depths, of letters whose blocks the model has."""
    pattern = spec.mtp_pattern
    if not isinstance(pattern, str):
        raise SpecError(f"mtp_pattern={pattern!r} must be a string of {''.join(BLOCK_KINDS)}")
    if pattern and not spec.mtp_layers:
        raise SpecError(f"mtp_pattern={pattern!r} needs mtp_layers > 0 (multi-token prediction)")
    if spec.mtp_shared and not spec.mtp_layers:
        raise SpecError("mtp_shared=true needs mtp_layers > 0 (multi-token prediction)")
    if not spec.mtp_layers:
        return
    if spec.layer_pattern and not pattern:
        raise SpecError("a hybrid's mtp_layers needs mtp_pattern (the blocks of its MTP layer, e.g. '*E')")
    if pattern and not spec.layer_pattern:
        raise SpecError(f"mtp_pattern={pattern!r} applies to a hybrid layer_pattern only; an MTP layer of "
                        f"{spec.name} is one of its own layers")
    missing = sorted(set(pattern) - set(spec.layer_pattern))
    if missing:
        raise SpecError(f"mtp_pattern has {missing[0]!r}, a block layer_pattern does not have")


def _check_window(spec: Any) -> None:
    """A sliding window in causal attention, over at most the model's attention layers (all of them when
    window_layers is 0); a GLU clamp that is a positive number on a gated MLP."""
    if spec.window_layers and not spec.sliding_window:
        raise SpecError(f"window_layers={spec.window_layers} needs sliding_window > 0 (the keys a windowed layer sees)")
    if spec.sliding_window:
        if not spec.causal:
            raise SpecError(f"sliding_window={spec.sliding_window} needs causal attention (causal=false)")
        attention = spec.num_attention_layers + spec.layer_pattern.count("W")
        if not attention:
            raise SpecError(f"sliding_window={spec.sliding_window} needs attention layers (layer_pattern has no '*')")
        if spec.window_layers > attention:
            raise SpecError(f"window_layers={spec.window_layers} is more than the model's {attention} attention layers")
    if spec.glu_clamp < 0:
        raise SpecError(f"glu_clamp={spec.glu_clamp} must be positive (0: no clamp)")
    if spec.glu_clamp and not spec.gated:
        raise SpecError(f"glu_clamp={spec.glu_clamp} needs a gated MLP (mlp='swiglu'), not mlp={spec.mlp!r}")


def _choice(spec: Any, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(spec, name)
    if value not in allowed:
        raise SpecError(f"{name}={value!r} must be one of {', '.join(allowed)}")


def _dense_has_no_expert_fields(spec: Any) -> None:
    """A dense model (num_experts = 0) given an expert setting is a mistake: say so instead of ignoring it."""
    for name in _EXPERT_FIELDS:
        if getattr(spec, name):
            raise SpecError(f"{name}={getattr(spec, name)} needs num_experts > 0 (num_experts=0: a dense model)")
    if spec.moe_layer_freq != 1:
        raise SpecError(f"moe_layer_freq={spec.moe_layer_freq} needs num_experts > 0 (num_experts=0: a dense model)")
