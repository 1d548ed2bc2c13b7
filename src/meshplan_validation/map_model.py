"""A published record's model section (cleaned, records.clean_record) → ModelSpec, in four steps: the sizes of the
preset the record names where it gives none; a record that states every size (``states_sizes``) is priced as written
(issue 79, item 4): the preset its name names where that preset's sizes are the record's (the record names that very
model), else a spec of exactly its sizes whose other fields (biases, position embedding, tied embeddings, dropout)
come from the record's own text or its family's convention (record_fields.arch_fields), a preset of equal sizes only
named in the notes; a record that leaves sizes out takes the preset whose sizes equal those it gives (ties broken by
vocabulary, then name), else a spec built from its own sizes, with those its family's convention fixes
(record_fields.family_sizes); then the record's own vocabulary and sequence length. Each step says what it took
from where in the notes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from meshplan.kept import Kept
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model, preset_names
from meshplan_validation.patterns import NAME_SUFFIXES, NON_ALNUM
from meshplan_validation.record_fields import (
    arch_fields,
    convention,
    family_key,
    family_sizes,
    heads_from_head_dim,
    size_problems,
)
from meshplan_validation.skip import Skip

# the record's fields that are ModelSpec attributes of the same name, the sizes a preset must equal
SIZE_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "head_dim")
# the record's MoE fields → their ModelSpec attributes
MOE_FIELDS = {"num_experts": "num_experts", "moe_topk": "moe_topk", "moe_ffn_hidden_size": "moe_ffn_hidden_size",
              "shared_expert_ffn": "shared_expert_ffn_size"}
CORE_SIZES = ("num_layers", "hidden_size", "num_heads")  # without them a spec is built from a preset's or not at all
# a record that states these (and a MoE record its MoE_FIELDS' experts and top-k) states every size a spec needs
STATED_SIZES = (*CORE_SIZES, "num_kv_heads", "ffn_hidden_size", "vocab_size", "seq_length")
_PRESETS: dict[str, ModelSpec] = {}
# map_model's answers by the record's model section and text: a validation maps every record, and a source's
# records share a few models (vTrain's 720 runs: 4), each a ModelSpec built and checked afresh (17 % of that
# validation's CPU). A pure function of its arguments and the presets (loaded once, above); specs are frozen.
_MAPPED: Kept[tuple[ModelSpec, tuple[str, ...]]] = Kept(4096)


def presets() -> dict[str, ModelSpec]:
    """Every model preset by name, loaded once."""
    if not _PRESETS:
        _PRESETS.update({name: load_model(name) for name in preset_names()})
    return _PRESETS


def _norm_name(text: str) -> str:
    return NON_ALNUM.sub("", text.lower().replace(".1", "").replace("llama3.1", "llama3"))


def _name_score(record_name: str, preset: str) -> float:
    """Similarity of a record's model name to a preset name (longest common substring share)."""
    a, b = _norm_name(record_name), _norm_name(preset)
    best = 0
    for i in range(len(a)):
        for j in range(i + best + 1, len(a) + 1):
            if a[i:j] in b:
                best = j - i
            else:
                break
    return best / max(len(b), 1)


def preset_by_name(name: str) -> str | None:
    """The preset a record names when it gives no sizes: equal names once case, separators and a trailing
    "-Instruct" / "-hf" / "-v0.1" are dropped ("Llama-2-7b-hf" → llama2-7b; "GPT-2 XL" is not gpt2)."""
    stripped = name.strip()
    while True:  # the name as given first ("DeepSeek-V3" is a preset), then without one suffix more each time
        key = _norm_name(stripped)
        found = [p for p in presets() if _norm_name(p) == key]
        if found:
            return found[0] if len(found) == 1 else None
        if not NAME_SUFFIXES.search(stripped):
            return None
        stripped = NAME_SUFFIXES.sub("", stripped)


def map_model(m: dict[str, Any], text: str = "") -> tuple[ModelSpec, list[str]]:
    """The record's model (module docstring): priced as written where it states every size (``states_sizes``),
    else the preset whose sizes equal the record's (ties broken by vocabulary, then name), else built from its own
    fields with the sizes its family's convention fixes; with the record's own sequence length and vocabulary.
    ``text``: the record's notes, read with the model's ``arch_source`` for what it says of its architecture.
    Memoised (``_MAPPED``): a repeated section gets the same spec and a fresh list of the same notes; a Skip is
    raised afresh each time."""
    key = (json.dumps(m, sort_keys=True, default=repr), text)
    spec, said = _MAPPED.answer(key, None, _mapped, m, text)
    return spec, list(said)


def _mapped(m: dict[str, Any], text: str) -> tuple[ModelSpec, tuple[str, ...]]:
    spec, notes = _map_model(m, text)
    return spec, tuple(notes)


def _map_model(m: dict[str, Any], text: str) -> tuple[ModelSpec, list[str]]:
    problems = size_problems(m)
    if problems:
        raise Skip("; ".join(problems))
    name = m.get("name") or "model"
    notes: list[str] = []
    m = _core_sizes(m, name, notes)
    match = _matching_preset(m, name)
    if states_sizes(m) and not (match and preset_by_name(str(name)) == match[0]):
        named = f"; sizes as preset {match[0]}, whose other fields are not taken" if match else ""
        spec = _from_record(m | {"notes": text}, name, notes, named)
    else:
        spec = _from_preset(m, *match, notes) if match else _from_record(m | {"notes": text}, name, notes)
    return _as_recorded(spec, m, notes), notes


def states_sizes(m: dict[str, Any]) -> bool:
    """Whether a record states every size of its model (``STATED_SIZES``; a MoE record its experts and top-k too):
    it is priced with exactly those (issue 79, item 4)."""
    moe = bool(m.get("num_experts"))
    return all(m.get(k) is not None for k in STATED_SIZES) and (not moe or bool(m.get("moe_topk")))


def _core_sizes(m: dict[str, Any], name: Any, notes: list[str]) -> dict[str, Any]:
    """``m`` as given where it states the core sizes; else with the sizes of the preset its name names
    (``preset_by_name``) where it leaves them out, or with num_heads from head_dim; a Skip if still without them."""
    if all(m.get(k) is not None for k in CORE_SIZES):
        return m
    preset = preset_by_name(str(name))
    if preset is not None:
        spec = presets()[preset]
        fields = {k: k for k in SIZE_FIELDS} | {"vocab_size": "vocab_size"} | (MOE_FIELDS if spec.is_moe else {})
        return {k: v for k, v in m.items() if v is not None} | {
            k: getattr(spec, f) for k, f in fields.items() if m.get(k) is None}
    m = heads_from_head_dim(m, notes)
    missing = [f"model.{k}" for k in CORE_SIZES if m.get(k) is None]
    if missing:
        named = f"no preset named {name!r}" if m.get("name") else "model.name missing"
        raise Skip(f"model sizes not recorded: {', '.join(missing)} missing and {named} "
                   f"({m.get('arch_source') or 'no architecture source'})")
    return m


def _matching_preset(m: dict[str, Any], name: Any) -> tuple[str, ModelSpec] | None:
    """(name, spec) of the preset whose sizes equal every size the record states, dense or MoE alike, the one of
    the record's vocabulary first, then the closest name; None where no preset matches."""
    sizes = {k: m[k] for k in SIZE_FIELDS if m.get(k) is not None}
    sizes |= {f: m[k] for k, f in MOE_FIELDS.items() if m.get(k) is not None}
    moe, vocab = bool(m.get("num_experts")), m.get("vocab_size")
    candidates = [(vocab is not None and spec.vocab_size == vocab, _name_score(name, preset), preset, spec)
                  for preset, spec in presets().items()
                  if spec.is_moe == moe and all(getattr(spec, k) == v for k, v in sizes.items())]
    if not candidates:
        return None
    _, _, preset, spec = max(candidates, key=lambda c: (c[0], c[1]))
    return preset, spec


def _from_preset(m: dict[str, Any], preset: str, spec: ModelSpec, notes: list[str]) -> ModelSpec:
    """The matching preset, with the notes of what the record leaves out that it gives."""
    missing = [k for k in ("ffn_hidden_size", "num_kv_heads", "vocab_size") if m.get(k) is None]
    notes.append(f"model: preset {preset} (sizes match the record"
                 + (f"; {', '.join(missing)} from the preset" if missing else "") + ")")
    if m.get("seq_length") is None:
        notes.append(f"seq_length {spec.seq_length} from preset {preset} (not recorded)")
    return spec


def _from_record(m: dict[str, Any], name: Any, notes: list[str], named: str = "") -> ModelSpec:
    """A spec of the record's own sizes (``model_from_record``), with the note of what it assumes: ``named`` says
    which preset has its sizes (priced as written), else that none matches."""
    spec = model_from_record(m, notes)
    why = f"priced as written{named}" if named or states_sizes(m) else f"no preset matches {name}"
    notes.append(f"model: built from the record's sizes ({why}); {spec.mlp} MLP, {spec.norm}, "
                 f"{'tied' if spec.tied_embeddings else 'untied'}, {spec.position_embedding} positions, "
                 f"{'biases' if spec.linear_bias or spec.qkv_bias else 'no biases'}, "
                 f"{'dropout' if spec.dropout else 'no dropout'}")
    return spec


def _as_recorded(spec: ModelSpec, m: dict[str, Any], notes: list[str]) -> ModelSpec:
    """``spec`` with the record's vocabulary (said where it differs) and sequence length."""
    vocab, seq = m.get("vocab_size"), m.get("seq_length")
    if vocab is not None and vocab != spec.vocab_size:
        notes.append(f"vocab {vocab} as recorded (preset {spec.vocab_size})")
        spec = replace(spec, vocab_size=int(vocab))
    if seq is not None and seq != spec.seq_length:
        spec = spec.with_seq_length(int(seq))
    return spec


# ---- a model of the record's own sizes ---------------------------------------------------------------------------
def _family_value(name: str, attr: str) -> tuple[int, str] | None:
    """(value, where from) of a size the presets of the model's family (record_fields.family_key) agree on."""
    key = family_key(name)
    family = sorted(p for p in presets() if key and family_key(p) == key)
    values = {getattr(presets()[p], attr) for p in family}
    return (values.pop(), f"the {key} family's presets ({', '.join(family)})") if len(values) == 1 else None


def model_from_record(m: dict[str, Any], notes: list[str]) -> ModelSpec:
    """A Llama-like spec from a record's own sizes. SwiGLU unless F = 4h (the GeLU GPT MLP). A MoE record that
    gives only the experts' FFN size (every layer MoE) uses it for F too; ``head_dim`` where the heads do not split
    the hidden size evenly (GPT-OSS: 64 heads of 64 on a hidden size of 2880). Sizes its family's convention fixes
    are filled where it leaves them out (record_fields.family_sizes), each with a note in ``notes``."""
    name = m.get("name")
    m, derived = family_sizes(m, _family_value(str(name or ""), "vocab_size"))
    notes += derived
    f = m.get("ffn_hidden_size")
    if f is None and m.get("num_experts"):
        f = m.get("moe_ffn_hidden_size")
    seq = m.get("seq_length") or _family_value(str(name or ""), "seq_length")
    _require_sizes(m, f, seq)
    if isinstance(seq, tuple):
        notes.append(f"seq_length {seq[0]} from {seq[1]} (not recorded)")
        seq = seq[0]
    _check_heads(m)
    return replace(_spec(m, f, seq), **arch_fields(m, notes))


def _require_sizes(m: dict[str, Any], f: Any, seq: Any) -> None:
    """A Skip naming each size a spec needs that neither the record nor its family gives."""
    needed = (("ffn_hidden_size", f is not None), ("vocab_size", m.get("vocab_size") is not None),
              ("moe_topk", not m.get("num_experts") or bool(m.get("moe_topk"))), ("seq_length", bool(seq)),
              ("num_kv_heads", m.get("num_kv_heads") is not None))  # MHA or GQA: not guessed
    missing = [key for key, given in needed if not given]
    if missing:
        name = m.get("name")
        fam = convention(m)
        fixes = (f"the {fam.family} convention does not fix it" if fam else
                 f"no family convention or preset family ({family_key(str(name or ''))!r}) fixes it")
        raise Skip(f"model {name}: {', '.join('model.' + k for k in missing)} not recorded, no preset matches its "
                   f"sizes and {fixes}")


def _check_heads(m: dict[str, Any]) -> None:
    """A Skip where the heads do not split the hidden size (without a head_dim) or the kv-heads the heads."""
    name, h, heads = m.get("name"), int(m["hidden_size"]), int(m["num_heads"])
    if not int(m.get("head_dim") or 0) and h % heads:
        raise Skip(f"model {name}: num_heads={heads} does not divide hidden_size={h} and head_dim is not "
                   "recorded")
    if int(m["num_kv_heads"]) and heads % int(m["num_kv_heads"]):
        raise Skip(f"model {name}: num_kv_heads={m['num_kv_heads']} does not divide num_heads={heads}")


def _spec(m: dict[str, Any], f: Any, seq: Any) -> ModelSpec:
    """The ModelSpec of the record's sizes: a GeLU GPT block with layer norm where F = 4h, else SwiGLU with RMSNorm."""
    h = int(m["hidden_size"])
    gelu = int(f) == 4 * h
    kw: dict[str, Any] = {}
    if m.get("num_experts"):
        kw = {"num_experts": int(m["num_experts"]), "moe_topk": int(m["moe_topk"]),
              "moe_ffn_hidden_size": int(m.get("moe_ffn_hidden_size") or f),
              "shared_expert_ffn_size": int(m.get("shared_expert_ffn") or 0)}
    return ModelSpec(name=str(m.get("name")), num_layers=int(m["num_layers"]), hidden_size=h,
                     num_heads=int(m["num_heads"]), num_kv_heads=int(m.get("num_kv_heads") or 0),
                     head_dim=int(m.get("head_dim") or 0), ffn_hidden_size=int(f), vocab_size=int(m["vocab_size"]),
                     seq_length=int(seq), mlp="gelu" if gelu else "swiglu", norm="layernorm" if gelu else "rmsnorm",
                     **kw)
