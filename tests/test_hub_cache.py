"""``--model org/name`` (specs/hub_cache.py): read offline from a Hugging Face cache of huggingface_hub's layout
(models--org--name/refs/main, snapshots/<commit>/config.json a link into blobs/), else one line naming the file to
download and where; built in tmp_path, no network."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.cli import main
from meshplan.errors import SpecError
from meshplan.specs.hub_cache import cached_config, hub_cache, is_hub_id
from meshplan.specs.model_load import load_model

HF = Path(__file__).parent / "data" / "hf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(root: Path, repo_id: str, config: Path, commit: str = COMMIT) -> Path:
    """One model in a cache as ``hf download`` leaves it: the blob, the snapshot's link to it, refs/main."""
    org, name = repo_id.split("/")
    repo = root / f"models--{org}--{name}"
    (repo / "blobs").mkdir(parents=True)
    blob = repo / "blobs" / "3f1e0a9c"
    blob.write_text(config.read_text())
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(Path("../../blobs/3f1e0a9c"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot / "config.json"


def test_cache_folder_follows_huggingface_hub(monkeypatch, tmp_path):
    for key in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub_cache() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert hub_cache() == tmp_path / "cache"


def test_hub_ids_and_paths():
    assert is_hub_id("meta-llama/Meta-Llama-3-8B") and is_hub_id("Qwen/Qwen2.5-7B")
    assert not is_hub_id("llama3-8b") and not is_hub_id("x/config.json") and not is_hub_id("a/b/c")
    assert not is_hub_id(str(HF / "gpt2"))  # an existing folder is a path


def test_model_read_from_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    path = cache_repo(tmp_path, "meta-llama/Meta-Llama-3-8B", HF / "llama-3-8b" / "config.json")
    assert cached_config("meta-llama/Meta-Llama-3-8B") == path
    spec = load_model("meta-llama/Meta-Llama-3-8B")
    assert spec.name == "Meta-Llama-3-8B"
    # the same model as the config.json's path gives: 8,030,261,248 parameters (tests/test_model.py)
    assert spec == replace(load_model(str(HF / "llama-3-8b" / "config.json")), name="Meta-Llama-3-8B")
    assert spec.params() == 8_030_261_248


def test_refs_main_wins_over_an_older_snapshot(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    cache_repo(tmp_path, "org/model", HF / "llama-3-8b" / "config.json")
    old = tmp_path / "models--org--model" / "snapshots" / "fedcba"
    old.mkdir()
    (old / "config.json").write_text(json.dumps(json.loads((HF / "gpt2" / "config.json").read_text())))
    assert load_model("org/model").params() == 8_030_261_248  # refs/main's Llama, not the other snapshot's GPT-2


def test_a_model_not_in_the_cache_says_what_to_download(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(SpecError) as err:
        load_model("Qwen/Qwen2.5-7B")
    line = str(err.value)
    assert "\n" not in line
    assert "https://huggingface.co/Qwen/Qwen2.5-7B/resolve/main/config.json" in line
    assert str(tmp_path / "models--Qwen--Qwen2.5-7B" / "snapshots" / "main" / "config.json") in line
    code = main(["estimate", "--model", "Qwen/Qwen2.5-7B", "--system", "h100", "--gpus", "8"])
    out, err_text = capsys.readouterr()
    assert code == 2 and "resolve/main/config.json" in err_text and "Traceback" not in err_text


def test_estimate_of_a_cached_model(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    cache_repo(tmp_path, "Qwen/Qwen2-7B", HF / "qwen2-7b" / "config.json")
    code = main(["estimate", "--model", "Qwen/Qwen2-7B", "--system", "h100", "--gpus", "8", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["params"] == 7_615_616_512  # tests/test_model.py's Qwen2-7B count


def test_autoshard_reads_a_cached_model(monkeypatch, tmp_path):
    """The sharding planner (plan --autoshard) takes the Hub id too, at the config.json training length."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from meshplan.autoshard.planner import Request, load

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    cache_repo(tmp_path, "openai-community/gpt2", HF / "gpt2" / "config.json")
    _, inputs, name, depth = load(Request(model="openai-community/gpt2", system="h100", gpus=8, global_batch=8))
    assert (name, depth) == ("gpt2", 12)
    assert inputs[0][0][-1] == 1024  # GPT-2's 1,024 positions, below model_load.CONFIG_SEQ_LENGTH = 4,096
