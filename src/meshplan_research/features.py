"""Static features of an op, for the learned model (learned.py): what is known before anything runs, from the
trace (FLOPs, bytes, shapes, dtype, class, phase), the step's memory pattern (reuse distance,
meshplan.measure.reuse) and the graph (kernel launches, the length of the fused chain it belongs to,
meshplan.trace.fusion). No torch here; numpy only.

Sizes enter as log(1 + x): an op's time grows with them over six decades, and trees split a log axis evenly.
The aten op's name is a categorical feature (ordinal codes of the names seen in training; an unseen name is
missing, which the trees send down the side most training ops went).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from meshplan.trace.classes import CLASSES, aten_name

PHASES = ("fwd", "bwd_x", "bwd_w", "opt")
NUMERIC = ("log_flops", "log_read", "log_written", "log_out_numel", "log_in_numel", "inputs", "outputs",
           "log_intensity", "log_m", "log_n", "log_k", "log_groups", "log_distance", "chain_ops", "in_chain",
           "launches", "itemsize", "inplace")
NAMES = (*NUMERIC, *(f"class_{c}" for c in CLASSES), *(f"phase_{p}" for p in PHASES), "target")


def _numel(tensors: Sequence[str]) -> int:
    """The largest element count of ``["4x128x256:float32", …]`` (meshplan.measure.records)."""
    best = 0
    for text in tensors:
        n = 1
        for s in text.split(":")[0].split("x"):
            n *= int(s) if s else 1
        best = max(best, n)
    return best


def _itemsize(dtype: str) -> int:
    for key, size in (("float64", 8), ("int64", 8), ("float32", 4), ("int32", 4), ("16", 2), ("8", 1),
                      ("bool", 1)):
        if key in dtype:
            return size
    return 4


def numeric(rec: dict[str, Any]) -> list[float]:
    """The numeric features of one op record (records.op_records)."""
    nbytes = rec["bytes_read"] + rec["bytes_written"]
    tensors = rec["outputs"] or rec["inputs"] or [":float32"]
    out_dtype = tensors[0].split(":")[-1]
    return [math.log1p(rec["flops"]), math.log1p(rec["bytes_read"]), math.log1p(rec["bytes_written"]),
            math.log1p(_numel(rec["outputs"])), math.log1p(_numel(rec["inputs"])), len(rec["inputs"]),
            len(rec["outputs"]), math.log1p(rec["flops"] / nbytes if nbytes else 0.0), math.log1p(rec["m"]),
            math.log1p(rec["n"]), math.log1p(rec["k"]), math.log1p(rec["groups"]),
            math.log1p(max(rec["distance"], 0.0)), rec["group_ops"], float(rec["group"] >= 0), rec["launches"],
            _itemsize(out_dtype), float(aten_name(rec["target"]).endswith("_"))]


_CACHE: dict[int, tuple[dict[str, Any], list[float]]] = {}


def _fixed(rec: dict[str, Any]) -> list[float]:
    """The features that do not depend on the training set, memoised per record object (a leave-one-model-out
    evaluation asks for each record's features once per fold and method)."""
    hit = _CACHE.get(id(rec))
    if hit is not None and hit[0] is rec:
        return hit[1]
    row = numeric(rec) + [float(rec["cls"] == c) for c in CLASSES] + [float(rec["phase"] == p) for p in PHASES]
    if len(_CACHE) > 200_000:
        _CACHE.clear()
    _CACHE[id(rec)] = (rec, row)
    return row


def matrix(records: Sequence[dict[str, Any]], vocabulary: dict[str, int]) -> np.ndarray:
    """One row of NAMES per op record; the target name coded by ``vocabulary`` (NaN when absent)."""
    rows = [[*_fixed(rec), float(vocabulary.get(aten_name(rec["target"]), np.nan))] for rec in records]
    return np.asarray(rows, dtype=float).reshape(len(rows), len(NAMES))


def vocabulary(records: Sequence[dict[str, Any]], limit: int = 250) -> dict[str, int]:
    """Ordinal codes of the most frequent aten names (HistGradientBoosting takes up to 255 categories)."""
    counts: dict[str, int] = {}
    for rec in records:
        name = aten_name(rec["target"])
        counts[name] = counts.get(name, 0) + 1
    ranked = sorted(counts, key=lambda n: (-counts[n], n))[:limit]
    return {name: i for i, name in enumerate(sorted(ranked))}
