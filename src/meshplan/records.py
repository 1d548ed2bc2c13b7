"""Published-run records as plain values: what a file in the ``published_runs.jsonl`` schema says, read the
same way whatever the source wrote (numbers as text, "n/a", other names for the measured quantities).

validate.py maps a cleaned record onto meshplan; nothing here knows about models, clusters or plans.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any

from meshplan.errors import SpecError
from meshplan.fields import MAX_SIZE
from meshplan.files import parse_json, read_text


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
    if isinstance(value, (int, float)):
        return int(value) if 1 <= value <= MAX_SIZE else None
    found = re.search(r"\d+", str(value))
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
        found = LEADING_NUMBER.match(value.replace(",", "").replace("_", ""))
        if not found:
            return None
        text = found.group(1)
        parsed = float(text)
        if not math.isfinite(parsed):
            return None
        return int(parsed) if parsed.is_integer() and "." not in text and "e" not in text.lower() else parsed
    return None


LEADING_NUMBER = re.compile(r"\s*([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(?=\s|\(|%|$)")


def _field(key: str, value: Any) -> Any:
    if value is None or isinstance(value, (list, dict)):
        return None
    if key in TEXT_FIELDS:
        return str(value)
    return value if key in FLAG_FIELDS else number(value)


# Other names for the schema's measured quantities: (name, canonical name, factor).
MEASURE_ALIASES: tuple[tuple[str, str, float], ...] = (
    ("step_time_s", "iteration_time_s", 1.0), ("iteration_time_ms", "iteration_time_s", 1e-3),
    ("step_time_ms", "iteration_time_s", 1e-3), ("tokens_per_s_per_device", "tokens_per_s_per_gpu", 1.0),
    ("tokens_per_s", "tokens_per_s_total", 1.0), ("mfu", "mfu_pct", 100.0), ("hfu", "hfu_pct", 100.0),
)


def _canonical_measures(measured: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """``measured`` with the schema's names where a source used another (``mfu`` as a fraction → ``mfu_pct``;
    sequences per second × the sequence length → ``tokens_per_s_total``)."""
    out = dict(measured)
    for name, canonical, factor in MEASURE_ALIASES:
        value = out.get(name)
        if out.get(canonical) is None and isinstance(value, (int, float)):
            percent_already = canonical.endswith("_pct") and value > 1  # "mfu": 41 means 41 %, not 4100 %
            out[canonical] = value if percent_already else value * factor
    seq = model.get("seq_length")
    for name in ("samples_per_s", "sequences_per_s"):
        if out.get("tokens_per_s_total") is None and isinstance(out.get(name), (int, float)) and seq:
            out["tokens_per_s_total"] = out[name] * seq
    return out


def clean_record(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its model / hardware / parallel / measured sections as dicts of plain values, so that a
    file from another source (numbers as strings, "n/a", nested values) maps or skips with a reason."""
    out = dict(record)
    for section in ("model", "hardware", "parallel", "measured"):
        raw = record.get(section)
        values = raw if isinstance(raw, dict) else {}
        out[section] = {k: _field(k, v) for k, v in values.items()}
    out["measured"] = _canonical_measures(out["measured"], out["model"])
    for key in ("id", "group", "framework", "precision", "flops_accounting", "notes", "task"):
        if out.get(key) is not None and not isinstance(out[key], str):
            out[key] = str(out[key])
    return out


# The training settings a run's step time depends on that a source may leave out (the schema's README, "Read this
# before comparing", 2: "Configurations are incomplete in places": the NVIDIA tables give no activation-recompute
# setting, Narayanan et al. 2021 Table 1 no micro-batch). A record that states all of them has a complete
# configuration, the runs issue 4's median and p90 targets are set on.
# words a source writes for a value it does not state (validate's recompute reading strips them too)
UNSTATED_WORDS = r"not stated|unstated|unknown|n/a"
# text that states nothing: empty, or one of those words (or "na"), alone or before a remark in parentheses
UNSTATED_TEXT = re.compile(rf"^\s*(?:{UNSTATED_WORDS}|na)?\s*(?:\(|$)", re.IGNORECASE)


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
