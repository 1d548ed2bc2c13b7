"""What surrounds the decoder layers of a meta-device model (meta.py): the token embedding (V, H), a learned
position table, an embedding norm (a norm named for the embedding but registered after the layers, LFM2's
``embedding_norm``, is the final norm: Lfm2Model.forward applies it to the last layer's output), the final norm or none
(GPT-1's post-norm blocks: ModelSpec.final_norm), the LM head (tied or not, with or without a bias); and the models
that are not decoder-only language models, refused: encoders (a masked-LM model_type: BERT, RoBERTa, ELECTRA …),
encoder-decoders (``is_encoder_decoder``: BART, Whisper, …) and anything else built beside the decoder (a vision
tower, an audio encoder), named with its parameter count. Also the config-only fields: the sequence length, dropout
and the position encoding. See generic.py.
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import SpecError
from meshplan.specs.hf.meta import MetaModel
from meshplan.specs.hf.ple import ple_fields

DROPOUT = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob",
           "attention_probs_dropout_prob", "dropout", "residual_dropout", "embedding_dropout", "ffn_dropout")
POSITIONS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")


def text_config(cfg: Any) -> Any:
    """The language model's config of a composite one (a vision-language model's ``text_config``)."""
    getter = getattr(cfg, "get_text_config", None)
    return getter() if callable(getter) else cfg


def refuse_non_decoder(meta: MetaModel, where: str) -> None:
    """Encoders and encoder-decoders are priced by tracing them, never read as decoders."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES
    cls = type(meta.module).__name__
    if meta.encoder_decoder or getattr(meta.config, "is_encoder_decoder", False):
        raise SpecError(f"{where}: model_type={meta.model_type!r} ({cls}) is an encoder-decoder model; meshplan reads "
                        "decoder-only language models (trace it instead: meshplan trace / plan --model "
                        "module.py:factory)")
    if meta.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        raise SpecError(f"{where}: model_type={meta.model_type!r} ({cls}) is an encoder (bidirectional, "
                        "masked-LM) model; meshplan reads decoder-only language models (trace it instead: "
                        "meshplan trace / plan --model module.py:factory)")


def outside_fields(meta: MetaModel, where: str) -> dict[str, Any]:
    """Vocabulary, hidden size, tied head, head bias, positions, embedding norm, and the config-only fields."""
    refuse_non_decoder(meta, where)
    model, cfg = meta.module, text_config(meta.config)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    vocab, hidden = (int(n) for n in embed.weight.shape)
    weight = getattr(head, "weight", None)
    if weight is None or weight.dim() != 2 or weight.shape[1] != hidden:
        shown = "none" if weight is None else tuple(weight.shape)
        raise SpecError(f"{where}: the LM head ({shown}) is not a linear layer of the embedding's width {hidden}")
    tied = head.weight is embed.weight
    fields: dict[str, Any] = {"vocab_size": vocab, "hidden_size": hidden, "tied_embeddings": tied,
                              "head_bias": getattr(head, "bias", None) is not None}
    if int(head.weight.shape[0]) != vocab:  # an untied head over another vocabulary (Moshi: V, the embedding V + 1)
        fields["head_vocab_size"] = int(head.weight.shape[0])
    finals, others, weightless, past = 0, [], 0, False
    # a prediction head between the final norm and the vocabulary (ModernBertDecoderPredictionHead: dense, act, norm)
    transform = next((n for n, m in model.named_modules() if type(m).__name__.endswith("PredictionHead")), None)
    if transform is not None:
        fields["head_transform"] = True
    for name, module in model.named_modules():  # in the order the model registers them
        past = past or _under(name, meta.layer_path)
        own = sum(p.numel() for p in module.parameters(recurse=False))
        if _under(name, meta.layer_path) or module is embed or module is head or _under(name, transform or "\0"):
            continue
        if not own:
            bare = "norm" in type(module).__name__.lower() and not list(module.parameters())
            weightless += bare and "emb" not in name.split(".")[-1]
            continue
        width = int(module.weight.shape[-1]) if getattr(module, "weight", None) is not None else 0
        if "norm" in type(module).__name__.lower() and width == hidden:
            # named for the embedding (BLOOM's word_embeddings_layernorm, ModernBERT's embeddings.norm) and before the
            # layers; LFM2's embedding_norm follows them: its final norm
            if any("emb" in part for part in name.split(".")[-2:]) and not past:
                fields["embedding_norm"] = True
            else:
                finals += 1
        elif type(module).__name__.endswith("Embedding") and width == hidden and ("pos" in name or name[-3:] == "wpe"):
            fields.update(position_embedding="learned", max_position_embeddings=int(module.weight.shape[0]))
        else:
            others.append((own, name, type(module).__name__))
    ple, others = ple_fields(model, others, hidden, len(list(model.get_submodule(meta.layer_path))))
    fields |= ple  # per-layer embeddings (Gemma 4: ple.py)
    if others:
        text_type = str(getattr(getattr(meta.config, "text_config", None), "model_type", "") or "")
        hint = (f"; its language model alone is the config.json of its text_config (model_type {text_type!r})"
                if text_type else "")
        raise SpecError(f"{where}: {type(model).__name__} builds {_top(others)} beside its decoder layers, which "
                        f"meshplan does not model{hint}")
    count = finals + (weightless if not finals else 0)
    if count > 1:
        raise SpecError(f"{where}: {finals + weightless} final norms after the decoder layers (meshplan models one "
                        "or none)")
    return fields | _config_fields(cfg, fields) | {"final_norm_weights": finals == 1 if count else None,
                                                   "final_norm": count == 1}


def _under(name: str, path: str) -> bool:
    return name == path or name.startswith(path + ".")


def _top(others: list[tuple[int, str, str]]) -> str:
    """The largest top-level part among the unmodelled modules, with its parameter count."""
    groups: dict[str, int] = {}
    for own, name, _ in others:
        parts = name.split(".")
        key = ".".join(parts[:2]) if parts[0] in ("model", "transformer") and len(parts) > 1 else parts[0]
        groups[key] = groups.get(key, 0) + own
    key, count = max(groups.items(), key=lambda kv: kv[1])
    more = f" and {len(groups) - 1} more" if len(groups) > 1 else ""
    return f"{key} ({count:,} parameters){more}"


def _config_fields(cfg: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """The sequence length (the config's longest context, at most a learned table), dropout and the positions."""
    seq = next((v for n in POSITIONS if isinstance(v := getattr(cfg, n, None), int) and v > 0), 2048)
    table = fields.get("max_position_embeddings")
    out: dict[str, Any] = {"seq_length": min(seq, table) if table else seq}
    rates = [getattr(cfg, n, None) for n in DROPOUT]
    out["dropout"] = any(isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0 for r in rates)
    if "position_embedding" not in fields:
        keys = " ".join(cfg.to_dict())
        rope = "rope" in keys or "rotary" in keys or getattr(cfg, "position_embedding_type", "") == "rotary"
        out["position_embedding"] = "rope" if rope else "none"
    return out
