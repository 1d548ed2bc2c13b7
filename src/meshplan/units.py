"""Units. Inside meshplan everything is SI: bytes, seconds, FLOP, bytes/s, FLOP/s.

Human units (``"80 GiB"``, ``"900 GB/s"``, ``"1.2 us"``) are parsed and formatted here, at the edges only.
Decimal prefixes (k, M, G, T, P) are powers of 1000; binary ones (Ki, Mi, Gi, Ti) powers of 1024, as in IEC 80000-13.
"""

from __future__ import annotations

import math
import re

from meshplan.errors import SpecError

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4
GB = 1e9
TB = 1e12

_PREFIX = {
    "": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40,
    "u": 1e-6, "µ": 1e-6, "n": 1e-9, "m": 1e-3,
}
_UNIT = {"B", "B/s", "FLOP/s", "FLOPS", "s", "b/s", "bit/s", "bps", ""}
_QUANTITY = re.compile(r"^\s*([-+0-9.eE_]+)\s*([a-zA-Zµ]*?)(B/s|FLOP/s|FLOPS|bit/s|b/s|bps|B|s|)\s*$")


_UNITS_OF = {"B": ("B",), "B/s": ("B/s", "b/s", "bit/s", "bps"), "FLOP/s": ("FLOP/s", "FLOPS"), "s": ("s",)}
_EXAMPLE = {"B": "'80 GiB'", "B/s": "'900 GB/s'", "FLOP/s": "'989 TFLOP/s'", "s": "'3 us'"}


def parse_quantity(text: str | float | int, field: str = "value", unit: str | None = None) -> float:
    """Parse ``"80 GiB"``, ``"3.35 TB/s"``, ``"400 Gb/s"`` (bits → bytes), ``"989 TFLOP/s"``, ``"2 us"``.

    Numbers pass through unchanged (SI); bit rates are converted to bytes/s. With ``unit`` (``B``, ``B/s``,
    ``FLOP/s``, ``s``) a text must carry a unit of that kind: ``hbm_bandwidth = "3 TB"`` is an error.
    """
    bad = SpecError(f"{field}={text!r} is not a quantity like '80 GiB', '900 GB/s' or '989 TFLOP/s'")
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if not math.isfinite(text):
            raise bad
        return float(text)
    match = _QUANTITY.match(text) if isinstance(text, str) else None
    if match and unit is not None and match.group(3) not in _UNITS_OF[unit]:
        raise SpecError(f"{field}={text!r} must be in {unit}, like {_EXAMPLE[unit]}")
    if not match or match.group(2) not in _PREFIX:
        raise bad
    number, prefix, written = match.groups()
    try:
        value = float(number) * _PREFIX[prefix]
    except ValueError:
        raise bad from None
    if not math.isfinite(value):
        raise bad
    if written in ("b/s", "bit/s", "bps"):
        value /= 8.0
    return value


# compiled by re on first use (its own cache): a command given no duration compiles none (start-up, issue 83)
_DURATION = r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zµ]*)\s*$"
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str, field: str, low: float, high: float) -> float:
    """A time with its unit (``"50ms"``, ``"2 s"``, ``"1.5min"``, ``"1h"``; ns, us / µs, ms, s, min, h) in seconds,
    from ``low`` to ``high`` after conversion. A bare number is refused: ``50`` could be seconds or milliseconds."""
    span = f"{_duration(low)} to {_duration(high)}"
    match = re.match(_DURATION, text)
    if not match or match.group(2) not in _SECONDS:
        unit = "" if not match else " needs a unit (ns, us, ms, s, min or h)" if not match.group(2) else \
            f" has unit {match.group(2)!r}, not one of ns, us, ms, s, min, h"
        raise SpecError(f"{field}={text!r}{unit or ' is not a time'}: a time from {span}, like 200ms or 2s")
    value = float(match.group(1)) * _SECONDS[match.group(2)]
    if not low <= value <= high:
        raise SpecError(f"{field}={text!r} is {value:g} s, outside {span}")
    return value


def _duration(seconds: float) -> str:
    """``3600`` -> ``1 h``, ``1e-06`` -> ``1 us``: in the largest unit of ``_SECONDS`` it is at least one of."""
    unit = next((u for u, k in sorted(_SECONDS.items(), key=lambda uk: -uk[1]) if seconds >= k), "ns")
    return f"{seconds / _SECONDS[unit]:g} {unit}"


def fmt_bytes(n: float) -> str:
    """Binary units for memory: ``fmt_bytes(80 * GiB) == '80.0 GiB'``."""
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_over(used: float, limit: float) -> str:
    """``used > limit`` in the limit's binary unit with the fewest decimals (1 to 3) that tell them apart
    (``'72.53 GiB > 72.50 GiB'``, where one decimal read "72.5 GiB > 72.5 GiB"); closer still, the overshoot."""
    unit, size = next(((u, z) for u, z in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB))
                       if abs(limit) >= z), ("B", 1.0))
    for digits in (1, 2, 3):
        a, b = f"{used / size:.{digits}f}", f"{limit / size:.{digits}f}"
        if a != b:
            return f"{a} {unit} > {b} {unit}"
    return f"{a} {unit} > {b} {unit} (by {fmt_bytes(used - limit)})"


def fmt_time(seconds: float) -> str:
    """``fmt_time(0.0123) == '12.3 ms'``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.3g} s"


def fmt_count(n: float) -> str:
    """``fmt_count(8.03e9) == '8.03 B'`` for parameter counts and token rates."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(float(f"{n:.3g}")) >= scale:  # by the rounded value: 999,600 is "1 M", not "1e+03 k"
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g}"
