"""Inter-operator parallelism: the layers cut into pipeline stages over sub-meshes of their own shapes (Alpa, Zheng
et al. 2022, §5), each stage's time from the intra-operator plan on its sub-mesh.

For each sub-mesh size aligned to the tiers (stage_dp.sizes) the planner solves the intra-operator program once
(planner.py), and ``parts`` splits that plan's seconds and bytes into one layer's share (the tied blocks: every layer of
the group runs the same plan), what the ops before the layers (the embedding) add to the first stage and what those
after them (final norm, head, loss) add to the last: a slice of k layers on that sub-mesh costs k x one layer plus its
boundary ops (``option``). stage_dp.slice_stages runs Alpa's DP over (layer counts x sub-mesh sizes); ``price_slicing``
then prices the slicing it returns by meshplan's schedule simulator (simulator.simulate on the 1F1B table, per-stage
forward and backward times, each stage-to-stage send a p2p of the boundary activation over the link between the two
sub-meshes), plus the slowest stage's gradient reductions and optimizer step, the first and last stage's with the
all-reduce of the gradient of any parameter both read (a tied embedding and head: ``_tied_bytes``).

Memory per stage: the layers' state (parameters, gradients, optimizer state) and their saved activations for each
micro-batch 1F1B keeps in flight on it, plus what the whole model's plan holds besides its layers (the embedding's
and head's state, temporaries at the peak) on every stage: an upper bound for the stages without embedding or head.
The data parallelism within a stage is the batch split on its sub-mesh's dimensions, which its plan chooses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.autoshard.memory import Accounting
from meshplan.autoshard.problem import Problem, host_seconds
from meshplan.autoshard.solve import Sharding
from meshplan.autoshard.stage_dp import Option, Slicing
from meshplan.collectives.price import collective_time
from meshplan.pipeline.registry import one_chunk
from meshplan.pipeline.simulator import simulate
from meshplan.pipeline.tables import build
from meshplan.specs.hardware import Cluster


@dataclass(frozen=True, kw_only=True)
class StageParts:
    """An intra-operator plan on one sub-mesh split into a layer's share and what the first / last stage adds."""

    layer_fwd: float
    layer_bwd: float
    pre: tuple[float, float]  # (forward, backward) seconds of the ops before the layers
    post: tuple[float, float]
    layer_state: float  # bytes per device a layer keeps for the step (parameters, gradients, optimizer state)
    layer_saved: float  # bytes per device a layer keeps per micro-batch in flight (saved activations)
    other: float  # everything else at the peak (the embedding's and head's state, temporaries)
    layer_sync: float  # seconds per step per layer: gradient reductions and optimizer
    other_sync: float
    boundary: float  # bytes of the activation one stage sends the next, per micro-batch
    tied: float = 0.0  # gradient bytes per device of the parameters both the first and the last stage read


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    stages: int
    layers: tuple[int, ...]  # layers per stage
    micro_batches: int
    devices: tuple[int, ...]  # GPUs per stage
    step_time: float
    stage_fwd: tuple[float, ...]
    stage_bwd: tuple[float, ...]
    memory: tuple[float, ...]  # peak bytes per device per stage
    bubble: float
    p2p: tuple[float, ...]  # seconds per send across each boundary
    limit: float
    plans: tuple[Sharding, ...] = field(repr=False)  # each stage's intra-operator plan (on its sub-mesh)

    @property
    def fits(self) -> bool:
        return all(m <= self.limit for m in self.memory)

    @property
    def intra(self) -> Sharding:
        """The plan of the stage with the most layers (the one the placements and code are printed for)."""
        return self.plans[max(range(self.stages), key=lambda i: self.layers[i])]


def _side(problem: Problem, key: int) -> str:
    """block | pre | post of a template node (module docstring)."""
    ops, blocks = problem.flow.trace.ops, problem.blocks
    if not blocks.groups:
        return "pre"
    n = len(ops)
    op = key if key < n else next((i for i, found in enumerate(problem.flow.producers) if any(
        k == key for k, _ in found)), 0)
    if key >= n and problem.weight.get(key, 1.0) > 1.0:
        return "block"
    if blocks.group_block(op)[0] >= 0:
        return "block"
    first = blocks.groups[0].blocks[0]
    fwd = [i for i in first if ops[i].phase == "fwd"] or list(first)
    bwd = [i for i in first if ops[i].phase != "fwd"] or list(first)
    if ops[op].phase == "fwd":
        return "pre" if op < min(fwd) else "post"
    return "pre" if op > max(bwd) else "post"


def parts(sharding: Sharding, accounting: Accounting) -> StageParts:
    """The plan's seconds and bytes split by side (module docstring)."""
    problem, choice = sharding.problem, sharding.choice
    layers = float(problem.blocks.groups[0].layers) if problem.blocks.groups else 1.0
    t = {"block": [0.0, 0.0], "pre": [0.0, 0.0], "post": [0.0, 0.0]}
    sync = {"block": 0.0, "pre": 0.0, "post": 0.0}
    side = {k: _side(problem, k) if k < 10**9 else "" for k in problem.nodes}
    for key, node in problem.nodes.items():
        a, w = choice[key], problem.weight[key]
        where = side[key] or "block"
        t[where][0] += w * (node.time[a, 0] + node.comm[a, 0])
        t[where][1] += w * (node.time[a, 1] + node.comm[a, 1])
        if key in problem.optimizer:
            sync[where] += w * float(problem.optimizer[key][a])
    edges: dict[str, list[tuple[int, int]]] = {"block": [], "pre": [], "post": []}
    for (u, v), edge in problem.edges.items():
        a, b = choice[u], choice[v]
        where = next((side[k] for k in (u, v) if side.get(k) in ("pre", "post")), "block")
        t[where][0] += float(edge.fwd[a, b])
        t[where][1] += float(edge.bwd[a, b])
        sync[where] += float(edge.step[a, b])
        edges[where].append((u, v))
    for where in t:  # each side's passes take at least the host's launches and calls (problem.host_seconds)
        host = host_seconds(problem, {k for k in problem.nodes if (side[k] or "block") == where}, choice, edges[where])
        t[where] = [max(t[where][0], host[0]), max(t[where][1], host[1])]
    state, saved = _layer_bytes(problem, choice, accounting)
    peak = sharding.memory.peak if sharding.memory else 0.0
    return StageParts(layer_fwd=t["block"][0] / layers, layer_bwd=t["block"][1] / layers,
                      pre=(t["pre"][0], t["pre"][1]), post=(t["post"][0], t["post"][1]), layer_state=state,
                      layer_saved=saved, other=max(peak - layers * (state + saved), 0.0),
                      layer_sync=sync["block"] / layers, other_sync=sync["pre"] + sync["post"],
                      boundary=_boundary(problem), tied=_tied_bytes(problem, choice, accounting))


def _tied_bytes(problem: Problem, choice: dict[int, int], accounting: Accounting) -> float:
    """Gradient bytes per device of the parameters that forward ops before the layers and after them both read (a
    head tied to the embedding): cut into stages, the first and the last each hold them and all-reduce their gradient
    once per step (``price_slicing``; channels.embedding_sync for the model-level estimate)."""
    trace = problem.flow.trace
    read: dict[int, set[str]] = {}
    for i, op in enumerate(trace.ops if problem.blocks.groups else ()):  # no layers: no ends to tell apart
        if op.phase != "fwd":
            continue
        where = _side(problem, i)
        for t in op.inputs if where != "block" else ():
            if trace.storages[t.storage].role == "param":
                read.setdefault(t.storage, set()).add(where)
    total = 0.0
    for sid in (sid for sid, sides in read.items() if len(sides) == 2):
        found = accounting.vectors.get(trace.grad_of.get(sid, sid)) or accounting.vectors.get(sid)
        if found is not None and found[0] in choice:
            total += float(found[1][choice[found[0]]])
    return total


def _layer_bytes(problem: Problem, choice: dict[int, int], accounting: Accounting) -> tuple[float, float]:
    """One layer's persistent bytes and saved activations per device (the first block of the tied group)."""
    if not problem.blocks.groups:
        return 0.0, 0.0
    trace, end = problem.flow.trace, problem.flow.trace.forward_end
    block = set(problem.blocks.groups[0].blocks[0])
    state = saved = 0.0
    for sid, (a, b) in accounting.spans.items():
        if sid not in accounting.vectors:
            continue
        key, vec = accounting.vectors[sid]
        storage = trace.storages[sid]
        nbytes = accounting._factor(sid) * float(vec[choice[key]])
        if storage.role in ("param", "grad") and accounting._reads(sid, block):
            state += nbytes
        elif storage.created in block and storage.role == "activation" and a <= end < b:
            saved += nbytes
    return state, saved


def _boundary(problem: Problem) -> float:
    """Bytes of the tensor a block hands the next (the residual stream): the first block's first input."""
    if not problem.blocks.groups:
        return 0.0
    ops = problem.flow.trace.ops
    first = problem.blocks.groups[0].blocks[0][0]
    return float(max((t.nbytes for t in ops[first].inputs), default=0))


def option(p: StageParts, devices: int, shape: tuple[int, ...], key: int) -> Option:
    """The DP's view of one sub-mesh's plan (stage_dp.Option): per micro-batch seconds of a layer, of the first and
    last stages' extras, and bytes per GPU."""
    return Option(devices=devices, shape=shape, layer=p.layer_fwd + p.layer_bwd, pre=sum(p.pre), post=sum(p.post),
                  state=p.layer_state, saved=p.layer_saved, base=p.other, key=key)


def hop(cluster: Cluster, sender: int, receiver: int) -> int:
    """The rank stride a send from the stage starting at rank ``sender`` to the one at ``receiver`` is priced at:
    their distance, or the block of the outermost tier boundary between them (then the send crosses that tier)."""
    crossed, block = 0, 1
    for tier in cluster.tiers:
        block *= tier.size
        if sender // block != receiver // block:
            crossed = block
    return crossed or receiver - sender


def price_slicing(slicing: Slicing, parts_of: dict[int, tuple[StageParts, Sharding]], micro_batches: int,
                  limit: float, cluster: Cluster) -> Pipeline:
    """The step of a slicing (module docstring): each stage's forward and backward per micro-batch, sends between
    neighbours, simulator.simulate on 1F1B, then the slowest stage's gradient reductions and optimizer."""
    p = len(slicing.stages)
    fwd, bwd, memory, sync, plans, p2p = [], [], [], [], [], []
    offset = 0
    for i, (o, k) in enumerate(slicing.stages):
        part, plan = parts_of[o.key]
        first, last = i == 0, i == p - 1
        fwd.append(k * part.layer_fwd + first * part.pre[0] + last * part.post[0])
        bwd.append(k * part.layer_bwd + first * part.pre[1] + last * part.post[1])
        memory.append(part.other + k * (part.layer_state + (p - i) * part.layer_saved))
        sync.append(k * part.layer_sync + (first or last) * part.other_sync)
        plans.append(plan)
        if not last:
            stride = hop(cluster, offset, offset + o.devices)
            p2p.append(float(collective_time("p2p", part.boundary / o.devices, 2, stride, cluster)))
        offset += o.devices
    tied = max(parts_of[slicing.stages[0][0].key][0].tied, parts_of[slicing.stages[-1][0].key][0].tied)
    if p > 1 and tied:  # the ends' shared parameters: one all-reduce of their gradient between the two, exposed
        ends = float(collective_time("all_reduce", tied, 2, hop(cluster, 0, offset - slicing.stages[-1][0].devices),
                                     cluster))
        sync[0], sync[-1] = sync[0] + ends, sync[-1] + ends
    timeline = simulate(build(one_chunk(), p, micro_batches), tuple(fwd), tuple(bwd), tuple(p2p))
    return Pipeline(stages=p, layers=slicing.layers, micro_batches=micro_batches, devices=slicing.devices,
                    step_time=timeline.step_time + max(sync), stage_fwd=tuple(fwd), stage_bwd=tuple(bwd),
                    memory=tuple(memory), bubble=timeline.bubble_time, p2p=tuple(p2p), limit=limit,
                    plans=tuple(plans))
