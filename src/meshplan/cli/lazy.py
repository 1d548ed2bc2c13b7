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
import os
import re
import sys
from collections.abc import Iterable, Iterator, MutableMapping
from functools import reduce
from importlib import import_module
from typing import Any, NamedTuple

import click


class Lazy(NamedTuple):  # a NamedTuple, not a dataclass: a fifth of the time to define (start-up, issue 83)
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
        if self._found is None:  # only when a name is not the core's or the whole list is wanted (--help)
            self._found = {e.name: e for e in entry_points(self._plugins)} if self._plugins else {}
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


class EntryPoint(NamedTuple):
    """An entry point as ``importlib.metadata.EntryPoint`` has it: its name and ``module:attribute`` value."""

    name: str
    value: str

    def load(self) -> Any:
        """The object the value names (``importlib.metadata.EntryPoint.load``)."""
        found = re.match(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$", self.value)
        assert found is not None, f"entry point {self.name} = {self.value!r} names no module"
        return reduce(getattr, filter(None, (found["attr"] or "").split(".")), import_module(found["module"]))


def entry_points(group: str) -> list[Any]:
    """The entry points of ``group``, as ``importlib.metadata.entry_points(group=group)`` gives them, read without
    importing ``importlib.metadata`` (its ``email``, ``zipfile`` and ``pathlib``: a third of ``meshplan --help``'s
    time) where every distribution lies in a folder of ``sys.path``; else ``importlib.metadata``'s own."""
    folders = _metadata_folders()
    if folders is None:
        from importlib.metadata import entry_points as found  # noqa: PLC0415  (a zip or egg on sys.path)

        return list(found(group=group))
    points = []
    for folder in folders:
        try:
            with open(os.path.join(folder, "entry_points.txt"), encoding="utf-8") as f:
                text = f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
            continue
        section = None  # importlib.metadata.Sectioned.read: stripped lines, '#' comments, [group] then name = value
        for line in filter(None, map(str.strip, text.splitlines())):
            if line.startswith("#"):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line.strip("[]")
            elif section is not None:
                name, value = line.split("=", 1)
                if section == group:
                    points.append(EntryPoint(name.strip(), value.strip()))
    return points


def _metadata_folders() -> list[str] | None:
    """The ``*.dist-info`` and ``*.egg-info`` folders of ``sys.path``, the first of each distribution's name, in the
    order ``importlib.metadata.distributions()`` finds them (CPython 3.11's ``FastPath``, ``Lookup`` and ``_unique``);
    None where it would find others: a zip or egg on ``sys.path``, a finder of distributions other than
    ``PathFinder``, a name this reading does not take apart as it does."""
    from importlib.machinery import PathFinder  # noqa: PLC0415  (imported already: click's inspect imports it)

    if any(getattr(f, "find_distributions", None) is not None and f is not PathFinder for f in sys.meta_path):
        return None
    folders: list[str] = []
    seen: set[str] = set()
    for root in sys.path:
        if not isinstance(root, str) or os.path.isfile(root) or root.lower().endswith(".egg"):
            return None
        try:
            children = os.listdir(root or ".")
        except OSError:
            continue
        by_name: dict[str, list[str]] = {}
        for child in children:
            if child.lower().endswith((".dist-info", ".egg-info")):
                stem, ext = os.path.splitext(child)
                if ext not in (".dist-info", ".egg-info"):
                    return None  # importlib.metadata would read this one's name from its metadata
                by_name.setdefault(_normalized(child.lower().rpartition(".")[0].partition("-")[0]), []).append(child)
        for child in (c for group in by_name.values() for c in group):
            name = _normalized(os.path.splitext(child)[0].partition("-")[0])
            if name not in seen:
                seen.add(name)
                folders.append(os.path.join(root, child))
    return folders


def _normalized(name: str) -> str:
    """PEP 503's normal form with dashes as underscores (``importlib.metadata.Prepared.normalize``)."""
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")
