"""A step's pipeline ranks from its units: the per micro-batch times of the first, a middle and the last rank
with their sends (``stage_times``), how often a step updates the weights (``cadence``) and how often it runs
the schedule (``schedule_runs``). The step composes them
(step/assemble.py): the busiest of the first, the last and a middle rank, with its channels and optimizer step, and
the bubble
(bubble.flow_bubble, a flow shop: the other ranks' times once, over v; with equal ranks (p-1)/m for 1F1B and
(p-1)/(v·m) for the interleaved schedule, Narayanan et al. 2021 §2.2):
    t_step = max over the ranks of (m · t_rank + channels + optimizer) + ((p-2) · t_middle + t_other_end) / v
The asynchronous schedules never flush (steady.py): no bubble per step (their one fill per training run is amortised
away), and their optimizer-step cadence differs (``cadence``): PipeDream updates the weights after every micro-batch
(Narayanan et al. 2019 §3.3), so each of its m micro-batches per step carries its own data-parallel gradient reduction
and optimizer step; PipeDream-2BW after every m (Narayanan et al. 2021 §3.1), once per step as the synchronous ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from meshplan.cost.params import any_uneven, layers_on_first, layers_on_last, layers_on_stage
from meshplan.pipeline.forms import RankTimes
from meshplan.pipeline.registry import schedule_of
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.channels import Passes
from meshplan.step.passes import PassTimes, hide
from meshplan.step.units import Units
from meshplan.xp import Num, maximum, minimum, where


def stage_times(model: ModelSpec, plan: Plan, stack: Stack, u: Units, loop: float = 0.0
                ) -> tuple[PassTimes, PassTimes, PassTimes]:
    """Per micro-batch times of the first and the last pipeline rank, and of a middle rank (its layers and sends,
    without the embedding or the head), by component; each with ``loop`` (``loop_times``)."""
    def body(layers: Num) -> PassTimes:
        return rank_body(plan, u, real(layers))

    single = plan.pp == 1
    middle = with_sends(plan, stack, body(layers_on_stage(model, plan)), u)
    # an uneven last stage (plan.last_stage_layers) has layers of its own; an even split the same as the others (in a
    # search batch holding both, layers_on_last gives the even rows the others' count: the same numbers)
    own_last = with_sends(plan, stack, body(layers_on_last(model, plan)), u) if any_uneven(plan) else middle
    # an uneven first stage (plan.first_stage_layers, a scalar even in a search batch) likewise
    own_first = with_sends(plan, stack, body(layers_on_first(model, plan)), u) if plan.first_stage_layers else middle
    first = own_first.plus(u.embed).plus(u.head.scaled(real(single)))
    last = own_last.plus(u.head).plus(u.embed.scaled(real(single)))
    if loop:
        first, last, middle = (t.plus(loop_times(loop)) for t in (first, last, middle))
    return first, last, middle


def real(counts: Num) -> Num:
    """A batch's integer counts (layers, sends, micro-batches) as float64, cast once: each product with a pass's
    seconds would cast them again (NumPy converts an int64 operand element by element in every mixed operation, 11 %
    of the search's step-time instructions). The same numbers: counts below 2**53 convert exactly. One plan's as
    they are."""
    return counts.astype(np.float64) if isinstance(counts, np.ndarray) and counts.dtype.kind in "iub" else counts


def loop_times(loop: float) -> PassTimes:
    """The training loop's host work per micro-batch on a rank (``Stack.microbatch_host`` at the host's speed,
    step/host.on_host): the batch's fetch and copy, the loss's reduction and logging, timers, run between
    synchronisations (Megatron-LM's timers call torch.cuda.synchronize at each start and stop, megatron/timers.py; its
    pipeline sends synchronise after batch_isend_irecv; the loss's NaN check reads a device flag), so no queued GPU
    work hides it: booked as the GPU's wait on the host, on every rank, so a 1F1B pipeline pays it on each of the
    m + p − 1 micro-batch slots of its critical path (the bubble is the other ranks' times). Half of it in each
    pass (Megatron's timers and sends synchronise around the forward and the backward alike), which also leaves the
    forward-backward asymmetry that the zero-bubble and Chimera bubbles price (stage_bubble) as it was.
    Per micro-batch, not per model chunk: an interleaved schedule's v chunks are taken to share one (its CI runs
    have v = 1)."""
    return PassTimes(fwd_comm=loop / 2, host=loop)


def rank_body(plan: Plan, u: Units, layers: Num) -> PassTimes:
    """A rank's ``layers`` per micro-batch under the plan's recompute (``u``: the units of that mode): under full
    recompute of N layers (``plan.recompute_layers``; 0 all) N recomputed and the rest plain."""
    if plan.recompute == "full":
        redone = layers if plan.recompute_layers == 0 else minimum(plan.recompute_layers, layers)
        return u.layer.scaled(redone).plus(u.layer_plain.scaled(layers - redone))
    return u.layer.scaled(layers)


def with_sends(plan: Plan, stack: Stack, rank: PassTimes, u: Units) -> PassTimes:
    """A rank's layers with its pipeline sends: each of its v chunks sends its activation once in the forward pass
    and its gradient once in the backward pass. With ``stack.overlap_pp`` and v > 1 a send hides behind a chunk's
    compute of the same pass (1/v of the pass) at the overlap slowdown ``u.p2p_paid``, whatever exceeds it exposed
    (``hide``; with ``p2p_paid`` = 1 every send is exposed: hide(c, w, 1) = c)."""
    v, sends = real(plan.vpp), real(plan.vpp * (plan.pp > 1))
    send_f = u.p2p.fwd_comm  # one send of each pass, as exposed (the p2p ops are all communication)
    send_b = u.p2p.total - send_f
    t = rank.passes()
    interleaved = v > 1
    paid_f = where(interleaved, hide(send_f, t.t_f / v, u.p2p_paid), send_f)
    paid_b = where(interleaved, hide(send_b, t.t_b / v, u.p2p_paid), send_b)
    added = u.p2p.scaled(sends * (paid_f + paid_b) / maximum(send_f + send_b, 1e-30))
    hid_f: Num
    hid_b: Num
    hid_f = hid_b = 0.0
    if stack.overlap_pp:
        hid_f = sends * where(interleaved, minimum(send_f, t.t_f / v), 0.0)
        hid_b = sends * where(interleaved, minimum(send_b, t.t_b / v), 0.0)
    return rank.plus(added.with_(fwd_comm=sends * paid_f, hidden_f=hid_f, hidden_b=hid_b, traffic_f=sends * send_f,
                                 traffic_b=sends * send_b))


def cadence(plan: Plan) -> tuple[Num, Num]:
    """(micro-batches per weight update, weight updates per step): (m, 1), but (1, m) under PipeDream, which updates
    after every backward (Narayanan et al. 2019 §3.3); PipeDream-2BW updates once per m ≥ p (2021 §3.1)."""
    m = plan.grad_accum
    return (1, m) if schedule_of(plan.schedule).update_every_micro else (m, 1)


def schedule_runs(plan: Plan, stack: Stack) -> Num:
    """Runs of the pipeline schedule per step: 1, or where the training loop hands the schedule
    ``stack.schedule_batch`` sequences of a data-parallel rank at a time, ⌈m·b / schedule_batch⌉ of them (b the
    micro-batch; at least 1, at most m: a micro-batch a run). Each run starts from an empty pipeline and drains it,
    and ends with the data-parallel reduction of its gradients; the optimizer still steps once. NeMo AutoModel's
    benchmark loop (nemo_automodel/recipes/llm/benchmark.py @01926a5c, run_benchmark) calls _forward_backward_step
    once per gradient-accumulation step, ga_steps = global_batch_size // (local_batch_size · dp), and with pipeline
    parallelism each call runs ``schedule.step`` over its local batch (recipes/llm/train_ft.py there), so m·b /
    local_batch_size runs of local_batch_size / pp_microbatch_size micro-batches; torch.distributed.pipelining's
    schedules mark the last backward of each ``step`` (``last_backward``), on which a stage whose module is an
    FSDPModule (components/moe/parallelizer.py apply_fsdp wraps each stage's root) turns its gradient sync and
    resharding back on and reduce-scatters its gradients: torch 2.8's backward_maybe_with_nosync, and
    components/moe/fsdp_mixin.py patched_backward_maybe_with_nosync where a config sets enable_fsdp_optimizations,
    which tests the FSDPModule branch before its once-a-step MoE one. So the next run gathers the weights again: the
    reduction and the gather ZeRO-1's traffic prices once a step, once a run (step/channels.step_channels at m / runs
    micro-batches, times runs). The run's token count is read off its CPU batch (``.item()`` of a host tensor: no
    device synchronisation). Without pipeline parallelism, or under a schedule that never flushes
    (pipeline/registry.py), 1. Time only: peak memory still holds the step's m micro-batches in flight, where a run
    holds at most m / runs (an interleaved warm-up can exceed a run: Kimi K2's rank 0, 30 chunk-micro-batches of a
    run's 24), so a runs stack's memory reads high (review22)."""
    if not stack.schedule_batch or not schedule_of(plan.schedule).flushes:
        return 1
    m = plan.grad_accum
    runs = minimum(maximum(-(-(m * plan.micro_batch) // stack.schedule_batch), 1), m)
    if isinstance(runs, np.ndarray):
        return where(plan.pp > 1, runs, 1)
    return int(runs) if plan.pp > 1 else 1


def run_cadence(plan: Plan, stack: Stack) -> tuple[Num, Num, Num]:
    """(micro-batches per run of the data-parallel traffic, its runs per step, runs of the schedule): ``cadence``
    with each update's micro-batches split over the schedule's runs (``schedule_runs``)."""
    per_update, updates = cadence(plan)
    runs = schedule_runs(plan, stack)
    if type(runs) is int and runs == 1:
        return per_update, updates, 1
    return per_update / runs, updates * runs, runs


def stage_bubble(plan: Plan, ends: Sequence[tuple[Passes, Num]], runs: Num = 1) -> Num:
    """The bubble of ``plan``'s schedule from the first, the last and a middle rank's passes and their totals (p − 2
    middle ranks alike; scalars or a search batch's arrays): its record's closed form over per-rank times
    (meshplan.pipeline.forms: a flow shop over each rank's value, bubble.flow_bubble), paid once per run of the
    schedule (``schedule_runs``), each over its m / runs micro-batches."""
    ranks = RankTimes.of_ends(plan.pp, *((p.t_f, p.t_b, total) for p, total in ends))
    if type(runs) is int and runs == 1:
        return schedule_of(plan.schedule).bubble(ranks, plan.vpp, plan.grad_accum)
    return runs * schedule_of(plan.schedule).bubble(ranks, plan.vpp, plan.grad_accum / runs)


def two_chunk_times(schedule: object, first: PassTimes, last: PassTimes, middle: PassTimes, head: PassTimes
                    ) -> tuple[PassTimes, PassTimes, PassTimes]:
    """The end ranks' passes per micro-batch where the schedule's record places the stages otherwise than one a
    rank in order: ZB-V's V runs the LM head on the first rank (the last rank turns the V: the middle ranks' layers);
    Chimera's end ranks each take half of the micro-batches through the first stage and half through the last,
    (first + last)/2 on average. Else unchanged."""
    record = schedule_of(schedule)
    if record.mirrored:
        both = first.plus(last).scaled(0.5)
        return both, both, middle
    if not record.head_last:
        return first.plus(head), middle, middle  # even stages (its refusals): the last rank's layers
    return first, last, middle


def ep_overlapped(rank: PassTimes, slowdown: Num) -> PassTimes:
    """DualPipe's forward-backward chunk pairs: a chunk's expert-parallel all-to-all runs under the other chunk's
    kernels (DeepSeek-V3 §3.2.1, Figure 4), exposed only beyond them plus the overlap's slowdown (``passes.hide``).
    The forward's share of the exposed communication (``fwd_comm``) loses half of what is hidden (dispatch and
    combine move the same bytes forward and backward)."""
    ep = hide(rank.ep, rank.fwd + rank.bwd, slowdown)
    saved = rank.ep - ep
    return rank.with_(ep=ep, fwd_comm=rank.fwd_comm - saved / 2)


def unpaired_passes(pp: Num, v: Num, m: Num) -> Num:
    """Passes of a rank's layers (v chunks each) that run without a partner under the combined 1F1B schedule, beyond
    the m that ``PassTimes.unpaired`` is not charged for. Megatron-Core core_v0.14.0 (23e00ed): combined_1f1b.py
    runs the first micro-batch's forward and the last one's backward alone (pp = 1: one pass); schedules.py
    get_pp_rank_microbatches gives rank r of an interleaved pipeline w_r = (pp − r − 1)·2 + (v − 1)·pp + 1 forward
    chunks of warm-up (the + 1 under overlap_moe_expert_parallel_comm), at most m·v, and as many backward chunks of
    cool-down, all alone. Priced along the last rank, the step's critical path: its own w = (v − 1)·pp + 1 and the
    pp − 1 chunks of fill and drain the bubble holds (priced there with paired passes): min(m, w / v) + (pp − 1) / v,
    that is pp once m·v >= w."""
    return minimum(m, ((v - 1) * pp + 1) / v) + (pp - 1) / v
