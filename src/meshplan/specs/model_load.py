"""Loading a ModelSpec: from a flat mapping of its fields (a TOML preset), a preset name (``llama3-70b``), a
``.toml`` preset file or a Hugging Face ``config.json`` (read by hf_config.py)."""

from __future__ import annotations

import tomllib
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

from meshplan.errors import SpecError
from meshplan.fields import not_a_preset, require_fields, unknown_field
from meshplan.files import read_json, read_toml
from meshplan.specs.hf_config import from_hf_config
from meshplan.specs.model import ModelSpec

_FIELDS = {f.name for f in fields(ModelSpec)}


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
    root = resources.files("meshplan") / "presets" / "models"
    return sorted(p.name.removesuffix(".toml") for p in root.iterdir() if p.name.endswith(".toml"))


def load_model(ref: str) -> ModelSpec:
    """A preset name (``llama3-70b``), a ``.toml`` preset file or a Hugging Face ``config.json``."""
    path = Path(ref)
    if path.suffix.lower() == ".json":
        where = f"model={str(path)!r}"
        return from_hf_config(read_json(path, "model"), name=path.parent.name or path.stem, where=where)
    if path.suffix.lower() == ".toml":
        return model_from_dict(read_toml(path, "model"), where=f"model={str(path)!r}")
    root = resources.files("meshplan") / "presets" / "models"
    preset = root / f"{ref}.toml"
    if ref not in preset_names():
        raise not_a_preset("model", ref, preset_names(), "a preset, a .toml file or a config.json")
    return model_from_dict(tomllib.loads(preset.read_text()), where=f"preset {ref}")
