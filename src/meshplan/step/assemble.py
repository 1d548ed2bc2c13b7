"""The step from its per-micro-batch units, composed once for one plan or a batch of them under a grid of settings
(recompute × ZeRO × optimizer offload × activation offload), each part computed once for the settings it changes
with. Time (``compose``): each rank's m passes, the data-parallel and offload channels beside them (channels.py;
sharing a tier's bandwidth with the layers' traffic where both span it, contention.py),
its optimizer step, and the bubble (bubble.flow_bubble; and the channels, once per run of the schedule where a step
runs it several times: stages.schedule_runs); the step is the busiest of the first, the last and a middle pipeline
rank plus the bubble (``EndSteps.total``, the one sum):
    t_step = max over the ranks of (m · t_rank + dp + offload + optimizer) + bubble
Memory: step/memory_grid.py (``compose_memory``), over the same grid and ranks (step/grid.py). The middle rank is
rank 1, which holds the most micro-batches in flight of the middle ones (p − 1 under 1F1B) and, the ranks alike in
settings, the same passes and parameters as every other middle rank: a middle rank whose layers carry more
parameters than the first's (DeepSeek-V3: the first rank's 3 dense layers) is the heaviest and the busiest (its
data-parallel gradients). Ranks that differ further (per-rank settings, a lighter first stage) are priced one by one
(step/ranks.py).
``estimate`` composes one plan under its own settings (``assemble``: a grid of one, with the time by component and
the memory of the rank with the larger footprint, ``StepCosts``); the search composes batches of plans under the
space's grid (search/scoring.py). Fields are floats for one plan or NumPy arrays for many.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, cast

import numpy as np

from meshplan.collectives.contention import any_shared
from meshplan.cost.params import StageParams, middle_or_first
from meshplan.cost.tensors import rank_tensors
from meshplan.cost.wrapper_work import by_work
from meshplan.cost.wrappers import partitioned_zero
from meshplan.kept import Kept
from meshplan.memory import model_states
from meshplan.pipeline.registry import schedule_of
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import DEFAULT as DEFAULT_STACK
from meshplan.specs.stack import Stack
from meshplan.step.channels import (
    Collectives,
    Offload,
    Passes,
    dp_collectives,
    embedding_sync,
    offload,
    step_channels,
    update_time,
    weight_fetch,
)
from meshplan.step.grid import Settings, middle_may_bind, own_settings, rank_params, with_settings
from meshplan.step.host import iteration_host, loop_host, optimizer_loops, paid_per_step
from meshplan.step.memory import Ends, Phases, memory_at_peak
from meshplan.step.memory_grid import compose_memory
from meshplan.step.passes import ZERO, PassTimes
from meshplan.step.shared_links import shared_collectives
from meshplan.step.stages import (
    cadence,
    ep_overlapped,
    real,
    run_cadence,
    stage_bubble,
    stage_times,
    two_chunk_times,
    unpaired_passes,
)
from meshplan.step.units import Parts, Units, unit_costs
from meshplan.xp import Num, distinct

MEMORY = ("weights", "grads", "optimizer", "activations", "buffers")


@dataclass(frozen=True, slots=True)
class EndSteps:
    """One setting's step: the first, the last and a middle pipeline rank side by side on a leading axis of 3
    (``pipelined``, ``dp``, ``offload``, ``optimizer``: seconds per step; a middle rank's layers, DeepSeek-V3's dense
    first layers, may carry more parameters than the first's), the bubble, and each rank's passes by component."""

    pipelined: Num  # m · t_rank: the rank's passes of its m micro-batches
    dp: Num  # what the DP collectives add beside them (channels.step_channels) and the embedding_sync, per step
    offload: Num  # what the activation-offload copies add beyond that
    optimizer: Num
    bubble: Num
    first: PassTimes
    last: PassTimes
    middle: PassTimes
    beside: Num | None = None  # pipelined + dp + offload, where the settings that share them summed it once

    def ranks(self) -> np.ndarray:
        """Each rank's step beside the bubble: m · t_rank + dp + offload + optimizer (the first, the last and a
        middle rank on the leading axis: ``pipelined`` is always stacked, so the sum is an array)."""
        beside = self.pipelined + self.dp + self.offload if self.beside is None else self.beside
        return cast(np.ndarray, beside + self.optimizer)

    def total(self, out: np.ndarray | None = None) -> Num:
        """The step: the busiest rank's, plus the bubble (written into ``out`` in its dtype if given)."""
        ranks = self.ranks()
        busiest = np.maximum(ranks[0], ranks[1])
        if len(ranks) > 2:  # a middle rank (middle_may_bind)
            busiest = np.maximum(busiest, ranks[2])
        return np.add(busiest, self.bubble, out=out, casting="unsafe")


def compose(model: ModelSpec, cluster: Cluster, plan: Plan, units: Mapping[str, Units], grid: Settings,
            stack: Stack, eff: Efficiency = DEFAULT, dtype: type = np.float64
            ) -> Iterator[tuple[tuple[int, int, int, int], EndSteps]]:
    """The step of ``plan`` (one plan, or a batch of them: search.batch.PlanBatch) under every setting of ``grid``,
    with its index (recompute, zero, offload opt, offload act) into the grid's axes; ``units`` per recompute mode.
    Each part is computed once for the settings it changes with: per recompute mode the ranks' passes and the
    bubble, per activation-offload setting the copies and the channels of every ZeRO stage at once
    (channels.step_channels), per ZeRO stage and optimizer offload the optimizer step. The passes are held in
    ``dtype`` (the search ranks in float32 and re-estimates its winners in float64)."""
    shape, m, slowdown = np.shape(plan.dp), real(plan.grad_accum), eff.overlap_slowdown
    updates = real(cadence(plan)[1])  # PipeDream: an update (DP reduction, optimizer) per micro-batch
    per_run, synced, runs = map(real, run_cadence(plan, stack))  # a step's runs of the schedule (AutoModel's loop)
    n = 3 if middle_may_bind(model, stack, plan) else 2  # ranks priced: the ends, and a middle one where it may bind
    record = schedule_of(plan.schedule)
    parted = {(z, oo): partitioned_zero(with_settings(plan, zero=z, offload_optimizer=oo), stack)
              for z in grid.zero for oo in grid.offload_optimizer}
    params, collectives, tied, shared, stepped = _weight_side(model, cluster, plan, stack, n, parted, eff)
    traffic = (collectives, shared) if stack.overlap_dp and any_shared(shared) else collectives
    logging = iteration_host(stack, cluster.python_host) / updates  # once per step: opt is paid per update
    opt = {k: stepped[k] + logging for k in parted}
    loop = loop_host(stack, cluster.python_host)  # the training loop's, per micro-batch and rank
    forward: dict = {}  # the forward passes do not change with the recompute mode: priced once without copies
    for r, rc in enumerate(grid.recompute):
        ranked = with_settings(plan, recompute=rc)
        for work, settings in by_work(plan, stack, grid.zero, grid.offload_optimizer):
            u = units[rc].under(work)  # the passes of the settings whose wrapper does this work every micro-batch
            first, last, middle = two_chunk_times(ranked.schedule, *stage_times(model, ranked, stack, u, loop), u.head)
            if record.ep_overlapped:  # DualPipe's chunk pairs hide the EP all-to-alls (stages.ep_overlapped)
                first, last, middle = (ep_overlapped(t, slowdown) for t in (first, last, middle))
            ends = [(t.passes(), t.total) for t in (first, last, middle)]  # each sum once (PassTimes.total)
            bubble = stage_bubble(ranked, ends, runs)
            passes = Passes(*(_rows(plan, [getattr(t, f) for t, _ in ends[:n]], shape, dtype)
                              for f in Passes.__slots__))
            pipelined = m * _rows(plan, [total for _, total in ends[:n]], shape, dtype)
            if any(t.unpaired is not ZERO for t in (first, last, middle)[:n]):  # the combined 1F1B's lone passes
                pipelined = pipelined + unpaired_passes(plan.pp, plan.vpp, m) * _rows(
                    plan, [t.unpaired for t in (first, last, middle)[:n]], shape, dtype)
            zeros = tuple(dict.fromkeys(parted[zero, oo] for _, zero, _, oo in settings))
            for a, oa in enumerate(grid.offload_activations):
                copies = _copies(model, cluster, with_settings(ranked, offload_activations=oa), u, shape, dtype, n)
                channels: dict[int, tuple[Num, Num]] = {}
                for stages, fetch in _fetches(cluster, plan, params, zeros, stack, shape, dtype):
                    fetched = replace(copies, fetch=fetch) if plan.offload_weights else copies  # else 0.0 both
                    channels |= step_channels(passes, per_run, traffic, stages, fetched, slowdown, stack.overlap_dp,
                                              forward)
                side: dict[int, tuple[Num, Num, Num]] = {}  # per ZeRO stage partitioned: what its settings share
                for z, zero, o, oo in settings:
                    if (key := parted[zero, oo]) not in side:
                        dp, moved = (_per_step(synced, x) for x in channels[key])
                        dp = dp + _per_step(updates, tied)  # embedding_sync
                        side[key] = (dp, moved, pipelined + dp + moved)
                    dp, moved, beside = side[key]
                    yield (r, z, o, a), EndSteps(pipelined, dp, moved, _per_step(updates, opt[zero, oo]), bubble,
                                                 first, last, middle, beside)


_Side = tuple[StageParams, Collectives, np.ndarray, Collectives, dict[tuple[int, bool], Num]]


def _per_step(updates: Num, x: Num) -> Num:
    """``updates`` · ``x``: ``x`` itself for one update a step (x · 1 is x, bit for bit: no copy of a batch's array)."""
    return x if type(updates) is int and updates == 1 else updates * x


def _weight_side(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, n: int,
                 parted: dict[tuple[int, bool], int], eff: Efficiency) -> _Side:
    """What the n ranks' weights cost beside the passes, none of it read from the micro-batch: their parameters, the
    data-parallel collectives, the embedding's sync, their share of the tiers the layers' traffic spans, and per (ZeRO
    stage, optimizer offload) the optimizer step with its host loops (``parted``: the ZeRO stage each partitions).
    A batch's on the distinct rows of its other columns (a search chunk's micro-batch options: DeepSeek-V3's 15,360
    plans hold 3,740), spread back: the same element-wise arithmetic on fewer elements."""
    if type(plan) is Plan:  # one plan's, kept for its other settings (``_SIDES``)
        key = (id(model), id(cluster), id(stack), id(eff), n, tuple(parted.items()), with_settings(plan, **_GRID_FREE))
        held = (model, cluster, stack, eff)
        return _SIDES.answer(key, held, _frozen_side, model, cluster, plan, stack, n, parted, eff)
    rows = _micro_free(plan)
    if rows is None:
        return _side(model, cluster, plan, stack, n, parted, eff)
    first, inverse = rows
    few = _side(model, cluster, cast(Any, plan).select(first), stack, n, parted, eff)

    def spread(x: Num) -> Num:  # a value per rank and row (or one for all)
        return x[..., inverse] if isinstance(x, np.ndarray) and x.ndim else x

    def spread_all(c: Collectives) -> Collectives:  # the seconds spread, the cadence (``once``) as it was
        return Collectives(spread(c.all_reduce), spread(c.gather), spread(c.scatter), c.once, spread(c.lead_f),
                           spread(c.lead_b), spread(c.after))

    params = StageParams(*(spread(getattr(few[0], f)) for f in StageParams.__slots__))
    return (params, spread_all(few[1]), cast(np.ndarray, spread(few[2])), spread_all(few[3]),
            {k: spread(v) for k, v in few[4].items()})


# one plan's weight side, kept by the identities of its model, cluster, stack and efficiency, its ranks priced, the ZeRO
# stage each (ZeRO stage, optimizer offload) partitions (``parted``, which carries those settings) and the plan without
# the grid's settings, which nothing of it reads (``compose`` prices a batch's once for its whole grid): a space's plans
# that differ in their recompute or activation offload alone (issue 83)
_GRID_FREE = {"recompute": "none", "zero": 1, "offload_optimizer": False, "offload_activations": False}
_SIDES: Kept[_Side] = Kept(64)
# rows of a batch below which ``_weight_side`` computes every row: the distinct rows, the sub-batch and the spread cost
# more than they save on a small chunk (the weight side is mostly Python there: an 8-count plan's 1-3k-plan chunks)
SHARE_ABOVE = 8192


def _frozen_side(*args: Any) -> _Side:
    """``_side``, its arrays read-only (kept: no caller may change what the next one reads, as memory_grid._frozen)."""
    side = _side(*args)
    params, first, _, last, _ = side
    for x in (*(getattr(params, f) for f in StageParams.__slots__), *first, side[2], *last, *side[4].values()):
        if isinstance(x, np.ndarray):
            x.flags.writeable = False
    return side


def _micro_free(plan: Plan) -> tuple[np.ndarray, np.ndarray] | None:
    """(first, inverse): the distinct rows of a batch's per-plan columns but the micro-batch, where fewer than its
    rows (None for one plan, or where each row is its own)."""
    if not np.ndim(plan.dp) or np.size(plan.dp) < SHARE_ABOVE:
        return None
    columns = [v for f in fields(plan) if f.name != "micro_batch"
               and isinstance(v := getattr(plan, f.name), np.ndarray) and v.ndim == 1]
    if not columns or any(int(column.min()) < 0 for column in columns):
        return None
    first, inverse = distinct(columns)  # packed into one integer (mixed radix): a 1-D unique
    return (first, inverse) if len(first) < len(inverse) else None


def _side(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, n: int, parted: dict[tuple[int, bool], int],
          eff: Efficiency) -> _Side:
    """``_weight_side`` of every row of ``plan``."""
    shape, ends = np.shape(plan.dp), rank_params(model, plan)[:n]
    if schedule_of(plan.schedule).weight_copies == 2:  # DualPipe, two stages per rank: both reduced and stepped
        ends = tuple(replace(e, dense=2 * e.dense, expert=2 * e.expert, adapters=2 * e.adapters) for e in ends)
    params = StageParams(*(_rows(plan, [getattr(e, f) for e in ends], shape, np.float64)
                           for f in StageParams.__slots__))
    collectives = dp_collectives(model, cluster, plan, params, eff, stack)  # the same for every ZeRO stage
    tied = _rows(plan, embedding_sync(model, cluster, plan, eff)[:n], shape, np.float64)  # after the backward
    shared = Collectives(*shared_collectives(model, cluster, plan, params, eff, collectives))  # contention.py
    host = _step_hosts(model, cluster, plan, stack, tuple(parted), n, shape, collectives.all_reduce)
    return params, collectives, tied, shared, {
        k: update_time(cluster, with_settings(plan, zero=z, offload_optimizer=k[1]), params, eff, stack) + host[k]
        for k, z in parted.items()}


def _step_hosts(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, settings: tuple[tuple[int, bool], ...],
                n: int, shape: tuple[int, ...], all_reduce: Num) -> dict[tuple[int, bool], Num]:
    """The host's per-step work of the optimizer's per-parameter loops (step/host.optimizer_loops), per (ZeRO stage,
    optimizer offload) of the grid (``settings``): over the tensors the wrapper of that setting walks
    (cost/wrappers.py; DualPipe's ranks hold two stages), for the n ranks (``all_reduce``: their gradient all-reduce's
    seconds, a row each, under which the loops' part before the step's first synchronisation may hide:
    step/host.optimizer_loops)."""
    host: dict[tuple[int, bool], Num] = dict.fromkeys(settings, 0.0)
    if not paid_per_step(stack):
        return host
    tensors, both = rank_tensors(model, plan, stack)[:n], schedule_of(plan.schedule).weight_copies
    for z, oo in settings:
        setting = with_settings(plan, zero=z, offload_optimizer=oo)
        host[z, oo] = _rows(plan, [optimizer_loops(t, setting, stack, cluster.python_host, both, _row(all_reduce, i))
                                   for i, t in enumerate(tensors)], shape, np.float64)
    return host


def _row(values: Num, i: int) -> Num:
    """Row ``i`` of a per-rank array (a float: the same for every rank)."""
    return values[i] if isinstance(values, np.ndarray) and values.ndim else values


def _copies(model: ModelSpec, cluster: Cluster, plan: Plan, u: Units, shape: tuple[int, ...], dtype: type, n: int
            ) -> Offload:
    """The first, the last (and, n = 3, a middle) rank's activation-offload copies (channels.offload)."""
    if not plan.offload_activations:
        return Offload()
    each = [offload(model, cluster, plan, u.layer_saved, last) for last in (False, True)]
    each += [offload(model, cluster, plan, u.layer_saved, False, rank=1)] * (n == 3)
    return Offload(_rows(plan, [o.copy for o in each], shape, dtype),
                   _rows(plan, [o.share for o in each], shape, dtype))


def _fetches(cluster: Cluster, plan: Plan, params: StageParams, zeros: tuple[int, ...], stack: Stack,
             shape: tuple[int, ...], dtype: type) -> Iterator[tuple[tuple[int, ...], Num]]:
    """(ZeRO stages, the end ranks' weight fetch per pass) with offloaded weights (channels.weight_fetch: the weights
    each GPU holds, a shard under ZeRO-3, the whole stage's below); without, every stage at once with none."""
    if not plan.offload_weights:
        yield zeros, 0.0
        return
    for group in ((z for z in zeros if z < 3), (z for z in zeros if z == 3)):
        stages = tuple(group)
        if stages:
            held = model_states(params, with_settings(plan, zero=stages[0]), stack)[0]  # the three ranks (stacked)
            yield stages, weight_fetch(cluster, np.asarray(held, dtype=dtype))


def _flag(x: Num) -> Num:
    """A comparison's outcome: a bool for one plan (so that ``where`` picks without NumPy), an array for many."""
    return bool(x) if np.ndim(x) == 0 else x


def _each(x: Num, ndim: int, n: int) -> tuple[Num, ...]:
    """The first, the last (and the middle) rank's value of ``x``: its n rows, or ``x`` itself for each."""
    if np.ndim(x) == ndim:
        rows = cast(np.ndarray, x)
        return tuple(rows[i] for i in range(n))
    return (x,) * n


def _rows(plan: Plan, values: Sequence[Num], shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """The first, the last (and a middle) rank's value, stacked on a leading axis of 2 (3); where the pipeline has no
    middle rank (p ≤ 2) the first rank's value stands in the middle row (a copy: the largest of the rows is
    unchanged)."""
    out: np.ndarray = np.empty((len(values), *shape), dtype=dtype)
    out[0], out[1] = values[0], values[1]
    if len(values) == 3:
        out[2] = middle_or_first(plan, values[2], values[0])
    return out


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
    reserved_memory: Num = 0.0  # what the caching allocator reserves at most (memory.Memory.reserved)
    use_first: Num = True  # the first pipeline rank takes the longer step (else the last): the breakdown's rank
    # every rank's step beside the bubble and peak memory, where the ranks are priced apart (step/ranks.py)
    stage_steps: tuple[Num, ...] = ()
    stage_memory: tuple[Num, ...] = ()


def assemble(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, u: Units, eff: Efficiency = DEFAULT
             ) -> StepCosts:
    """The step of one plan (or a batch) under its own settings (``compose``, a grid of one), by component: the
    busier end rank's passes, channels and optimizer step, and the bubble; and memory."""
    settings = own_settings(plan)
    ((_, step),) = compose(model, cluster, plan, {plan.recompute: u}, settings, stack, eff)
    ranks = step.ranks()
    busiest = np.argmax(ranks, axis=0)  # 0 the first, 1 the last, 2 the middle rank (ties: the first)
    n = len(ranks)
    pick = {f: _choose(busiest, _each(getattr(step, f), ranks.ndim, n)) for f in ("dp", "optimizer", "offload")}
    each = (step.first, step.last, step.middle)[:n]
    stage = PassTimes(*(_choose(busiest, tuple(getattr(t, f) for t in each)) for f in PassTimes.__slots__))
    m = plan.grad_accum
    breakdown = {"compute": m * (stage.fwd + stage.bwd), "recompute": m * stage.recompute, "tp": m * stage.tp,
                 "cp": m * stage.cp, "ep": m * stage.ep + unpaired_passes(plan.pp, plan.vpp, m) * stage.unpaired,
                 "pp": m * stage.pp, "host": m * stage.host, "bubble": step.bubble} | pick
    mem = compose_memory(model, plan, {plan.recompute: u}, settings, stack)
    mems = tuple(memory_at_peak((mem.weights[0, 0, e], mem.grads[0, 0, e], mem.optimizer[0, 0, e]),
                                Phases(*mem.activations[0, 0, e]), mem.buffers[0], Ends(*mem.ends[:, 0]))
                 for e in range(mem.weights.shape[2]))
    heaviest = np.argmax(np.stack([np.asarray(x.total) for x in mems]), axis=0)
    memory = {k: _choose(heaviest, tuple(getattr(x, k) for x in mems)) for k in MEMORY}
    return StepCosts(breakdown=breakdown, step_time=step.total(), memory=memory,
                     peak_memory=mem.peak()[0, 0, 0, 0],
                     stage_fwd=stage.fwd, stage_bwd=stage.bwd + stage.recompute,
                     host_memory=mem.host()[0, 0, 0, 0],
                     ranks=tuple((r.t_f, r.t_b) for r in (step.first.passes(), step.middle.passes(),
                                                          step.last.passes())),
                     rank_memory=(mems[0].total, mems[1].total), use_first=_flag(busiest != 1),
                     reserved_memory=np.max(np.stack([np.asarray(x.total + x.stranded) for x in mems]), axis=0))


def _choose(index: Num, values: tuple) -> Num:
    """``values[index]``: of one plan (a NumPy integer), or each plan's of a batch (np.choose)."""
    if np.ndim(index) == 0:
        return values[int(index)]
    return np.choose(cast(np.ndarray, index), [np.broadcast_to(v, np.shape(index)) for v in values])


def step_costs(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack = DEFAULT_STACK,
               eff: Efficiency = DEFAULT, parts: Parts | None = None) -> StepCosts:
    """Step time, its breakdown and memory, without validation (the search validates in bulk)."""
    return assemble(model, cluster, plan, stack, unit_costs(model, cluster, plan, stack, eff, parts), eff)
