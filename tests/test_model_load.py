"""Loading a ModelSpec (model_load.py): every preset well formed, and bad input (an unknown preset, malformed
TOML or JSON, a missing file, an unknown field) a one-line SpecError naming it."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from meshplan.errors import SpecError
from meshplan.specs.hf.config import from_hf_config
from meshplan.specs.model_load import load_model, model_from_dict, preset_names

HF = Path(__file__).parent / "data" / "hf"


def hf_dict(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())


# ---- presets -----------------------------------------------------------------------------------------------
PRESETS_DIR = Path(__file__).resolve().parents[1] / "src" / "meshplan" / "presets" / "models"


@pytest.mark.parametrize("name", preset_names())
def test_preset_is_well_formed(name: str) -> None:
    text = (PRESETS_DIR / f"{name}.toml").read_text()
    data = tomllib.loads(text)
    assert data["name"] == name
    assert data["source"], f"{name}: no source"
    assert text.startswith("#"), f"{name}: no provenance comment"
    spec = load_model(name)
    if spec.is_moe:
        assert spec.params() > spec.params(active=True)
    else:
        assert spec.params() == spec.params(active=True)


# ---- bad input ---------------------------------------------------------------------------------------------
def test_unknown_preset_names_it() -> None:
    with pytest.raises(SpecError, match="'no-such-model'"):
        load_model("no-such-model")


def test_malformed_toml(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\nnum_layers = = 2\n')
    with pytest.raises(SpecError, match="malformed TOML"):
        load_model(str(path))


def test_malformed_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": 4096,')
    with pytest.raises(SpecError, match="malformed JSON"):
        load_model(str(path))
    path.write_text("[1, 2]")
    with pytest.raises(SpecError, match="JSON object"):
        load_model(str(path))


def test_missing_file() -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_model("/nonexistent/config.json")


TINY = {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 256,
        "vocab_size": 100}


def test_non_positive_size_from_files(tmp_path: Path) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in (TINY | {"num_layers": 0}).items()))
    with pytest.raises(SpecError, match="num_layers=0"):
        load_model(str(path))
    with pytest.raises(SpecError, match="hidden_size=-4096"):
        from_hf_config(hf_dict("llama-3-8b") | {"hidden_size": -4096}, "neg")


def test_unknown_field_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="'hidden'"):
        model_from_dict(TINY | {"hidden": 64})
