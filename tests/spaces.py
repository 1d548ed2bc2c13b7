"""Search-space settings the tests share.

``EVERY_PLAN``: every plan meshplan models (the generic stack: 2D SUMMA, any placement, every ZeRO stage), no memory
headroom, ranked by time alone. Not Space's defaults, which are the command line's (Megatron-Core,
fields.MEMORY_HEADROOM, the simplest plan first within the error band): the tests that check the search against
estimate() on every plan of a space, or rank by time, name these.
"""

from __future__ import annotations

from meshplan.specs.stack import Stack

EVERY_PLAN = {"stack": Stack(), "headroom": 0.0, "prefer_simple": False}
