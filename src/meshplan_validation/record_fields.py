"""What the validation derives from a cleaned published record (records.clean_record) where the record leaves it
out, each with the note that says so: model sizes its family's convention fixes, tp / pp taken as 1, num_heads from
head_dim, the global batch from a count of tokens, settings lent by a sibling record of the same source; and the
checks that name a size a record states wrongly or a value it could not read. Plain values in and out: map_model.py
matches presets and builds the specs, map_layout.py the plan's sizes.

Symbols: h hidden size, F FFN hidden size, A heads, K kv-heads, V vocabulary.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from meshplan.fields import MAX_LAYERS, MAX_SIZE
from meshplan_validation.patterns import ARCH_TEXT, DEPARTS, NAME_SPLIT, NAME_WORDS, NON_ALNUM, REMARKS, SIZE_TOKEN
from meshplan_validation.records import BATCH_TOKENS, positive_int, stated


@dataclass(frozen=True)
class Convention:
    """What every model of a family has: F as a function of h (``ffn``: "4h" or "llama1"), multi-head attention
    (``mha``: K = A), and where the family fixes them its vocabulary and training sequence length (0: not fixed)."""

    family: str
    pattern: str  # regex on the model's name, its remarks in parentheses left out
    ffn: str
    mha: bool
    source: str
    vocab: int = 0
    seq: int = 0
    # the fields that are not sizes which every model of the family has (ModelSpec field -> value; ``ARCH_FIELDS``),
    # with their source in ``source``; a field left out: the builder's assumption (map_model.model_from_record)
    arch: tuple[tuple[str, object], ...] = ()


# The fields of a model that are not sizes and that a record built from its own sizes must still fix (issue 79, item
# 4): biases, the position embedding, tied embeddings, dropout. Read from the record's text where it states them
# (``stated_arch``), else from its family's convention (``Convention.arch``), else the builder's assumption, each
# with a note that says which.
ARCH_FIELDS = ("qkv_bias", "linear_bias", "position_embedding", "tied_embeddings", "dropout")
# GPT-2 (Radford et al. 2019; openai-community/gpt2 config.json: Conv1D c_attn and c_proj with biases, wpe learned
# positions, lm_head tied to wte, resid / attn / embd pdrop 0.1) and Megatron-LM's GPT, which GPT-3-style records
# train (megatron/arguments.py: --hidden-dropout 0.1, --attention-dropout 0.1, learned absolute positions,
# add_bias_linear, embeddings tied unless --untie-embeddings-and-output-weights; NVIDIA/Megatron-LM and
# microsoft/Megatron-DeepSpeed f4157bea alike)
GPT_ARCH = (("qkv_bias", True), ("linear_bias", True), ("position_embedding", "learned"), ("tied_embeddings", True),
            ("dropout", True))


# BLOOM and the BigScience tr11 runs that searched its topology (Megatron-DeepSpeed, bigscience fork): ALiBi, no
# position parameters (--position-embedding-type alibi), a LayerNorm after the word embedding (--embed-layernorm),
# both in train/tr11-200B-ml/tr11-200B-ml.slurm @217dc6c (2022-02-17, the prequel's script) and tr11-176B-ml.slurm;
# Megatron's parallel linears with biases; the embedding tied to the head across the pipeline (GPTModelPipe's
# TiedLayerSpec; chronicles-prequel.md's "tied-embedding desynchronization bug"); dropout 0.1, since no script sets
# it ("The default Megatron-LM dropout settings are inherited", train/tr11-176B-ml/README.md @053adafe;
# bigscience-workshop/Megatron-DeepSpeed megatron/arguments.py: --hidden-dropout / --attention-dropout default 0.1)
BLOOM_ARCH = (("qkv_bias", True), ("linear_bias", True), ("position_embedding", "none"), ("tied_embeddings", True),
              ("dropout", True), ("embedding_norm", True))


# Most specific first: the first family whose pattern matches the name is the record's ("BLOOM-style GPT": BLOOM).
CONVENTIONS: tuple[Convention, ...] = (
    Convention("GPT-NeoX", r"gpt[-_ ]?neox", "4h", True,
               "Black et al. 2022 (GPT-NeoX-20B) and HF GPTNeoXConfig: intermediate_size = 4·hidden_size, "
               "multi-head attention"),
    Convention("GPT-J", r"gpt[-_ ]?j\b", "4h", True, "Wang & Komatsuzaki 2021 (GPT-J-6B): n_inner = 4·n_embd"),
    Convention("OPT", r"\bopt\b", "4h", True,
               "Zhang et al. 2022 (OPT), Table 1, §2.2 and HF OPTConfig: ffn_dim = 4·hidden_size, multi-head "
               "attention, sequences of 2048 tokens", seq=2048),
    Convention("BLOOM", r"\bbloom", "4h", True,
               "BigScience 2022 (BLOOM), §3.2-3.3: a 4·hidden MLP, multi-head attention, a 250,680-token "
               "vocabulary, sequences of 2048 tokens; ALiBi, an embedding LayerNorm, biases, tied embeddings, "
               "Megatron's dropout 0.1 (BLOOM_ARCH)", vocab=250680, seq=2048, arch=BLOOM_ARCH),
    Convention("MPT", r"\bmpt\b", "4h", True,
               "MosaicML llm-foundry MPTConfig: expansion_ratio = 4, multi-head attention"),
    Convention("Megatron-Turing NLG", r"turing[-_ ]?nlg|\bmt[-_ ]?nlg", "4h", True,
               "Smith et al. 2022 (MT-NLG 530B): Megatron-LM's GPT, d_ff = 4·d_model, multi-head attention"),
    Convention("GPT", r"\bgpt(?![-_ ]?oss)", "4h", True,
               "Radford et al. 2019 (GPT-2) and Brown et al. 2020 (GPT-3), Table 2.1: d_ff = 4·d_model, multi-head "
               "attention; Megatron-LM arguments.py sets ffn_hidden_size = 4·hidden_size and num_query_groups = "
               "num_attention_heads when not given; biases on every linear, learned positions, tied embeddings, "
               "dropout 0.1 (GPT-2's config.json; Megatron-LM's argument defaults)", arch=GPT_ARCH),
    # "LLaMA 65B", "LLaMA-13B", not "Llama 2 70B", "Llama-3-8B", "Llama3.1-405B" (a version after the name)
    Convention("LLaMA (v1)", r"\bllama(?![-_ .]?\d+(?:\.\d+)?(?![bm\d.]))", "llama1", True,
               "Touvron et al. 2023 (LLaMA) and facebookresearch/llama v1 model.py: FeedForward "
               "F = 256·ceil(int(2/3·4h) / 256) (multiple_of 256), multi-head attention, the 32,000-piece "
               "SentencePiece vocabulary, max_seq_len 2048", vocab=32000, seq=2048),
)


def convention(m: dict[str, Any]) -> Convention | None:
    """The family convention of a dense record's model (``m`` the cleaned model section), or None."""
    name = str(m.get("name") or "")
    if m.get("num_experts") or str(m.get("arch") or "").lower() == "moe" or DEPARTS.search(name):
        return None
    bare = REMARKS.sub(" ", name)
    return next((c for c in CONVENTIONS if re.search(c.pattern, bare, re.I)), None)


def stated_arch(m: dict[str, Any]) -> dict[str, object]:
    """The fields of ``ARCH_FIELDS`` that a record's own text states (its model's ``arch_source`` and its ``notes``,
    patterns.ARCH_TEXT): the first statement of each field, a negation before an affirmation."""
    text = " ".join(str(m.get(k) or "") for k in ("arch_source", "notes"))
    out: dict[str, object] = {}
    for field, value, pattern in ARCH_TEXT:
        if field not in out and pattern.search(text):
            out[field] = value
    return out


def arch_fields(m: dict[str, Any], notes: list[str]) -> dict[str, object]:
    """The non-size fields of a model built from a record's sizes (``ARCH_FIELDS``): what its text states, else what
    its family's convention fixes; a note says which came from where (fields neither fixes are the builder's)."""
    stated = stated_arch(m)
    fam = convention(m)
    # the family fills what the record leaves unstated, a record silent on all of it too: a GPT record that left out
    # its FFN size would take its preset's biases, learned positions and tied embeddings (map_model._from_preset), so
    # one that states it takes the same (tests/test_validate_records.py: what was derived is what was left out)
    family = {k: v for k, v in (fam.arch if fam else ()) if k not in stated}
    if stated:
        notes.append("as the record states: " + ", ".join(f"{k} {v}" for k, v in stated.items()))
    if family and fam is not None:
        notes.append(f"the {fam.family} convention: " + ", ".join(f"{k} {v}" for k, v in family.items()))
    return stated | family


def llama1_ffn(h: int) -> int:
    """LLaMA's SwiGLU width (facebookresearch/llama v1 model.py): int(2·4h/3) rounded up to a multiple of 256
    (4096 → 11008, 5120 → 13824, 6656 → 17920, 8192 → 22016)."""
    return 256 * math.ceil(int(2 * 4 * h / 3) / 256)


def family_sizes(m: dict[str, Any], family_vocab: tuple[int, str] | None) -> tuple[dict[str, Any], list[str]]:
    """``m`` with the sizes its family's convention fixes where the record leaves them out, and the notes that say
    which and why: F (4h for GPT-style models, LLaMA's rule), K = A for multi-head families, V and the sequence length
    where the family fixes them; else V from ``family_vocab`` ((V, where from): the presets of the family, when they
    agree)."""
    fam = convention(m)
    m, notes = dict(m), []
    derived = _convention_sizes(m, fam) if fam is not None else []
    if derived:
        notes.append(f"{', '.join(derived)}: not recorded, the {fam.family} convention ({fam.source})")
    if m.get("vocab_size") is None and family_vocab is not None:
        m["vocab_size"] = family_vocab[0]
        notes.append(f"vocab_size {family_vocab[0]} from {family_vocab[1]} (not recorded)")
    return m, notes


def _convention_sizes(m: dict[str, Any], fam: Convention) -> list[str]:
    """Fills ``m`` (a copy of the model section) with the sizes ``fam`` fixes where it leaves them out; says which."""
    h, derived = m.get("hidden_size"), []
    if m.get("ffn_hidden_size") is None and isinstance(h, int) and h > 0:
        m["ffn_hidden_size"] = 4 * h if fam.ffn == "4h" else llama1_ffn(h)
        derived.append(f"ffn_hidden_size {m['ffn_hidden_size']} = "
                       + ("4·hidden_size" if fam.ffn == "4h" else "LLaMA's SwiGLU rule"))
    if fam.mha and m.get("num_kv_heads") is None and m.get("num_heads") is not None:
        m["num_kv_heads"] = m["num_heads"]
        derived.append(f"num_kv_heads = num_heads = {m['num_heads']} (multi-head attention)")
    for key, value in (("vocab_size", fam.vocab), ("seq_length", fam.seq)):
        if m.get(key) is None and value:
            m[key] = value
            derived.append(f"{key} {value}")
    return derived


def family_key(name: str) -> str:
    """A model name without its size, remarks and release words, normalised: "Llama 3.1 405B" → "llama3",
    "Qwen3-235B-A22B" → "qwen3", "gpt-neox-20b" → "gptneox"; equal keys are one family."""
    bare = REMARKS.sub(" ", name.lower())
    tokens = [t for t in NAME_SPLIT.split(bare) if t and not SIZE_TOKEN.match(t) and t not in NAME_WORDS]
    return NON_ALNUM.sub("", "".join(tokens).replace("llama3.1", "llama3"))


# sizes a record states: (field, smallest value that says something); 0 kv-heads or experts means none
SIZES = {"num_layers": 1, "hidden_size": 1, "num_heads": 1, "num_kv_heads": 0, "ffn_hidden_size": 1, "head_dim": 0,
         "vocab_size": 1, "seq_length": 1, "num_experts": 0, "moe_topk": 0, "moe_ffn_hidden_size": 0,
         "shared_expert_ffn": 0}


def size_problems(m: dict[str, Any]) -> list[str]:
    """Each stated size of the model section that is not a whole number in range, named:
    ``model.num_layers=-3 is not a whole number from 1 to 10000``."""
    out = []
    for key, low in SIZES.items():
        value = m.get(key)
        high = MAX_LAYERS if key == "num_layers" else MAX_SIZE
        if value is None:
            continue
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not whole or not low <= value <= high:
            out.append(f"model.{key}={value!r} is not a whole number from {low} to {high}")
    return out


# ---- layout and batch ----------------------------------------------------------------------------------------
def heads_from_head_dim(m: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """``m`` with num_heads = hidden_size / head_dim where it gives those two and not the heads."""
    h, d = m.get("hidden_size"), m.get("head_dim")
    if m.get("num_heads") is not None or not h or not d or h % d:
        return m
    notes.append(f"num_heads {h // d} = hidden_size / head_dim = {h} / {d} (not recorded)")
    return m | {"num_heads": h // d}


def unstated_model_parallel(p: dict[str, Any], n: int) -> list[str]:
    """The notes for tp / pp / cp taken as 1 where the record leaves them out: implied where dp (× the stated sizes)
    is the GPU count, a data-parallel-only stack where the record states its sharding and no model-parallel size."""
    unstated = [k for k in ("tp", "pp") if positive_int(p.get(k)) is None]
    unstated += [] if positive_int(p.get("cp")) is not None or p.get("cp") is None else ["cp"]
    if not unstated:
        return []
    invalid = [f"{k}={p[k]!r}" for k in unstated if p.get(k) is not None]
    product = math.prod(positive_int(p.get(k)) or 1 for k in ("dp", "tp", "pp", "cp"))
    if positive_int(p.get("dp")) and product == n:
        why = f"dp*tp*pp*cp = {n} GPUs as recorded leaves no other model parallelism"
    elif p.get("zero_or_fsdp") is not None and stated(p.get("zero_or_fsdp")):
        why = f"data-parallel sharding {str(p['zero_or_fsdp'])[:40]!r} stated, no model-parallel size"
    else:
        why = "no model-parallel size stated"
    said = "; " + ", ".join(invalid) + " not a size" if invalid else ""
    return [f"{' = '.join(unstated)} = 1 (not stated{said}; {why})"]


def batch_from_tokens(record: dict[str, Any], seq: int, notes: list[str]) -> int | None:
    """The global batch in sequences from one the record gives in tokens (BATCH_TOKENS), where the sequence length
    divides it."""
    for section in ("parallel", "measured"):
        for key in BATCH_TOKENS:
            tokens = positive_int((record.get(section) or {}).get(key))
            if tokens and tokens % seq == 0:
                notes.append(f"global batch {tokens // seq} = {section}.{key} {tokens} / seq_length {seq} "
                             "(global_batch_size not stated)")
                return tokens // seq
    return None


BORROWED = ("micro_batch_size", "vp", "global_batch_size")


# The records that can lend, by (group, model name, tp, pp), each list in the records' order (``lenders``).
Lenders = dict[tuple[Any, ...], list[dict[str, Any]]]


def fill_from_siblings(record: dict[str, Any], records: Sequence[dict[str, Any]], index: Lenders | None = None
                       ) -> dict[str, Any]:
    """A record that leaves micro-batch, virtual pipeline or global batch unstated takes them from a record
    of the same source (group), model and tp/pp that states them; the global batch scales with dp (the same
    micro-batches per pipeline). Korthikanti et al. 2022's 2,240-GPU run is its 280-GPU Table 3 run × 8.
    ``index``: ``lenders(records)``, built once by a caller that fills every record of ``records``."""
    p = record.get("parallel") or {}
    if all(p.get(k) is not None for k in BORROWED):
        return record
    other = _lender(record, records, index)
    if other is None:
        return record
    q, filled, notes = other["parallel"], dict(p), []
    for k in BORROWED:
        if p.get(k) is None:
            value = q[k]
            if k == "global_batch_size" and positive_int(p.get("dp")) and positive_int(q.get("dp")):
                value = q[k] * positive_int(p["dp"]) // positive_int(q["dp"])
            filled[k] = value
            notes.append(f"{k} {value}")
    note = f"from {other['id']} (same source, model, tp/pp): " + ", ".join(notes)
    return record | {"parallel": filled, "_borrowed": note}


def lenders(records: Sequence[dict[str, Any]]) -> Lenders | None:
    """The records that can lend (current, stating every BORROWED setting and a dp) by their group, model and tp/pp,
    in order; None where a record's key is no dict key (a list where a name goes: ``_lender`` then scans). Built once
    a validation, it makes each record's search a lookup: a scan of every record for each (720 × 720 for vTrain's
    runs) was 11 % of that validation's CPU."""
    index: Lenders = {}
    for other in (o for o in records if _can_lend(o)):
        key = _sibling_key(other)
        if not _hashable(key):
            return None
        index.setdefault(key, []).append(other)
    return index


def _hashable(value: Any) -> bool:
    """Whether ``value`` can be a dict key: a JSON record's list or table (where a name or a size goes) cannot, nor a
    tuple holding one."""
    if isinstance(value, tuple):
        return all(_hashable(v) for v in value)
    return isinstance(value, Hashable)


def _can_lend(other: dict[str, Any]) -> bool:
    q = other.get("parallel") or {}
    return not other.get("superseded") and bool(q.get("dp")) and all(q.get(k) is not None for k in BORROWED)


def _sibling_key(record: dict[str, Any]) -> tuple[Any, ...]:
    p = record.get("parallel") or {}
    return record.get("group"), (record.get("model") or {}).get("name"), p.get("tp"), p.get("pp")


def _lender(record: dict[str, Any], records: Sequence[dict[str, Any]], index: Lenders | None
            ) -> dict[str, Any] | None:
    """The first of ``records`` that is not ``record``, is a current record of its source, model and tp/pp and
    states every BORROWED setting and a dp, or None: looked up in ``index`` (``lenders(records)``; built here where
    not given)."""
    index = lenders(records) if index is None else index
    key = _sibling_key(record)
    if index is None:
        found = [o for o in records if _can_lend(o) and _sibling_key(o) == key]
    elif _hashable(key):
        found = index.get(key, [])
    else:  # no lender's key holds a list or a table (else ``index`` is None): none equals this one
        return None
    return next((other for other in found if other is not record), None)


# ---- skip reasons -------------------------------------------------------------------------------------------
def with_unread(reason: str, record: dict[str, Any]) -> str:
    """The reason, with the unreadable values (``records.clean_record``'s ``_unread``) of the fields it names."""
    named = [u for u in record.get("_unread") or []
             if re.search(rf"\b{re.escape(u.split('=', 1)[0].rsplit('.', 1)[-1])}\b", reason)
             or (u.startswith("measured") and "measurement" in reason)]
    return reason + (f" (not read: {', '.join(named)})" if named else "")
