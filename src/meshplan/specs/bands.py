"""How far a predicted step time may be from the measured one: the error band of comparable published runs.

``presets/error_bands.json`` (written by benchmarks/accuracy.py from the runs of docs/ACCURACY.md) holds, per GPU
architecture and model kind (dense / MoE), the 80th percentile of |predicted / measured − 1| and the runs behind it;
an architecture it does not list takes the overall band. Two plans whose step times differ by less than the band
cannot be told apart by this model (search/run.py ranks them as equivalent).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def _bands() -> dict:
    return json.loads((resources.files("meshplan") / "presets" / "error_bands.json").read_text())


def error_band(architecture: str, moe: bool) -> float:
    """The relative half-width of the step-time band for a GPU architecture and a dense or MoE model."""
    data = _bands()
    found = data["bands"].get(f"{architecture or 'unstated'}/{'moe' if moe else 'dense'}")
    return float((found or data["overall"])["band"])
