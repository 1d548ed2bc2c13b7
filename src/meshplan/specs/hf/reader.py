"""Reading one Hugging Face ``config.json``: typed access to its keys, so that a missing required key or a value of
the wrong JSON type is a one-line SpecError naming the file, the key and the value (families.py reads through it)."""

from __future__ import annotations

from typing import Any

from meshplan.errors import SpecError

_MISSING = object()


class ConfigReader:
    """Reads keys of one config.json, checking each value's JSON type: a missing required key or a value of the
    wrong kind is a one-line SpecError naming the file, the key and the value."""

    def __init__(self, config: dict[str, Any], name: str, model_type: str):
        self.config, self.name, self.model_type = config, name, model_type

    def _bad(self, key: str, value: Any, kind: str) -> SpecError:
        return SpecError(f"{self.name}: config.json {key}={value!r} must be {kind}")

    def _int(self, key: str, value: Any, minimum: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self._bad(key, value, "a positive integer" if minimum else "a non-negative integer")
        return value

    def need(self, key: str, minimum: int = 1) -> int:
        """A required integer key (a size or a count), at least ``minimum``."""
        value = self.config.get(key, _MISSING)
        if value is _MISSING or value is None:
            raise SpecError(f"{self.name}: config.json (model_type={self.model_type!r}) has no {key!r}")
        return self._int(key, value, minimum)

    def get(self, key: str, default: int, minimum: int = 0) -> int:
        """An optional integer key; ``default`` also replaces an explicit null, as the HF config classes do."""
        value = self.config.get(key)
        return default if value is None else self._int(key, value, minimum)

    def flag(self, key: str, default: bool) -> bool:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(key, value, "true or false")
        return value

    def number(self, key: str, default: float) -> float:
        """An optional non-negative number; ``default`` also replaces an explicit null."""
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
            raise self._bad(key, value, "a non-negative number")
        return float(value)

    def strings(self, key: str) -> list[str] | None:
        """An optional list of strings (``layer_types``), None when absent."""
        value = self.config.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad(key, value, "a list of strings")
        return value

    def text(self, key: str) -> str:
        value = self.config.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self._bad(key, value, "a string")
        return value

    def layers(self, key: str) -> list[int]:
        """A list of layer indices (``mlp_only_layers``)."""
        value = self.config.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._bad(key, value, "a list of layer indices")
        return sorted(self._int(key, v, 0) for v in value)

    def dropout(self, *keys: str) -> bool:
        """Any of the dropout probabilities above zero."""
        rates = []
        for key in keys:
            value = self.config.get(key)
            if value is None:
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
                raise self._bad(key, value, "a probability between 0 and 1")
            rates.append(value)
        return any(rate > 0 for rate in rates)
