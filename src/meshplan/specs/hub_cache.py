"""``--model org/name``: a Hugging Face Hub id, read offline from the local Hugging Face cache.

The cache's layout is huggingface_hub's (``file_download.hf_hub_download``; documented in "Manage the cache
system", huggingface.co/docs/huggingface_hub/guides/manage-cache): ``<cache>/models--<org>--<name>/refs/main``
holds the commit the ``main`` branch resolved to, and ``snapshots/<commit>/config.json`` the file. The cache is
``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub`` (huggingface_hub ``constants.py``). Nothing is fetched: with no config.json there, one
line says which file to download and where to put it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from meshplan.errors import SpecError

# a Hub repository id: one organisation or user, one name (huggingface_hub validate_repo_id: letters, digits,
# '-', '_', '.'; at most 96 characters)
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def is_hub_id(ref: str) -> bool:
    """``org/name`` that is not a file on disk (``x/config.json``, ``x/model.toml``, an existing file or folder is a
    path; ``Qwen/Qwen2.5-7B`` is an id)."""
    path = Path(ref)
    return bool(_REPO_ID.fullmatch(ref)) and path.suffix.lower() not in (".json", ".toml") and not path.exists()


def hub_cache() -> Path:
    """The Hugging Face cache folder, as huggingface_hub resolves it from the environment."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def cached_config(repo_id: str) -> Path:
    """The cached ``config.json`` of ``repo_id``: the snapshot ``refs/main`` names, else the only (or newest)
    snapshot that has one. SpecError (one line: the file to download and where) when there is none."""
    org, name = repo_id.split("/")
    repo = hub_cache() / f"models--{org}--{name}"
    ref = repo / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
        if (repo / "snapshots" / commit / "config.json").is_file():
            return repo / "snapshots" / commit / "config.json"
    found = sorted(repo.glob("snapshots/*/config.json"), key=lambda p: p.stat().st_mtime)
    if found:
        return found[-1]
    raise SpecError(f"model={repo_id!r} is not in the Hugging Face cache ({repo}) and meshplan does not download: "
                    f"fetch https://huggingface.co/{repo_id}/resolve/main/config.json into "
                    f"{repo / 'snapshots' / 'main' / 'config.json'} (or run `hf download {repo_id} config.json`), "
                    "or pass a config.json's path")
