"""Megatron-Core's custom pipeline layout (``--pipeline-model-parallel-layout``, TransformerConfig
.pipeline_model_parallel_layout; megatron/core/transformer/pipeline_parallel_layer_layout.py, core 0.16.1), written
from and read into Plan.stage_layers.

The layout lists every model chunk, the first chunk of every pipeline rank, then the second of every rank, and so on,
separated by ``|``; in a chunk ``E`` is the embedding, ``t`` a decoder layer, ``m`` a multi-token-prediction layer,
``L`` the loss (with the output layer); ``x*N`` repeats a character, ``(…)*N`` a group, commas are cosmetic. The
embedding is on the first rank's first chunk, the MTP layers and the loss on the last rank's last chunk, as
Megatron-Core's validate_layer_layout asserts. Rank r's l_r layers split evenly over its v chunks (Plan.stage_layers:
each a multiple of v).
"""

from __future__ import annotations

import re

from meshplan.errors import SpecError


def layout_string(stage_layers: tuple[int, ...], vpp: int, mtp_layers: int = 0) -> str:
    """The layout of ``stage_layers`` decoder layers per rank over ``vpp`` chunks each (module docstring)."""
    pp, chunks = len(stage_layers), []
    for c in range(vpp):
        for r, layers in enumerate(stage_layers):
            n = layers // vpp
            body = "t" if n == 1 else f"t*{n}"
            head = "E" if (r, c) == (0, 0) else ""
            tail = ("m" * mtp_layers + "L") if (r, c) == (pp - 1, vpp - 1) else ""
            chunks.append(head + body + tail)
    return "|".join(chunks)


def _expand(text: str) -> str:
    """The layout with its repetitions written out and its commas left out."""
    text = text.replace(",", "").replace(" ", "")
    for _ in range(len(text)):  # innermost groups first, until none is left
        grouped = re.sub(r"\(([^()]*)\)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), text)
        if grouped == text:
            break
        text = grouped
    return re.sub(r"([EtmL])\*(\d+)", lambda g: g.group(1) * int(g.group(2)), text)


def stage_layers_of(text: str, pp: int, name: str = "--pipeline-model-parallel-layout") -> tuple[tuple[int, ...], int]:
    """(decoder layers per rank, chunks per rank) of a layout string for ``pp`` ranks."""
    chunks = _expand(text).split("|")
    if any(set(c) - set("EtmL") for c in chunks) or len(chunks) % pp:
        raise SpecError(f"{name} {text!r} must be chunks of E, t, m and L separated by | (a multiple of the "
                        f"pipeline size {pp} of them)")
    vpp = len(chunks) // pp
    return tuple(sum(chunks[c * pp + r].count("t") for c in range(vpp)) for r in range(pp)), vpp
