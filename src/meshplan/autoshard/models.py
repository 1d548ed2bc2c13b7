"""Where the planner's models come from: a user's ``module.py:factory``, a Hugging Face ``config.json`` built on fake
tensors, or a meshplan preset turned into the Hugging Face config of the same architecture.

A Hugging Face causal LM is traced as it trains: ``model(input_ids=ids, labels=ids).loss`` (the loss in the graph),
no KV cache, its experts (Mixtral, Qwen-MoE) run by transformers' ``grouped_mm`` implementation (one grouped GEMM per
projection, as torchtitan runs them; the default implementation loops over the experts hit, which depends on the
routing values). Attention is SDPA with ``is_causal=True`` and no mask, which is what transformers runs on a GPU
when nothing is padded; on fake tensors it cannot tell and would materialise the mask, so the ``meshplan``
attention implementation registered here calls transformers' own SDPA function without it.

Depth: a model with L > 2 layers is built with 2 (``TRACED_LAYERS``) and planned as L (blocks.py weighs the traced
blocks as L; memory.py adds the untraced blocks' bytes). The preset's parameter count equals PyTorch's count of the
same Hugging Face model at full depth (tests/test_hf_config.py).
"""

from __future__ import annotations

from typing import Any

from meshplan.captured import captured
from meshplan.errors import MissingDependency, SpecError
from meshplan.specs.model import ModelSpec

TRACED_LAYERS = 2
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def _torch() -> Any:
    try:
        import torch
        import transformers  # noqa: F401
    except ModuleNotFoundError as exc:
        raise MissingDependency(exc.name or "torch", "torch") from None
    return torch


def supported(spec: ModelSpec) -> bool:
    """Whether torch_models.py builds the preset's module: dense Llama / GPT layers, or Mixtral's MoE (every layer,
    no shared experts); the others go through transformers (``preset_config``)."""
    moe_ok = not spec.num_experts or (not spec.shared_expert_ffn_size and not spec.first_k_dense_layers
                                      and spec.moe_layer_freq == 1 and spec.mlp == "swiglu")
    return moe_ok and not spec.kv_lora_rank and not spec.layer_pattern


def preset_config(spec: ModelSpec) -> dict[str, Any]:
    """The Hugging Face config of a preset's architecture: Llama (SwiGLU, RMSNorm, RoPE), Mixtral (the same with
    experts) or GPT-2 (GELU, LayerNorm, learned positions, tied head; the GELU one kernel, PyTorch's tanh
    approximation as Megatron-LM's fused bias-GELU computes it, not GPT-2's default ``gelu_new`` written as five
    element-wise ops; the preset's dropout)."""
    if spec.mlp == "swiglu" and spec.norm == "rmsnorm" and spec.position_embedding == "rope" and \
            not spec.kv_lora_rank and not spec.layer_pattern:
        config = {"model_type": "llama", "num_hidden_layers": spec.num_layers, "hidden_size": spec.hidden_size,
                  "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
                  "head_dim": spec.head_dim, "intermediate_size": spec.ffn_hidden_size,
                  "vocab_size": spec.vocab_size, "tie_word_embeddings": spec.tied_embeddings,
                  "max_position_embeddings": spec.seq_length, "attention_bias": spec.qkv_bias}
        if spec.num_experts:
            if spec.shared_expert_ffn_size or spec.first_k_dense_layers or spec.moe_layer_freq != 1:
                raise SpecError(f"model={spec.name}: no Hugging Face class for its MoE layout; give its config.json")
            config |= {"model_type": "mixtral", "num_local_experts": spec.num_experts,
                       "num_experts_per_tok": spec.moe_topk, "intermediate_size": spec.moe_ffn_hidden_size}
        return config
    if spec.mlp == "gelu" and spec.norm == "layernorm" and spec.position_embedding == "learned":
        drop = 0.1 if spec.dropout else 0.0  # Megatron-LM's hidden and attention dropout (presets' ``dropout``)
        return {"model_type": "gpt2", "n_layer": spec.num_layers, "n_embd": spec.hidden_size, "n_head": spec.num_heads,
                "n_inner": spec.ffn_hidden_size, "vocab_size": spec.vocab_size,
                "n_positions": max(spec.max_position_embeddings, spec.seq_length),
                "tie_word_embeddings": spec.tied_embeddings, "activation_function": "gelu_pytorch_tanh",
                "resid_pdrop": drop, "embd_pdrop": drop, "attn_pdrop": drop}
    raise SpecError(f"model={spec.name}: meshplan has no Hugging Face class for this architecture "
                    f"(mlp={spec.mlp}, norm={spec.norm}, positions={spec.position_embedding}); give its config.json "
                    "or a module.py:factory")


def read_config(path: str) -> dict[str, Any]:
    from meshplan.files import read_json

    data = read_json(path, "model")
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise SpecError(f"model={path!r}: a config.json needs a model_type")
    return data


def depth(config: dict[str, Any]) -> int:
    return int(next((config[k] for k in DEPTH_KEYS if isinstance(config.get(k), int)), 1))


def _register() -> str:
    """Transformers' SDPA attention with no mask (module docstring), under the name ``meshplan``."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
        return sdpa_attention_forward(module, query, key, value, None, **kwargs)

    AttentionInterface.register("meshplan", attention)
    AttentionMaskInterface.register("meshplan", lambda *args, **kwargs: None)
    return "meshplan"


def hf_model(config: dict[str, Any], layers: int = TRACED_LAYERS) -> Any:
    """The causal LM of ``config`` with ``layers`` layers, on fake tensors, returning its loss."""
    torch = _torch()
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    config = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map", "architectures")}
    model_type = config.pop("model_type")
    for key in DEPTH_KEYS:
        if key in config:
            config[key] = layers
    for key, value in list(config.items()):  # per-layer lists (layer_types, mlp_only_layers) at the traced depth
        if isinstance(value, list) and len(value) > layers and key.startswith("layer"):
            config[key] = value[:layers]
    try:
        with captured("transformers"):  # its advice and warnings: one note, not pages (captured.py)
            cfg = transformers.AutoConfig.for_model(model_type, **(config | {"use_cache": False}))
            cfg._attn_implementation = _register()
            if getattr(cfg, "num_local_experts", 0) or getattr(cfg, "num_experts", 0):
                cfg._experts_implementation = "grouped_mm"
            with FakeTensorMode(allow_non_fake_inputs=True):
                model = transformers.AutoModelForCausalLM.from_config(cfg)
    except (AssertionError, ValueError, KeyError, TypeError, RuntimeError, IndexError, ArithmeticError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]  # its own checks of the config, torch's of shapes
        raise SpecError(f"model_type={model_type!r}: transformers cannot build it ({type(exc).__name__}: "
                        f"{first})") from None

    module: Any = torch.nn.Module  # torch, imported when a model is built

    class CausalLM(module):
        """The model with its loss: ``hf(input_ids=ids, labels=ids).loss``."""

        def __init__(self, hf: Any) -> None:
            super().__init__()
            self.hf = hf

        def forward(self, input_ids: Any) -> Any:
            return self.hf(input_ids=input_ids, labels=input_ids).loss

    wrapped = CausalLM(model)
    wrapped.train()
    return wrapped
