"""Answers kept by the identities of the objects they come from (issue 83: a search asks the same question of the
same frozen specs again and again).

A key made of ``id(obj)`` is cheap (hashing a frozen spec hashes every field), but an id is an address: once the
object is freed, a new one may take it and find an answer that is not its own. ``Kept`` holds the objects beside the
answer, so that none is freed, and no id reused, while the answer is kept; the oldest goes when it is full. Its
callers (step/ranks.rank_shared, step/grid.rank_params, autoshard/rules.place) ask pure functions of frozen
objects: the same objects give the same answer, and a kept answer is the one a fresh call would give.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Kept(Generic[T]):
    """The last ``size`` answers, each held with the objects whose ids its key holds (module docstring)."""

    __slots__ = ("size", "answers")

    def __init__(self, size: int) -> None:
        self.size = size
        self.answers: dict[Hashable, tuple[object, T]] = {}

    def answer(self, key: Hashable, held: object, compute: Callable[..., T], *args: Any) -> T:
        """The answer kept for ``key``, else ``compute(*args)``, kept with ``held`` (the objects ``key`` names by id)
        in place of the oldest when full."""
        found = self.answers.get(key)
        if found is not None:
            return found[1]
        new = compute(*args)
        if len(self.answers) >= self.size:
            del self.answers[next(iter(self.answers))]  # the oldest
        self.answers[key] = (held, new)
        return new
