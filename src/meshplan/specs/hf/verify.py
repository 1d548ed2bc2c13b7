"""The check every config.json import passes when transformers is installed: the ModelSpec read from it against the
model transformers builds from the same config on the meta device (meta.py), layer by layer.

Each Hugging Face decoder layer's parameters must equal those ModelSpec gives its layer (``layer_params``; a hybrid
reading that split a layer into blocks, the sum of its blocks), and the parameters outside the layers (embedding,
positions, final norm, head) ``embedding_params() + head_params()``; the totals then agree. The first disagreement
is refused in one line naming the layer, both counts and the layer's weights with their shapes; behind equal
counts, the first layer of each kind must also have the widths the spec gives it (``shape_mismatch``).
"""

from __future__ import annotations

from meshplan.errors import SpecError
from meshplan.specs.hf.meta import MetaModel
from meshplan.specs.hf.modules import read_layer
from meshplan.specs.model import ModelSpec


def mismatch(spec: ModelSpec, meta: MetaModel, groups: tuple[int, ...] | None = None) -> str | None:
    """What differs between ``spec`` and the meta-device model (one line), or None when every count agrees."""
    groups = groups or (1,) * len(meta.layers)
    if sum(groups) != spec.num_layers or len(groups) != len(meta.layers):
        return (f"meshplan reads {spec.num_layers} layers, transformers builds {len(meta.layers)} "
                f"({meta.layer_path or 'no layer list'})")
    start = 0
    for i, (blocks, built) in enumerate(zip(groups, meta.layers, strict=True)):
        ours = sum(spec.layer_params(j) for j in range(start, start + blocks))
        start += blocks
        if ours != built:
            return (f"layer {i}: meshplan counts {ours:,} parameters, transformers builds {built:,} "
                    f"({_shapes(meta, i)})")
    ours = spec.embedding_params() + spec.head_params()
    if ours != meta.outside_layers:
        return (f"embedding, final norm and head: meshplan counts {ours:,} parameters, transformers builds "
                f"{meta.outside_layers:,}")
    return None if spec.is_hybrid else shape_mismatch(spec, meta)


def shape_mismatch(spec: ModelSpec, meta: MetaModel) -> str | None:
    """The weight shapes behind equal counts: in the first layer of each kind (dense, MoE), the widths of q, k and v
    (A·d, K·d), the dense MLP's F, the experts' count E and width F_e as the built weights have them
    (modules.read_layer), so that two sizes swapped with the same product are not taken for the model."""
    embed = meta.module.get_input_embeddings().weight
    if tuple(embed.shape) != (spec.vocab_size, spec.hidden_size):
        return f"the embedding is {tuple(embed.shape)}, meshplan reads ({spec.vocab_size}, {spec.hidden_size})"
    layers = meta.module.get_submodule(meta.layer_path)
    firsts = {spec.is_moe_layer(i): i for i in reversed(range(spec.num_layers))}
    for moe, i in sorted(firsts.items()):
        sizes = read_layer(layers[i], spec.hidden_size).sizes
        att, mlp, experts = sizes.get("attention", {}), sizes.get("mlp", {}), sizes.get("moe", {})
        want = {"q": spec.q_dim, "k": spec.kv_dim, "v": spec.v_dim, "qkv": spec.q_dim + spec.kv_dim + spec.v_dim}
        built = {k: att[k] for k in want if k in att and not spec.is_mla}
        if not moe and "ffn" in mlp:
            want["ffn"], built["ffn"] = spec.ffn_hidden_size, mlp["ffn"]
        if moe and "experts" in experts:
            want |= {"experts": spec.num_experts, "expert ffn": spec.moe_ffn_hidden_size}
            built |= {"experts": experts["experts"], "expert ffn": experts.get("ffn")}
        wrong = [k for k in built if built[k] != want[k]]
        if wrong:
            shown = ", ".join(f"{k} {built[k]} (meshplan {want[k]})" for k in wrong)
            return f"layer {i}: transformers builds {shown}"
    return None


def check_build(spec: ModelSpec, meta: MetaModel, where: str, groups: tuple[int, ...] | None = None) -> None:
    """Refuse ``spec`` when it disagrees with the meta-device model (``mismatch``)."""
    problem = mismatch(spec, meta, groups)
    if problem:
        raise SpecError(f"{where}: model_type={meta.model_type!r} is not read exactly, refused: {problem}")


def _shapes(meta: MetaModel, i: int, limit: int = 8) -> str:
    """The weights of layer i with their shapes, the first ``limit`` of them."""
    layer = meta.module.get_submodule(meta.layer_path)[i]
    named = [f"{n} {tuple(p.shape)}" for n, p in layer.named_parameters()]
    return ", ".join(named[:limit]) + (f", … {len(named) - limit} more" if len(named) > limit else "")
