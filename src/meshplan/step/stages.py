"""A step's pipeline ranks from its units: the per micro-batch times of the first, a middle and the last rank
with their sends (``stage_times``), and how often a step updates the weights (``cadence``). The step composes them
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

from dataclasses import replace

from meshplan.cost.params import any_uneven, layers_on_first, layers_on_last, layers_on_stage
from meshplan.pipeline.bubble import flow_bubble
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.passes import PassTimes, hide
from meshplan.step.units import Units
from meshplan.xp import Num, maximum, minimum, where


def stage_times(model: ModelSpec, plan: Plan, stack: Stack, u: Units, loop: float = 0.0
                ) -> tuple[PassTimes, PassTimes, PassTimes]:
    """Per micro-batch times of the first and the last pipeline rank, and of a middle rank (its layers and sends,
    without the embedding or the head), by component; each with ``loop`` (``loop_times``)."""
    def body(layers: Num) -> PassTimes:
        return rank_body(plan, u, layers)

    single = plan.pp == 1
    middle = with_sends(plan, stack, body(layers_on_stage(model, plan)), u)
    # an uneven last stage (plan.last_stage_layers) has layers of its own; an even split the same as the others (in a
    # search batch holding both, layers_on_last gives the even rows the others' count: the same numbers)
    own_last = with_sends(plan, stack, body(layers_on_last(model, plan)), u) if any_uneven(plan) else middle
    # an uneven first stage (plan.first_stage_layers, a scalar even in a search batch) likewise
    own_first = with_sends(plan, stack, body(layers_on_first(model, plan)), u) if plan.first_stage_layers else middle
    first = own_first.plus(u.embed).plus(u.head.scaled(single))
    last = own_last.plus(u.head).plus(u.embed.scaled(single))
    if loop:
        first, last, middle = (t.plus(loop_times(loop)) for t in (first, last, middle))
    return first, last, middle


def loop_times(loop: float) -> PassTimes:
    """The training loop's host work per micro-batch on a rank (``Stack.microbatch_host`` at the host's speed,
    step/host.on_host): the batch's fetch and copy, the loss's reduction and logging, timers, run between
    synchronisations (Megatron-LM's timers call torch.cuda.synchronize at each start and stop, megatron/timers.py; its
    pipeline sends synchronise after batch_isend_irecv; the loss's NaN check reads a device flag), so no queued GPU
    work hides it: booked as the GPU's wait on the host, on every rank, so a 1F1B pipeline pays it on each of the
    m + p − 1 micro-batch slots of its critical path (the bubble is the other ranks' times). Half of it in each
    pass (Megatron's timers and sends synchronise around the forward and the backward alike), which also leaves the
    forward-backward asymmetry that the zero-bubble and Chimera bubbles price (step/stages.split_bubble) as it was.
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
    v, sends = plan.vpp, plan.vpp * (plan.pp > 1)
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
    return rank.plus(replace(added, fwd_comm=sends * paid_f, hidden_f=hid_f, hidden_b=hid_b,
                             traffic_f=sends * send_f, traffic_b=sends * send_b))


def cadence(plan: Plan) -> tuple[Num, Num]:
    """(micro-batches per weight update, weight updates per step): (m, 1), but (1, m) under PipeDream, which updates
    after every backward (Narayanan et al. 2019 §3.3); PipeDream-2BW updates once per m ≥ p (2021 §3.1)."""
    m = plan.grad_accum
    return (1, m) if plan.schedule == "pipedream" else (m, 1)


def split_bubble(schedule: str, pp: Num, first: PassTimes, last: PassTimes, middle: PassTimes, m: Num = 0) -> Num:
    """The bubble of a split-backward schedule from the ranks' passes (assemble.py): ``zero_bubble.closed_bubble`` with
    T_B = T_W = half the backward, T_F the forward, as the flow shop of ``bubble.flow_bubble`` prices ranks of
    unequal times: ZB-H1's (p − 1)·T_F is 1F1B's flow form over forward times; DualPipe's Table 2 form
    (p/2 − 1)·(T_F + T_B) its (p/2 − 1)/(p − 1) share of that flow form over T_F + T_B. ZB-V (zero_bubble_v.py): its
    table's (p − 1)·max(T_F − T_B, (T_B − T_F)/2), the paper's (p − 1)·(T_F + T_B − 2·T_W) where T_F ≥ T_B = T_W,
    over each rank's value; Chimera (chimera.py): its
    table's (p/2 − 1)·((T_F + T_B) + (2K − 1)·|T_B − T_F|) for K = m/p basic units, the first term 1F1B's flow form
    over whole passes at its (p/2 − 1)/(p − 1) share, the second over the ranks' largest |T_B − T_F| (Table 1's
    (p/2 − 1)·(T_F + T_B) where T_B = T_F; the concatenated units' intermediate bubbles otherwise, §3.5). The step
    stays monotone: a rate that widens |T_B − T_F| by δ shortens the m passes by at least δ, and m = K·p exceeds
    (p/2 − 1)(2K − 1)."""
    passes = [t.passes() for t in (first, last, middle)]
    if schedule == "zb-v":
        gap = [maximum(p.t_f - p.t_b / 2, (p.t_b / 2 - p.t_f) / 2) for p in passes]
        return flow_bubble("1f1b", pp, 1, *gap)
    if schedule == "chimera":
        whole = flow_bubble("1f1b", pp, 1, *(p.t_f + p.t_b for p in passes))
        widest: Num = 0.0
        for p in passes:
            widest = maximum(widest, maximum(p.t_b - p.t_f, p.t_f - p.t_b))  # the ranks' largest |T_B − T_F|
        units = maximum(2 * m / maximum(pp, 1) - 1, 0.0)
        return maximum(pp / 2 - 1, 0.0) * (whole / maximum(pp - 1, 1) + units * widest)
    if schedule == "dualpipe":  # Table 2's (p/2 − 1)·(T_F + T_B) with T_B = T_W = half the backward
        pair = flow_bubble("1f1b", pp, 1, *(p.t_f + p.t_b / 2 for p in passes))
        return pair * maximum(pp / 2 - 1, 0.0) / maximum(pp - 1, 1)
    return flow_bubble("1f1b", pp, 1, *(p.t_f for p in passes))


def two_chunk_times(schedule: object, first: PassTimes, last: PassTimes, middle: PassTimes, head: PassTimes
                    ) -> tuple[PassTimes, PassTimes, PassTimes]:
    """The end ranks' passes per micro-batch under the two-chunk schedules (zero_bubble_v.py): ZB-V's V runs the LM head
    on the first rank (the last rank turns the V: the middle ranks' layers); Chimera's end ranks each take half of the
    micro-batches through the first stage and half through the last, (first + last)/2 on average. Else unchanged."""
    if schedule == "zb-v":
        return first.plus(head), middle, middle  # even stages (specs/check_pipeline.py): the last rank's layers
    if schedule == "chimera":
        both = first.plus(last).scaled(0.5)
        return both, both, middle
    return first, last, middle


def ep_overlapped(rank: PassTimes, slowdown: Num) -> PassTimes:
    """DualPipe's forward-backward chunk pairs: a chunk's expert-parallel all-to-all runs under the other chunk's
    kernels (DeepSeek-V3 §3.2.1, Figure 4), exposed only beyond them plus the overlap's slowdown (``passes.hide``).
    The forward's share of the exposed communication (``fwd_comm``) loses half of what is hidden (dispatch and
    combine move the same bytes forward and backward)."""
    ep = hide(rank.ep, rank.fwd + rank.bwd, slowdown)
    saved = rank.ep - ep
    return replace(rank, ep=ep, fwd_comm=rank.fwd_comm - saved / 2)
