"""Per-layer embeddings among the modules of a meta-device Gemma 4 / Gemma 3n model (specs/model_extras.py
``per_layer_input``), for the generic reader (generic.py, outside.py), as transformers 5.24 builds them
(models/gemma4/modeling_gemma4.py): beside the layers ``embed_tokens_per_layer`` (an embedding V_p × L·d),
``per_layer_model_projection`` (H → L·d) and ``per_layer_projection_norm`` (d wide); in each layer
``per_layer_input_gate`` (H → d), ``per_layer_projection`` (d → H) and ``post_per_layer_input_norm`` (H wide).

And the structures of Gemma 3n and Gemma 4 meshplan does not model, refused by name from the config before any layer is
read: AltUp's parallel residual streams (``altup_num_inputs``, Gemma 3n), LAuReL's low-rank residual (``laurel_rank``),
layers that reuse an earlier layer's keys and values (``num_kv_shared_layers``: no k_proj / v_proj of their own) and
keys that are the values (``attention_k_eq_v``).
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import SpecError
from meshplan.specs.hf.modules import LayerBlocks, children, linear

MODEL_PARTS = ("embed_tokens_per_layer", "per_layer_model_projection", "per_layer_projection_norm")
LAYER_PARTS = ("per_layer_input_gate", "per_layer_projection")
LAYER_NORM = "post_per_layer_input_norm"
UNMODELLED = (("altup_num_inputs", lambda v: isinstance(v, int) and v > 1, "AltUp's parallel residual streams"),
              ("laurel_rank", lambda v: isinstance(v, int) and v > 0, "LAuReL's low-rank residual"),
              ("num_kv_shared_layers", lambda v: isinstance(v, int) and v > 0,
               "layers that reuse an earlier layer's keys and values (no k_proj / v_proj of their own)"),
              ("attention_k_eq_v", lambda v: v is True, "keys that are the values (one projection for both)"))


def refuse_unmodelled(cfg: Any, where: str) -> None:
    """One line naming every structure of the config meshplan does not model (module docstring)."""
    found = [f"{name}={getattr(cfg, name)!r} ({what})" for name, test, what in UNMODELLED
             if test(getattr(cfg, name, None))]
    if found:
        raise SpecError(f"{where}: {'; '.join(found)}: not modelled (meshplan reads Gemma 4's per-layer embeddings, "
                        "not these)")


def ple_fields(model: Any, others: list[tuple[int, str, str]], hidden: int, layers: int
               ) -> tuple[dict[str, Any], list[tuple[int, str, str]]]:
    """(the per-layer embedding's ModelSpec fields, the modules beside the layers left unclaimed) from
    outside.outside_fields' unclaimed ``others``."""
    named = {name.split(".")[-1]: name for _, name, _ in others}
    if not set(MODEL_PARTS) <= set(named):
        return {}, others
    table = model.get_submodule(named["embed_tokens_per_layer"]).weight
    projection = linear(model.get_submodule(named["per_layer_model_projection"]))
    width = int(model.get_submodule(named["per_layer_projection_norm"]).weight.shape[0])
    if projection is None or projection[:2] != (layers * width, hidden) or int(table.shape[1]) != layers * width:
        return {}, others
    rest = [o for o in others if o[1].split(".")[-1] not in MODEL_PARTS]
    return {"per_layer_input": width, "per_layer_vocab": int(table.shape[0])}, rest


def claim_ple_layers(modules: list[Any], layers: list[LayerBlocks], hidden: int, width: int) -> None:
    """Take each layer's gate, projection and norm of width ``width`` out of its unclaimed weights and its norms."""
    for module, layer in zip(modules, layers, strict=True):
        kids = children(module)
        if not all(name in kids for name in (*LAYER_PARTS, LAYER_NORM)):
            continue
        if linear(kids["per_layer_input_gate"]) != (width, hidden, False) or linear(
                kids["per_layer_projection"]) != (hidden, width, False):
            continue
        layer.unclaimed = [u for u in layer.unclaimed if u.split(".")[0] not in LAYER_PARTS]
        norms = [n for n, m in kids.items() if "norm" in type(m).__name__.lower() and not children(m)]
        layer.norms.pop(norms.index(LAYER_NORM))
