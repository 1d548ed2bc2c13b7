"""Inter-operator parallelism: the layers cut into pipeline stages over sub-meshes (Alpa, Zheng et al. 2022, §5).

Alpa's stage slicing minimises the pipeline's latency T* = Σ_i t_i + (B − 1)·max_j t_j over slicings of the layer
sequence into stages and of the cluster into sub-meshes, each stage's t_i from the intra-operator pass on its
sub-mesh, by dynamic programming over (stages left, first layer, devices left) for each candidate t_max (§5.2,
equations (4)-(5)), subject to each stage's memory with the micro-batches 1F1B keeps in flight on it (§5.2, the
memory check). Here, as in Alpa's own experiments on identical layers:

- the sub-meshes are equal: p stages of n = G/p contiguous devices (a shape aligned to the tiers, mesh.sub_mesh), one
  intra-operator plan per sub-mesh, whose batch split on the sub-mesh's dimensions is the data parallelism within
  (and, across sub-meshes of several nodes, on top of) each stage;
- the layers are the tied blocks (blocks.py); the ops before the first (the embedding) go with the first stage, the
  ops after the last (final norm, head, loss) with the last; a stage's time is its layers' plus those;
- with identical layers Σ t_i is the same for every slicing, so minimising T* is minimising t_max: the DP becomes,
  for each candidate t_max in increasing order, whether the layers can be cut into p stages each within t_max and
  within memory (first stage in flight p micro-batches, the last one), the first feasible t_max the optimum.

The step is then priced by meshplan's schedule simulator (schedule.simulate on the 1F1B table, per-stage forward and
backward times, the stage-to-stage send as a p2p of the boundary activation), plus the slowest stage's gradient
reductions and optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.autoshard.memory import Accounting
from meshplan.autoshard.problem import Problem
from meshplan.autoshard.solve import Sharding
from meshplan.comm import collective_time
from meshplan.schedule import build, simulate


@dataclass(frozen=True, kw_only=True)
class Parts:
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


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    stages: int
    layers: tuple[int, ...]  # layers per stage
    micro_batches: int
    devices: int  # per stage
    step_time: float
    stage_fwd: tuple[float, ...]
    stage_bwd: tuple[float, ...]
    memory: tuple[float, ...]  # peak bytes per device per stage
    bubble: float
    p2p: float
    limit: float
    intra: Sharding = field(repr=False)

    @property
    def fits(self) -> bool:
        return all(m <= self.limit for m in self.memory)


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


def parts(sharding: Sharding, accounting: Accounting) -> Parts:
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
    for (u, v), edge in problem.edges.items():
        a, b = choice[u], choice[v]
        where = next((side[k] for k in (u, v) if side.get(k) in ("pre", "post")), "block")
        t[where][0] += float(edge.fwd[a, b])
        t[where][1] += float(edge.bwd[a, b])
        sync[where] += float(edge.step[a, b])
    state, saved = _layer_bytes(problem, choice, accounting)
    peak = sharding.memory.peak if sharding.memory else 0.0
    return Parts(layer_fwd=t["block"][0] / layers, layer_bwd=t["block"][1] / layers, pre=tuple(t["pre"]),
                 post=tuple(t["post"]), layer_state=state, layer_saved=saved,
                 other=max(peak - layers * (state + saved), 0.0), layer_sync=sync["block"] / layers,
                 other_sync=sync["pre"] + sync["post"], boundary=_boundary(problem))


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


def slice_layers(p: Parts, layers: int, stages: int, limit: float) -> tuple[int, ...] | None:
    """Layers per stage minimising the slowest stage within memory, or None when no slicing fits (module
    docstring: the stage-slicing DP for identical layers)."""
    per = p.layer_fwd + p.layer_bwd
    extra = [0.0] * stages
    extra[0] += sum(p.pre)
    extra[-1] += sum(p.post)
    candidates = sorted({k * per + e for k in range(1, layers + 1) for e in set(extra)})
    for t_max in candidates:
        split = _fit(p, layers, stages, limit, t_max, per, extra)
        if split is not None:
            return split
    return None


def _fit(p: Parts, layers: int, stages: int, limit: float, t_max: float, per: float, extra: list[float]
         ) -> tuple[int, ...] | None:
    """Greedy from the last stage (fewest micro-batches in flight): as many layers as time and memory allow."""
    counts, left = [], layers
    for i in reversed(range(stages)):
        in_flight = stages - i
        room = limit - p.other
        by_memory = int(room // (p.layer_state + in_flight * p.layer_saved)) if room > 0 else 0
        by_time = int((t_max - extra[i] + 1e-15) // per) if per > 0 else layers
        take = min(by_memory, by_time, left - i)  # leave at least one layer for each earlier stage
        if take < 1:
            return None
        counts.append(take)
        left -= take
    if left != 0:
        return None
    return tuple(reversed(counts))


def pipeline(sharding: Sharding, accounting: Accounting, stages: int, micro_batches: int, limit: float
             ) -> Pipeline | None:
    """The best slicing of ``sharding``'s layers (an intra-operator plan on one stage's sub-mesh) into ``stages``
    stages within ``limit`` bytes per device, priced by the schedule simulator; None when none fits."""
    problem = sharding.problem
    layers = problem.blocks.groups[0].layers if problem.blocks.groups else 1
    if stages > layers or micro_batches < stages or sharding.price is None:
        return None
    p = parts(sharding, accounting)
    split = slice_layers(p, layers, stages, limit)
    if split is None:
        return None
    fwd = tuple(k * p.layer_fwd + (i == 0) * p.pre[0] + (i == stages - 1) * p.post[0] for i, k in enumerate(split))
    bwd = tuple(k * p.layer_bwd + (i == 0) * p.pre[1] + (i == stages - 1) * p.post[1] for i, k in enumerate(split))
    mesh = problem.mesh
    p2p = float(collective_time("p2p", p.boundary / mesh.devices, 2, mesh.devices, mesh.cluster)) if stages > 1 else 0.0
    timeline = simulate(build("1f1b", stages, micro_batches), fwd, bwd, p2p)
    sync = max(k * p.layer_sync + (i in (0, stages - 1)) * p.other_sync for i, k in enumerate(split))
    memory = tuple(p.other + k * (p.layer_state + (stages - i) * p.layer_saved) for i, k in enumerate(split))
    return Pipeline(stages=stages, layers=split, micro_batches=micro_batches, devices=mesh.devices,
                    step_time=timeline.step_time + sync, stage_fwd=fwd, stage_bwd=bwd, memory=memory,
                    bubble=timeline.bubble_time, p2p=p2p, limit=limit, intra=sharding)
