"""Translate a Hugging Face ``config.json`` into a ModelSpec, exactly or not at all.

With transformers installed (the ``hf`` extra), the model is built from the config on the meta device (meta.py)
and read either by its hand-written family (families.py, one per ``model_type``) or, for any other decoder-only
``model_type``, from the built modules (generic.py); the spec is then checked layer by layer against the built
model (verify.py) and refused with what differs when any count disagrees. Without transformers only the
families in ``EXACT`` (the hand-written ones, each tested against transformers' own count) are read; any other
``model_type`` is refused, naming what to install. A missing key raises SpecError naming it. ``seq_length`` is the
config's ``max_position_embeddings`` (``n_positions`` for GPT-2): the longest context the checkpoint supports, often
far longer than it was pretrained at; override it with ``ModelSpec.with_seq_length``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from meshplan import ranges
from meshplan.errors import SpecError
from meshplan.specs.hf.families import FAMILIES, WINDOWED, hf_key, sliding_window
from meshplan.specs.hf.generic import read_generic
from meshplan.specs.hf.meta import MetaModel, available, build_meta, transformers_registers
from meshplan.specs.hf.reader import ConfigReader
from meshplan.specs.hf.verify import check_build
from meshplan.specs.model import ModelSpec

# the model_types meshplan reads exactly from config.json alone (without transformers): the hand-written families
EXACT = tuple(sorted(FAMILIES))
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


# The modeling classes of the families: a checkpoint with its own model_type and remote code (``auto_map``) that
# names one of them in ``architectures`` is that family (Kimi-K2: model_type kimi_k2, DeepseekV3ForCausalLM)
FAMILY_CLASSES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                  "Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe",
                  "Qwen3MoeForCausalLM": "qwen3_moe", "GPT2LMHeadModel": "gpt2", "GPTNeoXForCausalLM": "gpt_neox",
                  "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
                  "GptOssForCausalLM": "gpt_oss", "NemotronHForCausalLM": "nemotron_h"}


def _check_type(config: Any, where: str) -> str:
    if not isinstance(config, dict):
        raise SpecError(f"{where}: config.json must be a JSON object, not {type(config).__name__}")
    model_type = config.get("model_type") or ""
    if not isinstance(model_type, str):
        raise SpecError(f"{where}: config.json model_type={model_type!r} must be a string")
    return model_type


def _resolve(config: dict[str, Any], where: str) -> tuple[dict[str, Any], str, str]:
    """The config to read, its model_type and what it was given as: a model_type neither a family nor known to
    transformers is read as the model_type of the class its ``architectures`` names, when that class is a family's
    or one of transformers' causal language models (remote-code checkpoints built on them)."""
    given = _check_type(config, where)
    if given in FAMILIES or (available() and transformers_registers(given)):
        return config, given, given
    architectures = config.get("architectures")
    names = [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []
    classes = dict(FAMILY_CLASSES)
    if available():
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        classes = {cls: t for t, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items() if isinstance(cls, str)} | classes
    found = next((classes[n] for n in names if n in classes), None)
    if found is None or not given:
        return config, given, given
    return config | {"model_type": found}, found, f"{given} as {found} ({names[0]})"


def _family(config: dict[str, Any], name: str, where: str, model_type: str) -> dict[str, Any]:
    family = FAMILIES[model_type]
    reader = ConfigReader(config, where, model_type)
    spec = family(reader)
    if family in WINDOWED:
        spec.update(sliding_window(reader, spec["num_layers"]))
    return spec


# the heads of a decoder-only language model in transformers' class names (LlamaForCausalLM, GPT2LMHeadModel)
CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel")


def _refuse_non_causal(config: dict[str, Any], where: str, model_type: str) -> None:
    """An encoder (BertForMaskedLM) or an encoder-decoder (``is_encoder_decoder``) is refused from its config.json
    alone, whatever its keys say (BERT-base read as Llama would be 160 M parameters, not its 110 M)."""
    architectures = config.get("architectures") or []
    names = [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []
    if config.get("is_encoder_decoder") is True or (names and not any(a.endswith(CAUSAL_HEADS) for a in names)):
        shown = f" ({', '.join(names)})" if names else " (encoder-decoder)"
        raise SpecError(f"{where}: model_type={model_type!r}{shown} is not a decoder-only language model, which "
                        "meshplan reads; trace the module instead (meshplan trace / plan --model module.py:factory)")


def _meta(config: dict[str, Any], where: str, model_type: str) -> MetaModel | None:
    """The meta-device build (None without transformers, or for a family transformers cannot build: remote code);
    a type without a family that cannot be built is refused."""
    if not model_type:
        raise SpecError(f"{where}: no model_type and so no model to read (a Hugging Face config.json names it: "
                        f"{', '.join(EXACT)}, or with transformers any causal language model it registers)")
    if model_type not in FAMILIES:
        _refuse_non_causal(config, where, model_type)
    if not available():
        if model_type in FAMILIES:
            return None
        raise SpecError(f"{where}: model_type={model_type!r} is not one meshplan reads exactly from config.json alone "
                        f"(those: "
                        f"{', '.join(EXACT)}); install transformers (pip install 'meshplan[hf]') to read it from "
                        "the model transformers builds")
    layers = next((config[k] for k in LAYER_KEYS if isinstance(config.get(k), int)), 0)
    if layers > ranges.MAX_LAYERS:
        raise SpecError(f"{where}: config.json has {layers} layers, more than {ranges.MAX_LAYERS:,}")
    meta = build_meta(config)
    if isinstance(meta, str):
        if model_type in FAMILIES:
            return None
        raise SpecError(f"{where}: model_type={model_type!r} cannot be read: {meta}")
    return meta


# The model_types whose MoE weights the experts' inputs by the router's scores and sums their outputs unweighted
# (ModelSpec.moe_score_before_experts): transformers models/llama4/modeling_llama4.py Llama4TextMoe.forward,
# ``routed_in * router_scores`` before ``self.experts``, ``.sum(dim=0)`` after. No parameter shows it.
SCORED_BEFORE = frozenset({"llama4", "llama4_text"})


def _routing(model_type: str) -> dict[str, Any]:
    return {"moe_score_before_experts": True} if model_type in SCORED_BEFORE else {}


def _named(fields: dict[str, Any], name: str, model_type: str, checked: bool) -> dict[str, Any]:
    how = "checked against transformers' meta-device build" if checked else "not checked: no transformers build"
    return fields | {"name": name, "source": f"Hugging Face config.json, model_type={model_type or 'unknown'} ({how})"}


def translate(config: dict[str, Any], name: str, where: str | None = None) -> dict[str, Any]:
    """ModelSpec fields (a flat dict) for a Hugging Face ``config.json`` dict (``where``: what errors name,
    by default ``name``), not yet checked against the build."""
    where = where or name
    config, model_type, given = _resolve(config, where)
    if config.get("head_dim") == 0 and not isinstance(config.get("head_dim"), bool):  # 0 is meshplan's "default"
        raise SpecError(f"{where}: head_dim=0 builds attention heads of width 0 (transformers takes it as "
                        "given); leave it out for hidden_size / num_attention_heads")
    if model_type in FAMILIES:
        return _named(_family(config, name, where, model_type), name, given, available())
    meta = _meta(config, where, model_type)
    assert meta is not None
    return _named(read_generic(meta, where)[0] | _routing(model_type), name, given, True)


def from_hf_config(config: dict[str, Any], name: str = "hf-model", where: str | None = None) -> ModelSpec:
    """Translate a Hugging Face ``config.json`` into a ModelSpec (the module docstring): a family of
    families.py or, with transformers, any decoder-only model it builds; checked against that build."""
    where = where or name
    config, model_type, given = _resolve(config, where)
    if config.get("head_dim") == 0 and not isinstance(config.get("head_dim"), bool):  # 0 is meshplan's "default"
        raise SpecError(f"{where}: head_dim=0 builds attention heads of width 0 (transformers takes it as "
                        "given); leave it out for hidden_size / num_attention_heads")
    _check_token_ids(config, where)
    if model_type in FAMILIES:
        fields_ = _rope_base(_family(config, name, where, model_type), config)
        spec = _spec(fields_, config, where)  # the family's values checked before anything is built
        meta = _meta(config, where, model_type)
        groups = None
    else:
        meta = _meta(config, where, model_type)
        assert meta is not None
        fields_, groups = read_generic(meta, where)
        spec = _spec(_rope_base(fields_, config), config, where)
    if meta is not None:
        check_build(spec, meta, where, groups)
    return replace(spec, **_named(_routing(model_type), name, given, meta is not None))


def _check_token_ids(config: dict[str, Any], where: str) -> None:
    """The padding token's row must be one of the embedding's (torch's nn.Embedding asserts padding_idx <
    num_embeddings when transformers builds it): refused here, before anything is built."""
    pad, vocab = config.get("pad_token_id"), config.get("vocab_size")
    if isinstance(pad, int) and not isinstance(pad, bool) and isinstance(vocab, int) and vocab > 0 \
            and not -vocab <= pad < vocab:
        raise SpecError(f"{where}: pad_token_id={pad} is outside the vocabulary (vocab_size={vocab}): the embedding "
                        "has no such row to pad with")


def _rope_base(fields_: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The RoPE base (``rope_theta``; transformers 5 keeps it in ``rope_parameters``), which the emitters write."""
    theta = config.get("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta"))
    if fields_.get("position_embedding", "rope") == "rope" and isinstance(theta, (int, float)) \
            and not isinstance(theta, bool) and theta > 0:
        fields_["rope_theta"] = float(theta)
    return fields_


def _spec(fields_: dict[str, Any], config: dict[str, Any], where: str) -> ModelSpec:
    try:
        return ModelSpec(**(fields_ | {"name": "hf-model"}))
    except SpecError as exc:  # name the config.json key the offending value came from
        message = str(exc)
        field_name = message.split("=", 1)[0]
        key = hf_key(str(config.get("model_type") or ""), field_name) if field_name.isidentifier() else None
        shown = f"config.json {key} → {message}" if key and key != field_name else f"config.json: {message}"
        raise SpecError(f"{where}: {shown}") from None
