"""Step-level channels beside a pipeline rank's passes: data-parallel collectives, activation offload, the optimizer.

A step of a pipeline rank runs m forward and m backward passes, one per micro-batch. Beside them run
- the data-parallel collectives of ZeRO (Rajbhandari et al. 2020 §5, §7), on one NCCL stream: stage 0 all-reduces the
  gradients beside the last backward; 1 (Megatron's distributed optimizer) reduce-scatters them there and all-gathers
  (or broadcasts: param_sync.py) the updated weights beside the first forward (Megatron-Core overlap_grad_reduce /
  overlap_param_gather); 2 reduce-scatters beside every backward; 3 gathers the weights beside every forward and
  backward, where it also reduce-scatters the gradients (FSDP FULL_SHARD, DeepSpeed ZeRO-3 prefetching);
- activation offload (Transformer Engine's CPU-offload handler, double-buffered one layer ahead): an offloaded
  layer's saved activations go to the host beside the forward pass and come back beside the backward pass, over the
  host link (PCIe; NVLink-C2C on Grace), on copy engines, and only while the offloaded layers run (a share s of the
  pass: a layer's copy cannot hide behind the compute of layers that are not offloaded);
- the optimizer step, after the last backward pass, and before it, where the first and the last pipeline stage both
  hold the word embedding (a tied head, multi-token prediction), its gradient's all-reduce between them
  (``embedding_sync``), exposed.

The channels share the pass. Per pass, symbols:
    K   its kernels (the backward pass with its recompute)
    T   the pass as the layer-level rules price it (step.passes.pass_times: kernels, the exposed TP / CP / EP / pipeline
        traffic, and the slowdown σ·H of what that traffic hides)
    H   the layer-level traffic hidden under the kernels;  T' = T − σ·H, the pass without that slowdown
    D   the pass's data-parallel collectives (one stream: their times add)
    O   its offload copies; s the offloaded layers' share of the pass
    L   the gathers a pass that starts from an empty queue runs alone (``Stack.drained_passes``; else 0)
    σ   the overlap slowdown (efficiency.py: compute overlapped by communication runs 18.9 % slower, Lee et al. 2025)
The data-parallel traffic (NVLink / NIC), the offload copies (host link) and the layers' own traffic each keep their
own link busy, at the same time, so the pass lasts as long as the slowest of them, not as their sum:
    X = max(T' + L, D, O + (1 − s)·T') + σ·max(H, min(H + D, K))     data-parallel traffic overlapped (overlap_dp)
    X = max(T', O + (1 − s)·T') + σ·H + D                            data-parallel traffic after the pass
With offloaded weights (ZeRO-Infinity) the fetches F of every layer's weights share the host link with the copies, so
the link is busy at least O + F: the terms O + (1 − s)·T' above become max(O + (1 − s)·T', O + F).
The data-parallel collectives may run while exposed layer traffic holds the compute stream (T' counts it), the copies
only beside the offloaded layers (what (1 − s)·T' blocks). The compute is slowed once for each second it overlaps any
communication, σ·min(H + D, K), and never less than the layer-level rules already charged (σ·H); copy engines take no
SMs, so the copies slow nothing (their HBM traffic, tens of GB/s against TB/s, is below this model's resolution).

Monotone: X is built from max, min and sums of T', K, H, D and O, each non-decreasing in every op's time (T' = K plus
the exposed layer traffic, step.passes.pass_times), and every op's time is non-increasing in every rate and
non-decreasing in every latency; so the step never lengthens when a rate grows and never shortens when a latency grows
(tests/test_properties.py checks it on random plans). Per step a rank takes m·T_f + m·T_b + Σ_passes (X − T) + its
optimizer step; the step is the larger of the first and the last rank's (a middle rank holds no more than the first),
plus the bubble.

Link contention (contention.py): where the data-parallel collectives overlap a pass whose layer traffic uses a tier
they also span (dp inside the NVLink domain beside tp; gradients and pipeline sends across nodes), the two share that
tier's bandwidth: X grows by the fluid model's wait W.
Not modelled: on DGX-class nodes GPUDirect RDMA and host copies share the GPU's PCIe link (taken here as two paths).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from meshplan.collectives.contention import contended
from meshplan.collectives.price import LIBRARIES, collective_time, priced_on
from meshplan.cost.fsdp import accumulation_bytes, lead_times
from meshplan.cost.params import StageParams, layers_on_first, layers_on_last, layers_on_rank, trainable
from meshplan.cost.records import OpCost
from meshplan.cost.zero_group import zero_groups
from meshplan.memory import OPTIMIZER_STATE, WEIGHT_BYTES, offloaded_layers, per_parameter_byte
from meshplan.pipeline.registry import schedule_of
from meshplan.roofline import memory_time
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.param_sync import dp_groups, gradient_sync, weight_sync
from meshplan.xp import Num, maximum, minimum, where

ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True, slots=True)
class Passes:
    """One pipeline rank's forward (f) and backward (b) pass per micro-batch: T, K and H of the module docstring."""

    t_f: Num
    t_b: Num
    k_f: Num
    k_b: Num
    h_f: Num
    h_b: Num
    c_f: Num = 0.0  # the layer traffic of each pass at its own seconds, exposed or hidden (contention.py's C)
    c_b: Num = 0.0


@dataclass(frozen=True, slots=True)
class Offload:
    """A rank's activation-offload copies per pass (seconds each way) and the offloaded layers' share of the pass."""

    copy: Num = 0.0
    share: Num = 1.0
    # offloaded weights (ZeRO-Infinity, Rajbhandari et al. 2021 §5): the rank's weights fetched from the host a layer
    # at a time beside every pass (``weight_fetch``), over the same host link as the copies but beside every layer
    fetch: Num = 0.0


class Collectives(NamedTuple):
    """Seconds of one gradient all-reduce, parameter all-gather and gradient reduce-scatter of a rank's weights, whether
    the gradients are reduced beside the last backward pass alone at every ZeRO stage (``once``: ``zero_traffic``),
    the gathers a drained forward / backward pass runs alone (``lead_f``, ``lead_b``: ``dp_collectives``), and the
    seconds of the reduction that runs after the last backward pass, exposed (``after``: ``dp_collectives``)."""

    all_reduce: Num
    gather: Num
    scatter: Num
    once: bool = False
    lead_f: Num = 0.0
    lead_b: Num = 0.0
    after: Num = 0.0


def dp_collectives(model: ModelSpec, cluster: Cluster, plan: Plan, params: StageParams, eff: Efficiency,
                   stack: Stack | None = None) -> Collectives:
    """The data-parallel collectives of a rank holding ``params``, over the dp·cp ranks (and the expert-data-parallel
    ranks for expert weights); trainable parameters only (LoRA: the adapters). ``params`` may hold arrays of any
    shape that broadcasts with the plan's (the search stacks the first and the last rank's). Their cadence is
    ``stack``'s: reduced once per update where it accumulates whole gradients (``zero_traffic``); lead: cost/fsdp;
    after: the reduce-scatter, where a pipeline's runtime reduces a stage's gradients after its last backward
    (specs/pipeline_runtime.PipelineRuntime.reduces_after; ``step_channels``)."""
    params = trainable(params, plan)
    groups = dp_groups(plan)  # over every replica, within the ZeRO group, across its instances (param_sync.py)
    (dense_group, layout_d, _), (expert_group, _, _) = groups["whole"]
    if plan.dp_mode == "ps":  # the parameter server's module only where a plan runs one (start-up, issue 83)
        from meshplan.step.param_server import ps_collectives
        return Collectives(*ps_collectives(cluster, plan, params.dense * (dense_group > 1)
                                           + params.expert * (expert_group > 1), eff))

    library = LIBRARIES[plan.collectives]  # NCCL's, or MPICH's per-message choice with the minimum spanning tree
    priced: dict[tuple[str, int], Callable[[str, Num, Num], Num]] = {}

    def price(span: str, i: int) -> Callable[[str, Num, Num], Num]:  # each group split over the tiers once
        span = "whole" if groups[span] is groups["whole"] else span  # one instance: the ZeRO group is every replica
        if (span, i) not in priced:
            group, layout, _ = groups[span][i]
            priced[span, i] = priced_on(group, layout, cluster, eff, library)
        return priced[span, i]

    def coll(kind: str, per_param: int, span: str = "whole") -> Num:
        (g_d, _, share_d), (g_e, _, share_e) = groups[span]
        t = weight_sync(kind, params.dense * per_param * share_d, g_d, price(span, 0))
        return t + weight_sync(kind, params.expert * per_param * share_e, g_e, price(span, 1)) if model.is_moe else t

    gather = coll(stack.param_sync if stack and plan.zero < 3 else "all_gather", WEIGHT_BYTES, "zero")  # param_sync.py
    leads = lead_times(model, plan, stack, gather, lambda n: price("whole", 0)("all_gather", n * WEIGHT_BYTES,
                                                                              dense_group))
    scatter = gradient_sync(stack.grad_sync if stack and plan.zero < 3 else "reduce_scatter", plan, coll)
    after = where(plan.pp > 1, scatter, 0.0) if stack and stack.pipeline_runtime_mode.reduces_after else 0.0
    return Collectives(coll("all_reduce", plan.grad_bytes), gather, scatter,
                       bool(stack and stack.accumulate_unsharded), *leads, after)


def embedding_sync(model: ModelSpec, cluster: Cluster, plan: Plan, eff: Efficiency) -> tuple[Num, Num, Num]:
    """Seconds per weight update that the (first, last, middle) pipeline rank spends all-reducing the gradient of the
    word embedding that the first and the last stage both hold: a tied LM head, or the multi-token-prediction layers'
    copy (cost/params.end_params, mtp_params), V/t·h gradients of ``plan.grad_bytes`` over the two ranks p − 1 stages
    apart, after the backward pass and before the optimizer, not overlapped. Megatron-LM
    (megatron/core/distributed/finalize_model_grads.py ``_allreduce_word_embedding_grads``, over the embedding group,
    after the data-parallel reduction; share_embeddings_and_output_weights or mtp_num_layers) and DeepSpeed's
    pipeline engine (runtime/pipe/engine.py ``_exec_reduce_tied_grads``: allreduce_tied_weight_gradients) both do.
    None without a pipeline, where the ends share a rank (the schedule's record: ``ends_apart``) or where the
    embedding trains no gradient (LoRA); a middle rank holds neither end."""
    nbytes = tied_gradient_bytes(model, plan)
    if type(nbytes) is float and nbytes == 0.0:  # nothing shared (a search batch's sizes give an array otherwise)
        return 0.0, 0.0, 0.0
    apart = (plan.pp > 1) * schedule_of(plan.schedule).ends_apart
    t = collective_time("all_reduce", nbytes, 2, plan.stride("pp") * maximum(plan.pp - 1, 1), cluster, eff) * apart
    return t, t, 0.0


def tied_gradient_bytes(model: ModelSpec, plan: Plan) -> Num:
    """Bytes of the shared word embedding's gradient on one GPU of an end stage (``embedding_sync``): V/t·h of the
    plan's gradient bytes where the head is tied or multi-token prediction holds a copy, 0 otherwise or under LoRA."""
    if not (model.tied_embeddings or model.mtp_layers > 0) or plan.finetune == "lora":
        return 0.0
    return model.vocab_size * model.hidden_size / plan.tp * plan.grad_bytes


def optimizer_time(cluster: Cluster, plan: Plan, params: StageParams, eff: Efficiency, stack: Stack | None = None
                   ) -> Num:
    """The optimizer step over this GPU's shard, memory-bound: read the gradient (``grad_reads`` times), read and write
    the state (the fp32 master weight and the optimizer's own state, K bytes: memory.OPTIMIZER_STATE), write the bf16
    weight: (r·g + 2K + 2) bytes per parameter (``step_bytes``; Adam's K = 12 gives g + 24 + 2), streamed at
    roofline.memory_time's rate as the sharding planner's optimizer is. Offloaded: the gradient goes to the host and
    the weight comes back over PCIe, and the host's update streams the same 2K bytes per parameter.
    Trainable parameters only (LoRA: the adapters)."""
    params = trainable(params, plan)
    if plan.zero >= 1:
        group_d, group_e = zero_groups(plan)  # the ZeRO group's ranks (cost/zero_group.py)
        shard = params.dense / group_d + params.expert / group_e
    else:
        shard = params.total
    per_param = step_bytes(plan, stack)
    if plan.offload_optimizer:
        return shard * per_param / cluster.host_bandwidth
    step = memory_time(OpCost("optimizer/step", "step", "memory", nbytes=shard * per_param), cluster.accelerator, eff)
    if plan.offload_weights:  # the updated bf16 weights go back to their home in host memory
        return step + shard * WEIGHT_BYTES / cluster.host_bandwidth
    return step


def step_bytes(plan: Plan, stack: Stack | None = None) -> Num:
    """HBM bytes per parameter of the optimizer's step (``optimizer_time``): with an fp32 master copy
    (``stack.master_weights``, the default) OPTIMIZER_STATE's r·g + 2K + 2; without (KempnerForge casts its model to
    bf16, kempnerforge/distributed/parallel.py:207-209 @01b461a, and torch.optim updates it in place) the bf16
    parameter is its own master: read the 16-bit gradient FSDP2 casts each reduced shard to
    (_fsdp_collectives.py:696, torch 2.13.0), read and write the 16-bit weight and state (memory.optimizer_bytes),
    ``per_parameter_byte``'s rule at 2 bytes: Adam 2 + 2·4 + 2·2 = 14 bytes, not g + 24 + 2 = 30."""
    if stack is None or stack.master_weights:
        return OPTIMIZER_STATE[plan.optimizer].step_bytes(plan.grad_bytes)
    return per_parameter_byte(plan.optimizer, WEIGHT_BYTES, master=False)[1] * WEIGHT_BYTES


def accumulation_time(cluster: Cluster, plan: Plan, params: StageParams, eff: Efficiency, stack: Stack) -> Num:
    """Seconds per weight update of FSDP's gradient accumulation without communication (cost/fsdp.accumulation_bytes
    per unsharded trainable parameter of the rank, memory-bound, at roofline.memory_time's rate): the casts and adds
    FSDP2 makes of whole gradients between its syncs, beyond the copy into the reduce-scatter buffer that each
    micro-batch's ops already count (cost/fsdp.fsdp_grad_prep). The op records of a micro-batch do not read m, so this
    difference is priced once per update."""
    nbytes = accumulation_bytes(plan, stack)
    if type(nbytes) is float and nbytes == 0.0:
        return 0.0
    op = OpCost("fsdp/grad_accumulate", "step", "memory", nbytes=trainable(params, plan).total * nbytes)
    return memory_time(op, cluster.accelerator, eff)


def update_time(cluster: Cluster, plan: Plan, params: StageParams, eff: Efficiency, stack: Stack) -> Num:
    """The GPU's work per weight update beside the passes: the optimizer step and FSDP's gradient accumulation
    (``optimizer_time`` + ``accumulation_time``)."""
    return optimizer_time(cluster, plan, params, eff, stack) + accumulation_time(cluster, plan, params, eff, stack)


def weight_fetch(cluster: Cluster, weights: Num) -> Num:
    """Seconds to fetch a rank's offloaded ``weights`` (bytes on the GPU under its ZeRO stage) from host memory over
    the host link, once per pass: ZeRO-Infinity prefetches each layer's parameters before its forward and again
    before its backward (Rajbhandari et al. 2021, §5.1 and §6.2: the host link's bandwidth bounds the step when the
    compute per parameter is small)."""
    return weights / cluster.host_bandwidth


def offload(model: ModelSpec, cluster: Cluster, plan: Plan, layer_saved: Num, last: bool, rank: int | None = None
            ) -> Offload:
    """The first (or last, or ``rank``'s) rank's offload copies per pass: the saved bytes of its offloaded layers over
    the host link, beside the share of the pass those layers take."""
    if not plan.offload_activations:
        return Offload()
    n = offloaded_layers(model, plan, last=last, rank=rank)
    layers = layers_on_rank(model, plan, rank) if rank is not None else (
        layers_on_last(model, plan) if last else layers_on_first(model, plan))
    return Offload(layer_saved * n / cluster.host_bandwidth, n / layers)


def pass_channels(t: Num, k: Num, h: Num, d: Num, copy: Num, share: Num, slowdown: float, overlapped: bool
                  ) -> tuple[Num, Num]:
    """X − T of one pass (module docstring), split into what the data-parallel collectives ``d`` add (their own
    exposure and the slowdown) and what the offload copies ``copy`` add beyond that."""
    return _pass(t - slowdown * h, k, h, d, copy, share, slowdown, overlapped)


def _pass(bare: Num, k: Num, h: Num, d: Num, copy: Num, share: Num, slowdown: float, overlapped: bool,
          fetch: Num = 0.0, lead: Num = 0.0) -> tuple[Num, Num]:
    """``pass_channels`` from T' = ``bare``; ``fetch``: the weight fetches (``Offload.fetch``), X ≥ O + fetch; ``lead``:
    the part of ``d`` run before the pass's compute can start (``Collectives.lead_f``), X ≥ lead + T'."""
    none = type(d) is float and d == 0.0
    no_fetch = type(fetch) is float and fetch == 0.0
    if none and type(copy) is float and copy == 0.0 and no_fetch:
        return 0.0, 0.0
    moved: Num = 0.0
    if not (type(copy) is float and copy == 0.0 and no_fetch):  # the copies' link is free only beside the offloaded
        busy = copy + (1 - share) * bare  # layers; the weight fetches run beside every layer, on the same link
        busy = busy if no_fetch else maximum(busy, copy + fetch)
        moved = maximum(0.0, busy - (bare if none or not overlapped else maximum(bare, d)))
    if none:
        return 0.0, moved
    if not overlapped:
        return d, moved
    dp = maximum(lead, d - bare) + slowdown * (maximum(h, minimum(h + d, k)) - h)
    return dp, moved


# What each ZeRO stage runs beside (the first forward, every other forward, the last backward, every other backward)
# pass of a step, by ``Collectives`` field: priced by ``step_channels``, counted by ``zero_counts``
ZERO_TRAFFIC: dict[int, tuple[tuple[str, ...], ...]] = {
    0: ((), (), ("all_reduce",), ()),
    1: (("gather",), (), ("scatter",), ()),
    2: (("gather",), (), ("scatter",), ("scatter",)),
    3: (("gather",), ("gather",), ("gather", "scatter"), ("gather", "scatter")),
}


def zero_traffic(zero: int, once: bool = False) -> tuple[tuple[str, ...], ...]:
    """``ZERO_TRAFFIC[zero]``; ``once``: the gradients reduced beside the last backward pass alone, the reduce-scatter
    beside every other backward dropped (stages 2 and 3; 0 and 1 reduce once already). That is gradient accumulation
    without communication (``Stack.accumulate_unsharded``): KempnerForge's maybe_no_sync
    (kempnerforge/training/grad.py:17-40 @01b461a) calls FSDP2's set_requires_gradient_sync(False) on every
    micro-batch but the last (torch/distributed/fsdp/_fully_shard/_fully_shard.py:413-435, torch 2.13.0 cf30153c:
    ``reduce_grads`` false), whose post_backward then accumulates and reshards, skipping the reduce-scatter
    (_fsdp_param_group.py:607-611), as Megatron's and DDP's no_sync do at stages 0 and 1. The weights are still
    resharded after each backward (``reshard_after_backward``), so ZeRO-3 gathers them every pass as before; stage 2
    becomes stage 1's traffic."""
    first_f, other_f, last_b, other_b = ZERO_TRAFFIC[zero]
    if once:
        other_b = tuple(kind for kind in other_b if kind != "scatter")
    return first_f, other_f, last_b, other_b


def zero_counts(zero: int, m: Num, once: bool = False) -> dict[str, Num]:
    """How often each data-parallel collective of ZeRO stage ``zero`` runs per weight update of m micro-batches
    (``zero_traffic``: once beside the first forward and the last backward, m − 1 times beside the others), those of
    the last backward first: stage 0 one all-reduce, 1 one reduce-scatter and one all-gather, 2 m reduce-scatters and
    one all-gather, 3 2·m all-gathers and m reduce-scatters (``once``: one reduce-scatter at every stage)."""
    first_f, other_f, last_b, other_b = zero_traffic(zero, once)
    counts: dict[str, Num] = {}
    for kinds, n in ((last_b, 1), (first_f, 1), (other_f, m - 1), (other_b, m - 1)):
        for kind in kinds:
            counts[kind] = counts.get(kind, 0) + n
    return counts


def _stage_traffic(c: Collectives, zero: int, once: bool) -> tuple[Num, ...]:
    """The data-parallel collectives' seconds beside (the first forward, every other forward, the last backward, every
    other backward) pass of a step, by ZeRO stage (``zero_traffic``); passes that carry the same collectives get the
    same object (``step_channels`` prices each once)."""
    sums: dict[tuple[str, ...], Num] = {(): 0.0}
    traffic = zero_traffic(zero, once)
    for kinds in traffic:
        if kinds not in sums:
            total = getattr(c, kinds[0])
            for kind in kinds[1:]:
                total = total + getattr(c, kind)
            sums[kinds] = total
    return tuple(sums[kinds] for kinds in traffic)


def step_channels(p: Passes, m: Num, c: Collectives | tuple[Collectives, Collectives], zeros: tuple[int, ...],
                  off: Offload, slowdown: float, overlapped: bool, forward: dict | None = None
                  ) -> dict[int, tuple[Num, Num]]:
    """For each ZeRO stage in ``zeros``: what the data-parallel collectives and the offload copies add to a rank's
    step, (dp, offload) seconds, summed over its m forward and m backward passes. ``c``: the collectives, or they and
    their seconds on the tiers the layers' own traffic shares (contention.py: overlapped, the two flows share those
    tiers' bandwidth). Passes that carry the same traffic are priced once (the search asks for every stage at once),
    and terms that are the constant 0.0 cost nothing. ``forward``: a memo of forward passes without copies, shared by
    callers whose ranks differ only in their recompute mode (which changes the backward pass only). The part of the
    last backward's reduce-scatter that runs after the pass (``Collectives.after``) adds whole, beside nothing, to
    every rank's last backward: a simplification, since in a 1F1B drain stage s > 0 ends its last backward about
    s·t_b before stage 0, so part of its reduction hides in the drain and only stage 0's is wholly on the step's path;
    the step's max over the first and the last rank hides the difference where the two hold similar parameters."""
    c, shared = (c, None) if isinstance(c, Collectives) else c
    bare = {"f": p.t_f - slowdown * p.h_f, "b": p.t_b - slowdown * p.h_b}
    priced: dict[tuple[str, int, int, int], tuple[Num, Num, tuple[Num, Num]]] = {}
    plain = forward is not None and type(off.copy) is float and off.copy == 0.0 and type(off.fetch) is float \
        and off.fetch == 0.0

    def one(pass_: str, d: Num, s: Num, lead: Num) -> tuple[Num, Num]:
        memo = forward if plain and pass_ == "f" and forward is not None else priced
        key = (pass_, id(d), id(s), id(lead))
        if key not in memo:
            k, h = (p.k_f, p.h_f) if pass_ == "f" else (p.k_b, p.h_b)
            dp, moved = _pass(bare[pass_], k, h, d, off.copy, off.share, slowdown, overlapped, off.fetch, lead)
            if overlapped and not (type(s) is float and s == 0.0):  # the pass (X = T + dp + moved) waits W for
                whole = (p.t_f if pass_ == "f" else p.t_b) + dp + moved  # the shared tiers
                dp = dp + contended(whole, p.c_f if pass_ == "f" else p.c_b, d, s)
            memo[key] = (d, s, (dp, moved))
        return memo[key][2]

    out = {}
    for zero in zeros:
        traffic = _stage_traffic(c, zero, c.once)
        sharing = (0.0,) * 4 if shared is None else _stage_traffic(shared, zero, c.once)
        leads = ((c.lead_f if ph == "f" else c.lead_b) if "gather" in k else 0.0  # a drained pass's first gathers
                 for ph, k in zip("ffbb", zero_traffic(zero, c.once), strict=True))
        after = c.after if "scatter" in zero_traffic(zero, c.once)[2] else 0.0  # the last backward's reduction
        if not (type(after) is float and after == 0.0):  # after the pass, exposed: none of it beside the pass
            traffic = (*traffic[:2], traffic[2] - after, traffic[3])
            sharing = sharing if shared is None else (*sharing[:2], minimum(sharing[2], traffic[2]), sharing[3])
        f1, f, b1, b = (one(*args) for args in zip("ffbb", traffic, sharing, leads, strict=True))
        terms = ((1, f1), (m - 1, f), (1, (b1[0] + after, b1[1])), (m - 1, b))
        out[zero] = (_sum((n, part[0]) for n, part in terms), _sum((n, part[1]) for n, part in terms))
    return out


def _sum(terms: Iterable[tuple[Num, Num]]) -> Num:
    """Σ n·x over (n, x) pairs, skipping the x that are the float 0.0 (no array work for them)."""
    total: Num = 0.0
    for n, x in terms:
        if type(x) is float and x == 0.0:
            continue
        term = x if type(n) is int and n == 1 else n * x
        total = term if type(total) is float and total == 0.0 else total + term
    return total
