"""The model a torchtitan job trains: its ``[model]`` table names a registered model and flavour (``name`` / ``flavor``,
torchtitan's ``train_spec.model_args[flavor]``, built on the meta device by torchtitan/train.py), so a config that
leaves them out trains torchtitan's default, ``llama3`` / ``debugmodel`` (a 6-layer test model).

Registered flavours (torchtitan 0.2.2, torchtitan/models/{llama3,qwen3,deepseek_v3}/__init__.py) are named when
meshplan's model has their architecture, checked as the meshplan preset each one is: ``llama3`` 8B / 70B / 405B
(Llama 3 8B / 70B, Llama 3.1 405B), ``qwen3`` 30B-A3B / 235B-A22B, ``deepseek_v3`` 671B
(tests/test_configs_build.py builds each and counts its parameters). What the flavour does that meshplan's model does
not say is written as a comment (``notes``).

Any other Llama-like model (SwiGLU, RMSNorm, RoPE, no biases, untied, plain attention) gets a flavour of its own,
written as a Python module that registers it (``definition``) and named in the TOML by ``[experimental]
custom_import``, which torchtitan/train.py imports before it looks the flavour up: a dense model as llama3's
TransformerModelArgs, a mixture of experts in every layer without shared experts as llama4's (Mixtral's router is
its softmax over all experts, top-k, renormalised: ``route_norm``). The FFN width is hit exactly by torchtitan's
rounding (llama3/model/model.py FeedForward: h = int(2·4H/3), h = int(multiplier·h), rounded up to
``multiple_of``): multiple_of = F and multiplier = F / int(8H/3). Anything else is refused with one line.
"""

from __future__ import annotations

import dataclasses
import re
from functools import cache

from meshplan.configs.common import refuse
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import extras_on
from meshplan.specs.model_load import load_model

_NAME = "torchtitan"
# (torchtitan model name, flavour) -> the meshplan preset with its architecture (torchtitan 0.2.2 models/*/__init__.py)
REGISTERED = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3.1-405b",
              ("qwen3", "30B-A3B"): "qwen3-30b-a3b", ("qwen3", "235B-A22B"): "qwen3-235b-a22b",
              ("deepseek_v3", "671B"): "deepseek-v3"}
# what a registered flavour does beyond meshplan's model (torchtitan 0.2.2's flavour definitions)
_FLAVOUR_NOTES = {
    "llama3": "torchtitan's llama3 flavours scale RoPE as Llama 3.1 does (RoPEScalingArgs: factor 8 beyond 8192 "
              "positions' wavelengths); no parameter depends on it",
    "deepseek_v3": "its 671B flavour attends with FlexAttention under a block-causal (per-document) mask, and keeps "
                   "the router's score-correction bias as a buffer (expert_bias), not a parameter: 256 x 58 fewer "
                   "parameters counted than Hugging Face's"}
PLACEHOLDER_ASSETS = "PATH/TO/HF_ASSETS"  # the tokenizer folder, torchtitan's scripts/download_hf_assets.py


def _shape(model: ModelSpec) -> ModelSpec:
    """The architecture alone: the name and the lengths are the job's (its seq_len), not the flavour's."""
    return dataclasses.replace(model, name="", seq_length=1, max_position_embeddings=0)


@cache
def _preset(name: str) -> ModelSpec:
    return _shape(load_model(name))


def registered(model: ModelSpec) -> tuple[str, str] | None:
    """The (model name, flavour) torchtitan registers with ``model``'s architecture, or None."""
    shape = _shape(model)
    for key, preset in REGISTERED.items():
        if shape == _preset(preset) and model.rope_theta in (0.0, _preset(preset).rope_theta):
            return key
    return None


def notes(model: ModelSpec, name: str) -> list[str]:
    """What the torchtitan model ``name`` trains that differs from meshplan's model, one line each."""
    out = [_FLAVOUR_NOTES[name]] if name in _FLAVOUR_NOTES else []
    if model.mtp_layers:
        out.append(f"torchtitan has no multi-token prediction: meshplan priced {model.mtp_layers} MTP layer(s), "
                   "which this job does not train")
    if not model.rope_theta and name not in _FLAVOUR_NOTES:
        out.append("meshplan's model states no RoPE base: the flavour's rope_theta is torchtitan's")
    return out


def _llama_like(model: ModelSpec) -> str:
    """Why ``model`` is not a Llama-like model a llama3 / llama4 flavour can hold ("" when it is)."""
    checks = [(model.mlp != "swiglu", f"mlp={model.mlp}"), (model.norm != "rmsnorm", f"norm={model.norm}"),
              (model.position_embedding != "rope", f"position_embedding={model.position_embedding}"),
              (model.tied_embeddings, "tied_embeddings"), (model.qkv_bias or model.linear_bias, "biases"),
              (model.qk_norm, "qk_norm"), (model.sliding_window > 0, "sliding_window"), (model.is_mla, "MLA"),
              (model.is_hybrid, "layer_pattern"), (model.attention_sinks, "attention_sinks"),
              (model.diff_attention, "diff_attention"), (model.attn_head_gate, "attn_head_gate"),
              (model.glu_clamp > 0, "glu_clamp"), (model.embedding_norm, "embedding_norm"),
              (model.dropout, "dropout"), (not model.causal, "causal=false"), (model.mtp_layers > 0, "mtp_layers"),
              (model.head_dim * model.num_heads != model.hidden_size, "head_dim x num_heads != hidden_size"),
              (not model.rope_theta, "rope_theta not stated")]
    if model.is_moe:
        checks += [(model.first_k_dense_layers > 0 or model.moe_layer_freq != 1, "dense layers among MoE layers"),
                   (model.shared_expert_ffn_size > 0, "shared experts"), (model.router_bias, "router_bias"),
                   (model.shared_expert_gate, "shared_expert_gate"), (model.moe_latent_size > 0, "latent MoE")]
    return ", ".join([why for bad, why in checks if bad] + extras_on(model))


def module_name(model: ModelSpec) -> str:
    """The Python module that registers the flavour of ``model``: meshplan_<name>."""
    return "meshplan_" + re.sub(r"\W", "_", model.name).lower()


def custom(model: ModelSpec) -> tuple[str, str, list[str]]:
    """(torchtitan model name, flavour, the Python module's lines registering it), or refused with one line."""
    why = _llama_like(model)
    if why:
        raise refuse(_NAME, "model", model.name, f"torchtitan registers no flavour of it and meshplan writes flavours "
                     f"of Llama-like models only (here: {why})")
    width = model.moe_ffn_hidden_size if model.is_moe else model.ffn_hidden_size
    base = int(2 * 4 * model.hidden_size / 3)
    args = [f"dim={model.hidden_size}", f"n_layers={model.num_layers}", f"n_heads={model.num_heads}",
            f"n_kv_heads={model.num_kv_heads}", f"vocab_size={model.vocab_size}", f"multiple_of={width}",
            f"ffn_dim_multiplier={width / base!r}", f"rope_theta={model.rope_theta!r}",
            f"max_seq_len={model.seq_length}"]
    flavour = f"meshplan-{model.name}"
    if model.is_moe:
        name, imports = "llama4", ["from torchtitan.models.llama4 import TransformerModelArgs, llama4_args",
                                   "from torchtitan.models.moe import MoEArgs"]
        args += ["rope_scaling_args=None", "every_n_layers_nope=None", "interleave_moe_layer_step=1",
                 "auto_scale_hidden_dim=False",
                 f"moe_args=MoEArgs(num_experts={model.num_experts}, num_shared_experts=0, top_k={model.moe_topk}, "
                 "score_func='softmax', route_norm=True, route_scale=1.0, "
                 f"score_before_experts={model.moe_score_before_experts}, "
                 # the for-loop experts (torchtitan 0.2.2 models/moe/moe.py _run_experts_for_loop; MoEArgs defaults
                 # to grouped_mm), the only expert path meshplan prices for torchtitan (its preset's expert_gemms):
                 # per-op SAC saves and recomputes them by aten.mm call (cost/recompute.per_op_saved)
                 "use_grouped_mm=False, load_balance_coeff=None)"]
    else:
        name, imports = "llama3", ["from torchtitan.models.llama3 import TransformerModelArgs, llama3_args",
                                   "from torchtitan.models.llama3.model.args import RoPEScalingArgs"]
        args.append("rope_scaling_args=RoPEScalingArgs(scaling_factor=1.0)")  # 1.0: no scaling
    lines = [f'"""Registers the torchtitan flavour {flavour!r} ({model.name} as meshplan priced it), written by '
             'meshplan."""', *imports, "", f"{name}_args[{flavour!r}] = TransformerModelArgs(",
             *(f"    {a}," for a in args), ")"]
    return name, flavour, lines
