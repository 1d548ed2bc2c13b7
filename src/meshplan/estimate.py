"""estimate(model, cluster, plan) -> Estimate: the one place that composes costs into a training step.

Per micro-batch, on each pipeline rank (the first holds the embedding, the last the LM head):
    t_rank = Σ_layers (fwd + bwd kernels) + recompute + exposed TP / CP / EP communication + pipeline p2p
Per step, the busier of the first and the last rank (channels.py: its m passes each way with the data-parallel
collectives and offload copies that share them, and its optimizer step), and the bubble (a flow shop,
``bubble_time``: the other ranks' times once, over v; with equal ranks (p-1)/m for 1F1B and (p-1)/(v·m) for the
interleaved schedule, Narayanan et al. 2021 §2.2):
    t_step = max over the end ranks of (m · t_rank + channels + optimizer) + ((p-2) · t_middle + t_other_end) / v
Overlap rules (stated once, here and in channels.py). A collective that hides behind compute slows it by the overlap
slowdown per second hidden (efficiency.py); a pass's time stays non-decreasing in every op's time (channels.py):
- TP collectives are exposed unless ``stack.overlap_tp``; then they hide behind the GEMMs of the same pass, which they
  share with SUMMA's panel broadcasts: what exceeds the GEMMs is exposed, once.
- Context-parallel K/V exchange hides behind the attention kernel of the same pass (ring attention).
- EP all-to-all (and expert-TP) traffic is exposed unless ``stack.overlap_ep``: Megatron-Core's 1F1B
  all-to-all overlap (MCore v0.14 "batch-level overlapping to hide EP-A2A communication",
  --overlap-moe-expert-parallel-comm --delay-wgrad-compute; the DeepSeek-V3 report §3.2.1 "DualPipe" idea)
  runs the forward of one micro-batch interleaved with the backward of another, node by node on two streams, so
  each of a layer's all-to-alls hides behind the nodes of the other micro-batch that run beside it
  (``combined_1f1b``: the backward's combine behind the forward's attention, both dispatches behind the two
  passes' expert kernels, the forward's combine behind the backward's attention), with the overlap slowdown.
- Pipeline p2p is exposed, unless ``stack.overlap_pp`` and the schedule is interleaved (v > 1): Megatron-Core's
  overlap_p2p_comm posts each send and receive on its own stream and waits for it only before the chunk that
  needs it, so it hides behind the compute of another chunk of the same pass, which it slows by the overlap
  slowdown (a chunk's activation is far smaller than its layers' work; Megatron-Bridge training/comm_overlap.py
  turns it on for every interleaved schedule, Megatron-LM's --no-overlap-p2p-communication defaults it on there).
- DP gradient reduction and the distributed optimizer's parameter all-gather (Megatron overlap-grad-reduce /
  overlap-param-gather, when ``stack.overlap_dp``), ZeRO-3's gathers and activation offload share the passes they
  run beside with the traffic above, each on its own link (channels.py).
The arithmetic accepts NumPy arrays in the numeric plan fields, so the search evaluates many plans with this
same code (``step_costs``); ``estimate`` adds the per-op table and the feasibility verdict for one plan.

MFU counts model FLOPs: 6·N per token for the matmul parameters N (embedding lookup excluded, LM head
included) plus 6·s·A·(d_qk + d_v) per layer for attention, without causal savings (PaLM, Chowdhery et al.
2022, App. B), against the dense peak of the plan's precision (an fp8 plan against the fp8 peak, so that MFU is at
most 1; ``mfu_bf16`` against the 16-bit peak, the basis NVIDIA's FP8 tables quote). HFU adds the FLOPs of recomputed
forward passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property, lru_cache
from typing import Any, TypeVar

import numpy as np

from meshplan.channels import Passes, dp_collectives, offload, optimizer_time, step_channels
from meshplan.comm import split_group, split_time
from meshplan.cost.attention import head_dims
from meshplan.cost.embed_head import embedding_ops, head_ops, mtp_ops
from meshplan.cost.layers import layer_kinds
from meshplan.cost.pipeline import pipeline_p2p
from meshplan.cost.recompute import RECOMPUTE_MODULES, freed_by, rerun_by, tp_rerun_by
from meshplan.cost.records import ACT_BYTES, FP32, OpCost, token_rows
from meshplan.groups import axis_layout
from meshplan.memory import (
    WEIGHT_BYTES,
    Memory,
    activation_bytes,
    embedding_in_flight,
    kind_fractions,
    layer_params,
    layers_on_last,
    layers_on_stage,
    model_states,
    offloaded_layers,
    stage_params,
    trainable,
)
from meshplan.roofline import compute_time, memory_time, op_time
from meshplan.specs.check import validate
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import DEFAULT as DEFAULT_STACK
from meshplan.specs.stack import Stack
from meshplan.units import fmt_bytes
from meshplan.xp import Num, maximum, minimum, where

COMPONENTS = ("compute", "recompute", "tp", "cp", "ep", "pp", "bubble", "dp", "optimizer", "offload")
MEMORY = ("weights", "grads", "optimizer", "activations", "buffers")
T = TypeVar("T")  # PassTimes, or a total (float / array)
ZERO = 0.0  # the one object PassTimes.total skips


# ---- timing a list of ops ---------------------------------------------------------------------------------
def time_ops(ops: list[OpCost], cluster: Cluster, plan: Plan, eff: Efficiency,
             compute: list[Num | None] | None = None) -> list[Num]:
    """Seconds of each op: collectives by comm.py, the rest by the roofline (or taken from ``compute``, the
    same ops' times computed elsewhere: the search times compute ops once per shape, not per placement)."""
    times, splits = [], {}
    for i, op in enumerate(ops):
        if op.kind == "collective":
            c = op.collective
            key = (c.axis, id(c.group) if isinstance(c.group, np.ndarray) else c.group)
            if key not in splits:  # the ops of a layer use a few groups: split each over the tiers once
                # (the group is kept with its split so that its id is not reused by another array meanwhile)
                splits[key] = (c.group, split_group(cluster, c.group, axis_layout(plan, c.axis)))
            one = split_time(c.kind, c.nbytes, c.group, splits[key][1], cluster, eff)
            times.append(one * op.repeat if type(op.repeat) is not float or op.repeat != 1.0 else one)
        elif compute is not None:
            times.append(compute[i])
        else:
            times.append(op_time(op, cluster.accelerator, plan.precision, eff))
    return times


@dataclass(frozen=True, slots=True)
class PassTimes:
    """Per micro-batch times of a group of ops (a layer, the embedding, the head), split by component, and what the
    step-level channels (channels.py) need of each pass: the forward pass's share of the exposed communication and
    the communication each pass hides under its kernels."""

    fwd: Num = 0.0  # forward kernels
    bwd: Num = 0.0  # backward kernels
    recompute: Num = 0.0
    tp: Num = 0.0
    cp: Num = 0.0
    ep: Num = 0.0
    pp: Num = 0.0
    fwd_comm: Num = 0.0  # of tp + cp + ep + pp: the forward pass's (the rest is the backward's)
    hidden_f: Num = 0.0  # communication seconds hidden under the forward kernels (H of channels.py)
    hidden_b: Num = 0.0  # ... under the backward kernels and the recompute

    @property
    def total(self) -> Num:
        total = self.fwd + self.bwd
        for part in (self.recompute, self.tp, self.cp, self.ep, self.pp):
            if part is not ZERO:  # components that are the constant 0.0 (``lean``) are skipped, not added
                total = total + part
        return total

    def lean(self) -> PassTimes:
        """The same passes with the communication components folded into ``tp`` (for code that needs only the
        passes, not their breakdown: the search's ranking)."""
        comm = self.total - self.fwd - self.bwd - self.recompute
        return PassTimes(self.fwd, self.bwd, self.recompute, comm, ZERO, ZERO, ZERO, self.fwd_comm, self.hidden_f,
                         self.hidden_b)

    def scaled(self, k: Num) -> PassTimes:
        return PassTimes(*(v if v is ZERO else v * k for v in (getattr(self, f) for f in PassTimes.__slots__)))

    def plus(self, other: PassTimes) -> PassTimes:
        return PassTimes(*(a if b is ZERO else b if a is ZERO else a + b
                           for a, b in ((getattr(self, f), getattr(other, f)) for f in PassTimes.__slots__)))

    def passes(self) -> Passes:
        """The forward and backward pass: T, K and H of channels.py."""
        t_f = self.fwd + self.fwd_comm
        return Passes(t_f=t_f, t_b=self.total - t_f, k_f=self.fwd, k_b=self.bwd + self.recompute,
                      h_f=self.hidden_f, h_b=self.hidden_b)


def pass_times(ops: list[OpCost], times: list[Num], plan: Plan, stack: Stack, recompute: str,
               eff: Efficiency = DEFAULT) -> PassTimes:
    """Sum kernels per pass, apply the overlap rules, add recompute (``"full"``: the forward again;
    ``"selective"``: the forward kernels of ``plan.recompute_modules`` again, ``ops.RECOMPUTE_MODULES``, with a
    recomputed MoE layer's exposed forward all-to-alls). A hidden collective still slows the compute it
    overlaps by ``eff.overlap_slowdown`` × its hidden time (SMs and HBM it takes; efficiency.py); that cost
    is booked under the collective's component."""
    s: dict[tuple[str, str], Num] = {}
    owned: set[tuple[str, str]] = set()  # sums this function allocated: safe to add into in place

    def add(key: tuple[str, str], t: Num) -> None:
        cur = s.get(key, 0.0)
        if key in owned and cur.shape == np.shape(t) and cur.dtype == np.result_type(cur, t):
            np.add(cur, t, out=cur)  # the search's arrays hold 10^5 keys: no new array per op
            return
        s[key] = cur + t
        if isinstance(s[key], np.ndarray):
            owned.add(key)

    paired = stack.overlap_ep and any(op.name in _A2A_NODES for op in ops)
    for op, t in zip(ops, times, strict=True):
        ph = "f" if op.phase == "fwd" else "b"
        if paired and (op.name in _A2A_NODES or op.name.startswith("moe/experts/")):
            add(_a2a_node(op), t)  # the combined 1F1B schedule's expert and all-to-all nodes, apart
        if op.collective is None:
            add((ph, op.kind), t)
        elif op.overlap in ("tp", "cp"):
            add((ph, op.overlap), t)
        elif op.overlap == "summa":
            add((ph, "summa"), t)
            add((ph, "summa_panel"), t / op.repeat)
        else:  # exposed, under its axis (expert-TP under ep; the K/V exchange across tp2 under cp)
            add((ph, {"etp": "ep", "tp2": "cp"}.get(op.collective.axis, op.collective.axis) + "_exposed"), t)
    g = s.get
    kernels = {ph: g((ph, "gemm"), 0.0) + g((ph, "attention"), 0.0) + g((ph, "memory"), 0.0) for ph in "fb"}
    tp, cp, ep, hidden = {}, {}, {}, {}
    sd = eff.overlap_slowdown
    for ph in "fb":
        gemm, attention, ring = g((ph, "gemm"), 0.0), g((ph, "attention"), 0.0), g((ph, "cp"), 0.0)
        behind = g((ph, "tp"), 0.0) if stack.overlap_tp else 0.0  # TP collectives that hide behind the GEMMs
        summa = g((ph, "summa"), 0.0)
        # the GEMMs of the pass are one window for the TP collectives that hide (slowing them by σ per second
        # hidden) and SUMMA's panel broadcasts after the first (seed 003: the first panel is exposed, the rest
        # hides; priced without slowdown as seed 003 does): what exceeds the window is exposed, once
        tp[ph] = (0.0 if stack.overlap_tp else g((ph, "tp"), 0.0)) + g((ph, "tp_exposed"), 0.0) + g(
            (ph, "summa_panel"), 0.0)
        if not (_none(behind) and _none(summa)):
            tp[ph] = tp[ph] + maximum(0.0, behind + summa - gemm) + sd * minimum(behind, gemm)
        cp[ph] = g((ph, "cp_exposed"), 0.0) if _none(ring) else hide(ring, attention, sd) + g((ph, "cp_exposed"), 0.0)
        ep[ph] = g((ph, "ep_exposed"), 0.0)
        hidden[ph] = (0.0 if _none(behind) else minimum(behind, gemm)) + (
            0.0 if _none(ring) else minimum(ring, attention))
    if paired:  # forward all-to-all behind the other micro-batch's backward kernels, and vice versa
        ep, hidden_ep = combined_1f1b(s, kernels, ep, sd)
        hidden = {ph: hidden[ph] + hidden_ep[ph] for ph in "fb"}
    hidden_b = hidden["b"]
    if recompute == "full":
        redo = kernels["f"] + tp["f"] + cp["f"] + ep["f"]
        hidden_b = hidden_b + hidden["f"]
    elif recompute == "selective":
        redo, again = _selective_redo(ops, times, plan, stack, ep["f"], sd)
        hidden_b = hidden_b + again
    else:
        redo = 0.0
    pp = {ph: g((ph, "pp_exposed"), 0.0) for ph in "fb"}
    return PassTimes(fwd=kernels["f"], bwd=kernels["b"], recompute=redo, tp=tp["f"] + tp["b"],
                     cp=cp["f"] + cp["b"], ep=ep["f"] + ep["b"], pp=pp["f"] + pp["b"],
                     fwd_comm=tp["f"] + cp["f"] + ep["f"] + pp["f"], hidden_f=hidden["f"], hidden_b=hidden_b)


def _none(x: Num) -> bool:
    """``x`` is the float 0.0 (no op of that kind): arithmetic with it can be skipped, keeping sums scalar."""
    return type(x) is float and x == 0.0


def _selective_redo(ops: list[OpCost], times: list[Num], plan: Plan, stack: Stack, ep_exposed: Num,
                    slowdown: float) -> tuple[Num, Num]:
    """What selective recompute of ``plan.recompute_modules`` adds to the backward pass, and the communication it
    hides: their forward kernels again; the TP collectives inside them again (``ops.tp_rerun_by``), those that hide
    behind GEMMs (``stack.overlap_tp``) behind the re-run GEMMs (``hide``), the others exposed; and a recomputed MoE
    layer's exposed forward all-to-alls."""
    modules = plan.recompute_modules
    redo = gemm = behind = exposed = 0.0
    for op, t, again in zip(ops, times, rerun_by(ops, modules), strict=True):
        if again:
            redo = redo + t
            if op.kind == "gemm":
                gemm = gemm + t
    for op, t, again in zip(ops, times, tp_rerun_by(ops, modules), strict=True):
        if again and stack.overlap_tp and op.overlap == "tp":
            behind = behind + t
        elif again:
            exposed = exposed + t
    redo = redo + exposed
    if any(RECOMPUTE_MODULES[m].all_to_all for m in modules):
        redo = redo + ep_exposed
    if _none(behind):
        return redo, 0.0
    return redo + hide(behind, gemm, slowdown), minimum(behind, gemm)


# Megatron-Core's combined 1F1B schedule (--overlap-moe-expert-parallel-comm) runs a MoE layer's forward for one
# micro-batch beside its backward for another, node by node on two streams (megatron/core/models/common/
# model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run):
#     comm_stream: combine_bwd | dispatch_fwd -> dispatch_bwd        | combine_fwd
#     comp_stream: attn_fwd    | mlp_bwd -> mlp_bwd_dw -> mlp_fwd    | attn_bwd
# The all-to-all nodes are the token dispatch and combine; the expert-TP gather and reduce-scatter run in the mlp
# node's pre- and post-processing on the compute stream (exposed, as without the overlap).
_A2A_NODES = {"moe/dispatch": "d", "moe/combine": "c"}


def _a2a_node(op: OpCost) -> tuple[str, str]:
    """The sum a MoE op's time also adds to for the combined schedule: ("fd" / "bd", "a2a") the forward / backward
    dispatch, ("fc" / "bc", "a2a") the combines; ("f" / "b" / "w", "experts") the experts' forward, input-gradient
    and weight-gradient kernels (the mlp node)."""
    ph = "f" if op.phase == "fwd" else "b"
    if op.name in _A2A_NODES:
        return ph + _A2A_NODES[op.name], "a2a"
    return ("f" if op.phase == "fwd" else "b" if op.phase == "bwd_x" else "w"), "experts"


def combined_1f1b(s: dict[tuple[str, str], Num], kernels: dict[str, Num], ep: dict[str, Num], slowdown: float
                  ) -> tuple[dict[str, Num], dict[str, Num]]:
    """The EP time of one MoE layer under the combined 1F1B schedule (the diagram above): each node starts when its
    stream is free and its producer on the other stream is done, so the layer takes
        max(F.attn, B.combine)                                        the first column
      + max(max(F.dispatch, B.mlp) + B.dispatch, max(B.mlp + B.mlp_dw, F.dispatch) + F.mlp)   the middle one
      + max(F.combine, B.attn)                                        the last
    (B.dispatch waits for the experts' input gradients, F.mlp for the forward dispatch). What it takes beyond the
    compute stream's work is the exposed all-to-all; the rest hides and slows the compute by ``slowdown`` × its length
    (as ``hide``). Returned per pass, half each, with the all-to-all time that hides."""
    g = s.get
    f_dispatch, f_combine, b_dispatch, b_combine = (g((k, "a2a"), 0.0) for k in ("fd", "fc", "bd", "bc"))
    f_mlp, b_mlp, b_mlp_dw = (g((k, "experts"), 0.0) for k in ("f", "b", "w"))
    f_attn, b_attn = kernels["f"] - f_mlp, kernels["b"] - b_mlp - b_mlp_dw
    middle = maximum(maximum(f_dispatch, b_mlp) + b_dispatch, maximum(b_mlp + b_mlp_dw, f_dispatch) + f_mlp)
    layer = maximum(f_attn, b_combine) + middle + maximum(f_combine, b_attn)
    comm = f_dispatch + f_combine + b_dispatch + b_combine
    exposed = maximum(0.0, layer - kernels["f"] - kernels["b"])
    cost = exposed + slowdown * maximum(0.0, comm - exposed)
    share = 0.5  # the two passes run together, node by node: their shared cost is split evenly (a split by their
    # all-to-all times would move with the rates and make one pass longer when a link gets faster)
    hidden = maximum(0.0, comm - exposed)
    return ({"f": ep["f"] - f_dispatch - f_combine + cost * share,
             "b": ep["b"] - b_dispatch - b_combine + cost * (1 - share)},
            {"f": hidden * share, "b": hidden * (1 - share)})


def hide(comm: Num, window: Num, slowdown: float) -> Num:
    """Exposed time of ``comm`` seconds of communication overlapped with ``window`` seconds of compute:
    what does not fit, plus the slowdown it inflicts on the compute while it runs (efficiency.py)."""
    return maximum(0.0, comm - window) + slowdown * minimum(comm, window)


# ---- the step -----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StepCosts:
    """Everything the search ranks on. Fields are floats for one plan or arrays for many."""

    breakdown: dict[str, Num]
    step_time: Num
    memory: dict[str, Num]  # of the pipeline rank with the larger footprint
    peak_memory: Num
    stage_fwd: Num  # forward time of one micro-batch on the busiest rank
    stage_bwd: Num
    host_memory: Num = 0.0  # bytes offloaded to this GPU's share of host memory
    # per micro-batch (forward, backward) of the first, a middle and the last pipeline rank, each pass with its own
    # exposed communication (``PassTimes.passes``): what the timeline simulates
    ranks: tuple[tuple[Num, Num], ...] = ()
    rank_memory: tuple[Num, Num] = (0.0, 0.0)  # peak memory of the first and of the last pipeline rank
    use_first: Num = True  # the first pipeline rank takes the longer step (else the last): the breakdown's rank


@dataclass(frozen=True, slots=True)
class _Parts:
    ops: dict[str, list[OpCost]]
    times: dict[str, list[Num]]


def _ops(model: ModelSpec, plan: Plan, stack: Stack) -> dict[str, list[OpCost]]:
    """Ops of one layer of each kind (``kind_fractions``: "dense" and "moe", or a hybrid's blocks), of the
    embedding, the head, what a multi-token-prediction depth adds to its layer and head (``ops.mtp_ops``) and a
    pipeline send."""
    return layer_kinds(model, plan, stack) | {
        "embed": embedding_ops(model, plan, stack), "head": head_ops(model, plan, stack),
        "mtp": mtp_ops(model, plan, stack), "p2p": pipeline_p2p(model, plan, stack)}


def _parts(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency,
           compute: dict[str, list[Num | None]] | None = None) -> _Parts:
    ops = _ops(model, plan, stack)
    return _Parts(ops, {k: time_ops(v, cluster, plan, eff, compute[k] if compute else None) for k, v in ops.items()})


def compute_times(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency = DEFAULT
                  ) -> dict[str, list[Num | None]]:
    """Roofline times of the non-collective ops (None for collectives), which depend on the op shapes only."""
    acc = cluster.accelerator
    return {k: [None if op.kind == "collective" else op_time(op, acc, plan.precision, eff) for op in v]
            for k, v in _ops(model, plan, stack).items()}


def _layer(model: ModelSpec, plan: Plan, stack: Stack, parts: _Parts, recompute: str, eff: Efficiency = DEFAULT
           ) -> PassTimes:
    """The average layer: each kind's pass times weighted by its share of the layers."""
    kinds = list(kind_fractions(model).items())
    if len(kinds) == 1:
        return pass_times(parts.ops[kinds[0][0]], parts.times[kinds[0][0]], plan, stack, recompute, eff)
    layer = None
    for kind, f in kinds:
        times = pass_times(parts.ops[kind], parts.times[kind], plan, stack, recompute, eff).scaled(f)
        layer = times if layer is None else layer.plus(times)
    return layer


def saved_bytes(ops: list[OpCost], recompute: str = "none", modules: tuple[str, ...] = ("core_attn",)) -> Num:
    """Bytes the forward pass keeps for the backward pass (selective recompute of ``modules`` frees some,
    ``ops.RECOMPUTE_MODULES``)."""
    kept = [not freed for freed in freed_by(ops, modules)] if recompute == "selective" else [True] * len(ops)
    return sum((op.saved for op, keep in zip(ops, kept, strict=True) if op.phase == "fwd" and keep), 0.0)


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

    def take(self, index: Any) -> Units:
        """Select elements (NumPy fancy indexing) of every array field."""
        def pick(v: Num) -> Num:
            return v[index] if hasattr(v, "shape") and v.shape else v

        def pick_times(t: PassTimes) -> PassTimes:
            return PassTimes(*(pick(getattr(t, f)) for f in PassTimes.__slots__))

        return Units(*(pick_times(getattr(self, f)) if isinstance(getattr(self, f), PassTimes)
                       else pick(getattr(self, f)) for f in Units.__slots__))


def unit_costs(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack = DEFAULT_STACK,
               eff: Efficiency = DEFAULT, parts: _Parts | None = None) -> Units:
    parts = parts or _parts(model, cluster, plan, stack, eff)
    return units_for_recomputes(model, plan, stack, parts, (plan.recompute,), eff)[plan.recompute]


def units_for_recomputes(model: ModelSpec, plan: Plan, stack: Stack, parts: _Parts, recomputes: tuple[str, ...],
                         eff: Efficiency = DEFAULT) -> dict[str, Units]:
    """The units of ``plan`` under each recompute mode: the ops and their times do not depend on it, only
    how they are summed (and which saved activations are kept), so the modes share one ``_parts`` and
    everything but the layer's recompute sum and saved bytes."""
    plain = _layer(model, plan, stack, parts, "none", eff)
    embed = pass_times(parts.ops["embed"], parts.times["embed"], plan, stack, "none", eff)
    p2p = pass_times(parts.ops["p2p"], parts.times["p2p"], plan, stack, "none", eff)
    embed_saved = saved_bytes(parts.ops["embed"])
    fractions = kind_fractions(model)
    units = {}
    for recompute in recomputes:
        redo = plain if recompute == "none" else _layer(model, plan, stack, parts, recompute, eff)
        head, head_saved = _head_and_mtp(model, plan, stack, parts, recompute, eff)
        saved = sum(saved_bytes(parts.ops[kind], recompute, plan.recompute_modules) * f
                    for kind, f in fractions.items())
        units[recompute] = Units(layer=redo, layer_plain=plain, embed=embed, head=head, p2p=p2p, layer_saved=saved,
                                 embed_saved=embed_saved, head_saved=head_saved,
                                 p2p_paid=eff.overlap_slowdown if stack.overlap_pp else 1.0)
    return units


def _head_and_mtp(model: ModelSpec, plan: Plan, stack: Stack, parts: _Parts, recompute: str, eff: Efficiency
                  ) -> tuple[PassTimes, Num]:
    """The last stage's head per micro-batch, and what it saves: the final norm, LM head and loss, and per
    multi-token-prediction depth its own ops (``ops.mtp_ops``), one layer of each of ``mtp_kinds`` and the head
    again (Megatron-Core's MTP layers share the output layer). Recompute as Megatron-Core's
    MultiTokenPredictionLayer: under full recompute it checkpoints the projection and its layer
    (``_checkpointed_forward(self._proj_and_transformer_layer, …)``), which then keep only their two inputs, the
    previous hidden state and the next tokens' embedding; its layer applies the selective modules as the others."""
    head = pass_times(parts.ops["head"], parts.times["head"], plan, stack, "none", eff)
    saved = saved_bytes(parts.ops["head"])
    if not model.mtp_layers:
        return head, saved
    full = recompute == "full"
    depth = pass_times(parts.ops["mtp"], parts.times["mtp"], plan, stack, "full" if full else "none", eff).plus(head)
    depth_saved = saved + (2 * _layer_input(model, plan) if full else saved_bytes(parts.ops["mtp"]))
    for kind in model.mtp_kinds:
        depth = depth.plus(pass_times(parts.ops[kind], parts.times[kind], plan, stack, recompute, eff))
        if not full:
            depth_saved = depth_saved + saved_bytes(parts.ops[kind], recompute, plan.recompute_modules)
    return head.plus(depth.scaled(model.mtp_layers)), saved + model.mtp_layers * depth_saved


def stage_times(model: ModelSpec, plan: Plan, stack: Stack, u: Units) -> tuple[PassTimes, PassTimes, PassTimes]:
    """Per micro-batch times of the first and the last pipeline rank, and of a middle rank (its layers and sends,
    without the embedding or the head), by component."""
    def body(layers: Num) -> PassTimes:
        if plan.recompute == "full":
            redone = layers if plan.recompute_layers == 0 else minimum(plan.recompute_layers, layers)
            return u.layer.scaled(redone).plus(u.layer_plain.scaled(layers - redone))
        return u.layer.scaled(layers)

    single = plan.pp == 1
    middle = _with_sends(plan, stack, body(layers_on_stage(model, plan)), u)
    # an uneven last stage (plan.last_stage_layers) has layers of its own; an even split the same as the others
    own_last = _with_sends(plan, stack, body(layers_on_last(model, plan)), u) if plan.last_stage_layers else middle
    first = middle.plus(u.embed).plus(u.head.scaled(single))
    last = own_last.plus(u.head).plus(u.embed.scaled(single))
    return first, last, middle


def _with_sends(plan: Plan, stack: Stack, rank: PassTimes, u: Units) -> PassTimes:
    """A rank's layers with its pipeline sends: each of its v chunks sends its activation once in the forward pass
    and its gradient once in the backward pass. With ``stack.overlap_pp`` and v > 1 a send hides behind a chunk's
    compute of the same pass (1/v of the pass) at the overlap slowdown ``u.p2p_paid``, whatever exceeds it exposed
    (``hide``; with ``p2p_paid`` = 1 every send is exposed: hide(c, w, 1) = c)."""
    v, sends = plan.vpp, plan.vpp * (plan.pp > 1)
    send_f = u.p2p.fwd_comm  # one send of each pass, as exposed (the p2p ops are all communication)
    send_b = u.p2p.total - send_f
    t = rank.passes()
    interleaved = v > 1
    paid_f = where(interleaved, hide(send_f, t.t_f / v, u.p2p_paid), send_f)
    paid_b = where(interleaved, hide(send_b, t.t_b / v, u.p2p_paid), send_b)
    added = u.p2p.scaled(sends * (paid_f + paid_b) / maximum(send_f + send_b, 1e-30))
    hid_f = hid_b = 0.0
    if stack.overlap_pp:
        hid_f = sends * where(interleaved, minimum(send_f, t.t_f / v), 0.0)
        hid_b = sends * where(interleaved, minimum(send_b, t.t_b / v), 0.0)
    return rank.plus(replace(added, fwd_comm=sends * paid_f, hidden_f=hid_f, hidden_b=hid_b))


def bubble_time(plan: Plan, first: Num, last: Num, middle: Num) -> Num:
    """The pipeline bubble per step, from the per micro-batch times of the first, last and middle ranks.

    A pipeline is a flow shop: the busiest rank b works m · t_b, and the step also waits for every other
    rank once, while the first micro-batch fills the pipeline and the last one drains it: Σ_{i≠b} t_i.
    Interleaving with v chunks per rank cuts those fill and drain steps to 1/v (Narayanan et al. 2021 §2.2:
    with equal ranks this is the familiar (p − 1)/v · t_stage). Only the first rank holds the embedding and
    only the last the LM head and loss, so the bubble is paid at the other ranks' times, not at the busiest
    one's: ((p − 2) · t_middle + t_other_end) / v."""
    busiest = maximum(first, last)
    others = first + last + (plan.pp - 2) * middle - busiest
    return (plan.pp > 1) * others / plan.vpp


@dataclass(frozen=True, slots=True)
class RankStep:
    """One pipeline rank's step beside the bubble: m passes each way, the step-level channels, the optimizer."""

    passes: PassTimes  # per micro-batch
    dp: Num  # what the data-parallel collectives add (channels.step_channels)
    offload: Num  # what the activation-offload copies add beyond that
    optimizer: Num
    micro_batches: Num

    @property
    def total(self) -> Num:
        return self.micro_batches * self.passes.total + self.dp + self.offload + self.optimizer


def rank_step(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, u: Units, rank: PassTimes,
              last: bool, eff: Efficiency = DEFAULT) -> RankStep:
    """The first (or ``last``) pipeline rank's step: its passes with the data-parallel collectives and offload copies
    that share them (channels.py) and its optimizer step, for its own parameters and offloaded layers."""
    params = stage_params(model, plan, not last)
    collectives = dp_collectives(model, cluster, plan, params, eff)
    copies = offload(model, cluster, plan, u.layer_saved, last)
    dp, moved = step_channels(rank.passes(), plan.grad_accum, collectives, (plan.zero,), copies,
                              eff.overlap_slowdown, stack.overlap_dp)[plan.zero]
    return RankStep(rank, dp, moved, optimizer_time(cluster, plan, params, eff), plan.grad_accum)


def model_state_memory(model: ModelSpec, plan: Plan, stack: Stack
                       ) -> tuple[tuple[Num, Num, Num], tuple[Num, Num, Num]]:
    """(weights, grads, optimizer) of the first and of the last pipeline rank."""
    return (model_states(stage_params(model, plan, True), plan, stack),
            model_states(stage_params(model, plan, False), plan, stack))


def _layer_input(model: ModelSpec, plan: Plan) -> Num:
    """The bytes of a layer's input on one GPU: its rows of the residual stream (sharded under SP / SUMMA)."""
    return token_rows(model, plan)[1] * model.hidden_size * ACT_BYTES


def loss_workspace(model: ModelSpec, plan: Plan, stack: Stack) -> Num:
    """Transient peak of the cross-entropy backward on the last stage, beyond the saved fp32 (log-)softmax of
    the logits (counted with the head's saved activations), per logit (T·V/t of them):
    ``stack.cross_entropy = "fused"`` (Megatron's vocab-parallel loss): the fp32 gradient of the logits, written
    over the saved softmax in place
    (Megatron-LM megatron/core/tensor_parallel/cross_entropy.py: the backward takes grad_input = softmax and
    updates it with in-place ops), so only the 16-bit copy autograd makes for the logits' dtype is new: 2 bytes.
    ``"pytorch"`` (``F.cross_entropy`` on upcast logits = log_softmax + nll_loss, eager autograd): nll_loss's
    backward materialises a dense fp32 gradient of the log-probabilities (``nll_loss_backward``: zeros with
    -1/N at the targets), and ``_log_softmax_backward_data`` writes a new fp32 gradient of the logits while
    that one and the saved output are alive: 4 + 4 bytes (the 16-bit cast follows once the first is freed).
    With tp > 1 the logits are a vocabulary-sharded DTensor and the loss runs under ``loss_parallel`` (torchtitan's
    default with TP): its nll_loss backward computes both gradients at once, in eager,
    ``(torch.zeros_like(x) + torch.exp(x)) * grad_output`` (torch/distributed/tensor/parallel/loss.py,
    ``_nll_loss_and_log_softmax_backward``), so three fp32 tensors (the zeros, the exponential or the sum, the
    product) are alive with the saved output: 4 + 4 + 4 bytes.
    ``"flash"`` (flash-attn's CrossEntropyLoss): the 16-bit gradient beside the saved 16-bit logits, 2 bytes."""
    # numeric plan fields may be arrays (a PlanBatch): no branch on tp
    per_logit = FP32 * (2 + (plan.tp > 1)) if stack.cross_entropy == "pytorch" else ACT_BYTES
    return token_rows(model, plan)[0] * model.vocab_size / plan.tp * per_logit


def pipeline_runtime_memory(model: ModelSpec, plan: Plan, stack: Stack) -> tuple[Num, Num]:
    """Bytes the pipeline runtime keeps per micro-batch for the whole step, on the first and on the last
    pipeline rank: none under Megatron-Core (``stack.pipeline_runtime = "megatron"``), which allocates its p2p
    buffers per transfer and frees a stage's output once it is sent and backpropagated.

    torch.distributed.pipelining (``"torch"``, torchtitan; torch/distributed/pipelining/stage.py of December 2024,
    the torch 1963fc8 of torchtitan's benchmarks; pytorch/pytorch#153383, May 2025, keeps the outputs of the last
    stage only) keeps, for each of the m micro-batches and each model chunk on the rank, until the next step clears
    them (``clear_runtime_states``): on a chunk that is not the pipeline's first, the activation receive buffer
    ``_prepare_forward_infra`` allocates up front and the input gradient autograd accumulates into it
    (``stage_backward`` reads ``.grad`` of the inputs); on a chunk that is not the last, the gradient receive buffer
    (``_prepare_backward_infra``) and the chunk's output (``forward_one_chunk`` appends it to ``output_chunks``);
    on the pipeline's last chunk, its output: the logits (fp32 where the loss upcasts them, torchtitan's
    ``self.output(h).float()``). Each boundary tensor is a layer input (``_layer_input``). The first rank holds
    v chunks of which v − 1 are not the first and all v not the last; the last rank the reverse, plus the logits.
    These add to the rank's activation peak, which lasts to its last forward, when all m outputs exist. (A middle
    rank holds 4·m·v boundaries, but fewer micro-batches in flight than the first.)"""
    if stack.pipeline_runtime != "torch":
        return 0.0, 0.0
    m, v, pipelined = plan.grad_accum, plan.vpp, plan.pp > 1
    boundaries = 2 * m * (2 * v - 1) * _layer_input(model, plan) * pipelined
    logit_bytes = FP32 if stack.cross_entropy == "pytorch" else ACT_BYTES
    logits = m * token_rows(model, plan)[0] * model.vocab_size / plan.tp * logit_bytes * pipelined
    return boundaries, boundaries + logits


def activation_memory(model: ModelSpec, plan: Plan, stack: Stack, u: Units) -> tuple[Num, Num]:
    """Saved activations on the first and on the last pipeline rank (memory.py), with the loss's transient
    workspace on the rank that computes the loss and what the pipeline runtime keeps per micro-batch."""
    single, layer_input = plan.pp == 1, _layer_input(model, plan)
    loss = loss_workspace(model, plan, stack)
    embed = u.embed_saved * embedding_in_flight(plan)
    kept_first, kept_last = pipeline_runtime_memory(model, plan, stack)
    first = activation_bytes(model, plan, u.layer_saved, layer_input) + embed + (u.head_saved + loss) * single
    last = activation_bytes(model, plan, u.layer_saved, layer_input, last=True) + u.head_saved + loss + (
        embed * single)
    return first + kept_first, last + kept_last


def buffer_memory(model: ModelSpec, plan: Plan) -> Num:
    """Transient buffers: the gathered activations of a TP collective (×2, in and out; none without tensor
    parallelism) and, with ZeRO-3, the unsharded weights of the layer in use and the one being prefetched, and
    the layer's unsharded gradients on their way to the reduce-scatter: autograd's 16-bit gradients and the
    reduce-scatter input they are copied into in the reduce dtype (``plan.grad_bytes``; PyTorch FSDP2
    ``foreach_reduce`` allocates that input, world size × the padded shard, before it copies the gradients in,
    and frees the previous layer's once its reduce-scatter has finished)."""
    weights_in_use = 2 * WEIGHT_BYTES  # per parameter: this layer's and the prefetched one's
    grads_in_transit = WEIGHT_BYTES + plan.grad_bytes  # per parameter: autograd's and the reduce-scatter input
    sharded = (plan.zero == 3) * layer_params(model, plan).total * (weights_in_use + grads_in_transit)
    gathered = 2 * token_rows(model, plan)[0] * model.hidden_size * ACT_BYTES
    return sharded + gathered * (plan.tp * plan.tp2 > 1)


def offloaded_optimizer(model: ModelSpec, plan: Plan, stack: Stack) -> Num:
    """Host bytes of an offloaded optimizer state (ZeRO-Offload keeps the fp32 state on the host, sharded as
    on the GPU), on the first pipeline rank."""
    if not plan.offload_optimizer:
        return 0.0
    return model_states(stage_params(model, plan, True), replace(plan, offload_optimizer=False), stack)[2]


def offloaded_activations(model: ModelSpec, plan: Plan, u: Units) -> Num:
    """Host bytes of offloaded activations: what the first (or, if more, the last) rank would otherwise hold for its
    in-flight micro-batches."""
    if not plan.offload_activations:
        return 0.0
    kept, layer_input = replace(plan, offload_activations=False), _layer_input(model, plan)
    first = activation_bytes(model, kept, u.layer_saved, layer_input) * offloaded_layers(model, plan) / (
        layers_on_stage(model, plan))
    last = activation_bytes(model, kept, u.layer_saved, layer_input, last=True) * offloaded_layers(
        model, plan, last=True) / layers_on_last(model, plan)
    return maximum(first, last)


def assemble(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, u: Units, eff: Efficiency = DEFAULT
             ) -> StepCosts:
    """The step from its per-micro-batch units: the busier of the first and the last pipeline rank (``rank_step``:
    its passes, the data-parallel and offload channels beside them, its optimizer step) plus the bubble; and
    memory."""
    first, last, middle = stage_times(model, plan, stack, u)
    ends = (rank_step(model, cluster, plan, stack, u, first, False, eff),
            rank_step(model, cluster, plan, stack, u, last, True, eff))
    use_first = ends[0].total >= ends[1].total
    pick = {f: where(use_first, getattr(ends[0], f), getattr(ends[1], f)) for f in ("dp", "optimizer", "offload")}
    stage = PassTimes(*(where(use_first, getattr(first, f), getattr(last, f)) for f in PassTimes.__slots__))
    m = plan.grad_accum
    breakdown = {"compute": m * (stage.fwd + stage.bwd), "recompute": m * stage.recompute, "tp": m * stage.tp,
                 "cp": m * stage.cp, "ep": m * stage.ep, "pp": m * stage.pp,
                 "bubble": bubble_time(plan, first.total, last.total, middle.total)} | pick
    states_first, states_last = model_state_memory(model, plan, stack)
    acts_first, acts_last = activation_memory(model, plan, stack, u)
    buffers = buffer_memory(model, plan)
    mem_first = Memory(*states_first, acts_first, buffers)
    mem_last = Memory(*states_last, acts_last, buffers)
    use_mem_first = mem_first.total >= mem_last.total
    memory = {k: where(use_mem_first, getattr(mem_first, k), getattr(mem_last, k)) for k in MEMORY}
    return StepCosts(breakdown=breakdown, step_time=sum(breakdown.values(), 0.0), memory=memory,
                     peak_memory=maximum(mem_first.total, mem_last.total),
                     stage_fwd=stage.fwd, stage_bwd=stage.bwd + stage.recompute,
                     host_memory=offloaded_optimizer(model, plan, stack) + offloaded_activations(model, plan, u),
                     ranks=tuple((r.t_f, r.t_b) for r in (first.passes(), middle.passes(), last.passes())),
                     rank_memory=(mem_first.total, mem_last.total), use_first=use_first)


def step_costs(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack = DEFAULT_STACK,
               eff: Efficiency = DEFAULT, parts: _Parts | None = None) -> StepCosts:
    """Step time, its breakdown and memory, without validation (the search validates in bulk)."""
    return assemble(model, cluster, plan, stack, unit_costs(model, cluster, plan, stack, eff, parts), eff)


# ---- FLOP accounting --------------------------------------------------------------------------------------
@lru_cache(maxsize=256)
def matmul_params(model: ModelSpec) -> int:
    """Parameters that take part in a matmul per token (active experts only; the LM head even if tied)."""
    lookup = model.embedding_params()
    head = model.vocab_size * model.hidden_size if model.tied_embeddings else 0
    return model.params(active=True) - lookup + head


def attention_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of Q·Kᵀ and A·V per token over all attention layers, no causal savings: 2·s·A·(d_qk + d_v)·L
    (a hybrid: its attention blocks), plus a hybrid's SSD scans (``ssd_flops_per_token``)."""
    return attention_layer_flops(model) * model.num_attention_layers + ssd_flops_per_token(model)


def attention_layer_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one attention layer's Q·Kᵀ and A·V, no causal savings: 2·s·A·(d_qk + d_v), the
    keys s a query may see; a sliding window lets it see w = min(sliding_window, s) of them, so the windowed share
    f of the layers counts 2·w·A·(d_qk + d_v) (the average layer: 2·((1 − f)·s + f·w)·A·(d_qk + d_v))."""
    d_qk, d_v = head_dims(model)
    f = model.window_share
    keys = (1 - f) * model.seq_length + f * min(model.sliding_window, model.seq_length)
    return 2.0 * keys * model.num_heads * (d_qk + d_v)


def ssd_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of the Mamba-2 SSD scans of the model's Mamba blocks (``ssd_block_flops``)."""
    return model.layer_pattern.count("M") * ssd_block_flops(model)


def ssd_block_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one Mamba block's SSD scan (``ops.ssd_ops``' products over a chunk, per token):
    n_h·(2·N·P + 2·(Q + N)·P) + G·2·Q·N."""
    q, n, p = model.mamba_chunk, model.mamba_state, model.mamba_head_dim
    return model.mamba_heads * (2.0 * n * p + 2.0 * (q + n) * p) + model.mamba_groups * 2.0 * q * n


def model_flops_per_token(model: ModelSpec) -> float:
    """Training (forward + backward) model FLOPs per token: 6·N + 3 · attention forward (PaLM App. B), plus the
    multi-token-prediction depths' (``mtp_flops_per_token``)."""
    return 6.0 * matmul_params(model) + 3.0 * attention_flops_per_token(model) + mtp_flops_per_token(model)


def mtp_flops_per_token(model: ModelSpec) -> float:
    """Per MTP depth, counted as the model's layers are: 6 · (the MTP layer's active parameters, eh_proj 2·H·H and
    its norms among them, + the LM head V·H) + 3 · the forward of its attention blocks' scores, 2·s·A·(d_qk + d_v)
    each, and of its Mamba blocks' scans (Megatron-Core's num_floating_point_operations counts the MTP layers
    likewise)."""
    if not model.mtp_layers:
        return 0.0
    params = model.mtp_layer_params(active=True) + model.vocab_size * model.hidden_size
    return model.mtp_layers * (6.0 * params + 3.0 * _mtp_scores_flops(model))


def _mtp_scores_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one MTP layer's attention scores and Mamba scans."""
    return (_mtp_attention_blocks(model) * attention_layer_flops(model)
            + model.mtp_kinds.count("mamba") * ssd_block_flops(model))


def _mtp_attention_blocks(model: ModelSpec) -> int:
    """Attention blocks in one MTP layer: a transformer layer's one, or a hybrid pattern's "*" blocks."""
    return sum(k == "attention" or (k in ("dense", "moe") and not model.is_hybrid) for k in model.mtp_kinds)


def plan_flops_per_token(model: ModelSpec, plan: Plan) -> float:
    """Model FLOPs per token the plan's training needs: ``model_flops_per_token``, or under LoRA without the weight
    gradients of the frozen base weights, 4·N + 3 · attention (the adapters' own FLOPs neglected; NeMo's LoRA
    "model TFLOP/s" counts the same)."""
    if plan.finetune == "lora":
        return model_flops_per_token(model) - 2.0 * matmul_params(model)
    return model_flops_per_token(model)


def recompute_flops_per_token(model: ModelSpec, plan: Plan, stack: Stack = DEFAULT_STACK) -> float:
    """Extra forward FLOPs per token that recomputation executes (counted like model FLOPs): under full recompute
    the layers' forward (a share of them with ``recompute_layers``) and every MTP depth's but its head; under
    selective recompute the modules' (``module_flops_per_token``, the attention core by its closed form)."""
    head = 2.0 * model.vocab_size * model.hidden_size
    mtp = mtp_flops_per_token(model) / 3
    if plan.recompute == "full":
        layers = layers_on_stage(model, plan)
        share = 1.0 if plan.recompute_layers == 0 else min(plan.recompute_layers, layers) / layers
        return share * (model_flops_per_token(model) / 3 - mtp - head) + mtp - model.mtp_layers * head
    if plan.recompute == "selective":
        modules = plan.recompute_modules
        attention = 0.0
        if "core_attn" in modules:
            blocks = model.num_attention_layers + model.mtp_layers * _mtp_attention_blocks(model)
            attention = blocks * attention_layer_flops(model)
        others = tuple(m for m in modules if m != "core_attn")
        return attention + (module_flops_per_token(model, plan, stack, others) if others else 0.0)
    return 0.0


def module_flops_per_token(model: ModelSpec, plan: Plan, stack: Stack, modules: tuple[str, ...]) -> float:
    """Forward FLOPs per token of the ops the selective recompute of ``modules`` runs again, over all layers: a
    layer's op on one GPU does the work of T/t of the tokens (T = b·s/c on the GPU; column- and row-parallel
    GEMMs split the work t ways, a rank's experts take the k·T/t rows it routes), so per token it is
    flops · t / T, counted once per layer of its kind (the multi-token-prediction depths' layers too)."""
    tokens = token_rows(model, plan)[0]
    counts = model.block_counts
    total = 0.0
    for kind, ops in layer_kinds(model, plan, stack).items():
        again = rerun_by(ops, modules)
        layers = counts[kind] + model.mtp_layers * model.mtp_kinds.count(kind)
        total += layers * sum(op.flops for op, redo in zip(ops, again, strict=True) if redo)
    return float(total * plan.tp / tokens)


# ---- the public result ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OpRow:
    """One op of the per-op table: per occurrence on the busiest rank, and how often it runs per step."""

    name: str
    phase: str
    kind: str
    count: float
    flops: float
    nbytes: float
    seconds: float
    bound: str  # compute | memory | network | host (launch-bound: per-expert GEMMs, ops.host_launched)

    @property
    def total_seconds(self) -> float:
        return self.count * self.seconds


@dataclass(frozen=True)
class Estimate:
    model: ModelSpec
    cluster: Cluster
    plan: Plan
    stack: Stack
    step_time: float
    breakdown: dict[str, float]
    memory: dict[str, float]
    peak_memory: float
    model_flops: float  # per step, all GPUs
    hardware_flops: float
    reasons: tuple[str, ...] = ()
    host_memory: float = 0.0  # bytes offloaded to host memory per GPU
    rank_memory: tuple[float, float] = (0.0, 0.0)  # peak memory of the first and of the last pipeline rank
    detail: tuple[Any, ...] = field(default=(), repr=False, compare=False)  # (efficiency, parts, units, costs)

    @cached_property
    def ops(self) -> tuple[OpRow, ...]:
        """The per-op table (computed on first use: the search re-estimates plans that never print it)."""
        eff, parts, units, costs = self.detail
        return _op_table(self.model, self.cluster, self.plan, self.stack, eff, parts, bool(costs.use_first))

    @property
    def fits(self) -> bool:
        return not self.reasons

    @property
    def tokens_per_step(self) -> int:
        return self.plan.global_batch * self.model.seq_length

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time

    @property
    def tflops_per_gpu(self) -> float:
        """Model TFLOP/s per GPU (the NeMo / Megatron-Bridge "model TFLOP/s")."""
        return self.model_flops / self.step_time / self.cluster.num_gpus / 1e12

    @property
    def mfu_basis(self) -> str:
        """The precision whose dense peak MFU and HFU are taken against: the one the plan's GEMMs run in."""
        return self.plan.precision

    @property
    def peak_flops_per_gpu(self) -> float:
        """Dense peak FLOP/s per GPU of ``mfu_basis`` (fp16 and bf16 stand in for each other)."""
        return self.cluster.accelerator.flops(self.plan.precision)

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation against the dense peak of the precision that runs (an fp8 plan: the fp8 peak), so
        it is at most 1; ``mfu_bf16`` is the same against the 16-bit peak, as sources that quote it do."""
        return self.model_flops / self.step_time / (self.peak_flops_per_gpu * self.cluster.num_gpus)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation (model FLOPs + recomputed forward FLOPs) against the same peak as ``mfu``."""
        return self.hardware_flops / self.step_time / (self.peak_flops_per_gpu * self.cluster.num_gpus)

    @property
    def mfu_bf16(self) -> float:
        return self.model_flops / self.step_time / (self.cluster.accelerator.half_flops * self.cluster.num_gpus)

    @property
    def hfu_bf16(self) -> float:
        return self.hardware_flops / self.step_time / (self.cluster.accelerator.half_flops * self.cluster.num_gpus)

    def to_dict(self, ops: bool = True) -> dict[str, Any]:
        """Everything as plain data; ``ops=False`` leaves out the per-op table."""
        p = self.plan
        out = {
            "model": self.model.name, "system": self.cluster.name, "gpus": self.cluster.num_gpus,
            "params": self.model.params(), "active_params": self.model.params(active=True),
            "plan": {f.name: getattr(p, f.name) for f in fields(p) if f.name not in ("placement", "tags")}
            | {"placement": list(p.placement), "grad_accum": p.grad_accum},
            "stack": self.stack.as_dict(),
            "step_time_s": self.step_time, "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s / self.cluster.num_gpus,
            "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu, "hfu": self.hfu, "mfu_basis": self.mfu_basis,
            "peak_flops_per_gpu": self.peak_flops_per_gpu, "mfu_bf16": self.mfu_bf16, "hfu_bf16": self.hfu_bf16,
            "breakdown_s": dict(self.breakdown), "memory_bytes": dict(self.memory),
            "peak_memory_bytes": self.peak_memory, "hbm_bytes": self.cluster.accelerator.hbm_bytes,
            "rank_memory_bytes": {"first": self.rank_memory[0], "last": self.rank_memory[1]},
            "host_memory_bytes": self.host_memory,
            "fits": self.fits, "reasons": list(self.reasons),
        }
        if ops:
            out["ops"] = [{"name": o.name, "phase": o.phase, "kind": o.kind, "count": o.count, "flops": o.flops,
                           "bytes": o.nbytes, "seconds": o.seconds, "bound": o.bound} for o in self.ops]
        return out


def estimate(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack = DEFAULT_STACK,
             eff: Efficiency = DEFAULT) -> Estimate:
    """Predict one training step of ``model`` on ``cluster`` under ``plan``, as the software ``stack`` runs it.

    Raises PlanError if the plan is invalid (divisibility, sizes); a plan that does not fit in memory is a
    valid result with ``fits == False`` and its reason.
    """
    if not isinstance(stack, Stack):  # an Efficiency passed where the stack goes: estimate(..., eff=...)
        raise TypeError(f"stack must be a Stack, not {type(stack).__name__} (pass the efficiency as eff=)")
    validate(model, cluster, plan, stack)
    parts = _parts(model, cluster, plan, stack, eff)
    units = unit_costs(model, cluster, plan, stack, eff, parts)
    costs = assemble(model, cluster, plan, stack, units, eff)
    tokens = plan.global_batch * model.seq_length
    model_flops = plan_flops_per_token(model, plan) * tokens
    hardware_flops = model_flops + recompute_flops_per_token(model, plan, stack) * tokens
    capacity = cluster.accelerator.hbm_bytes
    reasons: tuple[str, ...] = ()
    if costs.peak_memory > capacity:
        reasons += (f"memory {fmt_bytes(costs.peak_memory)} > {fmt_bytes(capacity)} HBM",)
    if costs.host_memory > cluster.host_memory:
        reasons += (f"offloaded {fmt_bytes(costs.host_memory)} > {fmt_bytes(cluster.host_memory)} host memory "
                    "per GPU",)
    return Estimate(model=model, cluster=cluster, plan=plan, stack=stack, step_time=float(costs.step_time),
                    breakdown={k: float(v) for k, v in costs.breakdown.items()},
                    memory={k: float(v) for k, v in costs.memory.items()}, peak_memory=float(costs.peak_memory),
                    host_memory=float(costs.host_memory),
                    rank_memory=(float(costs.rank_memory[0]), float(costs.rank_memory[1])),
                    model_flops=model_flops, hardware_flops=hardware_flops,
                    reasons=reasons, detail=(eff, parts, units, costs))


def _op_table(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency, parts: _Parts,
              first: bool) -> tuple[OpRow, ...]:
    """Every op with its time per occurrence and how many times the busiest rank runs it per step: the first
    (its layers and the embedding) or the last (its layers, the head and the multi-token-prediction depths, each a
    layer of ``mtp_kinds`` and the head again); a single stage runs all of them."""
    m, depths, single = plan.grad_accum, model.mtp_layers, plan.pp == 1
    layers = layers_on_stage(model, plan) if first else layers_on_last(model, plan)
    ends = single or not first  # the last stage's head and MTP depths are on the busiest rank
    counts = {kind: m * (layers * f + ends * depths * model.mtp_kinds.count(kind))
              for kind, f in kind_fractions(model).items()} | {
        "embed": m * (single or first), "head": m * ends * (1 + depths), "mtp": m * ends * depths,
        "p2p": m * plan.vpp * (plan.pp > 1)}
    rows = []
    acc = cluster.accelerator
    for group, ops in parts.ops.items():
        for op, t in zip(ops, parts.times[group], strict=True):
            if op.kind == "collective":
                bound = "network"
            else:
                compute, memory = compute_time(op, acc, plan.precision, eff), memory_time(op, acc, eff)
                bound = "host" if op.launches * eff.host_launch > max(compute, memory) else (
                    "compute" if compute >= memory else "memory")
            rows.append(OpRow(op.name, op.phase, op.kind, float(counts[group]), float(op.flops),
                              float(op.nbytes), float(t), bound))
    rows += _step_rows(model, cluster, plan, eff, first)
    return tuple(r for r in rows if r.count > 0 and (r.seconds > 0 or r.flops > 0))


def _step_rows(model: ModelSpec, cluster: Cluster, plan: Plan, eff: Efficiency, first: bool) -> list[OpRow]:
    """Once-per-step ops of the busiest rank: the gradient reduction / parameter gather (before overlap) and
    the optimizer step (ZeRO-3 traffic runs per micro-batch)."""
    params = stage_params(model, plan, first)
    all_reduce, gather, scatter = dp_collectives(model, cluster, plan, params, eff)
    grad_bytes, weight_bytes = trainable(params, plan).total * plan.grad_bytes, params.total * WEIGHT_BYTES
    m = plan.grad_accum
    comm = {0: [("dp/grad_all_reduce", 1, grad_bytes, all_reduce)],
            1: [("dp/grad_reduce_scatter", 1, grad_bytes, scatter), ("dp/param_all_gather", 1, weight_bytes, gather)],
            2: [("dp/grad_reduce_scatter", m, grad_bytes, scatter), ("dp/param_all_gather", 1, weight_bytes, gather)],
            3: [("dp/param_all_gather", 2 * m, weight_bytes, gather), ("dp/grad_reduce_scatter", m, grad_bytes,
                                                                      scatter)]}[plan.zero]
    rows = [OpRow(name, "step", "collective", float(count), 0.0, float(nbytes), float(t), "network")
            for name, count, nbytes, t in comm]
    opt = optimizer_time(cluster, plan, params, eff)
    rows.append(OpRow("optimizer/adam", "step", "memory", 1.0, 0.0, float(opt * cluster.accelerator.hbm_bandwidth
                                                                            * eff.memory), float(opt), "memory"))
    return rows
