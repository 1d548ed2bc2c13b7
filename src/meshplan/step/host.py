"""The host as a resource (issue 46): what a pass's ops cost the host CPU that issues them, and the seconds the GPU
waits on it. step/passes.py composes a pass's time with it; written once, so that any schedule of ops (training's
passes, a serving step, the sharding planner's) can use it.

The host's costs come as their own small record, ``HostCost`` (specs/host_cost.py: ``Stack.host``), not the whole
stack. The host issues each kernel and collective call asynchronously, ``host.per_kernel`` seconds each (``launches``;
one graph per pass under ``host.cuda_graphs``), at its own CPU's speed (``on_host``), and the GPU cannot run a
kernel before it is issued. Two bounds:
- without synchronisation the host's lead carries through the whole pass, and the pass takes max(host, GPU): the GPU
  waits max(0, H − G) (``host_times``). That is the launch queue's steady state: the GPU starts each kernel at
  max(its issue time, the end of the one before) (``queue_step``, a two-machine flow line), and L layers queued one
  after another take L·max(H, G) plus at most one layer's start-up, since a flow line runs at its slower machine's
  pace (tests/test_launch_queue.py). PyTorch's NCCL collectives are such calls: ProcessGroupNCCL enqueues the
  collective on its stream and returns, and ``wait()`` makes the compute stream wait on it, not the host
  (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, unless TORCH_NCCL_BLOCKING_WAIT), so an exposed all-reduce
  (Megatron's TP all-reduce) costs the host one call and the GPU its transfer; ranks that issue it alike meet at it
  without losing the lead. (Megatron's pipeline sends do synchronise the device after batch_isend_irecv, but a group
  of sends has no host term here: step/passes.py.) The published Megatron-LM 2021 runs agree: the GPU-bound runs at tp
  2-8 (Narayanan et al. 2021 Table 1) read 1-3 points slower had each all-reduce drained the host's lead.
- a synchronisation drains the queue (issue 46: "synchronisations (NCCL calls in stacks that wait, .item(), MoE token
  counts) drain the queue ... the step is the max of the host's and the GPU's timelines between syncs"): under
  ``host.blocking_collectives`` (a host that waits for each exposed collective to finish, as ``.item()`` waits)
  between syncs each segment starts from an empty queue and takes its flow line's makespan q_s (``queue_step``:
  between max(host_s, GPU_s) and Σ over its kernels of the larger of the two, plus one kernel's smaller), and then its
  closing collective c_s, which the host waits out issuing nothing (the wait blocks it), and the pass Σ_s (q_s + c_s),
  which is ≥ max(H, G) (Σ max ≥ max Σ). Collectives that hide behind compute (``host.hidden_tp``, the context-parallel
  ring) are no syncs. A CUDA-graphed stack launches the collectives inside its graph: one launch per pass, no
  segments. The MoE
  tokens-per-expert sync is the per-expert path's (roofline.op_time, mlp_moe.host_launched: HostCost.per_kernel too).
- every launch a synchronisation (``host.blocking_launches``: CUDA_LAUNCH_BLOCKING=1 "disables asynchronicity of
  kernel launches", CUDA C++ Programming Guide, "Asynchronous Concurrent Execution"; NCCL's kernels are launches too):
  the host issues the next kernel only after the GPU has run the last, so nothing of either hides and the pass takes
  H + G (the GPU waits H).
  BigScience trained BLOOM so (bigscience-workshop/bigscience train/tr11-176B-ml/README.md, "Important environment
  variables": the workaround for a hang at 40+ nodes).
- every layer's pass from an empty queue (``host.drained_layers``, Stack.drained_passes "layers"): each pass of a layer
  (and of the embedding and head) is priced as its flow line from an empty queue, not at the lead's steady state
  max(H, G), as a graph made of one layer's trace taken between host-side work may repeat it (vTrain's profiler
  flushes its records at every module's start and end: host work, no stated synchronisation; the choice is
  registered as made with its runs in view, meshplan_validation/fitted.py); its collectives close segments only where
  the host also waits for them.
The pass takes max(G, H), G the pass's GPU time after the overlap rules, and where the host waits for its collectives
the larger of that and Σ_s (q_s + c_s) (``host_idle``); each is non-increasing in every rate and
non-decreasing in the host's cost, so the step stays monotone (step/passes.py's docstring).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import cast

import numpy as np

from meshplan.cost.recompute import rerun_by, rerun_part, runs_again
from meshplan.cost.records import OpCost
from meshplan.cost.tensors import Tensors, stepped
from meshplan.cost.wrappers import partitioned_zero, wrapped
from meshplan.specs.host_cost import HostCost
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num, maximum, minimum, where


def on_host(stack: Stack, python_host: float) -> Stack:
    """``stack`` on a host CPU that takes ``python_host`` times as long for PyTorch's Python-side work as the x86 DGX
    host its constants were measured against (Cluster.python_host: Grace 2.46-2.75, a torch Linear's CPU time on GH200
    / GB200 against DGX H100's Xeon 8480C, NVIDIA/TransformerEngine issue #2053; the serving engines' Python loops
    scale the same, serve/engine.py): its host seconds per kernel, per compiled region and per parameter tensor
    scaled, and the training loop's per micro-batch and per step; 1 leaves it as is."""
    if python_host == 1.0:
        return stack
    # a derived stack, not user input: not checked against the fields' ranges again (a valid stack's times a valid
    # python_host may lie past them, as a slow host's cost may)
    scaled = copy.copy(stack)
    object.__setattr__(scaled, "host_dispatch", stack.host_dispatch * python_host)
    object.__setattr__(scaled, "collective_host", stack.collective_host * python_host)
    object.__setattr__(scaled, "region_host", stack.region_host * python_host)
    object.__setattr__(scaled, "tensor_host", stack.tensor_host * python_host)
    object.__setattr__(scaled, "tensor_host_queued", stack.tensor_host_queued * python_host)
    object.__setattr__(scaled, "microbatch_host", stack.microbatch_host * python_host)
    object.__setattr__(scaled, "iteration_host", stack.iteration_host * python_host)
    return scaled


def step_host(tensors: Num, stack: Stack, python_host: float = 1.0) -> Num:
    """Host seconds per optimizer step beyond the passes: ``tensors`` parameter tensors on the GPU (cost/tensors.py)
    at ``stack.tensor_host`` each, at this host's speed (``on_host``). The GPU waits them out: the step's
    synchronisations come first (the loss scaler's inf check and the gradient norm read back with ``.item()``
    in Megatron's and DeepSpeed's optimizers, the logged loss in every training loop), so no queued GPU work hides
    the per-parameter loops that follow, and the optimizer's kernels are issued only after them; the term adds to
    the optimizer step's GPU time (channels.optimizer_time). The part issued before the first synchronisation
    (``Stack.tensor_host_queued``) may hide under the gradient all-reduce queued ahead of it (``optimizer_loops``)."""
    return tensors * on_host(stack, python_host).tensor_host


def optimizer_loops(tensors: Tensors, plan: Plan, stack: Stack, python_host: float = 1.0, stages: int = 1,
                    all_reduce: Num = 0.0) -> Num:
    """Host seconds of the optimizer step's per-parameter loops on a rank holding ``tensors`` (of ``stages`` pipeline
    stages: DualPipe's ranks hold two) that the GPU waits out: the tensors that the wrapper the plan runs walks
    (cost/wrappers.wrapped, cost/tensors.stepped), at its cost per tensor (``step_host``), less what hides. The part
    issued before the step's first synchronisation (``Stack.tensor_host_queued``: Megatron's fp16 wrapper casts each
    fp16 main_grad before its found-inf ``.item()``) runs while the GPU works through ``queued`` seconds already
    queued (the data-parallel gradient all-reduce issued just before, on a stack that does not overlap it): that
    segment takes max(pre, queued), so min(pre, queued) of it hides; ``queued`` is ``queued_reduction`` of the rank's
    gradient all-reduce (``all_reduce`` seconds, channels.dp_collectives) under the ZeRO stage the plan's wrapper
    partitions (cost/wrappers.partitioned_zero). Non-decreasing in every per-tensor cost and tensor count,
    non-increasing in ``all_reduce``, and ``all_reduce`` + this is non-decreasing in ``all_reduce`` (the step stays
    monotone as the collective slows)."""
    walker = wrapped(stack, plan)
    count = stages * stepped(tensors, plan, walker)
    loops = step_host(count, walker, python_host)
    queued = queued_reduction(all_reduce, partitioned_zero(plan, stack), stack)
    if not walker.tensor_host_queued or (type(queued) is float and queued == 0.0):
        return loops
    return loops - minimum(count * on_host(walker, python_host).tensor_host_queued, queued)


def queued_reduction(all_reduce: Num, zero: int, stack: Stack) -> Num:
    """GPU seconds queued ahead of the optimizer step's first loops (``optimizer_loops``' ``queued``): the
    data-parallel gradient all-reduce (``all_reduce`` seconds, channels.dp_collectives), which a stack without ZeRO
    issues after the backward pass and, where it does not overlap it with the backward (``Stack.overlap_dp``), right
    before the optimizer step: Megatron's train_step calls reduce_model_grads and then optimizer.step (Megatron-
    DeepSpeed 4822c87e megatron/training.py; the local DDP's allreduce_gradients enqueues NCCL's all-reduce and
    returns, module docstring). 0 otherwise (an overlapped reduction is spent by then; ZeRO's reductions are its
    optimizer's own)."""
    if stack.overlap_dp or zero != 0:
        return 0.0
    return all_reduce


def paid_per_step(stack: Stack) -> bool:
    """Whether the stack has per-parameter loops in its optimizer step (``step_host``) at all (a wrapper picked per
    plan, cost/wrappers.py, may have)."""
    return bool(stack.tensor_host or stack.wrapper.per_plan)


def loop_host(stack: Stack, python_host: float = 1.0) -> float:
    """Host seconds the training loop spends per micro-batch on each pipeline rank (``stack.microbatch_host``,
    step/stages.loop_times), at this host's speed."""
    return float(on_host(stack, python_host).microbatch_host)


def iteration_host(stack: Stack, python_host: float = 1.0) -> float:
    """Host seconds the training loop spends per step beyond the passes and the optimizer (``stack.iteration_host``:
    its logging and bookkeeping, after the step's synchronisation), at this host's speed: once per step, however
    many optimizer updates the schedule makes (PipeDream's one per micro-batch included)."""
    return float(on_host(stack, python_host).iteration_host)


def launches(op: OpCost) -> Num:
    """Kernels the host issues for an op: a collective one NCCL call per message (``repeat``) when its group has
    more than one rank (the call's host cost is a launch's); a compute op with work ``max(op.kernels, op.launches)``
    (one per record of a fused kernel, the per-expert GEMMs one per local expert, an eager aten sequence of
    cost/eager.py one per aten op: the records follow the stack's fusion); an op without work (a view) none."""
    if op.collective is not None:
        return op.repeat * (op.collective.group > 1)
    return maximum(op.kernels, op.launches) * ((op.flops > 0) | (op.nbytes > 0))


def per_launch(op: OpCost, host: HostCost) -> float:
    """Host seconds per launch of ``op`` (``HostCost.per_call``): a collective call at ``host.per_collective`` where
    the stack states it (an NCCL call from the model's code is c10d's dispatch and enqueue, without the Python module
    code around a kernel that the per-kernel cost averages: Megatron-DeepSpeed's layer at tp 2 makes tp 1's Python
    calls and aten ops plus its all-reduces, data/measured/2026-11-27-megatron-host-cpu-tp.json), else
    ``host.per_kernel``."""
    return host.per_call(op.collective is not None)


def most_launches(op: OpCost) -> float:
    """An upper bound of ``launches`` over the plans of a batch, as one number (the search's ops hold arrays)."""
    if op.collective is not None:
        return op.repeat if type(op.repeat) is float else float(np.max(op.repeat))
    k, n = op.kernels, op.launches
    return max(k if type(k) is float else float(np.max(k)), n if type(n) is float else float(np.max(n)))


def host_times(ops: list[OpCost], plan: Plan, host: HostCost, recompute: str,
               count_of: Callable[[OpCost], Num] = launches) -> dict[str, Num]:
    """Host seconds to issue the forward ("f") and backward ("b") pass of a group of ops: kernels launched
    (``count_of``: ``launches``) × their host seconds each (``per_launch``: ``host.per_kernel``, a collective
    call ``host.per_collective`` where stated), the backward's including what recompute launches again;
    a CUDA-graphed stack (``host.cuda_graphs``) launches one graph per group and pass instead. Plus the records' own
    host seconds (``OpCost.host``: a framework's Python that launches nothing, such as ZeRO-3's module hooks), which
    full recompute runs again with the forward and a graph does not replace."""
    count, cost, hooks = (dict(d) for d in _issued(ops, host, count_of))
    if recompute == "full":  # the forward runs again, its modules' hooks with it
        count["b"], cost["b"] = count["b"] + count["f"], cost["b"] + cost["f"]
        hooks["b"] = hooks["b"] + hooks["f"]
    elif recompute == "selective":
        for op, share in zip(ops, rerun_by(ops, plan.recompute_modules), strict=True):
            if runs_again(share):
                n = rerun_part(share, count_of(op))  # all or a share of its kernels (per-op SAC's for-loop experts)
                count["b"], cost["b"] = count["b"] + n, cost["b"] + n * per_launch(op, host)
    if host.cuda_graphs:
        return {ph: minimum(c, 1.0) * host.per_kernel + hooks[ph] for ph, c in count.items()}
    return {ph: cost[ph] + hooks[ph] for ph in cost}


# The per-op sums of ``host_times`` (count, cost, hooks per pass) of the last ops lists met, by the list's identity
# (held here, so that its id is not reused while kept) with the host's costs and the count: a group's records are
# summed alike under every recompute mode, the bound's count and the launches' (passes.pass_times): DeepSeek-V3's
# search asked 469 times for 227 distinct sums. Few kept: a search's lists hold arrays of thousands of keys.
_ISSUED: dict[tuple[int, HostCost, Callable[[OpCost], Num]], tuple[list[OpCost], tuple[dict[str, Num], ...]]] = {}
_ISSUED_KEPT = 16


def _issued(ops: list[OpCost], host: HostCost, count_of: Callable[[OpCost], Num]) -> tuple[dict[str, Num], ...]:
    """(count, cost, hooks) per pass of ``ops``, summed in the records' order (``host_times``), kept (``_ISSUED``)."""
    key = (id(ops), host, count_of)
    kept = _ISSUED.get(key)
    if kept is not None and kept[0] is ops:
        return kept[1]
    count: dict[str, Num] = {"f": 0.0, "b": 0.0}
    cost: dict[str, Num] = {"f": 0.0, "b": 0.0}  # the launches' host seconds (``per_launch``)
    hooks: dict[str, Num] = {"f": 0.0, "b": 0.0}  # what the records' Python costs beyond their launches (op.host)
    per = (host.per_call(False), host.per_call(True))  # ``per_launch``'s two numbers: a kernel's, a collective call's
    alike = count_of is launches
    for op in ops:
        ph = "f" if op.phase == "fwd" else "b"
        m = _alike(op, count[ph], cost[ph]) if alike else None
        if m is None:
            n = count_of(op)
            count[ph], cost[ph] = count[ph] + n, cost[ph] + n * per[op.collective is not None]
        else:  # into the sums in place: arrays this loop made (its first op's sum is a new array)
            c, k = cast(np.ndarray, count[ph]), cast(np.ndarray, cost[ph])  # arrays (_alike's test)
            np.add(c, m, out=c)
            np.add(k, m * per[op.collective is not None], out=k)
        if not (type(op.host) is float and op.host == 0.0):  # ``hosted(op)``
            hooks[ph] = hooks[ph] + op.host
    for sums in (count, cost, hooks):  # kept: no caller may change them in place
        for v in sums.values():
            if isinstance(v, np.ndarray):
                v.flags.writeable = False
    if len(_ISSUED) >= _ISSUED_KEPT:
        del _ISSUED[next(iter(_ISSUED))]  # the oldest
    _ISSUED[key] = (ops, (count, cost, hooks))
    return count, cost, hooks


def _alike(op: OpCost, count: Num, cost: Num) -> float | None:
    """``launches(op)``'s one value where it holds it at every plan of a batch (the search's), else None: the
    sums ``count`` and ``cost`` are float arrays of the shape it has, so adding the number adds the same as adding the
    array (each element the same IEEE sum), without making the array and its masks (DeepSeek-V3's search: ~2,200 of
    the ~2,400 records of its batches of 10^3-10^5 plans). The masks' all-true read as one pass: the least flops,
    bytes or group size (NaN is not above 0, so it falls back)."""
    if not (type(count) is np.ndarray and type(cost) is np.ndarray and count.dtype == cost.dtype == np.float64
            and count.size):
        return None
    shape = count.shape
    if op.collective is not None:  # launches: repeat × (group > 1)
        group, repeat = op.collective.group, op.repeat
        if type(repeat) is not float or type(group) is not np.ndarray or group.shape != shape or cost.shape != shape:
            return None
        return repeat if group.min() > 1 else None
    kernels, calls, flops, nbytes = op.kernels, op.launches, op.flops, op.nbytes  # max(kernels, launches) × work
    if type(kernels) is not float or type(calls) is not float or cost.shape != shape:
        return None
    if type(flops) is np.ndarray and flops.shape == shape and (type(nbytes) is float or (
            type(nbytes) is np.ndarray and nbytes.shape == shape)):
        work = flops.min() > 0 or (type(nbytes) is np.ndarray and nbytes.min() > 0)
    elif type(flops) is float and type(nbytes) is np.ndarray and nbytes.shape == shape:
        work = flops > 0 or nbytes.min() > 0
    else:
        return None
    return (kernels if kernels >= calls else calls) if work else None


def forget_issued() -> None:
    """Drop the kept sums (``_ISSUED``): their caller is done with its lists (passes.forget_sums)."""
    _ISSUED.clear()


def hosted(op: OpCost) -> bool:
    """Whether ``op`` carries host seconds of its own (``OpCost.host``: an array, or a float other than 0.0)."""
    return not (type(op.host) is float and op.host == 0.0)


def exposed(op: OpCost, host: HostCost) -> bool:
    """A collective the stack does not hide behind compute (``HostCost.hidden_tp``: its TP collectives hide)."""
    return op.collective is not None and (op.overlap == "" or (op.overlap == "tp" and not host.hidden_tp))


def segment_time(ops: list[OpCost], times: list[Num], host: HostCost,
                 count_of: Callable[[OpCost], Num] = launches) -> dict[str, Num]:
    """Per pass ("f", "b") Σ over the segments between exposed collectives (``exposed``, over a group of more than
    one rank; each a sync where the host waits for them, ``host.blocking_collectives``) of the segment's queue time
    q_s (``queue_step``: host and GPU as a two-machine flow line, from the empty queue the sync leaves) plus c_s,
    its closing collective's time, which runs after both (it starts once issued and once the GPU is through the
    segment) while the host waits for it (a collective that hides counts nowhere, its call is host time). What
    precedes the first sync and follows the last are segments too, each from an empty queue (the layer before
    closed with a sync as this one does; pricing the two apart only delays: a restart never speeds a flow line). A
    pass without a sync (a collective over one rank closes nothing: its time is GPU time) keeps the lead it came
    with: max(host, GPU), the flow line's steady state (module docstring). The forward runs the ops in their
    records' order, the backward in the reverse (autograd walks the graph from the loss back: PyTorch docs,
    "Autograd mechanics"; cost/layers lists a layer in forward order). max(host_s, GPU_s) ≤ q_s ≤ Σ over its
    kernels of max(host, GPU) + the largest min(host, GPU) of one kernel (the kernel that sets Johnson's maximum
    pays both its host and its GPU time) ≤ host_s + GPU_s."""
    out: dict[str, Num] = {}
    for ph in "fb":
        pairs = [(op, t) for op, t in zip(ops, times, strict=True) if (op.phase == "fwd") == (ph == "f")]
        total: Num = 0.0
        issued: Num = 0.0  # when the host has issued the open segment's work so far (I)
        done: Num = 0.0  # when the GPU is through the open segment's kernels so far (E)
        host_s: Num = 0.0  # the pass's host and GPU seconds, for a pass without a sync
        gpu_s: Num = 0.0
        synced: np.ndarray | bool = False  # a sync closed a segment (per plan)
        for op, t in (pairs if ph == "f" else pairs[::-1]):
            n = count_of(op)
            h = n * per_launch(op, host)
            issued, host_s = issued + op.host, host_s + op.host + h  # the records' own Python runs before launches
            if op.collective is not None and not exposed(op, host):
                issued = issued + h  # hidden behind compute: its call only, neither GPU time nor a sync
            elif op.collective is not None:
                closes = (np.asarray(op.collective.group) > 1) & host.blocking_collectives  # else a kernel of the line
                synced, issued, gpu_s = np.logical_or(synced, closes), issued + h, gpu_s + t
                # the collective starts once issued and once the GPU is through the segment; the host waits for it
                # to finish, so it issues nothing while it runs: its time follows the queue, it does not hide in it
                total = total + where(closes, maximum(issued, done) + t, 0.0)
                issued, done = where(closes, 0.0, issued), where(closes, 0.0, maximum(issued, done) + t)
            else:
                (issued, done), gpu_s = queue_step(issued, done, n, h, t), gpu_s + t
        synced = np.logical_or(synced, host.drained_layers)  # every layer's pass from an empty queue
        if np.ndim(synced) == 0:
            synced = bool(synced)
        out[ph] = where(synced, total + maximum(issued, done), maximum(host_s, gpu_s))
    return out


def queue_step(issued: Num, done: Num, n: Num, h: Num, g: Num) -> tuple[Num, Num]:
    """One op through the launch queue: its ``n`` kernels (of ``h`` host and ``g`` GPU seconds in all, split evenly:
    a record holds a pass's kernels of one op, cost/records.py) after work the host had issued by ``issued`` and the
    GPU finished by ``done``; returns both times after it. A launch is asynchronous, the GPU runs a stream's kernels
    in issue order (CUDA C++ Programming Guide, "Asynchronous Concurrent Execution": "kernel launches" return to the
    host before the device completes them; "Streams": commands of a stream execute in order), so kernel j starts at
    max(its issue time, the end of kernel j − 1): the two-machine flow shop of Johnson (1954, "Optimal two- and
    three-stage production schedules with setup times included", Naval Research Logistics Quarterly 1, 61-68), whose
    makespan for a fixed order is max over k of (host time of kernels 1..k + GPU time of kernels k..n). For n equal
    kernels (a = h/n, b = g/n) that maximum lies at k = 1 or k = n (it is linear in k), so the GPU is done at
        max(done + g, issued + a + g, issued + h + b)
    and the host has issued by issued + h. Non-decreasing in ``issued``, ``done``, ``h``, ``g`` and in ``n`` at a
    fixed cost per launch (h = n·p: issued + n·p + g/n exceeds issued + p + g only where it grows with n), so a faster
    GPU or host never slows the queue; n = 0 (a view, or a compute op's GPU time without a launch) runs as one."""
    k = maximum(n, 1.0)
    a, b = h / k, g / k
    return issued + h, maximum(maximum(done + g, issued + a + g), issued + h + b)


def host_idle(ops: list[OpCost], times: list[Num], plan: Plan, host: HostCost, recompute: str,
              gpu: dict[str, Num], count_of: Callable[[OpCost], Num] = launches, region: bool = False
              ) -> dict[str, Num]:
    """Seconds the GPU waits on the host per pass ("f", "b"; module docstring), ``gpu`` the passes' GPU times G after
    the overlap rules: the pass takes max(G, H) and, where the host waits for its collectives, at least the
    segmented sum S (``segment_time``; full recompute runs the forward's segments again before the backward's), so
    the GPU waits max(0, H − G, S − G). Both max(G, H)
    and S are non-increasing in every rate (S sums raw op times, which only shrink; G is the overlap rules' GPU time,
    which does too), so the step stays monotone; S counts the exposed collectives only, so without host time
    S ≤ G. Where every launch blocks (``host.blocking_launches``) the GPU waits all of H, and the pass takes G + H,
    monotone alike. ``region``: the ops are a layer, which a compiled stack (``host.compiled``) runs as one
    torch.compile region: H gains ``host.per_region`` per pass (Dynamo's guards, AOTAutograd's wrapper:
    specs/stack.py)."""
    issued = host_times(ops, plan, host, recompute, count_of)
    if region and host.compiled:
        issued = {ph: h + host.per_region for ph, h in issued.items()}
    if host.blocking_launches:  # each launch waits for its kernel: the host's time and the GPU's add up
        return issued
    whole = {ph: maximum(0.0, issued[ph] - gpu[ph]) for ph in "fb"}
    if host.cuda_graphs or not (host.blocking_collectives or host.drained_layers):  # no sync: the lead carries
        return whole
    seg = segment_time(ops, times, host, count_of)
    if recompute == "full":
        seg["b"] = seg["b"] + seg["f"]
    return {ph: maximum(whole[ph], seg[ph] - gpu[ph]) for ph in "fb"}
