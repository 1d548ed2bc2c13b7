"""Every pipeline rank priced apart (issue 50 item 3): for one plan whose ranks differ beyond its two ends, a first
stage lighter than the middle ones (Plan.first_stage_layers, Megatron-Core decoder_first_pipeline_num_layers) or
per-rank recompute and activation offload (Plan.stage_recompute, Plan.stage_offload), rank r's time per micro-batch
(its layers under its own recompute and sends, the embedding on the first, the head on the last: step/stages.py),
its step beside the bubble (m · t_r + its data-parallel channels + offload copies + optimizer step: channels.py, as
``assemble.compose`` prices the end ranks), and its memory (its model states, its layers' activations for the
micro-batches in flight on it, memory.in_flight_chunks: p − r under 1F1B, Narayanan et al. 2021 §2.2, so the first
ranks hold the most and need the most recompute). The step is the busiest rank's plus the flow-shop bubble of the
others (bubble.py: every other rank once, over v):
    t_step = max_r (m · t_r + dp_r + offload_r + optimizer_r) + (Σ_r t_r − max_r t_r) / v
With ranks alike beyond the ends this is ``assemble``'s step exactly (tests/test_stage_settings.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshplan.collectives.contention import any_shared
from meshplan.cost.flops import recompute_flops_per_token
from meshplan.cost.params import (
    StageParams,
    layers_on_first,
    layers_on_rank,
    layers_on_stage,
)
from meshplan.cost.tensors import tensors_on_rank
from meshplan.cost.wrapper_work import work_of
from meshplan.cost.wrappers import partitioned_zero
from meshplan.kept import Kept
from meshplan.memory import (
    Memory,
    activation_bytes,
    buffer_memory,
    layer_input_bytes,
    model_states,
    offloaded_layers,
    pipeline_runtime_memory,
)
from meshplan.pipeline.forms import RankTimes
from meshplan.pipeline.registry import schedule_of
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan, revised
from meshplan.specs.stack import Stack
from meshplan.step.assemble import StepCosts
from meshplan.step.channels import (
    Collectives,
    Offload,
    dp_collectives,
    embedding_sync,
    offload,
    step_channels,
    update_time,
)
from meshplan.step.grid import params_of_rank
from meshplan.step.host import iteration_host, loop_host, optimizer_loops
from meshplan.step.memory import Phases, activation_memory, gathered_ends, memory_at_peak, recompute_working
from meshplan.step.passes import PassTimes
from meshplan.step.shared_links import shared_collectives
from meshplan.step.stages import (
    cadence,
    loop_times,
    rank_body,
    run_cadence,
    schedule_runs,
    unpaired_passes,
    with_sends,
)
from meshplan.step.units import Units
from meshplan.xp import Num


def recompute_entry(entry: str) -> tuple[str, int]:
    """A ``Plan.stage_recompute`` entry as (recompute mode, layers fully recomputed: 0 all): "none", "selective",
    "full", or N (N layers fully recomputed, Megatron's block method; "0" none)."""
    if entry.isdigit():
        return ("full", int(entry)) if int(entry) else ("none", 0)
    return entry, 0


def rank_view(plan: Plan, rank: int) -> Plan:
    """``plan`` with rank ``rank``'s own recompute and offload (``stage_recompute``, ``stage_offload``)."""
    changes: dict[str, Any] = {}
    if plan.stage_recompute:
        mode, layers = recompute_entry(plan.stage_recompute[rank])
        changes |= {"recompute": mode, "recompute_layers": layers}
    if plan.stage_offload:
        changes |= {"offload_activations": plan.stage_offload[rank] > 0, "offload_layers": plan.stage_offload[rank]}
    return revised(plan, changes) if changes else plan


def priced_apart(model: ModelSpec, plan: Plan) -> bool:
    """Whether ``plan`` (one plan) needs its ranks priced apart: per-rank settings, or a middle rank holding more
    layers than the first (the end ranks then no longer bound the step and the memory)."""
    if plan.pp == 1:
        return False
    return bool(plan.stage_recompute or plan.stage_offload or plan.stage_layers or
                (plan.pp > 2 and layers_on_first(model, plan) < layers_on_stage(model, plan)))


def stage_modes(plan: Plan) -> tuple[str, ...]:
    """The recompute modes the ranks of ``plan`` run (the units to build)."""
    return tuple(sorted({rank_view(plan, r).recompute for r in range(plan.pp)}))


@dataclass(frozen=True, slots=True)
class RankCost:
    """One pipeline rank's step: per micro-batch passes, its step beside the bubble and its parts, memory, host."""

    times: PassTimes
    step: float  # m · t_r + dp + offload + optimizer
    dp: float
    offload: float
    optimizer: float
    memory: Memory
    host: float  # bytes this rank offloads to host memory


@dataclass(frozen=True, slots=True)
class RankShared:
    """What rank ``rank`` of a plan takes from its parameters and its groups alone, whatever its recompute and
    offload (``Plan.stage_recompute``, ``Plan.stage_offload``): its parameters, its data-parallel traffic, its
    embedding all-reduce, its optimizer step and its buffers; the stage DP's lines (search/stage_lines.py) price a
    rank under four settings and share these."""

    params: StageParams
    traffic: Collectives | tuple[Collectives, Collectives]
    zero: int
    tied: Num
    optimizer: Num  # per update: the optimizer's step and its host loops
    iteration: Num  # per step: the training loop's host work
    buffers: Num


# the last few answers of ``rank_shared``, by the identities of its arguments (held with the answer, so that no id is
# reused while kept): the stage DP's pruning (search/stage_lines.ends_reach) prices a proposal's end ranks and then
# ``estimate`` prices them again (``assemble_ranks``), the same objects (8-count sweep: 30 of 266 calls; DeepSeek-V3:
# 36). Every argument is frozen, so the same objects give the same answer.
_KEPT: Kept[RankShared] = Kept(16)
# the plan fields of the ranks' recompute and activation offload, none of which ``_rank_shared`` reads (nor anything it
# calls: cost/params, step/channels' data-parallel collectives and optimizer step, step/host, memory.buffer_memory;
# tests/test_kept_answers.py flips each): and their answers, by the plan without them (``_ALIKE``), for the plans the
# stage DP prices, which differ in them (DeepSeek-V3 on 2,048 H100: 98 computed -> 46; search/stage_dp.py)
SETTINGS_UNREAD: dict[str, object] = {"recompute": "none", "recompute_layers": 0, "offload_activations": False,
                                      "offload_layers": 0, "stage_recompute": (), "stage_offload": ()}
_ALIKE: Kept[RankShared] = Kept(64)


def rank_shared(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency, rank: int
                ) -> RankShared:
    """``RankShared`` of rank ``rank`` of ``plan``: nothing here reads the rank's own recompute or offload. The
    answer for the same objects kept a while (``_KEPT``), and for a plan equal but for those settings
    (``SETTINGS_UNREAD``, ``_ALIKE``)."""
    held = (model, cluster, plan, stack, eff)
    return _KEPT.answer((*map(id, held), rank), held, _alike, model, cluster, plan, stack, eff, rank)


def _alike(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency, rank: int) -> RankShared:
    """``_rank_shared``'s answer kept by the plan without its ranks' settings (``SETTINGS_UNREAD``)."""
    if type(plan) is not Plan:
        return _rank_shared(model, cluster, plan, stack, eff, rank)
    held = (model, cluster, stack, eff)
    key = (*map(id, held), revised(plan, SETTINGS_UNREAD), rank)
    return _ALIKE.answer(key, held, _rank_shared, model, cluster, plan, stack, eff, rank)


def _rank_shared(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency, rank: int
                 ) -> RankShared:
    first, last = rank == 0, rank == plan.pp - 1
    params = params_of_rank(model, plan, rank)  # kept across plans alike in what it reads
    collectives = dp_collectives(model, cluster, plan, params, eff, stack)
    shared = Collectives(*shared_collectives(model, cluster, plan, params, eff, collectives))  # contention.py
    traffic = (collectives, shared) if stack.overlap_dp and any_shared(shared) else collectives
    zero = partitioned_zero(plan, stack)  # BF16_Optimizer's partitions without ZeRO (cost/wrappers.py)
    tied = embedding_sync(model, cluster, plan, eff)[0] * (first or last)  # the ends' embedding all-reduce
    opt = update_time(cluster, revised(plan, {"zero": zero}), params, eff, stack) + optimizer_loops(
        tensors_on_rank(model, plan, stack, rank), plan, stack, cluster.python_host,
        all_reduce=collectives.all_reduce)
    return RankShared(params, traffic, zero, tied, opt, iteration_host(stack, cluster.python_host),
                      buffer_memory(model, plan))


# the last few answers of ``price_rank``, by the identities of what it reads (the objects held with the answer, as
# ``_KEPT``'s): the stage DP's pruning (search/stage_lines.ends_reach) prices a proposal's end ranks, then ``estimate``
# prices every rank of it (``assemble_ranks``) with the same objects (DeepSeek-V3 on 2,048 H100: 56 of 489 calls)
_PRICED: Kept[RankCost] = Kept(64)


def price_rank(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, units: Mapping[str, Units],
               eff: Efficiency, rank: int, shared: RankShared | None = None) -> RankCost:
    """Rank ``rank`` of ``plan`` under its own settings (``rank_view``); ``units`` per recompute mode; ``shared``:
    ``rank_shared``'s answer for this rank of a plan differing at most in its ranks' settings, where known. The
    answer for the same objects kept a while (``_PRICED``): it reads ``units`` only at the rank's own mode."""
    view = _view(plan, rank)
    fixed = shared or rank_shared(model, cluster, plan, stack, eff, rank)
    held = (model, cluster, plan, stack, eff, units[view.recompute], fixed)
    return _PRICED.answer((*map(id, held), rank), held, _price_rank, model, cluster, plan, stack, held[5], eff, rank,
                          view, fixed)


# ``rank_view``'s plans by the plan (by identity, held) and the rank's own entries, all that it reads: the ranks of one
# setting share one (the stage DP's lines give every rank of a trial plan one setting: search/stage_lines.py)
_VIEWS: Kept[Plan] = Kept(64)


def _view(plan: Plan, rank: int) -> Plan:
    """``rank_view(plan, rank)``, kept where the plan has per-rank settings (else the plan itself)."""
    recompute, offload = plan.stage_recompute, plan.stage_offload
    if not (recompute or offload):
        return plan
    key = (id(plan), recompute[rank] if recompute else None, offload[rank] if offload else None)
    return _VIEWS.answer(key, plan, rank_view, plan, rank)


def _price_rank(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, mine: Units, eff: Efficiency,
                rank: int, view: Plan, fixed: RankShared) -> RankCost:
    """``price_rank`` of the rank's ``view``, its units ``mine`` and ``fixed`` (its ``rank_shared``)."""
    u, last = mine.under(work_of(view, stack)), rank == plan.pp - 1
    layers, shares = layers_on_rank(model, plan, rank), schedule_of(plan.schedule).end_shares(plan.pp, rank)
    held = (plan, stack, mine, cluster, eff, fixed)
    key = (*map(id, held), *(own[rank] if own else None for own in (plan.stage_recompute, plan.stage_offload)),
           type(layers), layers, shares, last)
    times, channels, states = _PASSES.answer(key, held, _passes, cluster, stack, u, eff, view, (layers, shares, last),
                                             fixed)
    zero = fixed.zero
    updates = cadence(plan)[1]
    per_run, synced, runs = run_cadence(plan, stack)  # the data-parallel traffic once per run of the schedule
    if channels is None:  # its offload copies, which read its rank (its layers offloaded)
        channels = step_channels(times.passes(), per_run, fixed.traffic, (zero,),
                                 offload(model, cluster, view, u.layer_saved, last, rank), eff.overlap_slowdown,
                                 stack.overlap_dp)
    if runs == 1:
        dp, moved = float(updates * (channels[zero][0] + fixed.tied)), float(updates * channels[zero][1])
    else:
        dp, moved = float(synced * channels[zero][0] + updates * fixed.tied), float(synced * channels[zero][1])
    opt = float(updates * fixed.optimizer + fixed.iteration)
    memory = memory_at_peak(states[:3], _activations(model, view, stack, u, rank), fixed.buffers,
                            gathered_ends(model, plan, stack))
    host = states[3]  # the optimizer's states held in host memory, where they are offloaded
    if view.offload_activations:  # the offloaded layers' share of what the rank would otherwise keep
        kept = activation_bytes(model, revised(view, {"offload_activations": False}), u.layer_saved,
                                layer_input_bytes(model, view), last, rank)
        host = host + kept * offloaded_layers(model, view, last, rank) / layers_on_rank(model, plan, rank)
    lone = unpaired_passes(plan.pp, plan.vpp, plan.grad_accum) * times.unpaired  # the combined 1F1B's passes alone
    return RankCost(times, float(plan.grad_accum * times.total + lone + dp + moved + opt), dp, moved, opt, memory,
                    float(host))


# a rank's passes, its model states and, without offload copies, its data-parallel channels, by what they read
# (``_passes``): the plan, the stack, the units, the cluster, the efficiency and the rank's ``RankShared`` by identity
# (held, as ``_KEPT``'s), and the rank's own recompute and offload entries, its layer count, its shares of the embedding
# and the head and whether it is the last. Its index reaches none of them otherwise (its activations and offload copies,
# which read it, are priced apart), so the middle ranks of a plan that hold as many layers under one setting share them
# (assemble_ranks: 14 of DeepSeek-V3's 16 ranks; the stage DP's lines: ranks 1 and p - 2, search/stage_lines.py)
_Passes = tuple[PassTimes, dict[int, tuple[Num, Num]] | None, tuple[Num, Num, Num, Num]]
_PASSES: Kept[_Passes] = Kept(64)


def _passes(cluster: Cluster, stack: Stack, u: Units, eff: Efficiency, view: Plan,
            at: tuple[Num, tuple[float, float], bool], fixed: RankShared) -> _Passes:
    """A rank's time per micro-batch (its ``view``'s layers under its recompute with its sends, its ``at`` = (layers,
    shares of the embedding and the head, last or not), the loop's host work), its model states (weights, gradients,
    optimizer; and the optimizer's in host memory, where offloaded) and, where it offloads no activations, its
    data-parallel channels (step/channels.step_channels; with offload, its copies read its index: None)."""
    layers, shares, last = at
    key = (id(u), id(stack), view.recompute, view.recompute_layers, view.vpp, view.pp, type(layers), layers,
           *map(type, shares), shares, type(cluster.python_host), cluster.python_host)
    times = _TIMES.answer(key, (u, stack), _rank_times, stack, u, view, layers, shares, cluster.python_host)
    states = _STATES.answer((id(fixed), id(stack), last), (fixed, stack), _states, fixed.params, view, stack, last)
    if view.offload_activations:
        return times, None, states
    return times, step_channels(times.passes(), run_cadence(view, stack)[0], fixed.traffic, (fixed.zero,), Offload(),
                                eff.overlap_slowdown, stack.overlap_dp), states


# a rank's passes per micro-batch (``_rank_times``) by all that they read: its units and the stack (by identity, held),
# its view's recompute, recompute layers, chunks and stages, its layer count and shares of the embedding and the head
# (with their types) and the host's speed. The stage DP's lines price each pipeline's ranks on every GPU count of a
# strong-scaling sweep, whose counts share their units (the same objects, step/parts._Read) where only dp differs:
# llama3-70b's 8 counts ask 544 times for 150 distinct passes (search/stage_lines.py)
_TIMES: Kept[PassTimes] = Kept(256)


def _rank_times(stack: Stack, u: Units, view: Plan, layers: Num, shares: tuple[float, float], python_host: float
                ) -> PassTimes:
    """A rank's ``layers`` under its ``view``'s recompute with its sends, its ``shares`` of the embedding and the
    head, and the training loop's host work per micro-batch at ``python_host``."""
    times = with_sends(view, stack, rank_body(view, u, layers), u)
    # the embedding's and the head's shares this rank runs, where its schedule's record places them (issue 82:
    # ZB-V's head on the first rank, Chimera's ends half each, as the end ranks' path prices them)
    for part, share in zip((u.embed, u.head), shares, strict=True):
        times = times.plus(part if share == 1 else part.scaled(share)) if share else times
    if stack.microbatch_host:  # the training loop's host work per micro-batch (step/stages.loop_times)
        times = times.plus(loop_times(loop_host(stack, python_host)))
    return times


# a rank's model states (``_states``) by its ``RankShared`` and the stack (by identity, held) and whether it is the
# last: ``cost/model_states`` reads of the plan none of the ranks' settings (``SETTINGS_UNREAD``: it reads their
# parameters, the ZeRO stage, the optimizer and its offload, the schedule's weight versions, the micro-batches), and
# a ``RankShared`` is one rank's of plans differing at most in those settings (``price_rank``), so the settings the
# stage DP's lines price a rank under share them (search/stage_lines.py: 3 or 4 a rank and layer count)
_STATES: Kept[tuple[Num, Num, Num, Num]] = Kept(64)


def _states(params: StageParams, view: Plan, stack: Stack, last: bool) -> tuple[Num, Num, Num, Num]:
    """(weights, gradients, optimizer) bytes on the GPU, and the optimizer's in host memory where offloaded."""
    return (*model_states(params, view, stack, last), model_states(
        params, revised(view, {"offload_optimizer": False}), stack, last)[2] if view.offload_optimizer else 0.0)


def _activations(model: ModelSpec, view: Plan, stack: Stack, u: Units, rank: int) -> Phases:
    """Rank ``rank``'s activations by phase (step/memory.Phases): an end rank's as step/memory.py prices it (the
    embedding's or the head's and the loss's with its layers'); a middle rank's layers for its micro-batches in
    flight, and what the pipeline runtime keeps: torch.distributed.pipelining's 4·m·v boundaries on a middle rank
    against the first rank's 2·m·(2v − 1) (memory.pipeline_runtime_memory)."""
    if rank in (0, view.pp - 1):
        return Phases(*(float(x) for x in activation_memory(model, view, stack, u)[rank != 0]))
    kept = pipeline_runtime_memory(model, view, stack)[0] * 2 * view.vpp / (2 * view.vpp - 1)
    redo = recompute_working(view, u.layer_saved, u.layer_working)
    return Phases(float(activation_bytes(model, view, u.layer_saved, layer_input_bytes(model, view), rank=rank,
                                         working=u.layer_working) - redo + kept), 0.0, float(redo))


def rank_bubble(plan: Plan, times: list[PassTimes], runs: int = 1) -> float:
    """The bubble over every rank's own time: the schedule record's closed form (meshplan.pipeline.forms), the one
    the end ranks' path prices over the first, the last and a middle rank (issue 82: Chimera's and ZB-V's forms
    here too, not 1F1B's over the forwards); once per run of the schedule (stages.schedule_runs)."""
    passes = [t.passes() for t in times]
    ranks = RankTimes.of_each([(float(p.t_f), float(p.t_b)) for p in passes], [float(t.total) for t in times])
    if runs == 1:
        return float(schedule_of(plan.schedule).bubble(ranks, plan.vpp, plan.grad_accum))
    return float(runs * schedule_of(plan.schedule).bubble(ranks, plan.vpp, plan.grad_accum / runs))


def shared_rank(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency, rank: int,
                memo: dict[tuple[int, float], RankShared]) -> RankShared:
    """``rank_shared`` of ``rank``, a middle rank's kept in ``memo`` by its cluster and layer count: a middle rank
    reads its rank only through the layers it holds (its parameters, its tensors; no end's embedding or head), so
    middle ranks of equal counts on one cluster share it (``assemble_ranks``, search/stage_lines.py)."""
    if rank in (0, plan.pp - 1):
        return rank_shared(model, cluster, plan, stack, eff, rank)
    key = (id(cluster), float(layers_on_rank(model, plan, rank)))
    if key not in memo:
        memo[key] = rank_shared(model, cluster, plan, stack, eff, rank)
    return memo[key]


def assemble_ranks(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, units: Mapping[str, Units],
                   eff: Efficiency) -> StepCosts:
    """The step of one plan priced rank by rank (module docstring), as ``assemble.assemble`` reports it: the
    busiest rank's breakdown, the heaviest rank's memory, every rank's step and memory (``stage_steps``,
    ``stage_memory``)."""
    memo: dict[tuple[int, float], RankShared] = {}
    ranks = [price_rank(model, cluster, plan, stack, units, eff, r, shared_rank(model, cluster, plan, stack, eff, r,
                                                                                memo)) for r in range(plan.pp)]
    bubble = rank_bubble(plan, [c.times for c in ranks], int(schedule_runs(plan, stack)))
    busiest = max(range(plan.pp), key=lambda r: ranks[r].step)
    heaviest = max(range(plan.pp), key=lambda r: ranks[r].memory.total)
    stage, m = ranks[busiest].times, plan.grad_accum
    breakdown = {"compute": m * (stage.fwd + stage.bwd), "recompute": m * stage.recompute, "tp": m * stage.tp,
                 "cp": m * stage.cp, "ep": m * stage.ep + unpaired_passes(plan.pp, plan.vpp, m) * stage.unpaired,
                 "pp": m * stage.pp, "host": m * stage.host, "bubble": bubble, "dp": ranks[busiest].dp,
                 "optimizer": ranks[busiest].optimizer, "offload": ranks[busiest].offload}
    middle = max(ranks[1:-1], key=lambda c: c.step, default=ranks[0])
    return StepCosts(breakdown=breakdown, step_time=ranks[busiest].step + bubble,
                     memory=ranks[heaviest].memory.as_dict(), peak_memory=ranks[heaviest].memory.total,
                     stage_fwd=stage.fwd, stage_bwd=stage.bwd + stage.recompute,
                     host_memory=max(c.host for c in ranks),
                     ranks=tuple((r.t_f, r.t_b) for r in (c.times.passes() for c in (ranks[0], middle, ranks[-1]))),
                     rank_memory=(ranks[0].memory.total, ranks[-1].memory.total), use_first=busiest != plan.pp - 1,
                     stage_steps=tuple(c.step for c in ranks), stage_memory=tuple(c.memory.total for c in ranks),
                     reserved_memory=max(float(c.memory.total + c.memory.stranded) for c in ranks))


def stage_recompute_flops(model: ModelSpec, plan: Plan, stack: Stack) -> float:
    """Recomputed forward FLOPs per token of a plan with per-rank recompute (cost/flops.recompute_flops_per_token
    of each rank's own setting, by its share of the layers; N of a rank's L_r layers recomputed in full: N / L_r of
    the full recompute's)."""
    total = 0.0
    for r in range(plan.pp):
        view, layers = rank_view(plan, r), float(layers_on_rank(model, plan, r))
        partial = view.recompute == "full" and view.recompute_layers
        share = min(view.recompute_layers, layers) / layers if partial else 1.0
        total += layers / model.num_layers * share * recompute_flops_per_token(model, view.with_(recompute_layers=0),
                                                                                stack)
    return total
