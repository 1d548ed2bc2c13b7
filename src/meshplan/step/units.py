"""The per-micro-batch units a step repeats (``Units``): an average layer (with and without the plan's
recompute), the embedding, the head with the multi-token-prediction depths, one pipeline send each way, and the
activation bytes each saves. Built from the ops of each group (``cost/``) timed once (``timed_parts``) and
summed by ``passes.pass_times``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from operator import attrgetter
from typing import Any

import numpy as np

from meshplan.collectives.comm import split_group
from meshplan.collectives.groups import axis_layout
from meshplan.cost.embed_head import embedding_ops, head_ops, mtp_ops
from meshplan.cost.layers import layer_kinds
from meshplan.cost.params import kind_fractions
from meshplan.cost.pipeline import pipeline_p2p
from meshplan.cost.recompute import compiled, freed_by, per_op, per_op_kept
from meshplan.cost.records import OpCost
from meshplan.cost.wrapper_work import work_ops
from meshplan.memory import layer_input_bytes
from meshplan.roofline import kept_op_times, op_time
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import DENSE_AXES, Plan
from meshplan.specs.stack import DEFAULT as DEFAULT_STACK
from meshplan.specs.stack import Stack
from meshplan.step.host import on_host
from meshplan.step.passes import PassTimes, forget_sums, pass_times, time_ops
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
    return Parts(ops, {k: time_ops(v, cluster, plan, eff, compute[k] if compute else None) for k, v in ops.items()},
                 cluster.python_host, extra,
                 {w: {k: time_ops(v, cluster, plan, eff) for k, v in groups.items()} for w, groups in extra.items()})


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


def compute_times(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency = DEFAULT,
                  ops: dict[str, list[OpCost]] | None = None) -> dict[str, list[Num | None]]:
    """Roofline times of the non-collective ops (None for collectives), which depend on the op shapes only.
    ``ops``: the plan's op records where the caller built them already (``plan_ops``)."""
    acc = cluster.accelerator
    return {k: [None if op.kind == "collective" else op_time(op, acc, plan.precision, eff) for op in v]
            for k, v in (_ops(model, plan, stack) if ops is None else ops).items()}


def saved_bytes(ops: list[OpCost], recompute: str = "none", modules: tuple[str, ...] = ("core_attn",),
                layer_input: Num = 0.0, compiled: bool = False) -> Num:
    """Bytes the forward pass keeps for the backward pass (selective recompute of ``modules`` frees some,
    ``ops.RECOMPUTE_MODULES``; a per-op policy keeps its input and what ``per_op_kept(ops, compiled)`` counts)."""
    if recompute == "selective" and per_op(modules):
        return layer_input + per_op_kept(ops, compiled)
    kept = [not freed for freed in freed_by(ops, modules)] if recompute == "selective" else [True] * len(ops)
    return sum((op.saved for op, keep in zip(ops, kept, strict=True) if op.phase == "fwd" and keep), 0.0)


def _layer(model: ModelSpec, plan: Plan, stack: Stack, parts: Parts, recompute: str, eff: Efficiency = DEFAULT
           ) -> PassTimes:
    """The average layer: each kind's pass times weighted by its share of the layers."""
    kinds = list(kind_fractions(model).items())
    if len(kinds) == 1:
        return pass_times(parts.ops[kinds[0][0]], parts.times[kinds[0][0]], plan, stack, recompute, eff, True)
    layer: PassTimes | None = None
    for kind, f in kinds:
        times = pass_times(parts.ops[kind], parts.times[kind], plan, stack, recompute, eff, True).scaled(f)
        layer = times if layer is None else layer.plus(times)
    assert layer is not None  # kinds holds at least one kind
    return layer


@dataclass(frozen=True, slots=True)
class Units:
    """Per-micro-batch costs of the pieces a step repeats: an average layer (with and without the plan's
    recompute), the embedding, the head, one pipeline send each way, and the activations each saves.

    They depend only on tp, cp, micro-batch, ep, etp, the tp / cp / pp strides and the categorical settings,
    so the search computes them once per distinct key and ``assemble`` reuses them across plans.
    """

    layer: PassTimes
    layer_plain: PassTimes
    embed: PassTimes
    head: PassTimes
    p2p: PassTimes
    layer_saved: Num
    embed_saved: Num
    head_saved: Num
    p2p_paid: Num  # slowdown per second of a pipeline send hidden behind compute: overlap_pp's, else 1 (exposed)
    # the same units under each kind of work a DeepSpeed optimizer wrapper does every micro-batch that some ZeRO
    # setting of the plan runs (cost/wrapper_work.py); the step picks per setting (``under``)
    wrapped: dict[str, Units] | None = None
    # what one layer's recompute holds beyond ``layer_saved`` while the backward pass reruns it under a per-op policy
    # over the whole layer (torchtitan's op_sac): the layer's other saved activations (memory.activation_bytes)
    layer_working: Num = 0.0

    def under(self, work: str) -> Units:
        """The units of a setting whose wrapper does ``work`` every micro-batch (cost/wrapper_work.work_of; "":
        none). Units built without that work's twin fail here rather than price the setting without it."""
        if not work:
            return self
        if self.wrapped is None or work not in self.wrapped:
            raise KeyError(f"units without the twin of wrapper work {work!r} (timed_parts' works)")
        return self.wrapped[work]

    def saved(self, index: Any) -> Saved:
        """The saved-activation fields at ``index`` (NumPy fancy indexing): all a step's memory reads of its units."""
        def pick(v: Num) -> Num:
            return v[index] if isinstance(v, np.ndarray) and v.shape else v

        return Saved(pick(self.layer_saved), pick(self.embed_saved), pick(self.head_saved), pick(self.layer_working))

    def take(self, index: Any) -> Units:
        """Select elements (NumPy fancy indexing) of every array field (the search's, 10^4 fields a sweep: a
        PassTimes' fields read at once)."""
        def pick(v: Any) -> Any:  # a Num field
            return v[index] if isinstance(v, np.ndarray) and v.shape else v

        def each(v: Any) -> Any:  # a field: PassTimes, Num, or the wrapped twins (work -> Units, or None)
            if isinstance(v, PassTimes):
                return PassTimes(*[pick(x) for x in _pass_fields(v)])
            if isinstance(v, dict):
                return {w: u.take(index) for w, u in v.items()}
            return pick(v)

        return Units(*[each(v) for v in _unit_fields(self)])


_pass_fields, _unit_fields = attrgetter(*PassTimes.__slots__), attrgetter(*Units.__slots__)  # every field, in order


@dataclass(frozen=True, slots=True)
class Saved:
    """What a step's memory reads of its units (step/memory.py): the activation bytes each piece saves, and what a
    per-op recompute holds beyond them (``Units`` has the same fields)."""

    layer_saved: Num
    embed_saved: Num
    head_saved: Num
    layer_working: Num = 0.0


def unit_costs(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack = DEFAULT_STACK,
               eff: Efficiency = DEFAULT, parts: Parts | None = None) -> Units:
    parts = parts or timed_parts(model, cluster, plan, stack, eff)
    return units_for_recomputes(model, plan, stack, parts, (plan.recompute,), eff)[plan.recompute]


def units_for_recomputes(model: ModelSpec, plan: Plan, stack: Stack, parts: Parts, recomputes: tuple[str, ...],
                         eff: Efficiency = DEFAULT) -> dict[str, Units]:
    """The units of ``plan`` under each recompute mode: the ops and their times do not depend on it, only
    how they are summed (and which saved activations are kept), so the modes share one ``timed_parts`` and
    everything but the layer's recompute sum and saved bytes. The host pays the stack's costs at its own speed
    (``on_host``). Each carries its twin under each kind of wrapper work of ``parts`` (``Units.wrapped``)."""
    if parts.kept is not None:  # parts kept for such plans (timed_parts): so are their units
        return _kept_units(model, plan, stack, parts, recomputes, eff)
    hosted = on_host(stack, parts.python_host)
    units = _units_for(model, plan, hosted, parts, recomputes, eff)
    if not parts.wrapper_ops:
        return units
    twins = {w: _units_for(model, plan, hosted, parts.with_work(w), recomputes, eff) for w in parts.wrapper_ops}
    return {rc: replace(u, wrapped={w: t[rc] for w, t in twins.items()}) for rc, u in units.items()}


# the units of kept parts (``Parts.kept``) by (key, stack, efficiency, recompute mode): no unit reads what the parts'
# key leaves out of the plan (a rank's layers and setting, the optimizer's offload, dp: ``_units_for`` reads the
# recompute modules and what sets the op shapes; tests/test_parts_kept.py), so the variants of a plan that the
# refinements price (search/stage_dp.py: 9 a GPU count) and the --mtbf search's plans of one shape share them
_UNITS: dict[tuple[object, ...], Units] = {}
_UNITS_KEPT = 1024


def _kept_units(model: ModelSpec, plan: Plan, stack: Stack, parts: Parts, recomputes: tuple[str, ...],
                eff: Efficiency) -> dict[str, Units]:
    """``units_for_recomputes`` of kept parts, each mode's units computed once (``_UNITS``): the modes not yet known
    computed together, as ``units_for_recomputes`` computes them (each mode's from the shared plain layer and ends)."""
    key = (parts.kept, model, stack, eff)
    known = {rc: _UNITS[(key, rc)] for rc in recomputes if (key, rc) in _UNITS}  # read before a full store clears
    missing = tuple(dict.fromkeys(rc for rc in recomputes if rc not in known))
    if missing:
        if len(_UNITS) >= _UNITS_KEPT:
            _UNITS.clear()
        fresh = units_for_recomputes(model, plan, stack, replace(parts, kept=None), missing, eff)
        _UNITS.update({(key, rc): u for rc, u in fresh.items()})
        known.update(fresh)
    return {rc: known[rc] for rc in recomputes}


def _units_for(model: ModelSpec, plan: Plan, stack: Stack, parts: Parts, recomputes: tuple[str, ...],
               eff: Efficiency) -> dict[str, Units]:
    """``units_for_recomputes`` of one set of parts, the stack on its host."""
    plain = _layer(model, plan, stack, parts, "none", eff)
    embed = pass_times(parts.ops["embed"], parts.times["embed"], plan, stack, "none", eff)
    p2p = pass_times(parts.ops["p2p"], parts.times["p2p"], plan, stack, "none", eff)
    embed_saved = saved_bytes(parts.ops["embed"])
    fractions = kind_fractions(model)
    ends: dict[str | bool, tuple[PassTimes, Num]] = {}  # the head, an MTP depth's own ops (full recompute or not)
    units = {}
    for recompute in recomputes:
        redo = plain if recompute == "none" else _layer(model, plan, stack, parts, recompute, eff)
        head, head_saved = _head_and_mtp(model, plan, stack, parts, recompute, eff, ends)
        saved, eager = (sum(saved_bytes(parts.ops[k], recompute, plan.recompute_modules, layer_input_bytes(model, plan),
                                        c) * f for k, f in fractions.items()) for c in (compiled(stack), False))
        whole = recompute == "selective" and per_op(plan.recompute_modules)
        working = sum(saved_bytes(parts.ops[kind]) * f for kind, f in fractions.items()) - eager if whole else 0.0
        units[recompute] = Units(layer=redo, layer_plain=plain, embed=embed, head=head, p2p=p2p, layer_saved=saved,
                                 embed_saved=embed_saved, head_saved=head_saved,
                                 p2p_paid=eff.overlap_slowdown if stack.overlap_pp else 1.0, layer_working=working)
    forget_sums()  # the sums kept for these parts' modes (passes._sums) go with them
    return units


def _head_and_mtp(model: ModelSpec, plan: Plan, stack: Stack, parts: Parts, recompute: str, eff: Efficiency,
                  ends: dict[str | bool, tuple[PassTimes, Num]] | None = None) -> tuple[PassTimes, Num]:
    """The last stage's head per micro-batch, and what it saves: the final norm, LM head and loss, and per
    multi-token-prediction depth its own ops (``embed_head.mtp_ops``), one layer of each of ``mtp_kinds`` and the head
    again (Megatron-Core's MTP layers share the output layer). Recompute as Megatron-Core's
    MultiTokenPredictionLayer: under full recompute it checkpoints the projection and its layer
    (``_checkpointed_forward(self._proj_and_transformer_layer, …)``), which then keep only their two inputs, the
    previous hidden state and the next tokens' embedding; its layer applies the selective modules as the others."""
    ends = {} if ends is None else ends  # what the recompute modes share: the head, a depth's own ops
    if "head" not in ends:
        ends["head"] = (pass_times(parts.ops["head"], parts.times["head"], plan, stack, "none", eff),
                        saved_bytes(parts.ops["head"]))
    head, saved = ends["head"]
    if not model.mtp_layers:
        return head, saved
    full = recompute == "full"
    if full not in ends:
        ends[full] = (pass_times(parts.ops["mtp"], parts.times["mtp"], plan, stack, "full" if full else "none",
                                 eff).plus(head), 0.0)
    depth = ends[full][0]
    depth_saved = saved + (2 * layer_input_bytes(model, plan) if full else saved_bytes(parts.ops["mtp"]))
    for kind in model.mtp_kinds:
        depth = depth.plus(pass_times(parts.ops[kind], parts.times[kind], plan, stack, recompute, eff))
        if not full:
            depth_saved = depth_saved + saved_bytes(parts.ops[kind], recompute, plan.recompute_modules)
    return head.plus(depth.scaled(model.mtp_layers)), saved + model.mtp_layers * depth_saved
