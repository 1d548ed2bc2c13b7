"""The command line's commands, each imported when first used: ``meshplan plan`` loads the search and not the serving
engines, the sharding planner or the HTML report, and ``meshplan --help`` loads none of them.

``Commands`` is the mapping click's group keeps its commands in (``Group.commands``): looking a name up imports that
command's module; the ``meshplan.commands`` entry points (commands of other packages) are read only when a name is
not one of the core's or the whole list is wanted. While ``listing()``, a command not yet imported is a stand-in with
its summary (``Lazy.summary``), so that the group's own listing needs no import. pip keeps its commands the same way
(``pip/_internal/commands/__init__.py``: ``commands_dict``, name to module, class and summary).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any

import click


@dataclass(frozen=True)
class Lazy:
    """Where a command lives and the first paragraph of its help (what a listing of the commands shows)."""

    name: str
    module: str
    attribute: str
    summary: str

    def load(self) -> click.Command:
        command = getattr(import_module(self.module), self.attribute)
        assert isinstance(command, click.Command), f"{self.module}.{self.attribute} is no click command"
        return command

    def stand_in(self) -> click.Command:
        """A command with this one's name and summary and nothing else: click shortens its summary for a listing
        as it would the real command's help."""
        return click.Command(self.name, help=self.summary)


class Commands(MutableMapping[str, click.Command]):
    """Name → command, each imported on first use (see the module's docstring)."""

    def __init__(self, lazy: Iterable[Lazy], plugins: str | None = None) -> None:
        self._lazy = {c.name: c for c in lazy}
        self._plugins = plugins  # the entry point group of other packages' commands, read when first needed
        self._found: dict[str, Any] | None = None
        self._loaded: dict[str, click.Command] = {}
        self._listing = False

    def _entry_points(self) -> dict[str, Any]:
        if self._found is None:
            from importlib.metadata import entry_points  # noqa: PLC0415  (~20 ms: only when a name is not the core's)

            self._found = {e.name: e for e in entry_points(group=self._plugins)} if self._plugins else {}
        return self._found

    def __getitem__(self, name: str) -> click.Command:
        if name in self._loaded:
            return self._loaded[name]
        if name in self._lazy:
            if self._listing:
                return self._lazy[name].stand_in()
            command = self._lazy[name].load()
        elif name in self._entry_points():
            command = self._entry_points()[name].load()
        else:
            raise KeyError(name)
        self._loaded[name] = command
        return command

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._loaded.pop(name, None)
        self._lazy.pop(name, None)
        self._entry_points().pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._lazy or name in self._entry_points()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted({*self._loaded, *self._lazy, *self._entry_points()}))

    def __len__(self) -> int:
        return len({*self._loaded, *self._lazy, *self._entry_points()})

    @contextlib.contextmanager
    def listing(self) -> Iterator[None]:
        """While listing: a command not yet imported is its stand-in."""
        self._listing = True
        try:
            yield
        finally:
            self._listing = False
