"""The project's bounded memo: the last answers of a pure function of frozen objects, kept by a key the caller makes.

No NumPy here (files.py reads presets on paths that import none): the step grid, the rank costs, the op times, the
sharding rules, the built-in presets' specs and the validation layer's record maps all keep their answers in one.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

_T = TypeVar("_T")


class Kept(Generic[_T]):
    """The last ``size`` answers of a pure function of frozen objects, by a key that holds those objects' ids: each
    answer is held with the objects (``held``), so that none is freed and no id reused (a new object at a freed
    address would find an answer not its own) while it is kept; the oldest goes when full. A key by ``id`` is cheap
    where hashing a frozen spec hashes every field: step/ranks.rank_shared, step/grid.rank_params and
    autoshard/rules.place ask the same question of the same objects again and again (issue 83). A key of values
    (files.preset_spec's: a document's JSON text) needs nothing held (``held=None``)."""

    __slots__ = ("size", "answers")

    def __init__(self, size: int) -> None:
        self.size = size
        self.answers: dict[Hashable, tuple[object, _T]] = {}

    def answer(self, key: Hashable, held: object, compute: Callable[..., _T], *args: Any) -> _T:
        """The answer kept for ``key``, else ``compute(*args)``'s, kept with ``held``."""
        found = self.answers.get(key)
        if found is not None:
            return found[1]
        new = compute(*args)
        if len(self.answers) >= self.size:
            del self.answers[next(iter(self.answers))]  # the oldest
        self.answers[key] = (held, new)
        return new
