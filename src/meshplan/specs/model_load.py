"""Loading a ModelSpec: from a flat mapping of its fields (a TOML preset), a preset name (``llama3-70b``), a
``.toml`` preset file, a Hugging Face ``config.json`` (read by specs/hf/config.py) or a Hub id ``org/name`` whose
config.json is in the local Hugging Face cache (hub_cache.py).

A config.json names the longest context the checkpoint serves (``max_position_embeddings``, 131,072 for
Qwen2.5-7B), not the length it was trained at; a step at that length is rarely what a user plans. So a config.json
model trains at ``CONFIG_SEQ_LENGTH`` (or its context, if shorter) unless ``--seq`` says otherwise, and keeps the
context as ``max_position_embeddings``, which serving may fill. A preset states its own documented length."""

from __future__ import annotations

from dataclasses import fields, replace
from functools import cache
from pathlib import Path
from typing import Any

from meshplan.errors import SpecError
from meshplan.fields import not_a_preset, require_fields, unknown_field
from meshplan.files import PRESETS, read_json, read_preset, read_toml
from meshplan.specs.model import ModelSpec

_FIELDS = {f.name for f in fields(ModelSpec)}

# The training length of a config.json model (tokens per sequence): 4,096, the main pre-training stage's sequence
# length of Llama 2 (Touvron et al. 2023, Table 1: context length 4k), Qwen2.5 (technical report 2024: 4,096 before
# the long-context stage), Qwen3 (technical report 2025: stages S1 and S2 at 4,096; the qwen3 presets) and
# DeepSeek-V3 (technical report §4.3: 4K before YaRN; the deepseek-v3 preset).
CONFIG_SEQ_LENGTH = 4096


def model_from_dict(data: dict[str, Any], where: str = "model") -> ModelSpec:
    """Build a ModelSpec from a flat mapping of its field names (as in a TOML preset)."""
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise unknown_field(where, unknown[0], _FIELDS,
                            "ModelSpec's (meshplan/specs/model.py; a preset's TOML shows most)")
    require_fields(data, ModelSpec, where)
    try:
        return ModelSpec(**data)
    except (TypeError, SpecError) as exc:  # a required field left out, or a value the spec refuses
        raise SpecError(f"{where}: {exc}") from None


def preset_names() -> list[str]:
    root = PRESETS / "models"
    return sorted(p.name.removesuffix(".toml") for p in root.iterdir() if p.name.endswith(".toml"))


def _hub_config(ref: str) -> Path | None:
    """The cached config.json of a Hub id ``org/name``, else None: hub_cache.py is imported only for a reference with a
    '/' (an id has one, a preset name none), not in every command's start-up (tests/test_startup.py)."""
    if "/" not in ref:
        return None
    from meshplan.specs.hub_cache import cached_config, is_hub_id
    return cached_config(ref) if is_hub_id(ref) else None


def load_model(ref: str) -> ModelSpec:
    """A preset name (``llama3-70b``), a ``.toml`` preset file or a Hugging Face ``config.json``."""
    hub = _hub_config(ref)
    if hub is not None:
        return _at_training_length(_from_config(read_json(hub, "model"), name=ref.split("/")[1],
                                                where=f"model={ref!r} ({hub})"))
    path = Path(ref)
    if path.suffix.lower() == ".json":
        where = f"model={str(path)!r}"
        spec = _from_config(read_json(path, "model"), name=path.parent.name or path.stem, where=where)
        return _at_training_length(spec)
    if path.suffix.lower() == ".toml":
        return model_from_dict(read_toml(path, "model", "models"), where=f"model={str(path)!r}")
    if ref not in preset_names():
        raise not_a_preset("model", ref, preset_names(), "a preset, a .toml file or a config.json")
    return _preset_model(ref)


@cache
def _preset_model(name: str) -> ModelSpec:
    """A model preset read once per process: the package's presets do not change under it, and ModelSpec is frozen."""
    return model_from_dict(read_preset(f"models/{name}.toml", f"preset {name}"), where=f"preset {name}")


def _from_config(config: dict[str, Any], name: str, where: str) -> ModelSpec:
    """specs/hf/config.from_hf_config, imported when a config.json is read (a dozen modules a preset never needs)."""
    from meshplan.specs.hf.config import from_hf_config  # noqa: PLC0415

    return from_hf_config(config, name=name, where=where)


def _at_training_length(spec: ModelSpec) -> ModelSpec:
    """A config.json model at ``CONFIG_SEQ_LENGTH`` (its context if shorter), the context kept as
    ``max_position_embeddings`` (module docstring)."""
    served = max(spec.seq_length, spec.max_position_embeddings)
    return replace(spec, seq_length=min(CONFIG_SEQ_LENGTH, spec.seq_length), max_position_embeddings=served)
