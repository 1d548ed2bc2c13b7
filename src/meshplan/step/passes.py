"""Pass times of a group of ops (a layer of each kind, the embedding, the head, a pipeline send): each op timed
(``time_ops``: collectives by collectives/price.py, the rest by the roofline), its kernels summed per pass, the
overlap rules applied and recompute added (``pass_times``), giving ``PassTimes`` by component.

Overlap rules (stated once, here and in channels.py). A collective that hides behind compute slows it by the overlap
slowdown per second hidden (efficiency.py); a pass's time stays non-decreasing in every op's time (channels.py):
- TP collectives are exposed unless the plan runs ``stack.overlap_tp`` (specs/host_cost.py: off without sequence
  parallelism where the framework turns it off); then they hide behind the GEMMs of the same pass, which they share
  with SUMMA's panel broadcasts: what exceeds the GEMMs is exposed, once.
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
  Applied per rank, where the sends are counted (stages.py, ``with_sends``).
- The host as a resource (step/host.py): the host issues each kernel and collective call asynchronously, at the
  stack's ``host_dispatch`` seconds each (one graph per pass under ``stack.cuda_graphs``), and the GPU cannot run a
  kernel before it is issued; each pass of each group of ops (a layer, the embedding, the head) takes max(GPU time,
  host time), and where the host waits for its collectives (``stack.blocking_collectives``) at least Σ over its
  segments between exposed collectives of the segment's launch queue (each kernel starts at max(its issue, the end of
  the one before), from the empty queue the sync leaves) plus the closing collective, which the waiting host
  cannot overlap (``host.host_idle``); where every launch blocks (``stack.blocking_launches``) the host's time and
  the GPU's add up; and a layer's host time never hides
  behind the head's GPU time. The excess (``PassTimes.host``, the GPU idle) is booked as exposed time, like exposed
  communication: it is no window for the DP traffic to hide in, and the GPU time it is measured against leaves out the
  slowdown of hidden traffic, which stays charged (T' = T − σ·H of channels.py is then max(GPU time without slowdown,
  host time)): both keep the step monotone in every rate (a faster link must not widen a window or turn slowdown into
  idle time). A group of collectives only (a pipeline send) has no host term: the host issues it amid the stage's
  kernels. The per-expert MoE path's host floor after the tokens-per-expert sync (its launches at the stack's cost per
  kernel, mlp_moe.host_launched, roofline.op_time) stays a per-op floor: the sync drains the queue right before them,
  so no GPU work hides it.
- DP gradient reduction and the distributed optimizer's parameter all-gather (Megatron overlap-grad-reduce /
  overlap-param-gather, when ``stack.overlap_dp``), ZeRO-3's gathers and activation offload share the passes they
  run beside with the traffic above, each on its own link (channels.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import cast

import numpy as np

from meshplan.collectives.comm import split_group
from meshplan.collectives.groups import axis_layout
from meshplan.collectives.price import LIBRARIES, PricedOnce
from meshplan.cost.recompute import RECOMPUTE_MODULES, rerun_by, rerun_part, runs_again, tp_rerun_by
from meshplan.cost.records import OpCost
from meshplan.roofline import op_time
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.host_cost import plan_host, tp_hidden
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.channels import Passes
from meshplan.step.host import forget_issued, host_idle, hosted, most_launches
from meshplan.xp import Num, maximum, minimum

ZERO = 0.0  # the one object PassTimes.total skips


def time_ops(ops: list[OpCost], cluster: Cluster, plan: Plan, eff: Efficiency,
             compute: list[Num | None] | None = None, priced: PricedOnce | None = None) -> list[Num]:
    """Seconds of each op: collectives by the one dispatcher (collectives/price.py), the rest by the roofline (or
    taken from ``compute``, the same ops' times computed elsewhere: the search times compute ops once per shape, not
    per placement). ``priced``: the prices of the collectives met so far on this cluster and plan (the other groups'
    of the plan: parts._timed), each priced once."""
    times: list[Num] = []
    library = LIBRARIES[plan.collectives]  # NCCL's, or MPICH's with the minimum spanning tree
    splits: dict[tuple[str, object], tuple[Num, list[Num]]] = {}
    priced = PricedOnce() if priced is None else priced
    for i, op in enumerate(ops):
        if op.kind == "collective":
            c = op.collective
            assert c is not None  # a collective op carries its Collective (cost/records.py)
            key = (c.axis, id(c.group) if isinstance(c.group, np.ndarray) else c.group)
            if key not in splits:  # the ops of a layer use a few groups: split each over the tiers once
                # (the group is kept with its split so that its id is not reused by another array meanwhile)
                splits[key] = (c.group, split_group(cluster, c.group, axis_layout(plan, c.axis)))
            one = priced.seconds(c, splits[key][1], cluster, eff, library)  # the one dispatcher's (price.py)
            times.append(one * op.repeat if type(op.repeat) is not float or op.repeat != 1.0 else one)
        elif compute is not None:
            times.append(cast(Num, compute[i]))  # set for every op that is not a collective
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
    fwd_comm: Num = 0.0  # of tp + cp + ep + pp + host: the forward pass's (the rest is the backward's)
    hidden_f: Num = 0.0  # communication seconds hidden under the forward kernels (H of channels.py)
    hidden_b: Num = 0.0  # ... under the backward kernels and the recompute
    host: Num = ZERO  # seconds the GPU waits on the host beyond its kernels and exposed communication (host-bound)
    # the pass's collectives and sends at their own seconds, exposed or hidden alike (each rule's c, not what it
    # leaves exposed; full recompute's re-run forward ones in the backward, selective recompute's left out): the
    # traffic that shares a tier with the data-parallel collectives (contention.py)
    traffic_f: Num = ZERO
    traffic_b: Num = ZERO
    # what the MoE layers' all-to-alls add to a micro-batch's passes run without a partner, beyond ``ep`` (the
    # combined 1F1B schedule's warm-up and cool-down, ``unpaired_passes``); not in ``total``
    unpaired: Num = ZERO

    @property
    def total(self) -> Num:
        total = self.fwd + self.bwd
        for part in (self.recompute, self.tp, self.cp, self.ep, self.pp, self.host):
            if part is not ZERO:  # components that are the constant 0.0 (``lean``) are skipped, not added
                total = total + part
        return total

    def lean(self) -> PassTimes:
        """The same passes with the communication components folded into ``tp`` (for code that needs only the
        passes, not their breakdown: the search's ranking)."""
        comm = self.total - self.fwd - self.bwd - self.recompute
        return PassTimes(self.fwd, self.bwd, self.recompute, comm, ZERO, ZERO, ZERO, self.fwd_comm, self.hidden_f,
                         self.hidden_b, ZERO, self.traffic_f, self.traffic_b, self.unpaired)

    def scaled(self, k: Num) -> PassTimes:
        return PassTimes(*[v if v is ZERO else v * k for v in _fields_of(self)])

    def plus(self, other: PassTimes) -> PassTimes:
        return PassTimes(*[a if b is ZERO else b if a is ZERO else a + b
                           for a, b in zip(_fields_of(self), _fields_of(other), strict=True)])

    def with_(self, **changes: Num) -> PassTimes:
        """``dataclasses.replace(self, **changes)``, without its walk over the fields' records."""
        values = dict(zip(PassTimes.__slots__, _fields_of(self), strict=True))
        values.update(changes)
        return PassTimes(**values)

    def passes(self) -> Passes:
        """The forward and backward pass: T, K and H of channels.py."""
        t_f = self.fwd + self.fwd_comm
        return Passes(t_f=t_f, t_b=self.total - t_f, k_f=self.fwd, k_b=self.bwd + self.recompute,
                      h_f=self.hidden_f, h_b=self.hidden_b, c_f=self.traffic_f, c_b=self.traffic_b)


# every field of a PassTimes in order, read at C speed (scaled and plus run thousands of times a search)
_fields_of = attrgetter(*PassTimes.__slots__)


def pass_times(ops: list[OpCost], times: list[Num], plan: Plan, stack: Stack, recompute: str,
               eff: Efficiency = DEFAULT, region: bool = False) -> PassTimes:
    """Sum kernels per pass, apply the overlap rules, add recompute (``"full"``: the forward again;
    ``"selective"``: the forward kernels of ``plan.recompute_modules`` again, ``ops.RECOMPUTE_MODULES``, with a
    recomputed MoE layer's exposed forward all-to-alls). A hidden collective still slows the compute it
    overlaps by ``eff.overlap_slowdown`` × its hidden time (SMs and HBM it takes; efficiency.py); that cost
    is booked under the collective's component. ``region``: the ops are a layer (a torch.compile region under a
    compiled stack: step/host.host_idle)."""
    paired = stack.overlap_ep and any(op.name in _A2A_NODES for op in ops)
    s = _sums(ops, times, paired)
    g = s.get
    kernels = {ph: g((ph, "gemm"), 0.0) + g((ph, "attention"), 0.0) + g((ph, "memory"), 0.0) for ph in "fb"}
    sd = eff.overlap_slowdown
    hides_tp = tp_hidden(stack, plan.sequence_parallel)  # the TP overlap as the framework runs this plan
    tp, cp, ep, hidden = _overlap(s, hides_tp, sd)
    unpaired: Num = ZERO
    if paired:  # forward all-to-all behind the other micro-batch's backward kernels, and vice versa
        alone = ep["f"] + ep["b"]  # the all-to-alls exposed, as a pass without a partner runs them
        ep, hidden_ep = combined_1f1b(s, kernels, ep, sd)
        hidden = {ph: hidden[ph] + hidden_ep[ph] for ph in "fb"}
        unpaired = maximum(0.0, alone - ep["f"] - ep["b"])
    hidden_b = hidden["b"]
    if recompute == "full":
        redo = kernels["f"] + tp["f"] + cp["f"] + ep["f"]
        hidden_b = hidden_b + hidden["f"]
    elif recompute == "selective":
        redo, again = _selective_redo(ops, times, plan, hides_tp, ep["f"], sd)
        hidden_b = hidden_b + again
    else:
        redo = 0.0
    pp = {ph: g((ph, "pp_exposed"), 0.0) for ph in "fb"}
    traffic = _traffic(ops, times)
    fwd_comm = tp["f"] + cp["f"] + ep["f"] + pp["f"]
    idle: Num = ZERO
    # the host as a resource (docstring): its launches, or its records' own host seconds (OpCost.host)
    if (stack.host_dispatch or any(hosted(op) for op in ops)) and any(op.collective is None for op in ops):
        gpu_f = kernels["f"] + fwd_comm - sd * hidden["f"]
        gpu_b = kernels["b"] + redo + tp["b"] + cp["b"] + ep["b"] + pp["b"] - sd * hidden_b
        gpu = {"f": gpu_f, "b": gpu_b}
        host = plan_host(stack, plan.sequence_parallel)  # the host's costs, their own record (specs/host_cost.py)
        most = host_idle(ops, times, plan, host, recompute, gpu, most_launches, region)  # a bound: idle nowhere,
        if np.any(most["f"] > 0) or np.any(most["b"] > 0):  # skip
            waits = host_idle(ops, times, plan, host, recompute, gpu, region=region)
            idle = waits["f"] + waits["b"]
            fwd_comm = fwd_comm + waits["f"]
    return PassTimes(fwd=kernels["f"], bwd=kernels["b"], recompute=redo, tp=tp["f"] + tp["b"],
                     cp=cp["f"] + cp["b"], ep=ep["f"] + ep["b"], pp=pp["f"] + pp["b"],
                     fwd_comm=fwd_comm, hidden_f=hidden["f"], hidden_b=hidden_b, host=idle,
                     traffic_f=traffic["f"], traffic_b=traffic["b"] + (traffic["f"] if recompute == "full" else ZERO),
                     unpaired=unpaired)


# ``_sums`` of the last lists of ops and times met, by the lists' identity (held here, so that their ids are not reused
# while kept): a group's sums are the same under every recompute mode (DeepSeek-V3's search: 408 calls, 228 distinct)
_SUMS: dict[tuple[int, int, bool], tuple[list[OpCost], list[Num], dict[tuple[str, str], Num]]] = {}
_SUMS_KEPT = 8


def forget_sums() -> None:
    """Drop the kept sums (``_SUMS``, host._ISSUED): a caller done with its lists lets their arrays go (a search's
    batch of 15,823 keys: 20 MiB of sums kept past their units, DeepSeek-V3's peak 203 -> 224 MiB)."""
    _SUMS.clear()
    forget_issued()


def _sums(ops: list[OpCost], times: list[Num], paired: bool) -> dict[tuple[str, str], Num]:
    """``_summed``, kept for the last lists met (``_SUMS``; its arrays read-only: no caller changes them)."""
    key = (id(ops), id(times), paired)
    kept = _SUMS.get(key)
    if kept is not None and kept[0] is ops and kept[1] is times:
        return kept[2]
    s = _summed(ops, times, paired)
    for v in s.values():
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
    if len(_SUMS) >= _SUMS_KEPT:
        del _SUMS[next(iter(_SUMS))]  # the oldest
    _SUMS[key] = (ops, times, s)
    return s


def _summed(ops: list[OpCost], times: list[Num], paired: bool) -> dict[tuple[str, str], Num]:
    """The ops' times summed per (pass "f" / "b", kind): kernels by kind, collectives by the overlap they may take
    ("tp", "cp", "summa" and "summa_panel", one panel's) or exposed ("<axis>_exposed"), and with ``paired`` the
    combined 1F1B schedule's expert and all-to-all nodes apart (``_a2a_node``)."""
    s: dict[tuple[str, str], Num] = {}
    owned: set[tuple[str, str]] = set()  # sums this function allocated: safe to add into in place

    def add(key: tuple[str, str], t: Num) -> None:
        cur = s.get(key, 0.0)
        if (key in owned and isinstance(cur, np.ndarray) and cur.shape == np.shape(t)
                and cur.dtype == np.result_type(cur, t)):
            np.add(cur, t, out=cur)  # the search's arrays hold 10^5 keys: no new array per op
            return
        s[key] = cur + t
        if isinstance(s[key], np.ndarray):
            owned.add(key)

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
        else:  # exposed, under its axis (expert-TP under ep; the 2D layout's K/V exchange across tp2 under tp: it
            # is the tensor grid's second axis, not context parallelism, which a SUMMA plan with cp = 1 does not have)
            add((ph, {"etp": "ep", "etp_ep": "ep", "tp2": "tp"}.get(op.collective.axis, op.collective.axis)
                 + "_exposed"), t)
    return s


def _overlap(s: dict[tuple[str, str], Num], hides_tp: bool, sd: float
             ) -> tuple[dict[str, Num], dict[str, Num], dict[str, Num], dict[str, Num]]:
    """Per pass, the TP, CP and EP time the overlap rules leave (exposed, plus the slowdown ``sd`` of what hides),
    and the communication that hides under the kernels."""
    g = s.get
    tp, cp, ep, hidden = {}, {}, {}, {}
    for ph in "fb":
        gemm, attention, ring = g((ph, "gemm"), 0.0), g((ph, "attention"), 0.0), g((ph, "cp"), 0.0)
        behind = g((ph, "tp"), 0.0) if hides_tp else 0.0  # TP collectives that hide behind the GEMMs
        summa = g((ph, "summa"), 0.0)
        # the GEMMs of the pass are one window for the TP collectives that hide (slowing them by σ per second
        # hidden) and SUMMA's panel broadcasts after the first (seed 003: the first panel is exposed, the rest
        # hides; priced without slowdown as seed 003 does): what exceeds the window is exposed, once
        tp[ph] = (0.0 if hides_tp else g((ph, "tp"), 0.0)) + g((ph, "tp_exposed"), 0.0) + g(
            (ph, "summa_panel"), 0.0)
        if not (_none(behind) and _none(summa)):
            tp[ph] = tp[ph] + maximum(0.0, behind + summa - gemm) + sd * minimum(behind, gemm)
        cp[ph] = g((ph, "cp_exposed"), 0.0) if _none(ring) else hide(ring, attention, sd) + g((ph, "cp_exposed"), 0.0)
        ep[ph] = g((ph, "ep_exposed"), 0.0)
        hidden[ph] = (0.0 if _none(behind) else minimum(behind, gemm)) + (
            0.0 if _none(ring) else minimum(ring, attention))
    return tp, cp, ep, hidden


def _traffic(ops: list[OpCost], times: list[Num]) -> dict[str, Num]:
    """Each pass's collectives at their own seconds (``PassTimes.traffic_f``): ZERO where it has none."""
    out: dict[str, Num] = {"f": ZERO, "b": ZERO}
    for op, t in zip(ops, times, strict=True):
        if op.kind == "collective":
            ph = "f" if op.phase == "fwd" else "b"
            out[ph] = t if out[ph] is ZERO else out[ph] + t
    return out


def _none(x: Num) -> bool:
    """``x`` is the float 0.0 (no op of that kind): arithmetic with it can be skipped, keeping sums scalar."""
    return type(x) is float and x == 0.0


def _selective_redo(ops: list[OpCost], times: list[Num], plan: Plan, hides_tp: bool, ep_exposed: Num,
                    slowdown: float) -> tuple[Num, Num]:
    """What selective recompute of ``plan.recompute_modules`` adds to the backward pass, and the communication it
    hides: their forward kernels again; the TP collectives inside them again (``recompute.tp_rerun_by``), those that
    hide behind GEMMs (``hides_tp``) behind the re-run GEMMs (``hide``), the others exposed; and a recomputed
    MoE layer's exposed forward all-to-alls."""
    modules = plan.recompute_modules
    redo: Num
    gemm: Num
    behind: Num
    exposed: Num
    redo = gemm = behind = exposed = 0.0
    for op, t, share in zip(ops, times, rerun_by(ops, modules), strict=True):
        if runs_again(share):
            part = rerun_part(share, t)  # all or a share of its kernels (per-op SAC's for-loop experts)
            redo = redo + part
            if op.kind == "gemm":
                gemm = gemm + part
    for op, t, again in zip(ops, times, tp_rerun_by(ops, modules), strict=True):
        if again and hides_tp and op.overlap == "tp":
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


def hide(comm: Num, window: Num, slowdown: Num) -> Num:
    """Exposed time of ``comm`` seconds of communication overlapped with ``window`` seconds of compute:
    what does not fit, plus the slowdown it inflicts on the compute while it runs (efficiency.py)."""
    return maximum(0.0, comm - window) + slowdown * minimum(comm, window)
