"""The Hugging Face model families meshplan reads: one small function per ``model_type``, each reading the keys that
the family's ``modeling_*.py`` in ``transformers`` reads when it builds its modules, so that ``ModelSpec.params()``
equals ``sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())``
(``tests/test_hf_config.py`` checks this on the meta device when torch and transformers are installed); and, per
family, the config.json key each ModelSpec field comes from (``hf_key``, for errors).

Families (``model_type``) and the modules their parameter counts come from:

    llama, mistral, qwen2, qwen3   q/k/v/o, gate/up/down, RMSNorm       models/llama/modeling_llama.py,
                                   (qwen2: q/k/v bias; qwen3: q/k norm)  mistral/, qwen2/, qwen3/
    mixtral, qwen2_moe, qwen3_moe  router H->E, E experts (+ shared)   models/mixtral/, qwen2_moe/, qwen3_moe/
    gpt2                           Conv1D + biases, LayerNorm, learned positions, tied head   models/gpt2/
    gpt_neox                       fused qkv + bias, LayerNorm, rotary (no weights), untied   models/gpt_neox/
    deepseek_v2, deepseek_v3       MLA (low-rank q and kv) + MoE with shared experts   models/deepseek_v3/
    gpt_oss                        biased attention + sinks, biased experts and router, clamped   models/gpt_oss/
                                   GLU, alternating sliding-window layers
    nemotron_h                     hybrid blocks (hybrid_override_pattern): Mamba-2 mixer, GQA attention, relu2
                                   MLP or (latent) MoE with a shared expert   models/nemotron_h/

Sliding-window attention (``sliding_window`` and the "sliding_attention" entries of ``layer_types``, or the family's
default pattern) is read for the Llama-shaped families, Mixtral, Qwen-MoE and GPT-OSS (``WINDOWED``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshplan.errors import SpecError
from meshplan.specs.hf.reader import ConfigReader


def llama(c: ConfigReader) -> dict[str, Any]:
    """Llama / Mistral / Qwen2 / Qwen3 (models/llama/modeling_llama.py: LlamaAttention, LlamaMLP, RMSNorm).

    q_proj H->A*d, k_proj and v_proj H->K*d, o_proj A*d->H, bias=config.attention_bias on all four;
    gate/up/down H<->F, bias=config.mlp_bias; two RMSNorm weights per layer plus the final norm.
    ``head_dim`` defaults to H/A (``getattr(config, "head_dim", None) or hidden_size // num_heads``).
    """
    heads = c.need("num_attention_heads")
    hidden = c.need("hidden_size")
    attention_bias = c.flag("attention_bias", False)
    mlp_bias = c.flag("mlp_bias", False)
    spec: dict[str, Any] = {
        "num_layers": c.need("num_hidden_layers"),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": c.get("num_key_value_heads", heads, minimum=1),
        "head_dim": c.get("head_dim", 0),  # 0 -> hidden_size // num_heads in ModelSpec
        "ffn_hidden_size": c.need("intermediate_size"),
        "vocab_size": c.need("vocab_size"),
        "seq_length": c.need("max_position_embeddings"),
        "mlp": "swiglu",  # LlamaMLP is gated whatever hidden_act is: down(act(gate(x)) * up(x))
        "norm": "rmsnorm",
        "position_embedding": "rope",
        "tied_embeddings": c.flag("tie_word_embeddings", False),  # LlamaConfig default False
        "qkv_bias": attention_bias,
        # attention_bias biases o_proj too; mlp_bias the three MLP projections (linear_bias: both)
        "linear_bias": attention_bias and mlp_bias,
        "out_bias": attention_bias and not mlp_bias,
        "mlp_bias": mlp_bias and not attention_bias,
        "dropout": c.dropout("attention_dropout"),
    }
    if c.model_type == "qwen2":
        # models/qwen2/modeling_qwen2.py: q/k/v are nn.Linear(..., bias=True), o_proj bias=False.
        spec["qkv_bias"] = True
    if c.model_type == "qwen2_moe":
        # models/qwen2_moe/modeling_qwen2_moe.py: q/k/v bias=config.qkv_bias (default True), o_proj bias=False.
        spec["qkv_bias"] = c.flag("qkv_bias", True)
    if c.model_type in ("qwen3", "qwen3_moe"):
        # models/qwen3/modeling_qwen3.py: q_norm and k_norm are RMSNorm(head_dim) applied per head.
        spec["qk_norm"] = True
    return spec


def mixtral(c: ConfigReader) -> dict[str, Any]:
    """models/mixtral/modeling_mixtral.py: every layer is MoE; router gate H->E without bias; each expert is a
    gated MLP of intermediate_size (w1, w3: H->F, w2: F->H)."""
    spec = llama(c)
    spec.update(num_experts=c.need("num_local_experts"), moe_topk=c.need("num_experts_per_tok"),
                moe_ffn_hidden_size=c.need("intermediate_size"))
    return spec


def qwen_moe(c: ConfigReader) -> dict[str, Any]:
    """models/qwen2_moe/modeling_qwen2_moe.py and qwen3_moe/: layer i is MoE when i is not in mlp_only_layers
    and (i + 1) % decoder_sparse_step == 0; otherwise a dense MLP of intermediate_size. Router H->E without
    bias; experts of moe_intermediate_size. Qwen2-MoE adds one shared expert of
    shared_expert_intermediate_size gated by sigmoid(Linear(H, 1))."""
    spec = llama(c)
    layers = spec["num_layers"]
    step = c.get("decoder_sparse_step", 1, minimum=1)
    dense = c.layers("mlp_only_layers")
    if dense != list(range(len(dense))):
        raise SpecError(f"{c.name}: mlp_only_layers={dense} is not a leading run of layers 0..k-1 "
                        "(meshplan models the first k layers as dense)")
    if step != 1 and (dense or layers % step):
        # HF: MoE at layers step-1, 2*step-1, ...; ModelSpec: at k, k+step, ... (same count when step | L).
        raise SpecError(f"{c.name}: decoder_sparse_step={step} with num_hidden_layers={layers} and "
                        f"mlp_only_layers={dense} cannot be modelled")
    # transformers 5's Qwen3MoeConfig names the expert count num_local_experts (4.x: num_experts)
    experts = c.need("num_experts") if "num_local_experts" not in c.config else c.need("num_local_experts")
    spec.update(num_experts=experts, moe_topk=c.need("num_experts_per_tok"),
                moe_ffn_hidden_size=c.need("moe_intermediate_size"), first_k_dense_layers=len(dense),
                moe_layer_freq=step)
    if c.model_type == "qwen2_moe":
        spec.update(shared_expert_ffn_size=c.need("shared_expert_intermediate_size"), shared_expert_gate=True)
    return spec


def gpt2(c: ConfigReader) -> dict[str, Any]:
    """models/gpt2/modeling_gpt2.py: wte V*H, wpe n_positions*H (learned positions are parameters), per layer
    ln_1, ln_2 (LayerNorm weight+bias), c_attn Conv1D H->3H and c_proj H->H with biases, mlp c_fc H->n_inner
    and c_proj n_inner->H with biases (n_inner defaults to 4H); ln_f; lm_head tied to wte."""
    hidden = c.need("n_embd")
    positions = c.need("n_positions")
    return {
        "num_layers": c.need("n_layer"),
        "hidden_size": hidden,
        "num_heads": c.need("n_head"),
        "ffn_hidden_size": c.get("n_inner", 4 * hidden),
        "vocab_size": c.need("vocab_size"),
        "seq_length": positions,
        "max_position_embeddings": positions,
        "position_embedding": "learned",
        "mlp": "gelu",
        "norm": "layernorm",
        "tied_embeddings": c.flag("tie_word_embeddings", True),  # PretrainedConfig default True
        "qkv_bias": True,
        "linear_bias": True,
        "dropout": c.dropout("resid_pdrop", "attn_pdrop", "embd_pdrop"),
    }


def gpt_neox(c: ConfigReader) -> dict[str, Any]:
    """models/gpt_neox/modeling_gpt_neox.py: embed_in V*H; per layer input_layernorm, post_attention_layernorm
    (LayerNorm weight+bias), query_key_value H->3H and dense H->H (bias=config.attention_bias, default True),
    dense_h_to_4h / dense_4h_to_h with biases; final_layer_norm; embed_out V*H untied. Rotary: no weights."""
    attention_bias = c.flag("attention_bias", True)
    return {
        "num_layers": c.need("num_hidden_layers"),
        "hidden_size": c.need("hidden_size"),
        "num_heads": c.need("num_attention_heads"),
        "ffn_hidden_size": c.need("intermediate_size"),
        "vocab_size": c.need("vocab_size"),
        "seq_length": c.need("max_position_embeddings"),
        "position_embedding": "rope",
        "mlp": "gelu",
        "norm": "layernorm",
        "tied_embeddings": c.flag("tie_word_embeddings", False),
        "qkv_bias": attention_bias,
        "linear_bias": True,  # MLP linears always have a bias; dense follows attention_bias (default True)
        "dropout": c.dropout("attention_dropout", "hidden_dropout", "attention_probs_dropout_prob",
                             "hidden_dropout_prob"),
    }


def deepseek(c: ConfigReader) -> dict[str, Any]:
    """models/deepseek_v3/modeling_deepseek_v3.py (and the checkpoint's own modeling_deepseek.py).

    MLA (DeepSeek-V2 §2.1, V3 §2.1.1): q_a_proj H->q_lora_rank, q_a_layernorm, q_b_proj -> A*(nope+rope)
    (or q_proj H->A*(nope+rope) when q_lora_rank is null); kv_a_proj_with_mqa H->kv_lora_rank+rope,
    kv_a_layernorm, kv_b_proj kv_lora_rank -> A*(nope+v); o_proj A*v->H; no biases.
    MoE after the first first_k_dense_replace layers (dense MLP of intermediate_size), every moe_layer_freq-th
    layer: router (E, H), n_routed_experts gated experts of moe_intermediate_size, and n_shared_experts merged
    into one gated MLP of moe_intermediate_size * n_shared_experts. topk_method "noaux_tc" (V3) adds the
    per-expert score-correction bias e_score_correction_bias (E): an nn.Parameter in modeling_deepseek.py and
    a tensor in the checkpoint, a buffer in transformers (so not in its parameters()).
    The multi-token-prediction module (num_nextn_predict_layers) is not built by either modeling file and is
    not counted in the parameters: DeepSeek-V3's 671B excludes it (README_WEIGHTS.md: MTP adds 11.5B unique
    parameters); it is trained, so it becomes ``mtp_layers`` (costed on the last stage, ``embed_head.mtp_ops``).
    """
    heads = c.need("num_attention_heads")
    nope, rope = c.need("qk_nope_head_dim"), c.need("qk_rope_head_dim")
    dense, freq = c.get("first_k_dense_replace", 0), c.get("moe_layer_freq", 1, minimum=1)
    if dense % freq:
        # modeling_deepseek.py: MoE at layer_idx >= first_k_dense_replace with layer_idx % moe_layer_freq == 0;
        # ModelSpec: at k, k + freq, … (the same layers when freq divides k)
        raise SpecError(f"{c.name}: first_k_dense_replace={dense} with moe_layer_freq={freq} cannot be modelled "
                        "(meshplan puts MoE layers at k, k + freq, …)")
    return {
        "num_layers": c.need("num_hidden_layers"),
        "hidden_size": c.need("hidden_size"),
        "num_heads": heads,
        "num_kv_heads": heads,  # MLA: every head has its own (decompressed) key and value
        "head_dim": nope + rope,  # query/key width per head, the inner dimension of the score GEMM
        "ffn_hidden_size": c.need("intermediate_size"),
        "vocab_size": c.need("vocab_size"),
        "seq_length": c.need("max_position_embeddings"),
        "mlp": "swiglu",
        "norm": "rmsnorm",
        "position_embedding": "rope",
        "tied_embeddings": c.flag("tie_word_embeddings", False),
        "dropout": c.dropout("attention_dropout"),
        "q_lora_rank": c.get("q_lora_rank", 0),
        "kv_lora_rank": c.need("kv_lora_rank"),
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": c.need("v_head_dim"),
        "num_experts": c.need("n_routed_experts"),
        "moe_topk": c.need("num_experts_per_tok"),
        "moe_ffn_hidden_size": c.need("moe_intermediate_size"),
        "shared_expert_ffn_size": c.need("moe_intermediate_size") * c.get("n_shared_experts", 0),
        "first_k_dense_layers": dense,
        "moe_layer_freq": freq,
        # transformers' DeepseekV3TopkRouter always holds the bias (modeling_deepseek_v3.py)
        "router_bias": c.text("topk_method") == "noaux_tc" or c.model_type == "deepseek_v3",
        "mtp_layers": c.get("num_nextn_predict_layers", 0),
    }


def gpt_oss(c: ConfigReader) -> dict[str, Any]:
    """models/gpt_oss/modeling_gpt_oss.py: q/k/v/o with bias (attention_bias, default True), one sink logit
    per head (``sinks``), router weight E*H + bias E, experts gate_up_proj (E, H, 2F) + bias (E, 2F) and
    down_proj (E, F, H) + bias (E, H); RMSNorm; untied head. Every layer is MoE."""
    spec = llama(c)
    attention_bias = c.flag("attention_bias", True)
    spec.update(qkv_bias=attention_bias, linear_bias=True, out_bias=False, mlp_bias=False, attention_sinks=True,
                router_bias=True,
                num_experts=c.need("num_local_experts"),
                moe_topk=c.need("num_experts_per_tok"),
                moe_ffn_hidden_size=c.need("intermediate_size"),
                glu_clamp=c.number("swiglu_limit", 7.0),  # GptOssExperts clamps at swiglu_limit (default 7.0)
                yarn_rope=_yarn(c))
    return spec


def _yarn(c: ConfigReader) -> bool:
    """Whether the RoPE is YaRN-scaled: ``rope_scaling`` (transformers 5: ``rope_parameters``) of rope_type yarn."""
    scaling = c.config.get("rope_scaling") or c.config.get("rope_parameters") or {}
    return isinstance(scaling, dict) and str(scaling.get("rope_type", scaling.get("type", ""))) == "yarn"


def nemotron_h(c: ConfigReader) -> dict[str, Any]:
    """models/nemotron_h/modeling_nemotron_h.py (Nemotron-H, Nemotron 3): one block per letter of
    ``hybrid_override_pattern``, each RMSNorm + mixer + residual. Mamba-2 (NemotronHMamba2Mixer): in_proj
    H -> 2*D_i + 2*G*N + n_h without bias (mamba_proj_bias), conv1d over D_i + 2*G*N channels with bias
    (use_conv_bias), dt_bias / A_log / D per head, gated RMSNorm D_i, out_proj D_i -> H. Attention: q/k/v/o
    without bias, no position embedding. MLP: up -> relu2 -> down (intermediate_size). MoE: router H -> E with
    the score-correction bias, n_routed_experts experts of moe_intermediate_size (on moe_latent_size, between
    fc1_latent_proj and fc2_latent_proj, when set), one shared expert of moe_shared_expert_intermediate_size.
    The multi-token-prediction layers (num_nextn_predict_layers) are not counted."""
    heads, hidden = c.need("num_attention_heads"), c.need("hidden_size")
    pattern = c.text("hybrid_override_pattern") or _block_types(c)
    if not pattern:
        raise SpecError(f"{c.name}: config.json (model_type='nemotron_h') has no 'hybrid_override_pattern'")
    spec: dict[str, Any] = {
        "num_layers": c.get("num_hidden_layers", len(pattern), minimum=1), "layer_pattern": pattern,
        "hidden_size": hidden,
        "num_heads": heads, "num_kv_heads": c.get("num_key_value_heads", heads, minimum=1),
        "head_dim": c.get("head_dim", 0), "ffn_hidden_size": c.need("intermediate_size"),
        "vocab_size": c.need("vocab_size"), "seq_length": c.need("max_position_embeddings"),
        "mlp": "relu2", "norm": "rmsnorm", "position_embedding": "none",
        "tied_embeddings": c.flag("tie_word_embeddings", False),
        "mamba_heads": c.need("mamba_num_heads"), "mamba_head_dim": c.need("mamba_head_dim"),
        "mamba_state": c.need("ssm_state_size"), "mamba_groups": c.get("n_groups", 1, minimum=1),
        "mamba_conv": c.get("conv_kernel", 4, minimum=1), "mamba_chunk": c.get("chunk_size", 128, minimum=1),
    }
    if "E" in pattern:
        spec.update(num_experts=c.need("n_routed_experts"), moe_topk=c.need("num_experts_per_tok"),
                    moe_ffn_hidden_size=c.need("moe_intermediate_size"), router_bias=True,
                    shared_expert_ffn_size=c.get("moe_shared_expert_intermediate_size", 0)
                    * c.get("n_shared_experts", 1), moe_latent_size=c.get("moe_latent_size", 0))
    return spec


# transformers 5's NemotronHConfig spells the pattern as ``layers_block_type``, one name per layer
_BLOCK_LETTERS = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-",
                  "moe": "E"}


def _block_types(c: ConfigReader) -> str:
    names = c.strings("layers_block_type") or []
    unknown = [n for n in names if n not in _BLOCK_LETTERS]
    if unknown:
        raise SpecError(f"{c.name}: config.json layers_block_type has {unknown[0]!r} (known: "
                        f"{', '.join(_BLOCK_LETTERS)})")
    return "".join(_BLOCK_LETTERS[n] for n in names)


# How many layers of each family see a sliding window when config.json has no ``layer_types`` (the list newer
# configs spell it out in): models/mistral/ and mixtral/ window every layer when ``sliding_window`` is set (Mistral
# 7B v0.1: 4096; later checkpoints null); configuration_qwen2.py (qwen2_moe, qwen3, qwen3_moe alike) sets
# ``sliding_window`` only with ``use_sliding_window`` and then windows the layers from ``max_window_layers`` on;
# configuration_gpt_oss.py alternates, the first layer windowed.
def _default_window_layers(c: ConfigReader, layers: int) -> int:
    if c.model_type in ("mistral", "mixtral"):
        return layers
    if c.model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):  # Qwen2Config: max_window_layers=28
        return max(0, layers - c.get("max_window_layers", 28)) if c.flag("use_sliding_window", False) else 0
    if c.model_type == "gpt_oss":
        return (layers + 1) // 2
    return 0


def sliding_window(c: ConfigReader, layers: int) -> dict[str, Any]:
    """``sliding_window`` (the keys a windowed layer's query sees) and how many layers use it: the
    "sliding_attention" entries of ``layer_types`` where given, else the family's rule above."""
    # the config classes' defaults where config.json has no sliding_window key: GptOssConfig 128, MistralConfig and
    # Qwen2Config 4096 (Qwen2's applies only with use_sliding_window), MixtralConfig none
    default = {"gpt_oss": 128, "mistral": 4096, "qwen2": 4096, "qwen2_moe": 4096, "qwen3": 4096,
               "qwen3_moe": 4096}.get(c.model_type, 0)
    window = c.get("sliding_window", 0) if "sliding_window" in c.config else default  # null: no window
    types = c.strings("layer_types")
    if types is not None and len(types) != layers:
        raise SpecError(f"{c.name}: config.json layer_types has {len(types)} entries but num_hidden_layers={layers}")
    count = types.count("sliding_attention") if types is not None else _default_window_layers(c, layers)
    if not (window and count):
        return {}
    return {"sliding_window": window, "window_layers": 0 if count == layers else count}  # 0: every layer


FAMILIES: dict[str, Callable[[ConfigReader], dict[str, Any]]] = {
    "llama": llama,
    "mistral": llama,
    "qwen2": llama,
    "qwen3": llama,
    "mixtral": mixtral,
    "qwen2_moe": qwen_moe,
    "qwen3_moe": qwen_moe,
    "gpt2": gpt2,
    "gpt_neox": gpt_neox,
    "deepseek_v2": deepseek,
    "deepseek_v3": deepseek,
    "gpt_oss": gpt_oss,
    "nemotron_h": nemotron_h,
}
WINDOWED = (llama, mixtral, qwen_moe, gpt_oss)  # the families whose sliding windows are read (sliding_window)


# The config.json key each ModelSpec field is read from, per family (for errors that ModelSpec raises on a value
# it was given: ``hidden_size=… is larger than …`` becomes ``config.json n_embd → hidden_size=…``).
_LLAMA_NAMES = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size", "num_heads": "num_attention_heads",
                "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "ffn_hidden_size": "intermediate_size",
                "vocab_size": "vocab_size", "seq_length": "max_position_embeddings",
                "moe_topk": "num_experts_per_tok", "sliding_window": "sliding_window", "window_layers": "layer_types"}
_HF_NAMES: dict[str, dict[str, str]] = {
    "gpt2": {"num_layers": "n_layer", "hidden_size": "n_embd", "num_heads": "n_head", "ffn_hidden_size": "n_inner",
             "vocab_size": "vocab_size", "seq_length": "n_positions", "max_position_embeddings": "n_positions"},
    "mixtral": _LLAMA_NAMES | {"num_experts": "num_local_experts", "moe_ffn_hidden_size": "intermediate_size"},
    "gpt_oss": _LLAMA_NAMES | {"num_experts": "num_local_experts", "moe_ffn_hidden_size": "intermediate_size",
                               "glu_clamp": "swiglu_limit"},
    "qwen2_moe": _LLAMA_NAMES | {"num_experts": "num_experts", "moe_ffn_hidden_size": "moe_intermediate_size",
                                 "first_k_dense_layers": "mlp_only_layers",
                                 "shared_expert_ffn_size": "shared_expert_intermediate_size"},
    "qwen3_moe": _LLAMA_NAMES | {"num_experts": "num_experts", "moe_ffn_hidden_size": "moe_intermediate_size",
                                 "first_k_dense_layers": "mlp_only_layers"},
    "deepseek_v2": _LLAMA_NAMES | {"num_experts": "n_routed_experts", "moe_ffn_hidden_size": "moe_intermediate_size",
                                   "shared_expert_ffn_size": "n_shared_experts × moe_intermediate_size",
                                   "first_k_dense_layers": "first_k_dense_replace",
                                   "head_dim": "qk_nope_head_dim + qk_rope_head_dim"},
}
_HF_NAMES["deepseek_v3"] = _HF_NAMES["deepseek_v2"]
_HF_NAMES["nemotron_h"] = _LLAMA_NAMES | {
    "layer_pattern": "hybrid_override_pattern", "mamba_heads": "mamba_num_heads", "mamba_head_dim": "mamba_head_dim",
    "mamba_state": "ssm_state_size", "mamba_groups": "n_groups", "mamba_conv": "conv_kernel",
    "mamba_chunk": "chunk_size", "num_experts": "n_routed_experts", "moe_ffn_hidden_size": "moe_intermediate_size",
    "moe_latent_size": "moe_latent_size", "shared_expert_ffn_size": "moe_shared_expert_intermediate_size"}


def hf_key(model_type: str, field: str) -> str | None:
    """The config.json key (or expression) a ModelSpec field comes from for this ``model_type``, if known."""
    return _HF_NAMES.get(model_type, _LLAMA_NAMES).get(field)
