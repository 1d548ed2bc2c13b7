"""Framework configs out and in: ``emit`` writes a plan and a stack as the config a framework launches with,
``read`` reads one back, so that emit -> read gives the same Plan and a Stack that prices the same.

Formats: ``megatron`` (Megatron-LM pretrain_gpt.py arguments), ``torchtitan`` (a job TOML), ``deepspeed`` (a
ds_config.json) and ``nemo`` (Megatron-Bridge recipe overrides, Hydra/OmegaConf ``key=value``). Each module's
docstring cites the option names it writes. A plan a framework cannot express raises SpecError naming the field and
the framework.

Each format's module exports one ``ConfigFormat`` record (configs/format.py: name, stack preset, suffixes,
markers, emit, read), named after it (``MEGATRON``, ``TORCHTITAN``, ``DEEPSPEED``, ``NEMO``); ``FORMATS`` holds
them by name and the functions below dispatch through it.
"""

from __future__ import annotations

from pathlib import Path

from meshplan.configs.deepspeed import DEEPSPEED
from meshplan.configs.format import ConfigFormat
from meshplan.configs.megatron import MEGATRON
from meshplan.configs.nemo import NEMO
from meshplan.configs.torchtitan import TORCHTITAN
from meshplan.errors import SpecError
from meshplan.files import read_text
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

FORMATS: dict[str, ConfigFormat] = {f.name: f for f in (MEGATRON, TORCHTITAN, DEEPSPEED, NEMO)}

__all__ = ["FORMATS", "ConfigFormat", "detect", "emit", "read"]


def _format(fmt: str) -> ConfigFormat:
    if fmt not in FORMATS:
        raise SpecError(f"config format {fmt!r} must be one of {', '.join(FORMATS)}")
    return FORMATS[fmt]


def emit(fmt: str, model: ModelSpec, plan: Plan, stack: Stack) -> str:
    """The config text of ``plan`` run by ``stack`` in the framework ``fmt``."""
    return _format(fmt).emit(model, plan, stack)


def detect(text: str, path: str = "") -> str:
    """The format of a config: by its content where exactly one format's options appear in it (a DeepSpeed JSON
    saved as ``.txt`` is still DeepSpeed's), else by the file's suffix where only one format uses it."""
    suffix = Path(path).suffix.lower()
    by_suffix = [name for name, f in FORMATS.items() if suffix and suffix in f.suffixes]
    by_content = [name for name, f in FORMATS.items() if f.written_in(text)]
    if len(by_content) == 1:
        return by_content[0]
    if len(by_suffix) == 1 and (not by_content or by_suffix[0] in by_content):
        return by_suffix[0]
    raise SpecError(f"config {path or 'text'}: cannot tell its format (one of {', '.join(FORMATS)})")


def read(fmt_or_path: str, model: ModelSpec, gpus: int, text: str | None = None) -> tuple[Plan, Stack]:
    """The plan and stack of a config: ``fmt_or_path`` a file (its format detected) or a format name with
    ``text`` (or a file with ``text`` given: its name only tells the format)."""
    if text is None:
        text = read_text(fmt_or_path, "from")
    fmt = fmt_or_path if fmt_or_path in FORMATS else detect(text, fmt_or_path)
    form = _format(fmt)
    if not form.written_in(text):  # an empty or foreign file would otherwise be priced as the defaults
        shown = fmt_or_path if fmt_or_path not in FORMATS else f"{fmt} text"
        raise SpecError(f"config {shown}: sets none of {' / '.join(form.markers)}, so it says nothing of the "
                        f"plan (a {fmt} config names at least one)")
    try:
        return form.read(text, model, gpus)
    except (ValueError, TypeError, AttributeError, KeyError, OverflowError) as exc:
        # a value of the wrong kind the reader did not foresee (configs/values.py checks the ones it knows): still
        # bad input, one line naming the format, not an internal error
        raise SpecError(f"{fmt} config {_where(fmt_or_path)}: unreadable value: {type(exc).__name__}: {exc}") from None


def _where(fmt_or_path: str) -> str:
    return "text" if fmt_or_path in FORMATS else repr(fmt_or_path)
