"""Typed reads of a parsed framework config (a JSON object, a TOML table), shared by the ``read`` side of every
format: each value of the wrong kind is one SpecError naming the format, the key and the value, never a Python
exception from ``int()`` or ``.get()`` (issue 48: 21 DeepSpeed configs were internal errors).

What a config may hold besides the value itself, and how it is read:

- absent or ``null``: the framework's default (DeepSpeed's config classes take ``None`` as "not set").
- ``"auto"``: what the Hugging Face Trainer writes into the DeepSpeed configs it ships (transformers
  integrations/deepspeed.py, ``HfTrainerDeepSpeedConfig.trainer_config_process``, fills every ``"auto"`` from
  ``TrainingArguments``); read as that default (``auto`` below) and said once on stderr (``announce``), so that
  a user sees which number was priced.
- NaN, infinities, booleans where a number goes, lists or strings where a table goes: refused.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from meshplan.errors import SpecError

AUTO = "auto"


class Values:
    """One table of a config: ``data`` as parsed, ``where`` its place for errors (``deepspeed config``,
    ``deepspeed config: zero_optimization``); ``autos`` collects the ``"auto"`` values read as defaults."""

    def __init__(self, data: Any, where: str, autos: list[str] | None = None) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise SpecError(f"{where} must be an object of keys, not {_shown(data)}")
        self.data, self.where = data, where
        self.autos = [] if autos is None else autos

    def _name(self, key: str) -> str:
        section = self.where.partition(": ")[2]
        return f"{section}.{key}" if section else key

    def _fail(self, key: str, value: Any, what: str) -> SpecError:
        base = self.where.partition(": ")[0]
        return SpecError(f"{base}: {self._name(key)}={_shown(value)} {what}")

    def section(self, key: str) -> Values:
        """The table under ``key`` (absent or null: empty); a number, string or list there is refused."""
        value = self.data.get(key)
        if value is not None and not isinstance(value, dict):
            example = {"zero_optimization": '{"stage": 3}', "offload_optimizer": '{"device": "cpu"}'}.get(key, "{...}")
            raise self._fail(key, value, f"must be an object like {example}")
        base = self.where.partition(": ")[0]
        return Values(value, f"{base}: {self._name(key)}", self.autos)

    def raw(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def integer(self, key: str, default: int | None, *, auto: int | None = None, low: int = 1) -> int | None:
        """A whole number ≥ ``low`` (absent / null: ``default``; ``"auto"``: ``auto``, noted, or ``default``)."""
        value = self.data.get(key)
        if value is None:
            return default
        if value == AUTO:
            if auto is not None or default is not None:  # None: the caller derives it and says so
                self.autos.append(f"{self._name(key)}={default if auto is None else auto}")
            return default if auto is None else auto
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise self._fail(key, value, f"must be an integer ≥ {low}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        """true or false (absent / null: ``default``; ``"auto"``: ``default``, noted)."""
        value = self.data.get(key)
        if value is None:
            return default
        if value == AUTO:
            self.autos.append(f"{self._name(key)}={str(default).lower()}")
            return default
        if not isinstance(value, bool):
            raise self._fail(key, value, "must be true or false")
        return value

    def choice(self, key: str, default: str, allowed: tuple[str, ...]) -> str:
        """One of ``allowed`` (absent / null: ``default``; ``"auto"``: ``default``, noted)."""
        value = self.data.get(key)
        if value is None:
            return default
        if value == AUTO and AUTO not in allowed:
            self.autos.append(f"{self._name(key)}={default}")
            return default
        if not isinstance(value, str) or value not in allowed:
            raise self._fail(key, value, f"must be one of {', '.join(allowed)}")
        return value

    def text(self, key: str, default: str) -> str:
        """A string (absent / null: ``default``)."""
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._fail(key, value, "must be a string")
        return value


def announce(fmt: str, autos: list[str], source: str) -> None:
    """One line on stderr naming each ``"auto"`` read and the value priced (``source``: whose default it is)."""
    if autos:
        print(f"meshplan: note: {fmt} config: \"auto\" read as {source}: {', '.join(autos)}", file=sys.stderr)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
