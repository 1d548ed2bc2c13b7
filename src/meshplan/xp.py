"""Scalar-or-array arithmetic, so one cost formula serves one plan (Python floats, fast) or a million
(NumPy arrays, vectorised). Formulas must not branch on numeric plan fields; they call these instead."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeAlias, TypeVar, overload

import numpy as np

# A quantity of one plan (a Python number) or of many (an array, one element per plan: a PlanBatch's columns)
Num: TypeAlias = float | int | np.ndarray

_SCALAR = (int, float)
_T = TypeVar("_T")


@overload
def maximum(a: float, b: float) -> float: ...
@overload
def maximum(a: Num, b: Num) -> Num: ...
def maximum(a: Num, b: Num) -> Num:
    if type(a) in _SCALAR and type(b) in _SCALAR:
        return a if a >= b else b
    return np.maximum(a, b)


@overload
def minimum(a: float, b: float) -> float: ...
@overload
def minimum(a: Num, b: Num) -> Num: ...
def minimum(a: Num, b: Num) -> Num:
    if type(a) in _SCALAR and type(b) in _SCALAR:
        return a if a <= b else b
    return np.minimum(a, b)


def where(cond: Num | bool, a: Num, b: Num) -> Num:
    if a is b:  # also when both are the same constant (the search: components folded away)
        return a
    if type(cond) is bool:
        return a if cond else b
    return np.where(cond, a, b)


@overload
def ceil_log2(x: float) -> float: ...
@overload
def ceil_log2(x: Num) -> Num: ...
def ceil_log2(x: Num) -> Num:
    """⌈log2 x⌉ for x ≥ 1 (tree depth)."""
    if type(x) in _SCALAR:
        return float(max(0, int(x - 1).bit_length())) if x >= 1 else 0.0
    return np.ceil(np.log2(np.maximum(x, 1)))


@overload
def floor_div(a: int, b: int) -> int: ...
@overload
def floor_div(a: Num, b: Num) -> Num: ...
def floor_div(a: Num, b: Num) -> Num:
    if type(a) is int and type(b) is int:
        return a // b
    return np.floor_divide(a, b)


def distinct(keys: np.ndarray | Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """For key columns (fields × rows of non-negative integers: a 2-D array, or its columns unstacked): the first row
    of each distinct key and each row's key index. The columns are packed into one integer (mixed radix) for a fast
    1-D unique; the code is renumbered densely whenever the next column would overflow int64."""
    packed = np.zeros(len(keys[0]), dtype=np.int64)
    for column in keys:
        radix = int(column.max()) + 1
        if int(packed.max()) >= 2**62 // radix:
            packed = np.unique(packed, return_inverse=True)[1].reshape(-1)
        packed = packed * radix + column
    _, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def unique_rows(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(m, axis=0, return_inverse=True)`` for a 2-D float matrix: its distinct rows in lexicographic order
    and each row's index among them (``unique[inverse]`` is ``m``); a lexicographic sort of the rows themselves
    instead of NumPy's sort of them viewed as structured records, which costs ten times as much."""
    order = np.lexsort(m.T[::-1])
    ordered = m[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    inverse = np.empty(len(order), dtype=np.intp)
    inverse[order] = np.cumsum(new) - 1
    return ordered[new], inverse


_SMALL, _TIED = 2048, 8  # stable_order's: NumPy's own sort below _SMALL values or with over 1 in _TIED tied


def stable_order(values: np.ndarray) -> np.ndarray:
    """``np.argsort(values, kind="stable")`` of a 1-D array, the same indices, from NumPy's unstable argsort: a
    vectorised introsort (x86-simd-sort) where its stable one is a merge sort (timsort), 31.4 against 3.1 ms for
    91,546 random float64s on this machine (an AMD EPYC, NumPy 2.4); DeepSeek-V3's search orders four lower bounds of
    86,041-91,546 size combinations (search/evaluate.py): 17.0-21.0 ms each stably, 2.7-8.8 ms here (best of 3, in
    process, 2026-11-30, issue 83). The two orders differ only among equal values, which the stable one keeps in their
    index order: each run of them (NaNs together at the end, as both sorts put them; -0.0 equal to 0.0, as both
    compare them) is given that order back. Few values, or many tied (more than one in ``_TIED``), take NumPy's own
    stable sort, which is then the faster (values mostly in order already, timsort's runs, sort faster stably too:
    this is for values in no order)."""
    if len(values) < _SMALL:
        return np.argsort(values, kind="stable")
    order = np.argsort(values)
    ranked = values[order]
    same = ranked[1:] == ranked[:-1]
    if ranked.dtype.kind in "fc":
        nan = np.isnan(ranked)
        same |= nan[1:] & nan[:-1]
    if not same.any():
        return order
    tied = np.zeros(len(ranked), dtype=bool)
    tied[1:] |= same
    tied[:-1] |= same
    at = np.flatnonzero(tied)
    if len(at) * _TIED > len(ranked):
        return np.argsort(values, kind="stable")
    run = np.cumsum(np.concatenate(([True], ~same)))[at]  # the run of equal values each tied position is in
    order[at] = order[at][np.lexsort((order[at], run))]
    return order


def recent(answers: list[tuple[tuple[object, ...], _T]], key: tuple[object, ...], compute: Callable[[], _T]) -> _T:
    """The answer kept in ``answers`` for ``key`` (objects compared by identity: they are held there, so that their
    ids are not reused), else ``compute()``'s, kept among the last four, newest first (an array answer read-only: a
    caller cannot change a kept one). For a search's batches, whose settings share their columns (and the report's
    pipeline runs: report/plots.py)."""
    for known, answer in answers:
        if all(a is b for a, b in zip(known, key, strict=True)):
            return answer
    answer = compute()
    if isinstance(answer, np.ndarray):
        answer.flags.writeable = False
    answers.insert(0, (key, answer))
    del answers[4:]
    return answer

