"""The model Megatron builds, as Megatron-Core's TransformerConfig / MLATransformerConfig fields and GPTModel's
arguments (megatron/core/transformer/transformer_config.py, megatron/core/models/gpt/gpt_model.py, megatron-core
0.16.1), and as Megatron-LM's pretrain_gpt.py arguments that set them (megatron/training/arguments.py, tag
core_v0.16.1: ``core_transformer_config_from_args`` copies every argument named as a TransformerConfig field, and
translates ``--swiglu`` into gated_linear_unit with SiLU, ``--squared-relu`` into activation_func =
megatron.core.activations.squared_relu (arguments.py:1673-1675), ``--disable-bias-linear`` into add_bias_linear=False,
``--num-experts`` into num_moe_experts, ``--untie-embeddings-and-output-weights`` into GPTModel's
share_embeddings_and_output_weights=False). Megatron-Bridge's ``model.*`` overrides are the same fields
(configs/nemo.py).
The arguments: ``--num-layers``, ``--hidden-size``, ``--ffn-hidden-size``, ``--num-attention-heads``,
``--num-query-groups``, ``--kv-channels``, ``--seq-length``, ``--max-position-embeddings``, ``--swiglu``,
``--squared-relu``, ``--normalization``, ``--disable-bias-linear``, ``--add-qkv-bias``, ``--qk-layernorm``,
``--hidden-dropout``, ``--attention-dropout``, ``--untie-embeddings-and-output-weights``, ``--position-embedding-type``,
``--rotary-base``,
``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``, ``--moe-shared-expert-intermediate-size``,
``--moe-layer-freq``, ``--moe-token-dispatcher-type``, ``--moe-flex-dispatcher-backend`` (with flex),
``--moe-expert-capacity-factor`` and ``--moe-pad-expert-input-to-capacity`` (token drop: specs/token_drop.py),
``--moe-router-score-function``,
``--moe-router-enable-expert-bias``, ``--moe-router-pre-softmax`` (top-1 routing: TransformerConfig refuses a softmax
over the one chosen expert, transformer_config.py:1634-1641), ``--multi-latent-attention``, ``--q-lora-rank``,
``--kv-lora-rank``, ``--qk-head-dim``, ``--qk-pos-emb-head-dim``, ``--v-head-dim``, ``--mtp-num-layers``,
``--make-vocab-size-divisible-by``, ``--group-query-attention``.

With MLA, ``--qk-layernorm`` is the norm of the compressed q and kv (DeepSeek-V3's q_a_layernorm / kv_a_layernorm,
multi_latent_attention.py q_layernorm / kv_layernorm). Megatron's defaults that would change the priced model are
written out: biases (add_bias_linear True), dropout 0.1, RoPE base 10,000, LayerNorm, GeLU, tied embeddings, and the
token dispatcher (its default allgather where meshplan priced the stack's, alltoall in the megatron-core preset). The
vocabulary: Megatron pads it to a multiple of make_vocab_size_divisible_by x tp (megatron/core/tokenizers/utils/
build_tokenizer.py), the stack's ``vocab_multiple`` that meshplan prices (``vocabulary``). What
meshplan's model has and Megatron has no argument for is named in ``notes``, not written.
"""

from __future__ import annotations

from typing import Any

from meshplan.configs.common import refuse
from meshplan.errors import SpecError
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import extras_on, padded_vocab
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.specs.stack_variants import HYBRIDEP_DEFAULT_SMS

# TransformerConfig / GPTModel field -> Megatron-LM argument; a store_true flag of _WHEN_TRUE is written when the
# field is True, one of _WHEN_FALSE when it is False
MEGATRON_ARGUMENT = {
         "num_layers": "--num-layers", "hidden_size": "--hidden-size", "ffn_hidden_size": "--ffn-hidden-size",
         "num_attention_heads": "--num-attention-heads", "num_query_groups": "--num-query-groups",
         "kv_channels": "--kv-channels", "seq_length": "--seq-length",
         "max_position_embeddings": "--max-position-embeddings", "gated_linear_unit": "--swiglu",
         "activation_func": "--squared-relu",
         "normalization": "--normalization", "add_bias_linear": "--disable-bias-linear",
         "add_qkv_bias": "--add-qkv-bias", "qk_layernorm": "--qk-layernorm", "hidden_dropout": "--hidden-dropout",
         "attention_dropout": "--attention-dropout",
         "share_embeddings_and_output_weights": "--untie-embeddings-and-output-weights",
         "position_embedding_type": "--position-embedding-type", "rotary_base": "--rotary-base",
         "num_moe_experts": "--num-experts", "moe_router_topk": "--moe-router-topk",
         "moe_ffn_hidden_size": "--moe-ffn-hidden-size",
         "moe_shared_expert_intermediate_size": "--moe-shared-expert-intermediate-size",
         "moe_layer_freq": "--moe-layer-freq", "moe_token_dispatcher_type": "--moe-token-dispatcher-type",
         "moe_flex_dispatcher_backend": "--moe-flex-dispatcher-backend",
         "moe_hybridep_num_sms": "--moe-hybridep-num-sms",
         "moe_expert_capacity_factor": "--moe-expert-capacity-factor",
         "moe_pad_expert_input_to_capacity": "--moe-pad-expert-input-to-capacity",
         "moe_router_score_function": "--moe-router-score-function",
         "moe_router_enable_expert_bias": "--moe-router-enable-expert-bias",
         "moe_router_pre_softmax": "--moe-router-pre-softmax",
         "multi_latent_attention": "--multi-latent-attention", "q_lora_rank": "--q-lora-rank",
         "kv_lora_rank": "--kv-lora-rank", "qk_head_dim": "--qk-head-dim",
         "qk_pos_emb_head_dim": "--qk-pos-emb-head-dim", "v_head_dim": "--v-head-dim",
         "mtp_num_layers": "--mtp-num-layers", "make_vocab_size_divisible_by": "--make-vocab-size-divisible-by"}
# the flex dispatcher's backend written with --moe-token-dispatcher-type flex: the stack's (Stack.flex_backend), deepep
# (Megatron-Core's default) or hybridep (transformer_config.py:757-760 @ core_v0.17.0: moe_flex_dispatcher_backend
# 'deepep' or 'hybridep', "only hybridep supports the MNNVL case"), written out because through core_v0.15.0 flex ran
# only with --moe-enable-deepep (token_dispatcher.py MoEFlexTokenDispatcher: "DeepEP is not enabled. Please set
# --moe-enable-deepep")
_WHEN_TRUE = frozenset(("gated_linear_unit", "add_qkv_bias", "qk_layernorm", "moe_router_enable_expert_bias",
                        "multi_latent_attention", "moe_router_pre_softmax", "moe_pad_expert_input_to_capacity"))
_WHEN_FALSE = frozenset(("add_bias_linear", "share_embeddings_and_output_weights"))
# the activation TransformerConfig.activation_func holds for a squared-ReLU MLP (model.mlp "relu2"): Megatron-LM's
# --squared-relu (arguments.py:2073 @ core_v0.17.0, store_true) sets it to megatron.core.activations.squared_relu
# (core_transformer_config_from_args, arguments.py:1673-1675, which asserts it is not given with --swiglu); without it
# a non-gated MLP is GeLU. Megatron-Bridge takes no callable as an override (configs/nemo.py drops the field).
SQUARED_RELU = "squared_relu"
_POSITIONS = {"rope": "rope", "learned": "learned_absolute", "none": "none"}
# what meshplan's model may have that no argument above builds (ModelSpec field -> what it is)
_UNWRITTEN = {"sliding_window": "sliding-window attention", "attention_sinks": "attention sinks",
              "glu_clamp": "a clamped GLU", "embedding_norm": "a norm after the embedding",
              "layer_pattern": "a hybrid Mamba layer pattern", "moe_latent_size": "a latent MoE",
              "shared_expert_gate": "a gated shared expert", "index_topk": "DeepSeek Sparse Attention's indexer",
              "attn_head_gate": "a per-head attention output gate", "rope_key_norm": "a norm over MLA's RoPE key",
              "diff_attention": "differential attention", "yarn_rope": "YaRN-scaled RoPE"}


def _moe(model: ModelSpec, plan: Plan, stack: Stack) -> dict[str, Any]:
    forwards = stack.moe_dispatcher_mode.forwards
    if forwards and plan.tp * plan.ep == 1:
        raise refuse("megatron-core", "moe_dispatcher", stack.moe_dispatcher, "its flex dispatcher needs tp x ep > 1 "
                     "(megatron/core/transformer/moe/token_dispatcher.py:1360 @ core_v0.17.0, 'Flex token dispatcher "
                     "requires TPxEP > 1'): at tp = ep = 1 no token leaves its GPU, as alltoall prices it")
    sms = stack.flex_backend_mode.num_sms
    fields: dict[str, Any] = {
        "num_moe_experts": model.num_experts, "moe_router_topk": model.moe_topk,
        "moe_ffn_hidden_size": model.moe_ffn_hidden_size,
        "moe_shared_expert_intermediate_size": model.shared_expert_ffn_size or None,
        "moe_token_dispatcher_type": stack.moe_dispatcher,
        "moe_flex_dispatcher_backend": stack.flex_backend_mode.argument if forwards else None,
        # HybridEP's SMs where not Megatron-Core's default (Stack.flex_backend "hybridep-32sm": 32)
        "moe_hybridep_num_sms": None if not forwards or sms in (0, HYBRIDEP_DEFAULT_SMS) else sms,
        # token drop (Plan.moe_expert_capacity_factor; TransformerConfig's own fields, transformer_config.py:765-769
        # @ core_v0.17.0): written only where the plan drops tokens, so a dropless plan's arguments are as before
        "moe_expert_capacity_factor": plan.moe_expert_capacity_factor,
        "moe_pad_expert_input_to_capacity": plan.moe_pad_expert_input_to_capacity or None}
    if model.first_k_dense_layers or model.moe_layer_freq != 1:  # one 0 (dense) or 1 (MoE) a layer
        fields["moe_layer_freq"] = [int(model.is_moe_layer(i)) for i in range(model.num_layers)]
    if model.router_bias and model.is_mla:  # DeepSeek-V3's router: sigmoid scores with a score-correction bias
        fields |= {"moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True}
    elif model.moe_topk == 1:  # a softmax over one chosen expert has no gradient: TransformerConfig asks for this
        fields["moe_router_pre_softmax"] = True
    return fields


def _mla(model: ModelSpec) -> dict[str, Any]:
    return {"multi_latent_attention": True, "q_lora_rank": model.q_lora_rank or None,
            "kv_lora_rank": model.kv_lora_rank, "qk_head_dim": model.qk_nope_head_dim,
            "qk_pos_emb_head_dim": model.qk_rope_head_dim, "v_head_dim": model.v_head_dim}


def architecture(model: ModelSpec, plan: Plan, stack: Stack) -> tuple[dict[str, Any], list[str]]:
    """The TransformerConfig / GPTModel fields that build ``model`` (None: not written) and the notes on what they
    leave out, one line each."""
    fields: dict[str, Any] = {
        "num_layers": model.num_layers, "hidden_size": model.hidden_size, "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_heads, "num_query_groups": model.num_kv_heads,
        "kv_channels": None if model.is_mla else model.head_dim, "seq_length": model.seq_length,
        "max_position_embeddings": model.max_position_embeddings or model.seq_length,
        "gated_linear_unit": model.gated, "activation_func": SQUARED_RELU if model.mlp == "relu2" else None,
        "normalization": "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
        "add_bias_linear": model.linear_bias, "add_qkv_bias": model.qkv_bias and not model.linear_bias,
        "qk_layernorm": model.qk_norm or model.is_mla, "hidden_dropout": None if model.dropout else 0.0,
        "attention_dropout": None if model.dropout else 0.0,
        "share_embeddings_and_output_weights": model.tied_embeddings,
        "position_embedding_type": _POSITIONS[model.position_embedding],
        "rotary_base": int(model.rope_theta) if model.rope_theta and model.position_embedding == "rope" else None,
        "mtp_num_layers": model.mtp_layers or None}
    fields |= _moe(model, plan, stack) if model.is_moe else {}
    fields |= _mla(model) if model.is_mla else {}
    notes = [f"meshplan's model has {what} ({name}), which these arguments do not build"
             for name, what in _UNWRITTEN.items() if getattr(model, name)]
    notes += [f"meshplan's model has {what}, which these arguments do not build" for what in extras_on(model)]
    if model.position_embedding == "rope" and not model.rope_theta:
        notes.append("meshplan's model states no RoPE base: Megatron's --rotary-base default (10000) applies")
    if model.is_moe and stack.moe_dispatcher_mode.forwards:
        notes.append(f"flex dispatcher through {stack.flex_backend} (NVLink in the node, RDMA between nodes); on a "
                     "multi-node NVLink system (GB200 / GB300 NVL72) the backend is hybridep, the one Megatron-Core "
                     "runs across an NVLink domain wider than a node")
    if model.is_mla:
        notes.append("RoPE scaling is Megatron-Core's MLA default (MLATransformerConfig: yarn, factor 40 over 4096 "
                     "positions, DeepSeek-V3's); group-limited routing and the top-k scaling factor are not stated by "
                     "meshplan's model: set --moe-router-num-groups, --moe-router-group-topk, "
                     "--moe-router-topk-scaling-factor from its config.json")
    if model.router_bias and not model.is_mla:  # the field stands for two biases (ModelSpec.router_bias)
        notes.append("the router has a bias of one per expert, which meshplan does not tell apart: DeepSeek-style "
                     "score correction (GLM-4.5: add --moe-router-score-function sigmoid "
                     "--moe-router-enable-expert-bias) or a router linear bias (GPT-OSS: Megatron has none); "
                     "these arguments write neither")
    fields["make_vocab_size_divisible_by"], note = vocabulary(model, plan, stack)
    return fields, notes + ([note] if note else [])


def vocabulary(model: ModelSpec, plan: Plan, stack: Stack) -> tuple[int | None, str]:
    """``make_vocab_size_divisible_by`` and a note on the vocabulary Megatron builds: the stack's padding
    (``Stack.vocab_multiple`` q: Megatron pads V to a multiple of q x tp, specs/model_extras.padded_vocab, and
    meshplan prices the padded output layer), or with q = 1 the model's own V (divisor V / tp, which pads nothing,
    when tp divides V)."""
    vocab, q = model.vocab_size, stack.vocab_multiple
    if q > 1:
        padded = padded_vocab(vocab, plan.tp, q)
        return q, (f"Megatron pads the vocabulary {vocab:,} to {padded:,} (a multiple of {q} x tp={plan.tp}), as "
                   f"priced: the output layer computes the padded logits; the weights' memory counts {vocab:,} rows"
                   if padded != vocab else "")
    if vocab % plan.tp:
        return None, f"tp={plan.tp} does not divide the vocabulary {vocab}: Megatron pads it"
    return vocab // plan.tp, ""


def capacity_factor(text: Any, where: str) -> float | None:
    """A written ``moe_expert_capacity_factor``: a number, negative or "None" dropless as TransformerConfig takes it
    (transformer_config.py:1105-1107 @ core_v0.16.1: a negative factor becomes None)."""
    if text is None or str(text).lower() in ("none", "null"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"{where}={text} must be a number (the MoE capacity factor) or None") from None
    return None if value < 0 else value


def arguments(fields: dict[str, Any], num_heads: int) -> list[tuple[str, Any]]:
    """Megatron-LM's (argument, value) pairs for ``fields`` (True: a flag; None and False: not written)."""
    args: list[tuple[str, Any]] = []
    for name, value in fields.items():
        flag = MEGATRON_ARGUMENT[name]
        if value is None:
            continue
        if name in _WHEN_TRUE or name in _WHEN_FALSE:
            args.append((flag, value == (name in _WHEN_TRUE)))
        elif name == "activation_func":  # the one activation written besides --swiglu's: --squared-relu (a flag)
            args.append((flag, True))
        elif name == "moe_layer_freq":  # a Python expression Megatron-LM evaluates (arguments.py moe_freq_type)
            args.append((flag, _pattern(value)))
        elif name == "num_query_groups":
            args += [("--group-query-attention", True), (flag, value)] if value != num_heads else []
        else:
            args.append((flag, value))
    return args


def _pattern(layers: list[int]) -> str:
    """``([0]*3+[1]*58)`` for runs of 0s and 1s, as Megatron-LM's examples write --moe-layer-freq."""
    runs: list[list[int]] = []
    for flag in layers:
        if runs and runs[-1][0] == flag:
            runs[-1][1] += 1
        else:
            runs.append([flag, 1])
    return "(" + "+".join(f"[{flag}]*{count}" for flag, count in runs) + ")"
