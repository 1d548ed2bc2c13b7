"""Exhaustive search over parallel plans: candidates, vectorised scoring, pruning, ranked results.

The names below are imported on first use (PEP 562), so that a module importing one piece of the search (the
report's ``search.best.simplicity``, the serving search's ``search.space``) does not load all of it."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshplan.search.limits import check_space
    from meshplan.search.run import SearchResult, search
    from meshplan.search.space import Space

_WHERE = {"SearchResult": "meshplan.search.run", "Space": "meshplan.search.space",
          "check_space": "meshplan.search.limits", "search": "meshplan.search.run"}
__all__ = ["SearchResult", "Space", "check_space", "search"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'meshplan.search' has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
