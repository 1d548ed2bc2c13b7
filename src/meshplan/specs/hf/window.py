"""Layers of two attention shapes: windowed layers whose attention differs from the full layers' (Gemma 4 unified:
head width 256 beside 512; MiMo-V2-Flash: 8 KV heads and sinks beside 4 KV heads; dots3: no DSA indexer beside the
indexed layers). The generic reader (generic.py) reads such a model as a hybrid whose "sliding_attention" layers
(the config's ``layer_types``) hold windowed "W" blocks and whose other layers hold full "*" blocks, each kind with
its own shape (ModelSpec ``window_head_dim``, ``window_kv_heads``, ``window_sinks``;
mixer_params.window_attention_spec).
Layers whose attention is alike keep the plain reading (``sliding_window`` and ``window_layers``).
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import SpecError

ATTENTION_BLOCKS = ("attention", "mla")
# the attention sizes a windowed block may have of its own; every other size must be the full blocks'
OWN = {"q", "k", "v", "o_in", "q_norm", "k_norm", "sinks", "indexer"}


def split_windowed(layers: list[Any], cfg: Any) -> None:
    """Relabel the attention block of each "sliding_attention" layer "window" (its sizes under "window") when the
    windowed and the full layers' attention blocks differ in shape; leave the layers as read otherwise."""
    types = getattr(cfg, "layer_types", None)
    if not isinstance(types, list) or len(types) != len(layers) or "sliding_attention" not in types:
        return
    shapes: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for layer, kind in zip(layers, types, strict=True):
        shapes[kind == "sliding_attention"] += [layer.sizes[b] for b in ATTENTION_BLOCKS if b in layer.sizes]
    if not shapes[False] or not shapes[True] or shapes[False][0] == shapes[True][0]:
        return
    for layer, kind in zip(layers, types, strict=True):
        for i, block in enumerate(layer.blocks):
            if kind == "sliding_attention" and block in ATTENTION_BLOCKS:
                layer.blocks[i] = "window"
                layer.sizes["window"] = layer.sizes.pop(block) | {"mla": block == "mla"}


def window_fields(sizes: dict[str, Any], fields: dict[str, Any], where: str) -> dict[str, Any]:
    """window_head_dim, window_kv_heads and window_sinks of the "W" blocks, whose other sizes must be the full
    blocks' (``OWN``: the widths, q/k norms, sinks; MLA: all but the indexer)."""
    win = sizes.get("window")
    if win is None:
        return {}
    full = sizes.get("mla") if win["mla"] else sizes.get("attention")
    if full is None:
        raise SpecError(f"{where}: windowed attention layers without full ones of the same kind")
    differ = sorted(k for k in set(win) | set(full) if k not in OWN | {"mla"} and win.get(k) != full.get(k))
    if differ:
        raise SpecError(f"{where}: the windowed and full attention layers differ in {', '.join(differ)}")
    if win["mla"]:
        if win.get("indexer") is not None:
            raise SpecError(f"{where}: a DSA indexer in the windowed layers is not modelled")
        return {}
    heads = fields["num_heads"]
    dim, v_head = win["q"] // heads, fields.get("v_head_dim") or win["q"] // heads
    if dim * heads != win["q"] or win.get("o_in") != heads * v_head or win["k"] % dim or \
            win["v"] != win["k"] // dim * v_head:
        raise SpecError(f"{where}: windowed attention of q {win['q']}, k {win['k']}, v {win['v']} for {heads} heads "
                        "is not modelled")
    sinks = win.get("sinks", 0)
    if sinks not in (0, heads) or win.get("q_norm", dim) not in (dim, 0):
        raise SpecError(f"{where}: the windowed attention's sinks ({sinks}) or q/k norms are not per head")
    return {"window_head_dim": dim, "window_kv_heads": win["k"] // dim, "window_sinks": bool(sinks)}
