"""A serving record's engine string ("vLLM 0.5.4", "vllm==0.6.3.post1", "vLLM v0.10 ROCm", "TensorRT-LLM (PyTorch
backend …)", "vLLM, Oct 2024") -> the engine preset of that engine and version, from the table
presets/engine_versions.toml (its header gives the rule: the engine's pattern, a word it must hold, ROCm or not, the
last row whose first release is at most the string's version).

A string that states no single version ("vLLM", "pip install vllm", a range such as "0.5.x-0.6.1") but holds a date
("Sept 2024", "2024-10", "2024-10-15"), or whose record carries one (``preset_for(text, date)``), gets the version of
that date: the last row whose first release (``released``, its PyPI upload date) came out by the end of the period
the date names, since ``pip install`` takes the newest release there is. October 2024 is vLLM 0.6.3 (V0, async output
processing), not V1, which became vLLM's default only in 0.8.0 (March 2025)."""

from __future__ import annotations

import calendar
import re
from functools import cache
from typing import Any

from meshplan.files import read_preset

VERSION = re.compile(r"(?<![\w.])v?(\d+)\.(\d+)(?:\.(\d+))?")
# a version that is a wildcard ("0.5.x") or one end of a range ("0.5-0.6.1", "0.5 to 0.6"): no single version
RANGE = re.compile(r"(?<![\w.])v?\d+\.\d+(?:\.(?:\d+|x))*(?:\.x|\s*(?:-|–|to)\s*v?\d+\.\d+(?:\.\d+)?)", re.IGNORECASE)
ISO_DATE = re.compile(r"(?<!\d)(20\d\d)-(0[1-9]|1[0-2])(?:-(0[1-9]|[12]\d|3[01]))?(?!\d)")
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
NAMED_DATE = re.compile(r"\b(" + "|".join(MONTHS) + r")[a-z]*\.?\s+(20\d\d)\b", re.IGNORECASE)


@cache
def version_table() -> tuple[dict[str, Any], ...]:
    return tuple(read_preset("engine_versions.toml", "preset engine_versions.toml")["row"])


def parse_version(text: str) -> tuple[int, ...] | None:
    """The first dotted release number in ``text`` ("0.6.3.post1" -> (0, 6, 3)) that is not a wildcard or one end of
    a range ("0.5.x-0.6.1" states none), or None."""
    spans = [m.span() for m in RANGE.finditer(text)]
    for m in VERSION.finditer(text):
        if not any(a <= m.start() < b for a, b in spans):
            return tuple(int(g) for g in m.groups() if g is not None)
    return None


def parse_date(text: str) -> str | None:
    """The last day of the first date in ``text`` as YYYY-MM-DD ("Sept 2024" -> "2024-09-30", "2024-10" ->
    "2024-10-31", "2024-10-15" stays), or None."""
    found = []
    iso = ISO_DATE.search(text)
    if iso:
        year, month, day = int(iso.group(1)), int(iso.group(2)), iso.group(3)
        found.append((iso.start(), year, month, int(day) if day else None))
    named = NAMED_DATE.search(text)
    if named:
        found.append((named.start(), int(named.group(2)), MONTHS.index(named.group(1)[:3].lower()) + 1, None))
    if not found:
        return None
    _, year, month, day = min(found)
    return f"{year:04d}-{month:02d}-{day or calendar.monthrange(year, month)[1]:02d}"


def _matches(row: dict[str, Any], text: str, rocm: bool) -> bool:
    low = text.lower()
    return (re.search(row["engine"], low) is not None and row.get("contains", "") in low
            and bool(row.get("rocm", False)) == rocm)


def preset_for(text: str, date: str | None = None) -> str | None:
    """The engine preset for an engine string (its version; else the version of its date, else of ``date``, the
    record's; else the row marked ``unversioned``), or None when no row's engine matches it."""
    rocm = "rocm" in text.lower()
    rows = [r for r in version_table() if _matches(r, text, rocm)]
    if rows and any("contains" in r for r in rows):  # a row that names a backend outranks the engine's others
        rows = [r for r in rows if "contains" in r]
    if not rows:
        return None
    version = parse_version(text)
    if version is not None:
        covered = [r for r in rows if parse_version(r["since"]) <= version]  # type: ignore[operator]
        return (covered or rows[:1])[-1]["preset"]
    when = parse_date(text) or (parse_date(date) if isinstance(date, str) else None)
    if when is not None:
        out = [r for r in rows if str(r.get("released", "0000-00-00")) <= when]
        return (out or rows[:1])[-1]["preset"]
    marked = [r for r in rows if r.get("unversioned")]
    return (marked or rows)[-1]["preset"]
