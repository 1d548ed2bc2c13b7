"""The one dispatcher: which model prices a collective, chosen by the same rule for training (step/passes.py, the
data-parallel channels), serving (serve/iteration.py, the KV transfer), the sharding planner (autoshard/) and the
weight synchronisation of reinforcement learning (rl/sync.py).

The rule, on the collective's record (comm.Collective) and the library that runs it (``Library``):
1. a group of one: no time;
2. the tensor-parallel all-reduce (axis ``tp``) of a library that runs the serving engines' own one- / two-shot
   kernels (``Library.engine_kernels``) on an accelerator whose kernel cost is measured (``engine_kernel_measured``)
   or whose collective library is not NCCL (protocols.library: RCCL on AMD's GPUs, whose tuner prices RCCL's own
   ring, not the engine's kernel): allreduce.tp_all_reduce, inside tier 0 the slower of NCCL's protocols and the
   measured kernel (NCCL's protocols standing in for an unmeasured one), the hierarchical ring beyond it; every
   other all-reduce, whatever its axis, is rule 4's, so a tensor-parallel all-reduce costs a training plan what the
   same all-reduce costs its data-parallel channel and the sharding planner;
3. a MoE dispatch or combine that names its copies and routed experts (``Collective.copies`` > 1, ``experts`` > 0):
   forwarded through each node (dispatch.py: the flex backend's kernels, ``Collective.backend``); with ``experts``
   0 the plain all-to-all;
4. every other collective by the library's algorithm (``ALGORITHMS``, Plan.collectives): NCCL's (comm.split_time:
   its protocols inside tier 0, the α-β ring / double binary tree / chain beyond it) or MPICH's per-message choice
   that adds the minimum spanning tree (comm.fastest_time; Thakur, Rabenseifner & Gropp 2005 §4).

An engine states only its ``Library``; it never picks a formula itself, so the same collective costs the same wherever
it is priced (tests/test_collectives_agree.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from meshplan.collectives.allreduce import tp_all_reduce
from meshplan.collectives.comm import Collective, Layout, fastest_time, split_group, split_time
from meshplan.collectives.dispatch import dispatch_split
from meshplan.collectives.protocols import library as library_of
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.xp import Num

SplitTime = Callable[[str, Num, Num, list[Num], Cluster, Efficiency], Num]


@dataclass(frozen=True, kw_only=True, slots=True)
class Algorithm:
    """A collective library's algorithm family (rule 4 of the module docstring): the function that prices a
    collective split over the tiers, and its source."""

    time: SplitTime
    source: str


ALGORITHMS: dict[str, Algorithm] = {
    "nccl": Algorithm(time=split_time, source="NVIDIA/nccl src/graph/tuning.cc (protocols inside tier 0); Thakur et "
                      "al. 2005, Chan et al. 2007 (ring, double binary tree, chain beyond it): comm.py"),
    "mst": Algorithm(time=fastest_time, source="Thakur, Rabenseifner & Gropp 2005 §4 (MPICH: the faster of the "
                     "bandwidth-optimal algorithm and the minimum spanning tree per message): comm.mst_time"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Library:
    """What runs an engine's collectives: the algorithm family (``ALGORITHMS``: a training plan's
    ``Plan.collectives``) and whether the engine's own tensor-parallel all-reduce kernels replace NCCL's where
    their cost is measured (serving engines: vLLM's, SGLang's and TensorRT-LLM's custom all-reduce; allreduce.py)."""

    algorithm: str = "nccl"
    engine_kernels: bool = False

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"collective algorithm {self.algorithm!r} is not one of {', '.join(ALGORITHMS)}")


LIBRARIES = {name: Library(algorithm=name) for name in ALGORITHMS}  # a training plan's, by Plan.collectives
NCCL = LIBRARIES["nccl"]  # training's default, the sharding planner's and the weight synchronisation's
SERVING = Library(engine_kernels=True)  # the serving engines: NCCL plus their own all-reduce kernels


def engine_kernel_priced(cluster: Cluster) -> bool:
    """Whether the engines' own all-reduce kernel has a price of its own on ``cluster``'s accelerator: its cost is
    measured (``allreduce_bandwidth``), or the GPU's library is not NCCL, whose protocols then stand in for it."""
    acc = cluster.accelerator
    return acc.allreduce_bandwidth > 0 or library_of(acc.architecture) != "nccl"


def split_seconds(c: Collective, parts: list[Num], cluster: Cluster, eff: Efficiency = DEFAULT,
                  library: Library = NCCL) -> Num:
    """Seconds of one collective ``c`` over its group split over the tiers as ``parts`` (comm.split_group; the ops
    of a layer share a few groups, so callers split each once), by the module docstring's rule."""
    if c.kind == "all_reduce" and c.axis == "tp" and library.engine_kernels and engine_kernel_priced(cluster):
        return tp_all_reduce(c.nbytes, c.group, parts, cluster, eff, custom=True)
    if c.kind == "all_to_all" and c.copies > 1 and bool(np.any(np.asarray(c.experts) > 0)):
        return dispatch_split(c, parts, cluster, eff)
    return ALGORITHMS[library.algorithm].time(c.kind, c.nbytes, c.group, parts, cluster, eff)


def collective_seconds(c: Collective, layout: Layout, cluster: Cluster, eff: Efficiency = DEFAULT,
                       library: Library = NCCL) -> Num:
    """``split_seconds`` of a collective whose group sits on the ranks as ``layout`` (a stride, or strided factors:
    groups.axis_layout)."""
    return split_seconds(c, split_group(cluster, c.group, layout), cluster, eff, library)


def collective_time(kind: str, nbytes: Num, group: Num, layout: Layout, cluster: Cluster, eff: Efficiency = DEFAULT,
                    library: Library = NCCL) -> Num:
    """Seconds for one ``kind`` of ``nbytes`` over ``group`` ranks laid out as ``layout`` (comm.split_group); zero
    for a group of one: ``collective_seconds`` of a collective on no axis of the plan (the data-parallel, pipeline
    and mesh-dimension collectives of callers that hold no op record)."""
    return collective_seconds(Collective(kind, nbytes, "", group), layout, cluster, eff, library)


def priced_on(group: Num, layout: Layout, cluster: Cluster, eff: Efficiency = DEFAULT, library: Library = NCCL
              ) -> Callable[[str, Num, Num], Num]:
    """``collective_time`` of the collectives over one ``group`` laid out as ``layout``, as price(kind, nbytes, group),
    the group split over the tiers once for them all (comm.split_group, a pure function: the same parts each call
    would make; a batch's groups are arrays, which its cache does not keep). A call for another group is priced as
    ``collective_time`` prices it; "another" is an identity test (``of is not group``), so an equal group held in
    another object (a recomputed float or array) is priced that way too: the same answer, without the saved split.
    The data-parallel collectives of a search chunk split their group once, not once a kind
    (step/channels.dp_collectives)."""
    parts = split_group(cluster, group, layout)

    def price(kind: str, nbytes: Num, of: Num) -> Num:
        if of is not group:
            return collective_time(kind, nbytes, of, layout, cluster, eff, library)
        return split_seconds(Collective(kind, nbytes, "", of), parts, cluster, eff, library)

    return price


class PricedOnce:
    """``split_seconds`` for the collectives of one group of ops on one cluster, plan and library (passes.time_ops),
    each distinct collective priced once: a layer repeats its collectives (sequence parallelism's all-gather of the
    same activation before each column-parallel GEMM and again for its weight gradient; DeepSeek-V3's search: 1,206
    collectives timed in 180 groups, 552 distinct). Two collectives are the same when their kind, axis, copies and
    backend are equal, their group and routed experts are the same numbers (arrays: the same object) and their bytes
    have the same bits (arrays: also the same shape and strides), so the answer reused is the one ``split_seconds``
    gives each: the same number, bit for bit. The group's split over the tiers (``parts``) is the axis's and the
    group's on the caller's cluster and plan: one ``PricedOnce`` serves one cluster, plan, efficiency and library
    (parts._timed: all groups of a plan's ops)."""

    __slots__ = ("_scope", "_seen")

    def __init__(self) -> None:
        self._scope: tuple[Cluster, Efficiency, Library] | None = None  # the first call's: every call's (asserted)
        # by kind, axis, group, copies, experts and backend: each collective priced and its price (the collective
        # held here, so that the ids of its arrays in the key are not reused while kept)
        self._seen: dict[tuple[object, ...], list[tuple[Collective, Num]]] = {}

    def seconds(self, c: Collective, parts: list[Num], cluster: Cluster, eff: Efficiency, library: Library) -> Num:
        if self._scope is None:
            self._scope = (cluster, eff, library)
        scope = self._scope
        assert scope[0] is cluster and scope[1] is eff and scope[2] is library, "one PricedOnce a cluster and plan"
        key = (c.kind, c.axis, _held(c.group), c.copies, _held(c.experts), c.backend)
        seen = self._seen.setdefault(key, [])
        for other, one in seen:
            if _same_bits(other.nbytes, c.nbytes):
                return one
        one = split_seconds(c, parts, cluster, eff, library)
        seen.append((c, one))
        return one


def _held(x: Num) -> object:
    """A dict key for a number: an array by its identity (``PricedOnce`` holds it), else its type and value (the sign
    of a zero kept)."""
    if isinstance(x, np.ndarray):
        return id(x)
    return type(x), x, x == 0 and math.copysign(1.0, x) < 0


def _same_bits(a: Num, b: Num) -> bool:
    """``a`` and ``b`` are the same numbers, bit for bit (a NaN's too; -0.0 is not 0.0), of one type; arrays also of
    one shape and layout (NumPy's vector and scalar loops may differ in the last bit)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return (a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype and a.dtype.itemsize == 8
                and bool(np.array_equal(a.view(np.int64), b.view(np.int64))))
    return bool(a == b) and math.copysign(1.0, a) == math.copysign(1.0, b)
