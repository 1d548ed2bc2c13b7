"""Type checks for the frozen specs' fields, so that a TOML or JSON value of the wrong kind is one clear line.

TOML and JSON give strings, booleans, numbers, lists and tables; a spec field declared ``int`` that receives
``"2"`` or ``true`` (Python's ``bool`` is an ``int``), or a ``bool`` that receives ``"false"`` (a non-empty,
hence true, string) would otherwise be used as is. ``check_types`` reads each field's declared type and
raises SpecError naming the field and the value: ``tied_embeddings='false' must be true or false``.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, fields
from typing import Any

from meshplan.errors import SpecError

# The integer sizes of a model (layers, widths, vocabulary, sequence) are at most this: 2^31 - 1, the largest
# int32 (PyTorch's and CUDA's index type for a dimension); a sequence of 10^20 tokens is a typo, and its
# products overflow the int64 arithmetic of the batched search.
MAX_SIZE = 2**31 - 1
# Layers: 10,000, ten times the deepest transformer trained (DeepNet, Wang et al. 2022: 1,000 layers); the
# parameter count and the per-layer MoE pattern are sums over layers.
MAX_LAYERS = 10_000
# The largest cluster meshplan plans: 2^20 = 1,048,576 GPUs, beyond every machine built or announced (the
# largest announced AI clusters are a few hundred thousand to a million GPUs); a larger count is a typo.
MAX_GPUS = 2**20
# Plans a search space may hold by default (Space.max_plans, --max-plans): about 40 s at the measured rate (README,
# benchmarks/measure/search_speed.py), so that a typo in a GPU or expert count is one line, not an hour.
MAX_PLANS = 1_000_000_000
# The share of HBM a plan leaves free by default on the command line: the model's largest |error| of peak memory
# against the measured runs, 8.9 % (docs/ACCURACY.md, "Peak memory": torchtitan's Llama 3 8B run t4_0 under
# tensor parallelism with AsyncTP, whose buffers no field prices, measured as the allocator's reserved peak),
# rounded up.
# tests/test_supports.py checks that it covers docs/accuracy_summary.json's memory max_abs_error.
MEMORY_HEADROOM = 0.09


def usable_hbm(capacity: float, headroom: float = MEMORY_HEADROOM) -> float:
    """The bytes a plan may use of ``capacity``: what the headroom leaves (the search's feasibility and
    ``estimate``'s "fits" read the same rule)."""
    return capacity * (1 - headroom)


def _kind_error(name: str, value: Any, kind: str) -> str | None:
    """The complaint about ``value`` for a field declared ``kind`` (a string annotation), or None."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind in ("float | None", "int | None"):  # a number or nothing
        if value is None:
            return None
        kind = kind.removesuffix(" | None")
    if kind == "int" and not is_int:
        return f"{name}={value!r} must be an integer"
    if kind == "float" and not (is_int or isinstance(value, float)):
        return f"{name}={value!r} must be a number"
    if kind == "float" and not math.isfinite(value):
        return f"{name}={value!r} must be a finite number"
    if kind == "bool" and not isinstance(value, bool):
        return f"{name}={value!r} must be true or false"
    if kind == "bool | None" and not (value is None or isinstance(value, bool)):
        return f"{name}={value!r} must be true or false"
    if kind == "str" and not isinstance(value, str):
        return f"{name}={value!r} must be a string"
    return None


def check_types(spec: Any, prefix: str = "") -> None:
    """Raise SpecError for the first field of dataclass ``spec`` whose value is not of its declared type
    (``int``, ``float``, ``bool``, ``str``; the first three also ``| None``; other annotations are the spec's own
    business)."""
    for f in fields(spec):
        message = _kind_error(f.name, getattr(spec, f.name), str(f.type))
        if message:
            raise SpecError(prefix + message)


def at_most(spec: Any, names: tuple[str, ...], limit: int, prefix: str = "") -> None:
    """Raise SpecError for the first of ``names`` above ``limit``."""
    for name in names:
        value = getattr(spec, name)
        if value > limit:
            raise SpecError(f"{prefix}{name}={value} is larger than {limit:,}")


def at_least_one(spec: Any, names: tuple[str, ...], prefix: str = "") -> None:
    """Raise SpecError for the first of ``names`` below 1 or not finite: the byte counts, bytes/s and FLOP/s of a
    hardware spec, where a value below one is a typo whose times overflow (1e-300 B/s gives NaN step times)."""
    for name in names:
        value = getattr(spec, name)
        if not (value >= 1 and math.isfinite(value)):
            raise SpecError(f"{prefix}{name}={value!r} must be at least 1 and finite")


# Values longer than this are cut in error messages: a 20,000-character option is echoed as its first 60 and "…"
MAX_SHOWN = 60
# ... except a path (with a separator) up to this long, which names the file the user gave
MAX_PATH_SHOWN = 1024
# compiled by re on first use (its own cache): a start-up with no error to print compiles none (issue 83)
_QUOTED = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s'\"=]+"
_BREAKS = {c: repr(chr(c))[1:-1] for c in (*range(0, 32), 127, 0x85, 0x2028, 0x2029)}


def _clip(token: str) -> str:
    quoted = token[:1] in ("'", '"') and token[-1:] == token[:1] and len(token) > 1
    inner = token[1:-1] if quoted else token
    is_path = ("/" in inner or "\\" in inner) and len(inner) <= MAX_PATH_SHOWN
    if len(inner) <= MAX_SHOWN or is_path:
        return token
    cut = f"{inner[:MAX_SHOWN]}… ({len(inner):,} characters)"
    return f"{token[0]}{cut}{token[0]}" if quoted else cut


def one_line(message: str) -> str:
    """``message`` as one line of reasonable length: line breaks and control characters escaped, every value
    (a quoted string or a run without spaces) longer than MAX_SHOWN characters cut to that many and "…"; a
    path keeps up to MAX_PATH_SHOWN."""
    return re.sub(_QUOTED, lambda m: _clip(m.group()), message.translate(_BREAKS))


# A table of more known fields than this is not listed in an unknown-field error (the line would run past 600
# characters); the close matches are named instead, and where the fields are documented
MAX_LISTED = 20


def require_fields(data: dict[str, Any], cls: type, where: str, given: tuple[str, ...] = ()) -> None:
    """A field the spec ``cls`` needs that a file's table ``data`` leaves out (``given``: passed apart), named in one
    line rather than the dataclass's TypeError."""
    missing = [f.name for f in fields(cls) if f.init and f.name not in data and f.name not in given
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise SpecError(f"{where}: missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")


def unknown_field(where: str, key: str, known: set[str], documented: str) -> SpecError:
    """The error for a key of a file's table that is not one of ``known``: the known fields when they are few, else
    the closest (difflib) and ``documented`` (where the full list is)."""
    import difflib  # noqa: PLC0415  (only an error imports it: not every command's start-up)

    close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
    if len(known) <= MAX_LISTED:
        return SpecError(f"{where}: unknown field {key!r} (known: {', '.join(sorted(known))})")
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return SpecError(f"{where}: unknown field {key!r} ({hint}the {len(known)} fields are {documented})")


def not_a_preset(field: str, ref: str, names: list[str], forms: str) -> SpecError:
    """The error for ``ref`` that is neither a preset of ``names`` nor a file of ``forms``: the presets when they are
    few, else the closest (difflib) and where they are listed."""
    if len(names) <= MAX_LISTED:
        return SpecError(f"{field}={ref!r} is not {forms} (presets: {', '.join(names)})")
    import difflib  # noqa: PLC0415

    close = difflib.get_close_matches(ref, names, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return SpecError(f"{field}={ref!r} is not {forms} ({hint}`meshplan presets` lists the {len(names)} presets)")
