"""Translate a Hugging Face ``config.json`` into a ModelSpec.

``translate(config, name)`` returns a flat dict of ModelSpec field names, read by the family's translator
(hf_families.py, one per ``model_type``); ``from_hf_config`` builds the spec from it, naming the config.json key
behind any value the spec refuses. Any other ``model_type`` whose config has the Llama keys is read as Llama. A missing
key raises SpecError naming it. ``seq_length`` is the config's ``max_position_embeddings`` (``n_positions`` for
GPT-2): the longest context the checkpoint supports, often far longer than it was pretrained at; override it with
``ModelSpec.with_seq_length``.
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import SpecError
from meshplan.specs.hf_families import FAMILIES, LLAMA_KEYS, WINDOWED, hf_key, llama, sliding_window
from meshplan.specs.hf_reader import ConfigReader
from meshplan.specs.model import ModelSpec


def translate(config: dict[str, Any], name: str, where: str | None = None) -> dict[str, Any]:
    """ModelSpec fields (a flat dict) for a Hugging Face ``config.json`` dict (``where``: what errors name,
    by default ``name``)."""
    where = where or name
    if not isinstance(config, dict):
        raise SpecError(f"{where}: config.json must be a JSON object, not {type(config).__name__}")
    model_type = config.get("model_type") or ""
    if not isinstance(model_type, str):
        raise SpecError(f"{where}: config.json model_type={model_type!r} must be a string")
    family = FAMILIES.get(model_type)
    reader = ConfigReader(config, where, model_type)
    if family is None:
        _refuse_non_causal(config, where, model_type)
        missing = [k for k in LLAMA_KEYS if config.get(k) is None]
        if missing:
            kind = f"model_type={model_type!r} is not supported" if model_type else "no model_type"
            raise SpecError(f"{where}: {kind} and config.json has no {missing[0]!r} to read it as Llama "
                            f"(supported: {', '.join(sorted(FAMILIES))})")
        family = llama  # unknown but Llama-shaped: read as Llama
    spec = family(reader)
    if family in WINDOWED:
        spec.update(sliding_window(reader, spec["num_layers"]))
    spec["name"] = name
    spec["source"] = f"Hugging Face config.json, model_type={model_type or 'unknown'}"
    return spec


# the heads of a decoder-only language model in transformers' class names (LlamaForCausalLM, GPT2LMHeadModel)
CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel")


def _refuse_non_causal(config: dict[str, Any], where: str, model_type: str) -> None:
    """An architecture meshplan has no family for is read as Llama only when it is a decoder-only language model:
    an encoder (BertForMaskedLM), an encoder-decoder (``is_encoder_decoder``) or a vision model is not Llama-shaped
    whatever its keys say (BERT-base would read as 160 M parameters, not its 110 M)."""
    architectures = config.get("architectures") or []
    names = [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []
    causal = any(a.endswith(CAUSAL_HEADS) for a in names)
    if config.get("is_encoder_decoder") is True or (names and not causal):
        shown = f" ({', '.join(names)})" if names else " (encoder-decoder)"
        raise SpecError(f"{where}: model_type={model_type!r}{shown} is not a decoder-only language model meshplan can "
                        f"read as Llama (supported: {', '.join(sorted(FAMILIES))}); trace the module instead "
                        f"(meshplan trace / plan --model module.py:factory)")


def from_hf_config(config: dict[str, Any], name: str = "hf-model", where: str | None = None) -> ModelSpec:
    """Translate a Hugging Face ``config.json`` (a family of hf_families.py: Llama, Mistral, Mixtral, Qwen2/3(-MoE),
    GPT-2, GPT-NeoX, DeepSeek-V2/V3, GPT-OSS, Nemotron-H) into a ModelSpec. Unknown architectures are read as
    Llama-like if the keys are present."""
    fields_ = translate(config, name, where)
    theta = config.get("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta"))
    if fields_.get("position_embedding", "rope") == "rope" and isinstance(theta, (int, float)) \
            and not isinstance(theta, bool) and theta > 0:
        fields_["rope_theta"] = float(theta)  # transformers 5 keeps it in rope_parameters
    try:
        return ModelSpec(**fields_)
    except SpecError as exc:  # name the config.json key the offending value came from
        message = str(exc)
        field_name = message.split("=", 1)[0]
        key = hf_key(str(config.get("model_type") or ""), field_name) if field_name.isidentifier() else None
        shown = f"config.json {key} → {message}" if key and key != field_name else f"config.json: {message}"
        raise SpecError(f"{where or name}: {shown}") from None
