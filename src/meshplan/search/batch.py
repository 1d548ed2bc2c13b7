"""PlanBatch: many plans that share their categorical settings, with the numeric axes as NumPy arrays.

The cost code (ops, memory, estimate) never branches on a numeric plan field, so it evaluates a PlanBatch
exactly as it evaluates a Plan, one element per plan (DESIGN.md: one code path for one plan or a million).
Categorical settings (schedule, ZeRO stage, recompute mode, sequence parallelism, precision, overlap and
offload flags) are shared by the whole batch: the search groups plans by them. Placement varies per element
and is carried as the stride of each axis.

PlanBatch's fields are Plan's (``dataclasses.fields(Plan)``), so a field added to Plan needs no second definition:
each of ``NUMERIC`` becomes a column (an int64 array, one element per plan), every other field but ``placement`` and
``tags`` (``CATEGORICAL``) keeps Plan's type and default and is shared by the batch. The placement becomes
``placement_id``, an index into ``placements``, and ``strides`` holds each axis' stride per element.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field, fields, make_dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from meshplan.specs.plan import DENSE_AXES, Plan, revised
from meshplan.xp import Num, recent

_PLAIN = Plan()  # the template PlanBatch.plan fills in (revised: every field of it replaced but the tags)
NUMERIC = ("dp", "tp", "pp", "cp", "tp2", "ep", "etp", "vpp", "last_stage_layers", "micro_batch", "global_batch",
           "summa_panels")
CATEGORICAL = tuple(f.name for f in fields(Plan) if f.name not in NUMERIC and f.name not in ("tags", "placement"))


if TYPE_CHECKING:
    # The checker's view of a batch: a Plan whose NUMERIC fields are columns (the cost code, written for a Plan, takes
    # either: xp.py), with the fields generated below declared (tests/test_batch.py keeps the two lists equal).
    _Base = Plan
else:
    _Base = object


class _Batch(_Base):
    """What a PlanBatch does; its fields are generated from Plan's below."""

    if TYPE_CHECKING:  # a column where Plan holds one int (the override is the point: assignment ignored)
        dp: np.ndarray  # type: ignore[assignment]
        tp: np.ndarray  # type: ignore[assignment]
        pp: np.ndarray  # type: ignore[assignment]
        cp: np.ndarray  # type: ignore[assignment]
        tp2: np.ndarray  # type: ignore[assignment]
        ep: np.ndarray  # type: ignore[assignment]
        etp: np.ndarray  # type: ignore[assignment]
        vpp: np.ndarray  # type: ignore[assignment]
        last_stage_layers: np.ndarray  # type: ignore[assignment]
        micro_batch: np.ndarray  # type: ignore[assignment]
        global_batch: np.ndarray  # type: ignore[assignment]
        summa_panels: np.ndarray  # type: ignore[assignment]
        placement_id: np.ndarray
        placements: tuple[tuple[str, ...], ...]
        strides: dict[str, np.ndarray]  # None (the default) only until __post_init__ computes it

        def __init__(self, **fields: Any) -> None: ...

    @classmethod
    def of(cls, plans: Sequence[Plan]) -> PlanBatch:
        """Stack plans that agree on every categorical setting."""
        first = plans[0]
        for p in plans[1:]:
            for name in CATEGORICAL:
                if getattr(p, name) != getattr(first, name):
                    raise ValueError(f"plans differ in {name}: {getattr(first, name)!r} vs {getattr(p, name)!r}")
        placements = tuple(dict.fromkeys(p.placement for p in plans))
        numeric = {n: np.array([getattr(p, n) for p in plans], dtype=np.int64) for n in NUMERIC}
        ids = np.array([placements.index(p.placement) for p in plans], dtype=np.int64)
        return cls(**numeric, placement_id=ids, placements=placements,
                   **{n: getattr(first, n) for n in CATEGORICAL})

    def __len__(self) -> int:
        return len(self.dp)

    # Plan's own derived sizes, element-wise: their arithmetic does not branch
    num_gpus = Plan.num_gpus

    @property
    def grad_accum(self) -> np.ndarray:  # type: ignore[override]  # Plan's, a column
        """Plan.grad_accum, global_batch // (dp · micro_batch), of the last four column sets asked (``_ACCUM``): the
        batches of one search's settings share their columns (``select(..., **settings)``, ``revised``), and the step
        and memory of a chunk read it dozens of times (an int64 division each, 5 % of a memory pass's elements)."""
        return cast(np.ndarray, recent(_ACCUM, (self.global_batch, self.dp, self.micro_batch),
                                       lambda: np.asarray(Plan.grad_accum.fget(self))))  # type: ignore[attr-defined]

    num_micro_batches = grad_accum  # type: ignore[assignment]  # a column, as grad_accum

    def __post_init__(self) -> None:
        # Per element and axis: the product of the sizes of the axes placed inside it (computed once).
        if self.strides is not None:
            return
        # before[p, i, j]: axis j is placed inside axis i in placement p; stride_i = Π_j size_j^before[p, i, j]
        order = np.array([[list(p).index(a) for a in DENSE_AXES] for p in self.placements])
        before = order[:, None, :] < order[:, :, None]
        strides = np.ones((len(DENSE_AXES), len(self.dp)), dtype=np.int64)
        if before.any():  # each element's (axis, inner axis) pairs gathered at once, then read a pair at a time
            placed = np.ascontiguousarray(np.take(before.reshape(len(before), -1), self.placement_id, axis=0).T)
        for i in range(len(DENSE_AXES)):
            for j, inner in enumerate(DENSE_AXES):
                if before[:, i, j].any():
                    strides[i] *= np.where(placed[i * len(DENSE_AXES) + j], getattr(self, inner), 1)
        object.__setattr__(self, "strides", {a: strides[i] for i, a in enumerate(DENSE_AXES)})

    def stride(self, axis: str) -> np.ndarray:  # type: ignore[override]  # Plan's stride, a column
        """Per element: the product of the sizes of the axes placed inside ``axis``."""
        return self.strides[axis]

    def select(self, index: np.ndarray | slice, **settings: object) -> PlanBatch:
        """The plans at ``index`` (a boolean mask, integer array or slice: the columns' views), optionally with other
        categorical settings; a numeric column given among them is taken as it is (already at ``index``)."""
        given = {n: settings.pop(n) for n in (*NUMERIC, "placement_id") if n in settings}
        numeric = {n: given[n] if n in given else getattr(self, n)[index] for n in (*NUMERIC, "placement_id")}
        shared = {n: getattr(self, n) for n in CATEGORICAL} | settings
        strides = {a: v[index] for a, v in self.strides.items()}
        return type(self)(**numeric, placements=self.placements, strides=strides, **shared)

    def plan(self, i: int) -> Plan:
        """The i-th plan as a Plan."""
        values: dict[str, Any] = {n: int(getattr(self, n)[i]) for n in NUMERIC}
        values |= {n: getattr(self, n) for n in CATEGORICAL}
        values["placement"] = self.placements[int(self.placement_id[i])]
        return revised(_PLAIN, values)  # every field but ``tags`` given: Plan(**values), built faster


# grad_accum's last answers, newest first, with the columns themselves (held, so that their ids are not reused)
_ACCUM: list[tuple[tuple[object, ...], Num]] = []


def _fields() -> list[tuple]:
    """Plan's fields in Plan's order, a column (an array) for each of NUMERIC and Plan's type and default for each of
    CATEGORICAL; then the placement of each element and the strides."""
    plain = Plan()  # a default Plan computes from the others (None: sequence_parallel, schedule) is the plain run's
    columns = [(f.name, "np.ndarray") if f.name in NUMERIC else
               (f.name, f.type, field(default=getattr(plain, f.name) if f.default is None else f.default,
                                      default_factory=f.default_factory))
               for f in fields(Plan) if f.name in NUMERIC or f.name in CATEGORICAL]
    return columns + [
        ("placement_id", "np.ndarray"),  # index into ``placements``
        ("placements", "tuple[tuple[str, ...], ...]", field(default=(DENSE_AXES,))),
        ("strides", "dict[str, np.ndarray] | None", field(default=None)),  # per axis; from the placements if None
    ]


# in the class's namespace, not set after: dataclasses writes a class without one a docstring from inspect.signature
_BATCH_DOC = """Plans as columns: Plan's numeric fields (``NUMERIC``) as int64 arrays, its categorical ones
(``CATEGORICAL``) shared by every plan, the placement as ``placement_id`` into ``placements``."""
if TYPE_CHECKING:
    PlanBatch = _Batch
else:
    PlanBatch = make_dataclass("PlanBatch", _fields(), bases=(_Batch,), frozen=True, eq=False, kw_only=True,
                               namespace={"__module__": __name__, "__doc__": _BATCH_DOC})


def alike(a: PlanBatch, b: PlanBatch) -> bool:
    """Whether two batches can be ``joined``: the same categorical settings and placements."""
    return a.placements == b.placements and all(getattr(a, n) == getattr(b, n) for n in CATEGORICAL)


def same_plans(a: PlanBatch, b: PlanBatch) -> bool:
    """Whether two batches hold the same plans in the same order: ``alike``, every column and stride of one type and
    equal."""
    def same(x: np.ndarray, y: np.ndarray) -> bool:
        return x is y or (x.shape == y.shape and x.dtype == y.dtype and bool((x == y).all()))

    return alike(a, b) and all(same(getattr(a, n), getattr(b, n)) for n in (*NUMERIC, "placement_id")) and \
        a.strides.keys() == b.strides.keys() and all(same(v, b.strides[k]) for k, v in a.strides.items())


def joined(batches: Sequence[PlanBatch]) -> PlanBatch:
    """The plans of ``batches`` (which agree on every categorical setting and on their placements) in one batch, in
    their order: each column the batches' columns end to end."""
    first = batches[0]
    if not all(alike(first, b) for b in batches[1:]):
        raise ValueError("batches joined must share their categorical settings and placements")
    numeric = {n: np.concatenate([getattr(b, n) for b in batches]) for n in (*NUMERIC, "placement_id")}
    strides = {a: np.concatenate([b.strides[a] for b in batches]) for a in first.strides}
    return PlanBatch(**numeric, placements=first.placements, strides=strides,
                     **{n: getattr(first, n) for n in CATEGORICAL})
