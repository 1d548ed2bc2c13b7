"""Published-run records as plain values: what a file in the ``published_runs.jsonl`` schema says, read the
same way whatever the source wrote (numbers as text, "n/a", other names for the measured quantities).

The map_*.py modules map a cleaned record onto meshplan; nothing here knows about models, clusters or plans. The
patterns that read text live in patterns.py.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from meshplan.errors import SpecError
from meshplan.fields import MAX_SIZE
from meshplan.files import parse_json, read_text
from meshplan_validation.patterns import (
    DIGITS,
    LEADING_NUMBER,
    NAME_SEPARATORS,
    QUALIFIED,
    SPELLINGS,
    STATISTICS,
    TIME_UNIT,
    UNSTATED_TEXT,
)


def read_runs(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSONL file (blank lines ignored); a malformed line is a SpecError naming it."""
    runs = []
    lines = read_text(path, "validation file").splitlines()
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = parse_json(line, f"{path}:{line_no}")
        if not isinstance(record, dict) or not isinstance(record.get("id"), str) or not record["id"]:
            raise SpecError(f"{path}:{line_no}: a record must be an object with a non-empty string 'id'")
        runs.append(record)
    if not runs:
        raise SpecError(f"validation file {str(path)!r}: no records (one JSON object per line)")
    return runs


def runs_from_command_line(default: Path, doc: str | None) -> tuple[Path, list[dict[str, Any]]]:
    """The file a benchmark script names on its command line (else ``default``) and its records; a missing or
    malformed file ends the script with one line naming it (``--help`` prints the first paragraph of ``doc``)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("runs", nargs="?", type=Path, default=default,
                        help="a published-runs JSONL file (default: %(default)s)")
    path = parser.parse_args().runs
    try:
        return path, read_runs(path)
    except SpecError as err:
        sys.exit(f"{parser.prog}: {err}")


def positive_int(value: Any) -> int | None:
    """A parallel size or batch as a positive integer; None when not stated (a size below 1 says nothing)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float) and not value.is_integer():  # 3.5 GPUs or NaN: not a size
        return None
    if isinstance(value, (int, float)):
        return int(value) if 1 <= value <= MAX_SIZE else None
    found = DIGITS.search(str(value))
    return int(found.group()) if found and 1 <= int(found.group()) <= MAX_SIZE else None


NEGATIVE = ("none", "no", "false", "off", "disabled", "0", "0.0")


def flag(value: Any) -> bool:
    """A stated on/off setting: a bool, a number, or text ("false", "no", "off", "disabled" are off)."""
    if isinstance(value, str):
        return value.strip().lower() not in NEGATIVE
    return bool(value)


# Record fields that hold text, and fields that hold a flag or text; every other field of these sections is read
# as a number (text that does not start with one, such as "2M", becomes null: nothing here reads such fields).
TEXT_FIELDS = {"name", "arch", "arch_source", "gpu", "system", "interconnect", "pp_schedule", "mp_mode"}
FLAG_FIELDS = {"activation_recompute", "zero_or_fsdp", "interleaved_schedule", "sequence_parallel",
               "distributed_optimizer", "async_tp"}


def number(value: Any) -> Any:
    """A numeric field as a number: "8,192" → 8192, "1.5e3" → 1500.0, "n/a" / "" / lists → None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):  # a leading number, alone or before a remark: "8", "1,664.5", "8 (derived)", "45 %"
        found = LEADING_NUMBER.match(value.replace("_", ""))
        if not found:  # "1.234,5" or "12,5" (a decimal comma?), "~40", "1.2-1.4", "up to 150": not read
            return None
        text = found.group(1).replace(",", "")
        parsed = float(text)
        if not math.isfinite(parsed):
            return None
        return int(parsed) if parsed.is_integer() and "." not in text and "e" not in text.lower() else parsed
    return None


def _field(key: str, value: Any) -> Any:
    if value is None or isinstance(value, (list, dict)):
        return None
    if key in TEXT_FIELDS:
        return str(value)
    if key in FLAG_FIELDS:
        return value
    return None if isinstance(value, bool) else number(value)  # true is no size or rate


# ---- measured quantities --------------------------------------------------------------------------------------
# The schema's measured quantities (measurement.METRICS, in its order of preference) and the peak memory.
MEASURED = ("iteration_time_s", "tokens_per_s_per_gpu", "tokens_per_s_total", "model_tflops_per_gpu",
            "tflops_per_gpu", "mfu_pct", "hfu_pct", "pct_of_peak", "peak_memory_gib")
# Other names for them, read after the schema's own in this order: (name, canonical name, factor); factor None is
# the record's sequence length (sequences per second × tokens per sequence = tokens per second).
MEASURE_ALIASES: tuple[tuple[str, str, float | None], ...] = (
    ("step_time_s", "iteration_time_s", 1.0), ("iteration_time_ms", "iteration_time_s", 1e-3),
    ("step_time_ms", "iteration_time_s", 1e-3), ("tokens_per_s", "tokens_per_s_total", 1.0),
    ("mfu", "mfu_pct", 100.0), ("hfu", "hfu_pct", 100.0),
    ("samples_per_s", "tokens_per_s_total", None), ("sequences_per_s", "tokens_per_s_total", None),
)
# a time written with its unit (patterns.TIME_UNIT): seconds per unit
SECONDS = {"m": 1e-3, "s": 1.0}  # by the unit's first letter, "min…" apart


def measured_name(key: str) -> tuple[str, float | None, tuple[int, int]] | None:
    """The schema's name of a measured field as a source wrote it, the factor to it, and its rank (statistic, name)
    among the fields that give the same quantity (lowest first); None for a name of no quantity read."""
    name = NAME_SEPARATORS.sub("_", key.lower()).strip("_")
    found = QUALIFIED.fullmatch(name)
    if found is None:
        return None
    statistic = found.group(1) or found.group(3)
    body = found.group(2)
    for pattern, replacement in SPELLINGS:
        body = pattern.sub(replacement, body)
    stat_rank = STATISTICS.index(statistic) + 1 if statistic else 0
    if body in MEASURED:
        return body, 1.0, (stat_rank, 0 if body == key else 1)
    aliases = [a for a in MEASURE_ALIASES if a[0] == body]
    if aliases:
        return aliases[0][1], aliases[0][2], (stat_rank, 2 + MEASURE_ALIASES.index(aliases[0]))
    return None


def _measured_value(raw: Any, canonical: str, factor: float | None, seq: Any) -> float | None:
    """A measured value in the schema's unit: a number, or text that is one ("1,664.5", "41 %", "850 ms")."""
    value = number(raw) if not isinstance(raw, bool) else None
    if not isinstance(value, (int, float)):
        return None
    unit = TIME_UNIT.search(raw) if isinstance(raw, str) and canonical == "iteration_time_s" else None
    if unit:  # the unit written beside the number, whatever the name says
        word = unit.group(1).lower()
        return value * (60.0 if word.startswith("min") else SECONDS[word[0]])
    if factor is None:  # sequences per second
        return value * seq if isinstance(seq, (int, float)) and not isinstance(seq, bool) and seq > 0 else None
    percent_already = canonical.endswith("_pct") and (value > 1 or (isinstance(raw, str) and "%" in raw))
    return value if percent_already or factor == 1.0 else value * factor  # "mfu": 41 means 41 %, not 4100 %


def read_measured(measured: dict[str, Any], model: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``measured`` with every field's number (``number``) and the schema's quantities under their own names where
    a source wrote them otherwise, and which field each was read from where that is not its own name (or a unit was
    written beside it): another name (``step_time_ms`` → iteration_time_s), a statistic of repeated measurements
    (``iteration_time_s_median``), another spelling (``throughput_tokens_per_sec_per_device``)."""
    out = {k: _field(k, v) for k, v in measured.items()}
    best: dict[str, tuple[tuple[int, int], str, float]] = {}
    for key, raw in measured.items():
        named = measured_name(str(key))
        if named is None:
            continue
        canonical, factor, rank = named
        value = _measured_value(raw, canonical, factor, model.get("seq_length"))
        if value is not None and (canonical not in best or rank < best[canonical][0]):
            best[canonical] = (rank, key, value)
    read_from = {}
    for canonical, (_, key, value) in best.items():
        out[canonical] = value
        if key != canonical or (isinstance(measured[key], str) and TIME_UNIT.search(measured[key])):
            read_from[canonical] = f"{key}={measured[key]!r}"
    return out, read_from


# other names a record gives its global batch by, in tokens (parallel section; tokens_per_batch in measured too)
BATCH_TOKENS = ("global_batch_tokens", "global_batch_size_tokens", "tokens_per_batch", "batch_size_tokens")
# the numbers of each section that the map_*.py modules read (a measured field: any ``measured_name`` names), so
# that one it cannot read is said; a source's extra fields (remarks, flags as text) are not
READ_NUMBERS = {
    "model": ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "head_dim", "vocab_size",
              "seq_length", "num_experts", "moe_topk", "moe_ffn_hidden_size", "shared_expert_ffn"),
    "hardware": ("num_gpus", "gpus_per_node", "num_nodes", "nodes"),
    "parallel": ("tp", "pp", "dp", "cp", "vp", "ep", "etp", "micro_batch_size", "global_batch_size", "grad_accum",
                 *BATCH_TOKENS),
}


def clean_record(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its model / hardware / parallel / measured sections as dicts of plain values, so that a
    file from another source (numbers as strings, "n/a", nested values) maps or skips with a reason. Two lists go
    with it: ``_measured_from`` (``read_measured``: which field each measured quantity was read from, where not its
    own) and ``_unread`` (``section.key=value`` of each stated value that is not one of its kind: "fast" for a
    number, a list, a nested object). Cleaning a cleaned record changes nothing."""
    out = dict(record)
    unread = list(record.get("_unread") or [])
    for section in ("model", "hardware", "parallel", "measured"):
        raw = record.get(section)
        if raw is not None and not isinstance(raw, dict):
            unread.append(f"{section}={raw!r}"[:80])
        values = raw if isinstance(raw, dict) else {}
        out[section] = {k: _field(k, v) for k, v in values.items()}
        unread += _unread(section, values, out[section])
    raw_measured = record.get("measured")
    out["measured"], read_from = read_measured(raw_measured if isinstance(raw_measured, dict) else {}, out["model"])
    out["_measured_from"] = dict(record.get("_measured_from") or {}) | read_from
    out["_unread"] = list(dict.fromkeys(unread))
    for key in ("id", "group", "framework", "precision", "flops_accounting", "notes", "task"):
        if out.get(key) is not None and not isinstance(out[key], str):
            out[key] = str(out[key])
    return out


def _unread(section: str, values: dict[str, Any], cleaned: dict[str, Any]) -> list[str]:
    """``section.key=value`` of each stated value of a field that is read (READ_NUMBERS, a measured name) whose
    cleaned value is None, and in hardware and parallel of each number that is no size: 0 or less, fractional, past
    MAX_SIZE."""
    unread = [f"{section}.{k}={v!r}"[:80] for k, v in values.items()
              if stated(v) and cleaned[k] is None
              and (k in READ_NUMBERS.get(section, ()) or (section == "measured" and measured_name(str(k))))]
    if section in ("hardware", "parallel"):
        unread += [f"{section}.{k}={v!r}"[:80] for k, v in cleaned.items()
                   if k in READ_NUMBERS[section] and v is not None and positive_int(v) is None]
    return unread


# The training settings a run's step time depends on that a source may leave out (the schema's README, "Read this
# before comparing", 2: "Configurations are incomplete in places": the NVIDIA tables give no activation-recompute
# setting, Narayanan et al. 2021 Table 1 no micro-batch). A record that states all of them has a complete
# configuration, the runs the median and p90 accuracy targets are set on (docs/ACCURACY.md).
def stated(value: Any) -> bool:
    """Whether a cleaned field states a value: not None, and not text that says it is unknown."""
    return value is not None and not (isinstance(value, str) and UNSTATED_TEXT.match(value))


def unstated_settings(record: dict[str, Any]) -> tuple[str, ...]:
    """The settings a cleaned record (``clean_record``) leaves unstated, of: the parallel layout (tp and pp, or a
    ZeRO / FSDP setting for a run that is data-parallel only), micro_batch_size, global_batch_size,
    activation_recompute and precision. Empty for a complete configuration."""
    p = record.get("parallel") or {}
    missing = []
    if not (stated(p.get("tp")) and stated(p.get("pp"))) and not stated(p.get("zero_or_fsdp")):
        missing.append("parallel layout (tp and pp, or zero_or_fsdp)")
    missing += [key for key in ("micro_batch_size", "global_batch_size", "activation_recompute")
                if not stated(p.get(key))]
    if not stated(record.get("precision")):
        missing.append("precision")
    return tuple(missing)
