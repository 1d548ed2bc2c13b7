"""The ops of each group a step repeats (a layer kind, "embed", "head", "mtp", "p2p") and their times (``Parts``):
built from the op records of each group (``cost/``), timed once (``timed_parts``) and kept for the plans that read
them alike; the units (units.py) sum them into passes (``passes.pass_times``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any

from meshplan.collectives.comm import split_group
from meshplan.collectives.groups import axis_layout
from meshplan.collectives.price import PricedOnce
from meshplan.cost.embed_head import embedding_ops, head_ops, mtp_ops
from meshplan.cost.layers import layer_kinds
from meshplan.cost.pipeline import pipeline_p2p
from meshplan.cost.records import OpCost, same_record
from meshplan.cost.wrapper_work import work_ops
from meshplan.roofline import kept_op_times, op_time
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import DENSE_AXES, Plan
from meshplan.specs.stack import Stack
from meshplan.step.passes import time_ops
from meshplan.xp import Num


@dataclass(frozen=True, slots=True)
class Parts:
    """The ops of each group (a layer kind, "embed", "head", "mtp", "p2p") and their times, and the cluster's host CPU
    time for PyTorch's Python-side work against an x86 DGX host (Cluster.python_host: step/host.on_host); and, per
    kind of work a DeepSpeed optimizer wrapper does every micro-batch that some ZeRO setting of the plan runs
    (cost/wrapper_work.py), what it adds to the layers' and the ends' backward passes, with its times."""

    ops: dict[str, list[OpCost]]
    times: dict[str, list[Num]]
    python_host: float = 1.0
    wrapper_ops: dict[str, dict[str, list[OpCost]]] = field(default_factory=dict)
    wrapper_times: dict[str, dict[str, list[Num]]] = field(default_factory=dict)
    kept: tuple[object, ...] | None = field(default=None, compare=False)  # the kept parts' key (``timed_parts``)

    def with_work(self, work: str) -> Parts:
        """These parts with ``work``'s records at the end of their groups ("": as they are)."""
        if not work:
            return self

        def add(mine: dict[str, list[Any]], theirs: dict[str, list[Any]]) -> dict[str, list[Any]]:
            return {k: v + theirs.get(k, []) for k, v in mine.items()}

        return Parts(add(self.ops, self.wrapper_ops[work]), add(self.times, self.wrapper_times[work]),
                     self.python_host)


def _ops(model: ModelSpec, plan: Plan, stack: Stack) -> dict[str, list[OpCost]]:
    """Ops of one layer of each kind (``kind_fractions``: "dense" and "moe", or a hybrid's blocks), of the
    embedding, the head, what a multi-token-prediction depth adds to its layer and head (``embed_head.mtp_ops``) and a
    pipeline send. One plan's are kept (``_plan_ops``): they do not depend on the cluster, and a what-if prices the same
    plan on many (the property tests, the sweeps of a parameter); by the plan without its dp (``_dp_free``), which no
    op record reads: the plans a strong-scaling sweep prices at each GPU count differ in it alone."""
    if type(plan) is Plan:
        return {k: list(v) for k, v in _plan_ops(model, _dp_free(plan), stack).items()}
    return _build_ops(model, plan, stack)


def _dp_free(plan: Plan) -> Plan:
    """``plan`` with dp = 1 and the default placement: no op record of a layer, the ends or a send (cost/) reads either
    (nor the GPUs or the micro-batches dp sets: where a group sits is ``time_ops``' question, answered from the plan
    itself), so plans differing only in them share them (tests/test_parts_kept.py; a space's every placement)."""
    return plan if plan.dp == 1 and plan.placement == DENSE_AXES else plan.with_(dp=1, placement=DENSE_AXES)


@lru_cache(maxsize=1024)
def _plan_ops(model: ModelSpec, plan: Plan, stack: Stack) -> dict[str, tuple[OpCost, ...]]:
    return {k: tuple(v) for k, v in _build_ops(model, plan, stack).items()}


def _build_ops(model: ModelSpec, plan: Plan, stack: Stack) -> dict[str, list[OpCost]]:
    return layer_kinds(model, plan, stack) | {
        "embed": embedding_ops(model, plan, stack), "head": head_ops(model, plan, stack),
        "mtp": mtp_ops(model, plan, stack), "p2p": pipeline_p2p(model, plan, stack)}


def timed_parts(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency,
                compute: dict[str, list[Num | None]] | None = None, works: tuple[str, ...] | None = None) -> Parts:
    """Ops of each group and their times (``compute``: the non-collective ops' times, computed elsewhere), and the
    records of each kind of wrapper work in ``works`` (default: every kind some setting of the plan runs,
    cost/wrapper_work.possible_work). One plan's, with its works named, are kept (``_kept_parts``) for every plan
    that differs from it only in the layers and the recompute or offload setting of its ranks (``_PER_RANK``) or in
    its optimizer's offload (``_UNREAD``): the search's refinements price a plan and then such variants of it
    (search/refine.py, search/stage_dp.py), and the --mtbf search keeps plans in pairs differing in the offload; and,
    on a cluster of another size, in its dp where its groups split over the tiers alike (``_Read``: the plans of a
    strong-scaling sweep's GPU counts)."""
    if compute is None and works is not None and type(plan) is Plan:
        read = _read(model, cluster, plan, stack, works)
        kept = _kept_parts(model, read, stack, eff, works)
        return Parts({k: list(v) for k, v in kept.ops.items()}, {k: list(v) for k, v in kept.times.items()},
                     kept.python_host, {w: {k: list(v) for k, v in g.items()} for w, g in kept.wrapper_ops.items()},
                     {w: {k: list(v) for k, v in g.items()} for w, g in kept.wrapper_times.items()},
                     (model, read, stack, eff, works))
    return _timed(model, cluster, plan, stack, eff, compute, works)


# what a rank's layer count and recompute or offload setting set: no op record (ops of one layer, the ends, a send)
# nor its time reads them (the recompute is the units': units_for_recomputes; tests/test_parts_kept.py times
# searches' plans both ways)
_PER_RANK: dict[str, object] = {
    "stage_layers": (), "first_stage_layers": 0, "last_stage_layers": 0, "stage_recompute": (), "stage_offload": (),
    "recompute": "none", "recompute_layers": 0, "offload_activations": False, "offload_layers": 0}
# and what no op record nor time reads beside them: the optimizer's offload and the ZeRO stage (only which wrapper work
# a setting runs reads them, cost/wrapper_work.work_of, and the works are named apart; the search's compose shares one
# set of units over its grid's): the --mtbf search's 50 kept plans come in pairs differing in the offload alone (38
# timings -> 26, llama3-70b on 1,024 H100), a space's plans in sets differing in the stage alone (issue 83)
_UNREAD: dict[str, object] = _PER_RANK | {"offload_optimizer": False, "zero": 1}


@dataclass(frozen=True, slots=True)
class _Read:
    """A plan on a cluster, equal to another wherever what its ops and their times read is (``key``): the plan without
    its dp and placement (``_dp_free``), the cluster without its GPU count and its outermost tier's size
    (``_cluster_read``), and how the group of each collective of its ops splits over the cluster's tiers
    (comm.split_group: the one place ``time_ops`` reads the placement, dp's included). Plans of a strong-scaling
    sweep's GPU counts that differ only in dp, or a space's in placements that split their groups alike, are timed
    once (``_kept_parts``)."""

    key: tuple[object, ...]
    cluster: Cluster = field(compare=False)
    plan: Plan = field(compare=False)


def _read(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, works: tuple[str, ...]) -> _Read:
    """``plan`` on ``cluster`` as ``_kept_parts`` keeps it: without its ranks' settings and its optimizer's offload
    (``_UNREAD``), its dp and its placement (which its groups' splits carry)."""
    base = plan.with_(**_UNREAD, dp=1, placement=DENSE_AXES)  # the placement read through the splits alone
    splits = tuple((axis, group, tuple(split_group(cluster, group, axis_layout(plan, axis))))
                   for axis, group in _groups(model, base, stack, works, cluster.python_host))
    return _Read((_cluster_read(cluster), base, splits), cluster, plan)


@lru_cache(maxsize=256)
def _groups(model: ModelSpec, plan: Plan, stack: Stack, works: tuple[str, ...], python_host: float
            ) -> tuple[tuple[str, Num], ...]:
    """Each (axis, group) of a collective of ``plan``'s ops and of its wrapper work's, in a fixed order."""
    records: list[dict[str, Any]] = [_plan_ops(model, plan, stack), *work_ops(
        model, plan, stack, tuple(model.block_counts), works, python_host).values()]
    return tuple(sorted({(c.axis, c.group) for ops in records for group in ops.values() for op in group
                         if (c := op.collective) is not None}))


@lru_cache(maxsize=64)
def _cluster_read(cluster: Cluster) -> tuple[object, ...]:
    """Every field of ``cluster`` but its GPU count and its outermost tier's size, which no op's time reads
    (comm.split_group reads the inner tiers' sizes alone; the last tier holds what is left of a group)."""
    *inner, last = cluster.tiers
    return (tuple(inner), tuple(getattr(last, f.name) for f in fields(last) if f.name != "size"),
            tuple(getattr(cluster, f.name) for f in fields(cluster) if f.compare and f.name not in ("num_gpus",
                                                                                                    "tiers")))


@lru_cache(maxsize=256)
def _kept_parts(model: ModelSpec, read: _Read, stack: Stack, eff: Efficiency, works: tuple[str, ...]) -> Parts:
    return _timed(model, read.cluster, read.plan.with_(**_UNREAD), stack, eff, None, works)


def _timed(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency,
           compute: dict[str, list[Num | None]] | None, works: tuple[str, ...] | None) -> Parts:
    ops = _ops(model, plan, stack)
    if compute is None and type(plan) is Plan:  # its kernels' times, kept for its kept op records (roofline.py)
        compute = kept_op_times(_plan_ops(model, _dp_free(plan), stack), cluster.accelerator, plan.precision, eff)
    extra = work_ops(model, plan, stack, tuple(model.block_counts), works, cluster.python_host)
    priced = PricedOnce()  # the groups' collectives, each distinct one priced once (they repeat across groups too)
    return Parts(ops, {k: time_ops(v, cluster, plan, eff, compute[k] if compute else None, priced)
                       for k, v in ops.items()}, cluster.python_host, extra,
                 {w: {k: time_ops(v, cluster, plan, eff, None, priced) for k, v in groups.items()}
                  for w, groups in extra.items()})


def kernel_parts(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, compute: dict[str, list[Num | None]],
                 ops: dict[str, list[OpCost]] | None = None) -> Parts:
    """``timed_parts`` without the collectives' prices (0 s each) nor any wrapper work: what the forward and backward
    kernel times and the saved bytes of the units read (``pass_times`` sums the kernels apart from the collectives),
    for the search's units of one key per op shape (search/keyed.py), whose collectives are priced per key later.
    ``ops``: the plan's op records where the caller built them already (``plan_ops``)."""
    ops = _ops(model, plan, stack) if ops is None else ops
    return Parts(ops, {k: [0.0 if t is None else t for t in compute[k]] for k in ops}, cluster.python_host)


def plan_ops(model: ModelSpec, plan: Plan, stack: Stack) -> dict[str, list[OpCost]]:
    """The op records of each group of ``plan`` (a plan or a batch of them): what ``compute_times`` and
    ``kernel_parts`` read, built once for both."""
    return _ops(model, plan, stack)


# the groups whose op records read the stack's expert GEMMs (``Stack.expert_gemm`` and, with it, ``dglu_slowdown``):
# cost/mlp_moe.py and cost/moe_permute.py alone read them, for a MoE block, the "moe" layer kind (a hybrid's too); not
# the dense layer's nor a hybrid's other blocks', the ends' ("embed", "head", "mtp": an MTP depth's own layer is a "moe"
# one, which units.py adds) nor a send's (tests/test_twin_ops.py builds them under each choice for every MoE preset)
EXPERT_GROUPS = ("moe",)


def twin_ops(model: ModelSpec, plan: Plan, stack: Stack, other: dict[str, list[OpCost]]) -> dict[str, list[OpCost]]:
    """``plan_ops`` of ``plan`` on ``stack``, given ``other``: the op records of the same plan (or batch) on a stack
    that differs from ``stack`` in its expert GEMMs alone (search/variants.py's twin searches). The groups that do not
    read them (``EXPERT_GROUPS``) are ``other``'s, the same records; the others are built."""
    built = layer_kinds(model, plan, stack, EXPERT_GROUPS)
    return {k: list(built.get(k, v)) for k, v in other.items()}


def compute_times(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency = DEFAULT,
                  ops: dict[str, list[OpCost]] | None = None) -> dict[str, list[Num | None]]:
    """Roofline times of the non-collective ops (None for collectives), which depend on the op shapes only.
    ``ops``: the plan's op records where the caller built them already (``plan_ops``). An op equal to an earlier one
    (``records.same_record``: op_time reads the record alone) takes its time: the layer kinds of a model repeat ops
    (DeepSeek-V3's dense and MoE layers share their attention: 21 of its search's 99 compute ops)."""
    acc = cluster.accelerator
    timed: dict[tuple[str, str, str, str], list[tuple[OpCost, Num]]] = {}  # the ops timed, by name, phase and kind

    def time(op: OpCost) -> Num | None:
        if op.kind == "collective":
            return None
        alike = timed.setdefault((op.name, op.phase, op.kind, op.variant), [])
        for other, t in alike:
            if same_record(op, other):
                return t
        t = op_time(op, acc, plan.precision, eff)
        alike.append((op, t))
        return t

    return {k: [time(op) for op in v] for k, v in (_ops(model, plan, stack) if ops is None else ops).items()}
