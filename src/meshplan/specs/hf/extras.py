"""The small extra structures of model_extras.py, recognised among the weights of a meta-device layer that no block
claims (modules.read_layer's ``unclaimed``), for the generic reader (generic.py). Each is named by where it sits
and its shape, as transformers 5.24's modeling files build it:

    act_params     ``<mlp>.act_fn.alpha_p`` / ``alpha_n``, one value each, of an XIELUActivation (Apertus)
    sub_norms      ``<attention>.attn_sub_norm`` (A·d wide) and ``<mlp>.ffn_sub_norm`` (F wide) (BitNet)
    moe_post_norm  ``<moe>.post_mlp_layernorm`` over H (A.X-K1)
    last_out_bias  ``<attention>.dense_bias`` over H beside its ``dense`` output projection (GPT-NeoX-Japanese builds
                   it in the last layer only; in any other layer the per-layer check refuses it)
    first_norm_skipped  layer 0 holding one norm fewer than every other layer (ModernBERT-decoder)

(Laguna's per-head gate, Beam's gate bias and DiffLlama's λ vectors are read with the attention block itself,
modules.py: ModelSpec's attn_head_gate, gate_bias and diff_attention.)

What is recognised is taken out of ``unclaimed`` and becomes a ModelSpec field; the spec then counts the structure in
every layer of its kind, and the meta-device check (verify.py) refuses a model that has it in only some of them.
"""

from __future__ import annotations

from typing import Any

from meshplan.specs.hf.modules import LayerBlocks


def claim_extras(modules: list[Any], layers: list[LayerBlocks], hidden: int, cfg: Any) -> dict[str, Any]:
    """The extras' ModelSpec fields over all ``layers`` (their ``modules``; ``cfg`` the text config, for the head
    count), each recognised weight taken out of its layer's ``unclaimed``."""
    try:  # a config whose layers differ (transformers' per-layer configs) refuses the global value: no head gates
        heads = int(getattr(cfg, "num_attention_heads", 0) or 0)
    except Exception:  # noqa: BLE001 - AmbiguousGlobalPerLayerAttributeError, transformers' own
        heads = 0
    fields: dict[str, Any] = {}
    scalars = []
    for module, layer in zip(modules, layers, strict=True):
        kept, acts, weights = [], 0, dict(module.named_parameters())
        for entry in layer.unclaimed:
            found = _extra(module, weights, entry.split(" ")[0], hidden, heads)
            if found is None:
                kept.append(entry)
            elif found == "act_params":
                acts += 1
            else:
                fields[found] = True
        layer.unclaimed = kept
        scalars += [acts] if acts else []
    if scalars:  # one MLP's activation scalars: the first layer's (a layer with other counts fails the check)
        fields["act_params"] = scalars[0]
    return fields | ({"first_norm_skipped": True} if _first_norm_skipped(layers) else {})


def _first_norm_skipped(layers: list[LayerBlocks]) -> bool:
    """Layer 0 holds one norm fewer than the others, which all hold the same norms (ModernBERT-decoder's first
    attn_norm is an nn.Identity): layer 0's norms are completed with the others' first, so that the layers read
    alike; ModelSpec.first_norm_skipped takes the norm's weights back out of layer 0."""
    if len(layers) < 2 or len({tuple(layer.norms) for layer in layers[1:]}) != 1:
        return False
    if len(layers[0].norms) != len(layers[1].norms) - 1 or layers[0].norms != layers[1].norms[1:]:
        return False
    layers[0].norms.insert(0, layers[1].norms[0])
    return True


def _extra(layer: Any, weights: dict[str, Any], name: str, hidden: int, heads: int) -> str | None:
    """Which extra the layer's weight ``name`` (of its ``weights``) is (module docstring), or None."""
    weight = weights.get(name)
    if weight is None:  # an entry that names no single weight (a module the reader describes)
        return None
    path, _, leaf = name.rpartition(".")
    owner = layer.get_submodule(path) if path else layer
    shape, cls, parent = tuple(weight.shape), type(owner).__name__, path.rpartition(".")[2]
    if cls == "XIELUActivation" and leaf in ("alpha_p", "alpha_n") and weight.numel() == 1:
        return "act_params"
    if leaf == "weight" and parent in ("attn_sub_norm", "ffn_sub_norm") and "norm" in cls.lower():
        return "sub_norms"
    if leaf == "dense_bias" and shape == (hidden,) and hasattr(owner, "dense"):
        return "last_out_bias"
    if leaf == "weight" and parent == "post_mlp_layernorm" and shape == (hidden,) and hasattr(
            layer.get_submodule(path.rpartition(".")[0]), "experts"):
        return "moe_post_norm"
    return None
