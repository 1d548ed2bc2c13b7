"""The per-micro-batch units a step repeats (``Units``): an average layer (with and without the plan's
recompute), the embedding, the head with the multi-token-prediction depths, one pipeline send each way, and the
activation bytes each saves. Built from the ops of each group and their times (parts.py: ``Parts``, ``timed_parts``,
re-exported here) summed by ``passes.pass_times``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

import numpy as np

from meshplan.cost.params import kind_fractions
from meshplan.cost.recompute import compiled, freed_by, per_op, per_op_kept
from meshplan.cost.records import OpCost
from meshplan.memory import layer_input_bytes
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import DEFAULT as DEFAULT_STACK
from meshplan.specs.stack import Stack
from meshplan.step.host import on_host
from meshplan.step.parts import Parts, compute_times, kernel_parts, plan_ops, timed_parts
from meshplan.step.passes import PassTimes, forget_sums, pass_times
from meshplan.xp import Num

# parts.py's names are units' too (re-exported: callers import them from here)
__all__ = ["Parts", "Saved", "Units", "compute_times", "kernel_parts", "plan_ops", "saved_bytes", "timed_parts",
           "unit_costs", "units_for_recomputes"]


def saved_bytes(ops: list[OpCost], recompute: str = "none", modules: tuple[str, ...] = ("core_attn",),
                layer_input: Num = 0.0, compiled: bool = False, scored_before: bool = False) -> Num:
    """Bytes the forward pass keeps for the backward pass (selective recompute of ``modules`` frees some,
    ``ops.RECOMPUTE_MODULES``; a per-op policy keeps its input and what ``per_op_kept(ops, compiled, scored_before)``
    counts: ``scored_before``, ModelSpec.moe_score_before_experts)."""
    if recompute == "selective" and per_op(modules):
        return layer_input + per_op_kept(ops, compiled, scored_before)
    kept = [not freed for freed in freed_by(ops, modules)] if recompute == "selective" else [True] * len(ops)
    return sum((op.saved for op, keep in zip(ops, kept, strict=True) if op.phase == "fwd" and keep), 0.0)


def _layer(model: ModelSpec, plan: Plan, stack: Stack, parts: Parts, recompute: str, eff: Efficiency = DEFAULT,
           met: dict[tuple[str, str, bool], PassTimes] | None = None) -> PassTimes:
    """The average layer: each kind's pass times weighted by its share of the layers (``met``: ``_kind``'s)."""
    kinds = list(kind_fractions(model).items())
    met = {} if met is None else met
    if len(kinds) == 1:
        return _kind(plan, stack, parts, kinds[0][0], recompute, eff, True, met)
    layer: PassTimes | None = None
    for kind, f in kinds:
        times = _kind(plan, stack, parts, kind, recompute, eff, True, met).scaled(f)
        layer = times if layer is None else layer.plus(times)
    assert layer is not None  # kinds holds at least one kind
    return layer


def _kind(plan: Plan, stack: Stack, parts: Parts, kind: str, recompute: str, eff: Efficiency, region: bool,
          met: dict[tuple[str, str, bool], PassTimes]) -> PassTimes:
    """``pass_times`` of one layer of ``kind`` (``region``: as a torch.compile region), kept in ``met`` by kind,
    recompute mode and ``region`` where ``pass_times`` reads it (only a compiled stack's host pays per region:
    host.host_idle's ``region and host.compiled``, HostCost.compiled being Stack.compiled): a multi-token-prediction
    depth's layer (``_head_and_mtp``) is priced as the layers of its kind are, the same records and times, so it takes
    their pass times, the same numbers (DeepSeek-V3's search: 55 of its 339 calls)."""
    key = (kind, recompute, region and bool(stack.compiled))
    if key not in met:
        met[key] = pass_times(parts.ops[kind], parts.times[kind], plan, stack, recompute, eff, region)
    return met[key]


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


# the units of kept parts (``Parts.kept``) by (key, model, stack, efficiency), then by recompute mode: no unit reads
# what the parts' key leaves out of the plan (a rank's layers and setting, the optimizer's offload, dp: ``_units_for``
# reads the recompute modules and what sets the op shapes; tests/test_parts_kept.py), so the variants of a plan that
# the refinements price (search/stage_dp.py: 9 a GPU count) and the --mtbf search's plans of one shape share them.
# The modes under one key: the key (specs hashed field by field, a tuple's hash not kept) hashed once a call, not
# twice per mode asked
_UNITS: dict[tuple[object, ...], dict[str, Units]] = {}
_UNITS_KEPT = 512  # keys


def _kept_units(model: ModelSpec, plan: Plan, stack: Stack, parts: Parts, recomputes: tuple[str, ...],
                eff: Efficiency) -> dict[str, Units]:
    """``units_for_recomputes`` of kept parts, each mode's units computed once (``_UNITS``): the modes not yet known
    computed together, as ``units_for_recomputes`` computes them (each mode's from the shared plain layer and ends)."""
    key = (parts.kept, model, stack, eff)
    modes = _UNITS.get(key)
    known = {} if modes is None else {rc: modes[rc] for rc in recomputes if rc in modes}  # before a full store clears
    missing = tuple(dict.fromkeys(rc for rc in recomputes if rc not in known))
    if missing:
        fresh = units_for_recomputes(model, plan, stack, replace(parts, kept=None), missing, eff)
        if modes is None or len(_UNITS) >= _UNITS_KEPT:
            if len(_UNITS) >= _UNITS_KEPT:
                _UNITS.clear()
            modes = _UNITS[key] = dict(known)
        modes.update(fresh)
        known.update(fresh)
    return {rc: known[rc] for rc in recomputes}


def _units_for(model: ModelSpec, plan: Plan, stack: Stack, parts: Parts, recomputes: tuple[str, ...],
               eff: Efficiency) -> dict[str, Units]:
    """``units_for_recomputes`` of one set of parts, the stack on its host."""
    met: dict[tuple[str, str, bool], PassTimes] = {}  # each layer kind's pass times (``_kind``), the MTP depths' too
    plain = _layer(model, plan, stack, parts, "none", eff, met)
    embed = pass_times(parts.ops["embed"], parts.times["embed"], plan, stack, "none", eff)
    p2p = pass_times(parts.ops["p2p"], parts.times["p2p"], plan, stack, "none", eff)
    embed_saved = saved_bytes(parts.ops["embed"])
    fractions = kind_fractions(model)
    ends: dict[str | bool, tuple[PassTimes, Num]] = {}  # the head, an MTP depth's own ops (full recompute or not)
    units = {}
    for recompute in recomputes:
        redo = plain if recompute == "none" else _layer(model, plan, stack, parts, recompute, eff, met)
        head, head_saved = _head_and_mtp(model, plan, stack, parts, recompute, eff, ends, met)
        saved, eager = (sum(saved_bytes(parts.ops[k], recompute, plan.recompute_modules, layer_input_bytes(model, plan),
                                        c, model.moe_score_before_experts) * f for k, f in fractions.items())
                        for c in (compiled(stack), False))
        whole = recompute == "selective" and per_op(plan.recompute_modules)
        working = sum(saved_bytes(parts.ops[kind]) * f for kind, f in fractions.items()) - eager if whole else 0.0
        units[recompute] = Units(layer=redo, layer_plain=plain, embed=embed, head=head, p2p=p2p, layer_saved=saved,
                                 embed_saved=embed_saved, head_saved=head_saved,
                                 p2p_paid=eff.overlap_slowdown if stack.overlap_pp else 1.0, layer_working=working)
    forget_sums()  # the sums kept for these parts' modes (passes._sums) go with them
    return units


def _head_and_mtp(model: ModelSpec, plan: Plan, stack: Stack, parts: Parts, recompute: str, eff: Efficiency,
                  ends: dict[str | bool, tuple[PassTimes, Num]] | None = None,
                  met: dict[tuple[str, str, bool], PassTimes] | None = None) -> tuple[PassTimes, Num]:
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
        depth = depth.plus(_kind(plan, stack, parts, kind, recompute, eff, False, {} if met is None else met))
        if not full:
            depth_saved = depth_saved + saved_bytes(parts.ops[kind], recompute, plan.recompute_modules)
    return head.plus(depth.scaled(model.mtp_layers)), saved + model.mtp_layers * depth_saved
