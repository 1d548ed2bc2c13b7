"""A serving record's engine string ("vLLM 0.5.4", "vllm==0.6.3.post1", "vLLM v0.10 ROCm", "TensorRT-LLM (PyTorch
backend …)") -> the engine preset of that engine and version, from the table presets/engine_versions.toml (its
header gives the rule: the engine's pattern, a word it must hold, ROCm or not, the last row whose first release is at
most the string's version)."""

from __future__ import annotations

import re
import tomllib
from functools import cache
from typing import Any

from meshplan.files import PRESETS

VERSION = re.compile(r"(?<![\w.])v?(\d+)\.(\d+)(?:\.(\d+))?")


@cache
def version_table() -> tuple[dict[str, Any], ...]:
    text = (PRESETS / "engine_versions.toml").read_text()
    return tuple(tomllib.loads(text)["row"])


def parse_version(text: str) -> tuple[int, ...] | None:
    """The first dotted release number in ``text`` ("0.6.3.post1" -> (0, 6, 3)), or None."""
    m = VERSION.search(text)
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def _matches(row: dict[str, Any], text: str, rocm: bool) -> bool:
    low = text.lower()
    return (re.search(row["engine"], low) is not None and row.get("contains", "") in low
            and bool(row.get("rocm", False)) == rocm)


def preset_for(text: str) -> str | None:
    """The engine preset for an engine string, or None when no row's engine matches it."""
    rocm = "rocm" in text.lower()
    rows = [r for r in version_table() if _matches(r, text, rocm)]
    if rows and any("contains" in r for r in rows):  # a row that names a backend outranks the engine's others
        rows = [r for r in rows if "contains" in r]
    if not rows:
        return None
    version = parse_version(text)
    if version is None:
        marked = [r for r in rows if r.get("unversioned")]
        return (marked or rows)[-1]["preset"]
    covered = [r for r in rows if parse_version(r["since"]) <= version]  # type: ignore[operator]
    return (covered or rows[:1])[-1]["preset"]
