"""The generic Hugging Face reader: a ModelSpec from the modules of the model built on the meta device (meta.py),
for any decoder-only model_type without a hand-written family (families.py).

Each decoder layer is split into blocks (modules.py). When every layer is attention (or MLA) + MLP / MoE with the
same norms, the spec is a standard one (``layer_norms`` norms per layer; MoE layers after ``first_k_dense_layers``,
every ``moe_layer_freq``-th); otherwise it is a hybrid (``layer_pattern``: one letter per block, "*" attention,
"M" Mamba-2, "G" Gated DeltaNet, "-" MLP, "E" MoE, each block with one norm; "S", "K", "L", "W", "P", "R", "C": the
other letters of model_checks.BLOCK_KINDS), so that Jamba-style interleavings
and irregular MoE layouts keep their per-layer kinds. Sizes come from the weight shapes (H and V from the
embedding, head_dim from q_proj and the head count, K from k_proj, F from the down projection, E from the expert
tensors); what shapes do not say comes from the config (heads, top-k, MLA ranks, Mamba groups and state, Gated
DeltaNet key heads, sliding windows, dropout, MTP depth).
The small extra weights of some families (sub-norms, per-head gates, activation scalars …) become the fields of
specs/model_extras.py (extras.py). Any structure the spec cannot express raises SpecError naming it.
``read_generic`` returns the fields and, for a hybrid, how many blocks each Hugging Face layer became (for the
per-layer check in verify.py).
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import SpecError
from meshplan.specs.hf.extras import claim_extras
from meshplan.specs.hf.linear import linear_fields
from meshplan.specs.hf.meta import MetaModel
from meshplan.specs.hf.modules import LayerBlocks, read_layer
from meshplan.specs.hf.outside import outside_fields, text_config
from meshplan.specs.hf.ple import claim_ple_layers, refuse_unmodelled
from meshplan.specs.hf.sizes import attention_fields, deltanet_fields, mamba_fields, moe_fields
from meshplan.specs.hf.window import split_windowed, window_fields

LETTERS = {"attention": "*", "mla": "*", "window": "W", "parallel": "P", "mamba": "M", "mamba1": "S", "deltanet": "G",
           "kda": "K", "lightning": "L", "rglru": "R", "shortconv": "C", "mlp": "-", "moe": "E"}
MIXERS = ("attention", "mla", "window", "parallel", "mamba", "mamba1", "deltanet", "kda", "lightning", "rglru",
          "shortconv")
FFNS = ("mlp", "moe")
BLOCK_NAMES = MIXERS + FFNS


def cfg_get(cfg: Any, *names: str, default: Any = None) -> Any:
    """The first of ``names`` the transformers config has a non-null value for."""
    for name in names:
        value = getattr(cfg, name, None)
        if value is not None:
            return value
    return default


def read_generic(meta: MetaModel, where: str) -> tuple[dict[str, Any], tuple[int, ...] | None]:
    """ModelSpec fields for the model ``meta`` holds, and the blocks per layer of a hybrid (None: one layer each)."""
    model, cfg = meta.module, text_config(meta.config)
    if not meta.layers:
        raise SpecError(f"{where}: {type(model).__name__} has no list of decoder layers meshplan can read")
    refuse_unmodelled(cfg, where)  # Gemma 3n's AltUp and LAuReL, shared keys and values (ple.py)
    outside = outside_fields(meta, where)
    hidden = outside["hidden_size"]
    modules = list(model.get_submodule(meta.layer_path))
    layers = [read_layer(layer, hidden) for layer in modules]
    if outside.get("per_layer_input"):
        claim_ple_layers(modules, layers, hidden, outside["per_layer_input"])
    extras = claim_extras(modules, layers, hidden, cfg)
    split_windowed(layers, cfg)  # windowed layers of their own attention shape: "W" blocks (window.py)
    for layer in layers:  # attention and Mamba-2 side by side (Falcon-H1): one "P" block where the first stood
        if {"attention", "mamba"} <= set(layer.blocks):
            layer.blocks = ["parallel" if b == "attention" else b for b in layer.blocks if b != "mamba"]
    for i, layer in enumerate(layers):
        if layer.unclaimed:
            shown = ", ".join(layer.unclaimed[:3]) + (" …" if len(layer.unclaimed) > 3 else "")
            raise SpecError(f"{where}: layer {i} holds weights meshplan does not model: {shown}")
        _check_blocks(layer, i, where)
    try:
        fields = dict(outside) | _common(meta, layers, where) | extras
    except RuntimeError as exc:  # transformers' heterogeneous configs: a key that varies per layer has no global
        if type(exc).__name__ != "AmbiguousGlobalPerLayerAttributeError":
            raise
        raise SpecError(f"{where}: {str(exc).split(' and may')[0]} (per_layer_config) that meshplan reads as one "
                        "value, refused") from None
    final = fields.pop("final_norm_weights")
    if final is not None and final != fields.get("norm_weights", True):
        raise SpecError(f"{where}: the final norm {'has' if final else 'has no'} weights and the layers' norms "
                        f"{'do not' if final else 'do'}; meshplan's norms are all of one kind")
    uniform = all(_uniform(layer) for layer in layers) and len({len(layer.norms) for layer in layers}) == 1
    groups = None
    moe = [i for i, layer in enumerate(layers) if "moe" in layer.blocks]
    if uniform and _regular(moe, len(layers)):
        fields.update(num_layers=len(layers), layer_norms=len(layers[0].norms))
        if moe:
            fields.update(first_k_dense_layers=moe[0], moe_layer_freq=moe[1] - moe[0] if len(moe) > 1 else 1)
        fields["mtp_layers"] = int(cfg_get(cfg, "num_nextn_predict_layers", "mtp_num_layers", default=0) or 0)
    else:
        per_block = 2 if len(layers[0].norms) == 2 * len(layers[0].blocks) else 1  # post-norms too (Gemma 4)
        for i, layer in enumerate(layers):
            if len(layer.norms) != per_block * len(layer.blocks):
                raise SpecError(f"{where}: layer {i} has {len(layer.norms)} norms for its {len(layer.blocks)} blocks "
                                f"({', '.join(layer.blocks)}); meshplan's hybrid layers have one norm per block")
        fields["block_norms"] = per_block
        fields["layer_pattern"] = "".join(LETTERS[b] for layer in layers for b in layer.blocks)
        fields["num_layers"] = len(fields["layer_pattern"])
        groups = tuple(len(layer.blocks) for layer in layers)
    fields.update(_window(cfg, fields, layers))
    if fields.get("out_bias") and fields.get("mlp_bias"):  # both: ModelSpec's linear_bias
        fields.update(linear_bias=True, out_bias=False, mlp_bias=False)
    return fields, groups


def _check_blocks(layer: LayerBlocks, i: int, where: str) -> None:
    mixers = [b for b in layer.blocks if b in MIXERS]
    ffns = [b for b in layer.blocks if b in FFNS]
    if mixers.count("attention") > 1:
        raise SpecError(f"{where}: layer {i} has {mixers.count('attention')} attention blocks (cross-attention to an "
                        "encoder: the decoder of an encoder-decoder model), which meshplan does not model")
    if len(mixers) > 1:
        raise SpecError(f"{where}: layer {i} runs {' and '.join(mixers)} side by side; meshplan models one mixer "
                        "per block")
    if len(ffns) > 1:
        raise SpecError(f"{where}: layer {i} has {len(ffns)} feed-forward blocks ({', '.join(ffns)})")
    if not layer.blocks:
        raise SpecError(f"{where}: layer {i} has no attention, Mamba-2 or MLP block meshplan recognises")


def _uniform(layer: LayerBlocks) -> bool:
    """An attention (or MLA) + MLP / MoE layer: what a standard (not hybrid) spec's layers all are."""
    return len(layer.blocks) == 2 and layer.blocks[0] in ("attention", "mla") and layer.blocks[1] in FFNS


def _regular(moe: list[int], layers: int) -> bool:
    """MoE at k, k + f, k + 2f, … to the end (ModelSpec.is_moe_layer), or no MoE."""
    if not moe:
        return True
    step = moe[1] - moe[0] if len(moe) > 1 else 1
    return moe == list(range(moe[0], layers, step))


def _common(meta: MetaModel, layers: list[LayerBlocks], where: str) -> dict[str, Any]:
    """The fields every layer must agree on: attention, MLP, MoE, Mamba sizes and the norms."""
    cfg = text_config(meta.config)
    fields: dict[str, Any] = {}
    for kind in BLOCK_NAMES:
        seen = [(i, layer.sizes[kind]) for i, layer in enumerate(layers) if kind in layer.sizes]
        if not seen:
            continue
        first = seen[0][1]
        for i, sizes in seen:
            if sizes != first:
                raise SpecError(f"{where}: layers {seen[0][0]} and {i} have {kind} blocks of different shapes "
                                f"({_diff(first, sizes)}); meshplan's layers of a kind are alike")
    sizes = {kind: next((layer.sizes[kind] for layer in layers if kind in layer.sizes), None) for kind in BLOCK_NAMES}
    fields.update(attention_fields(cfg, sizes, fields_hidden(meta), where))
    fields.update(moe_fields(cfg, sizes, where))
    fields.update(mamba_fields(cfg, sizes["mamba"], where))
    fields.update(deltanet_fields(cfg, sizes["deltanet"], where))
    fields.update(linear_fields(cfg, sizes, fields, where))  # Kimi Delta Attention, lightning attention
    fields.update(window_fields(sizes, fields, where))  # windowed "W" blocks of their own shape
    if sizes["mamba1"]:  # Mamba-1 (modules._mamba1 checked its shapes)
        m1 = sizes["mamba1"]
        fields.update(ssm_inner=m1["inner"], mamba_state=m1["state"], ssm_dt_rank=m1["rank"], mamba_conv=m1["kernel"],
                      ssm_norms=m1["norms"])
    fields.update(_norms(layers, where))
    return fields


def fields_hidden(meta: MetaModel) -> int:
    return int(meta.module.get_input_embeddings().weight.shape[1])


def _diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return ", ".join(f"{k} {a.get(k)} vs {b.get(k)}" for k in keys[:3])


def _norms(layers: list[LayerBlocks], where: str) -> dict[str, Any]:
    """The norm kind every H-wide norm of the layers shares: RMSNorm (weight), LayerNorm (weight + bias) or a
    LayerNorm with a weight only."""
    kinds = {(width, bias, "rms" in name.lower()) for layer in layers for width, bias, name in layer.norms}
    if len(kinds) > 1:
        raise SpecError(f"{where}: the layers mix norms of different kinds ({', '.join(sorted(map(str, kinds)))})")
    if not kinds:
        return {"norm": "rmsnorm", "layer_norms": 0}
    width, bias, rms = kinds.pop()
    if width == 0:  # no learned weights (OLMo 1); the final norm must be weightless too (outside.py)
        return {"norm": "rmsnorm" if rms else "layernorm", "norm_weights": False}
    if rms and not bias:
        return {"norm": "rmsnorm"}
    return {"norm": "layernorm", "norm_bias": bias}


def _window(cfg: Any, fields: dict[str, Any], layers: list[LayerBlocks]) -> dict[str, Any]:
    """Sliding-window attention: ``sliding_window`` and the "sliding_attention" entries of ``layer_types``."""
    window = cfg_get(cfg, "sliding_window")
    types = cfg_get(cfg, "layer_types")
    local = cfg_get(cfg, "attention_window_size")  # RecurrentGemma: every attention layer local (Griffin §2.3)
    if window is None and types is None and isinstance(local, int) and local > 0:
        return {"sliding_window": local, "window_layers": 0}
    if not isinstance(window, int) or window <= 0 or not isinstance(types, list):
        return {}
    count = sum(t == "sliding_attention" for t in types)
    attention = sum(b in ("attention", "mla") for layer in layers for b in layer.blocks)
    if not count:
        return {}
    if any("window" in layer.blocks for layer in layers):  # "W" blocks: every one windowed, the "*" ones full
        return {"sliding_window": window, "window_layers": 0}
    return {"sliding_window": window, "window_layers": 0 if count >= attention else count}
