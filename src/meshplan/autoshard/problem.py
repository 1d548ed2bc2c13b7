"""The sharding problem of one traced step on one mesh: nodes with strategies, weighted, and the resharding costs
between them (Alpa, Zheng et al. 2022, §4.2: node costs c_v, d_v and edge matrices R_vu).

Nodes are built for one block of each tied group and for the ops outside the blocks (blocks.py); every op of
another block maps to its twin (``Blocks.rep``). Weights: a tied node counts once per block of the full model; an
edge inside a block likewise; an edge from one block to the next (the residual stream, forward and backward) once
per pair of neighbours; an edge between a block and the rest once per block that has it (the rotary tables every
layer reads) or once (the embedding into the first layer).

Edge costs: moving the producer's result, as the producer's strategy places it, to the placement the consumer's
strategy needs (reshard.py), in the consumer's pass. A parameter's gradient, as its last op leaves it (Partial
after a split batch: the data-parallel reduction), moves once per step to the parameter's placement, where the
optimizer keeps it; this is the gradient all-reduce (replicated parameters) or reduce-scatter (sharded ones, ZeRO
/ FSDP), and a sharded parameter read replicated is all-gathered each micro-batch in each pass (FSDP's gathers).
The optimizer step runs once per step on each device's share, memory-bound: memory.OPTIMIZER_STATE's step traffic
per parameter byte (trace/liveness.optimizer_per_byte): beside bf16 parameters mixed precision's, as estimate prices
it (Adam: read the bf16 gradient, read and write the fp32 master and moments, write the bf16 weight, 2 + 24 + 2 = 28
bytes a parameter, 14 x its bytes); at fp32 torch.optim's in place (Adam: 7 x); timed by roofline.memory_time as
channels.optimizer_time times the estimate's.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meshplan.autoshard.blocks import Blocks
from meshplan.autoshard.dataflow import Flow
from meshplan.autoshard.mesh import DeviceMesh
from meshplan.autoshard.placement import shards
from meshplan.autoshard.reshard import Resharder
from meshplan.autoshard.strategies import Node, Slot, build_node
from meshplan.cost.records import OpCost
from meshplan.roofline import memory_time
from meshplan.specs.efficiency import Efficiency
from meshplan.step.host import launches
from meshplan.trace.cost import op_cost
from meshplan.trace.liveness import optimizer_per_byte


@dataclass(kw_only=True)
class Edge:
    """All moves between two template nodes, as (strategies of u) x (strategies of v) matrices in seconds."""

    u: int
    v: int
    fwd: np.ndarray
    bwd: np.ndarray
    step: np.ndarray  # once per step (gradient reductions)
    calls: np.ndarray  # (2, |S_u|, |S_v|): the collectives of fwd and bwd, a host call each (``host_seconds``)
    uses: list[tuple[Slot, Slot, float, bool]] = field(default_factory=list)  # (produced, needed, weight, step)


@dataclass(kw_only=True)
class Problem:
    flow: Flow
    mesh: DeviceMesh
    blocks: Blocks
    nodes: dict[int, Node]  # template node key -> node
    weight: dict[int, float]  # template node key -> how many nodes of the full model it stands for
    edges: dict[tuple[int, int], Edge]
    template: dict[int, int]  # every node key -> its template's
    optimizer: dict[int, np.ndarray]  # parameter node -> per-strategy optimizer seconds per step
    grads: dict[int, int]  # parameter node key -> key of the node whose op last writes its gradient
    hubs: dict[int, tuple[Slot, Slot]] = field(default_factory=dict)  # hub -> (tensor it moves, a use it serves)
    views: dict[tuple[int, Slot], tuple[int, ...]] = field(default_factory=dict)  # (hub, reader) -> permutation
    optimizer_name: str = "adam"  # as Plan.optimizer names it (memory.OPTIMIZER_STATE): its step and its state
    host_dispatch: float = 0.0  # host seconds per launched kernel at this host's speed (``host_seconds``)
    launches: dict[int, tuple[float, float]] = field(default_factory=dict)  # node -> its kernels per pass (f, b)
    # ilp.pairwise's node costs and edge matrices by (micro-batches, passes): the same in each round of a plan
    weighed: dict[tuple, tuple[dict, dict]] = field(default_factory=dict, repr=False, compare=False)


def template_map(flow: Flow, blocks: Blocks) -> dict[int, int]:
    """Every node key (op index or source key) -> the key of its twin in its group's first block."""
    n = len(flow.trace.ops)
    tmpl: dict[int, int] = {}
    for i in range(n):
        tmpl[i] = blocks.rep.get(i, i)
    for i, found in enumerate(flow.producers):
        r = blocks.rep.get(i, i)
        for j, (key, _) in enumerate(found):
            if key >= n and key not in tmpl:
                twin = flow.producers[r][j][0]
                tmpl[key] = twin if twin >= n else key
    return tmpl


def build_problem(flow: Flow, blocks: Blocks, mesh: DeviceMesh, eff: Efficiency, optimizer: str = "adam",
                  host_dispatch: float = 0.0) -> Problem:
    """Nodes of the template, their weights, and the weighted edge matrices (module docstring); ``optimizer`` as
    Plan.optimizer names it; ``host_dispatch`` the host's seconds per launched kernel (``host_seconds``)."""
    n = len(flow.trace.ops)
    tmpl = template_map(flow, blocks)
    owner = [flow.owners[i] for i in range(n)]
    keys = {tmpl[k] for k in owner} | {tmpl[n + s] for s in range(len(flow.sources))}
    members: dict[int, list[int]] = {k: [] for k in keys}
    for i in range(n):
        if owner[i] in members and tmpl[i] == i:
            members[owner[i]].append(i)
    resharder = Resharder(mesh)
    nodes = {k: build_node(flow, k, tuple(members[k]), mesh, resharder, eff) for k in sorted(keys)}
    weight = {k: _node_weight(blocks, k) if k < n else _source_weight(flow, blocks, k) for k in nodes}
    problem = Problem(flow=flow, mesh=mesh, blocks=blocks, nodes=nodes, weight=weight, edges={}, template=tmpl,
                      optimizer={}, grads={}, optimizer_name=optimizer, host_dispatch=host_dispatch,
                      launches={k: _launches(flow, node) for k, node in nodes.items()} if host_dispatch else {})
    _data_edges(problem, owner)
    _grad_edges(problem, owner, eff, optimizer_per_byte(flow.trace, optimizer)[1])
    _fill_costs(problem, resharder)
    return problem


def host_seconds(problem: Problem, keys: Collection[int] | None = None, choice: dict[int, int] | None = None,
                 edges: Collection[tuple[int, int]] | None = None) -> tuple[float, float]:
    """Host seconds per micro-batch to launch the forward and the backward kernels of the nodes ``keys`` (all by
    default): the traced step is eager PyTorch, each aten op that does work launching the kernels its GPU
    implementation does (step/host.launches of trace/cost.op_cost, as the estimate counts them; a view none), each
    issued by the host at ``problem.host_dispatch`` (step/host.py's model: the host issues kernels asynchronously, so
    a pass takes at least its launches' host time), weighted as its node (a tied block's ops once per block). Under
    a ``choice`` of strategies the collectives it inserts in the passes are host calls too, one each (step/host.launches
    counts a collective as one launch): those of the nodes ``keys`` (Node.calls) and of the ``edges`` (all by
    default: Edge.calls); the per-step gradient reductions are not in the passes."""
    fwd = bwd = 0.0
    for key, (f, b) in problem.launches.items():
        if keys is None or key in keys:
            fwd, bwd = fwd + problem.weight[key] * f, bwd + problem.weight[key] * b
    if choice is not None and problem.host_dispatch:
        for key, node in problem.nodes.items():
            if keys is None or key in keys:
                calls = problem.weight[key] * node.calls[choice[key]]
                fwd, bwd = fwd + calls[0], bwd + calls[1]
        for pair in problem.edges if edges is None else edges:
            a, b = choice[pair[0]], choice[pair[1]]
            fwd, bwd = fwd + problem.edges[pair].calls[0, a, b], bwd + problem.edges[pair].calls[1, a, b]
    return float(fwd) * problem.host_dispatch, float(bwd) * problem.host_dispatch


def _launches(flow: Flow, node: Node) -> tuple[float, float]:
    """The kernels a node's ops launch in the forward and in the backward pass (``host_seconds``)."""
    count = [0.0, 0.0]
    for i in node.members:
        op = flow.trace.ops[i]
        if op.kind != "view":
            count[0 if op.phase == "fwd" else 1] += float(launches(op_cost(op)))
    return count[0], count[1]


def _node_weight(blocks: Blocks, key: int) -> float:
    g, _ = blocks.group_block(key)
    return float(blocks.groups[g].layers) if g >= 0 else 1.0


def _source_weight(flow: Flow, blocks: Blocks, key: int) -> float:
    """A source read only inside one tied block (its parameters) counts once per block."""
    n = len(flow.trace.ops)
    seen = {blocks.group_block(i) for i, found in enumerate(flow.producers) for k, _ in found if k == key}
    if len(seen) == 1:
        g, _ = next(iter(seen))
        if g >= 0:
            return float(blocks.groups[g].layers)
    return 1.0 if key >= n else _node_weight(blocks, key)


def _factor(blocks: Blocks, a: int, b: int) -> tuple[float, bool]:
    """(weight of one traced use from op a's block to op b's, whether it is a block-to-rest use to recount)."""
    ga, ba = blocks.group_block(a)
    gb, bb = blocks.group_block(b)
    if ga < 0 and gb < 0:
        return 1.0, False
    if ga >= 0 and ga == gb:
        group = blocks.groups[ga]
        if ba == bb:
            return group.layers / group.traced, False
        return (group.layers - 1) / max(group.traced - 1, 1), False
    return 1.0, True


def _edge(problem: Problem, u: int, v: int) -> Edge:
    key = (u, v)
    if key not in problem.edges:
        su, sv = problem.nodes[u].size, problem.nodes[v].size
        problem.edges[key] = Edge(u=u, v=v, fwd=np.zeros((su, sv)), bwd=np.zeros((su, sv)), step=np.zeros((su, sv)),
                                  calls=np.zeros((2, su, sv)))
    return problem.edges[key]


HUB = 10**9  # keys of hub nodes (one shared move of a tensor to several consumers) start here


def _data_edges(problem: Problem, owner: list[int]) -> None:
    """Every use of a tensor by an op of another node, weighted (module docstring); uses in one pass of one tensor
    by several nodes share one move (``_hubs``)."""
    flow, blocks, tmpl = problem.flow, problem.blocks, problem.template
    n = len(flow.trace.ops)
    boundary: dict[tuple, list[tuple[int, int]]] = {}  # per key: (block group, producer) of each use
    raw: list[tuple[int, int, Slot, Slot, float, int]] = []  # (u, v, produced, needed, weight, real producer)
    for i, found in enumerate(flow.producers):
        if flow.roles[i] == "source":  # its arguments only give a shape or dtype (zeros_like, new_zeros)
            continue
        for j, (p, slot) in enumerate(found):
            u = owner[p] if p < n else p
            if u == owner[i]:
                continue
            factor, recount = _factor(blocks, p if p < n else i, i)
            key = (tmpl[u], tmpl[owner[i]], (tmpl[p], slot), (tmpl[i], j))
            if recount:
                side = i if blocks.group_block(i)[0] >= 0 else p
                boundary.setdefault(key, []).append((blocks.group_block(side)[0], p))
                continue
            raw.append((*key, factor, p))
    for key, seen in boundary.items():
        g = max(group for group, _ in seen)
        full = g >= 0 and len(seen) == blocks.groups[g].traced
        weight = float(blocks.groups[g].layers) if full else float(len(seen))
        raw.extend((*key, weight / len(seen), p) for _, p in seen)
    _hubs(problem, raw)


def _hubs(problem: Problem, raw: list[tuple[int, int, Slot, Slot, float, int]]) -> None:
    """A tensor read in one pass by several nodes is moved once, to a hub node whose strategies are the
    placements it may be moved to, and read from there: Megatron's one all-gather before Q, K and V (one before
    gate and up), which separate edges would charge three (two) times. Readers of different views of one tensor
    that only permute its dimensions (a GEMM's operand and its transpose for the weight gradient) share it too: the
    hub holds the first reader's layout and each reader's placement maps onto it (``views``). The hub holds no
    memory (a temporary)."""
    ops, n = problem.flow.trace.ops, len(problem.flow.trace.ops)
    groups: dict[tuple, list[tuple]] = {}
    for use in raw:
        u, v, produced, needed, weight, p = use
        phase = "fwd" if needed[0] < n and ops[needed[0]].phase == "fwd" else "bwd"
        t = ops[needed[0]].inputs[needed[1]] if p < n and needed[0] < n else None  # the tensor as read
        layout = tuple(sorted(zip(t.shape, t.stride, strict=True))) if t is not None else ()
        same = (u, t.storage, t.offset, layout, phase) if t is not None else (use,)
        groups.setdefault(same, []).append(use)
    for uses in groups.values():
        if len({v for _, v, *_ in uses}) < 2 or not _hub(problem, uses):
            for u, v, produced, needed, weight, _ in uses:
                _edge(problem, u, v).uses.append((produced, needed, weight, False))


def _permutation(problem: Problem, canonical: Slot, read: Slot) -> tuple[int, ...] | None:
    """For each dimension of the view an op reads (``read``: op, argument), the dimension of ``canonical``'s with the
    same size and stride; None if the views are not permutations of each other."""
    ops = problem.flow.trace.ops
    a, b = ops[canonical[0]].inputs[canonical[1]], ops[read[0]].inputs[read[1]]
    pairs = list(zip(a.shape, a.stride, strict=True))
    found: list[int] = []
    for pair in zip(b.shape, b.stride, strict=True):
        d = next((i for i, q in enumerate(pairs) if q == pair and i not in found), None)
        if d is None:
            return None
        found.append(d)
    return tuple(found)


def to_view(p: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, ...]:
    """A hub's placement (its first reader's layout) in a reader's view (``perm``: that view's dimension -> the
    hub's)."""
    return tuple(perm.index(x) if x >= 0 else x for x in p)


def _hub(problem: Problem, uses: list[tuple]) -> bool:
    """One hub for ``uses`` (a tensor read by several nodes in one pass); False when the producer's view of it is not
    the first reader's (then every use is its own edge)."""
    ops = problem.flow.trace.ops
    u, produced, first = uses[0][0], uses[0][2], uses[0][3]
    out, read = ops[produced[0]].outputs[produced[1]], ops[first[0]].inputs[first[1]]
    perms = [_permutation(problem, first, needed) for *_, needed, _, _ in uses]
    if (out.shape, out.stride) != (read.shape, read.stride) or any(p is None for p in perms):
        return False
    key = HUB + len([k for k in problem.nodes if k >= HUB])
    places = {o[produced] for o in problem.nodes[u].outs if produced in o}
    for (_, v, _, needed, _, _), perm in zip(uses, perms, strict=True):
        assert perm is not None  # checked above
        if perm != tuple(range(len(perm))):
            problem.views[(key, needed)] = perm
        places |= {tuple(perm[x] if x >= 0 else x for x in o[needed]) for o in problem.nodes[v].needs
                   if needed in o}
    combos: list[Any] = sorted(places)  # a hub's strategies: the placements it carries, not labels
    problem.nodes[key] = Node(key=key, name=f"{problem.nodes[u].name} (shared move)", kind="hub", members=(),
                              combos=combos, outs=[{(key, 0): c} for c in combos], needs=[{} for _ in combos],
                              time=np.zeros((len(combos), 2)), comm=np.zeros((len(combos), 2)),
                              created=[{} for _ in combos], calls=np.zeros((len(combos), 2)))
    per_producer = {problem.blocks.group_block(p): w for *_, w, p in uses}  # one move per block's tensor
    problem.weight[key] = 1.0
    _edge(problem, u, key).uses.append((produced, (key, 0), sum(per_producer.values()), False))
    for _, v, _, needed, weight, _ in uses:
        _edge(problem, key, v).uses.append(((key, 0), needed, weight, False))
    problem.hubs[key] = (produced, uses[0][3])
    return True


def _grad_edges(problem: Problem, owner: list[int], eff: Efficiency, traffic: float) -> None:
    """Gradient to parameter placement, once per step; and the optimizer's time per parameter strategy (``traffic``
    bytes moved per parameter byte)."""
    flow, tmpl = problem.flow, problem.template
    last: dict[int, tuple[int, int]] = {}
    for op in flow.trace.ops:
        for slot, t in enumerate(op.outputs):
            last[t.storage] = (op.index, slot)
    acc, sizes = problem.mesh.cluster.accelerator, problem.mesh.sizes
    for number, src in enumerate(flow.sources):
        key = flow.key_of_source(number)
        grad = flow.trace.grad_of.get(src.storage)
        if src.role != "param" or tmpl.get(key) != key or key not in problem.nodes:
            continue
        node = problem.nodes[key]
        nbytes = flow.trace.storages[src.storage].nbytes
        steps = [OpCost("optimizer/step", "step", "memory", nbytes=traffic * nbytes / shards(o[(key, 0)], sizes))
                 for o in node.outs]
        problem.optimizer[key] = np.array([memory_time(step, acc, eff) for step in steps], dtype=float)
        if grad is None or grad not in last:
            continue
        p, slot = last[grad]
        problem.grads[key] = tmpl[owner[p]]
        edge = _edge(problem, tmpl[owner[p]], key)
        edge.uses.append(((tmpl[p], slot), (key, 0), problem.weight[key], True))


def _fill_costs(problem: Problem, resharder: Resharder) -> None:
    """The matrices: for each use, the move from the producer's placement to the needed one, per strategy pair."""
    ops, n = problem.flow.trace.ops, len(problem.flow.trace.ops)
    for edge in problem.edges.values():
        nu, nv = problem.nodes[edge.u], problem.nodes[edge.v]
        for produced, needed, weight, per_step in edge.uses:
            tensor, served = problem.hubs.get(produced[0], (produced, needed))
            if needed[0] >= HUB:
                served = problem.hubs[needed[0]][1]
            info = ops[tensor[0]].outputs[tensor[1]] if tensor[0] < n else problem.flow.sources[tensor[0] - n].info
            have = [o.get(produced) for o in nu.outs]
            if (produced[0], needed) in problem.views:  # a hub read through another view of the tensor
                perm = problem.views[(produced[0], needed)]
                have = [to_view(p, perm) if p is not None else None for p in have]
            want = [o.get(needed) for o in (nv.outs if per_step or needed[0] >= HUB else nv.needs)]
            phase = 1 if per_step or served[0] >= n or ops[served[0]].phase != "fwd" else 0
            target = edge.step if per_step else (edge.bwd if phase else edge.fwd)
            if nu.remake and not per_step:  # a result moved in the other pass is moved again (strategies._remade)
                for a, remake in enumerate(nu.remake):
                    hit = remake.get(produced)
                    if hit is not None and hit[0] != phase:
                        target[a, :] += weight * hit[1]
                        edge.calls[phase][a, :] += weight * hit[2]
            seconds, count = _move_matrix(have, want, info.nbytes, resharder)
            target += weight * seconds
            if not per_step:  # a per-step reduction's calls are not in a pass (host_seconds)
                edge.calls[phase] += weight * count


def _move_matrix(have: list, want: list, nbytes: float, resharder: Resharder) -> tuple[np.ndarray, np.ndarray]:
    """Seconds and collectives of the move from each producer strategy's placement to each consumer strategy's,
    computed once per distinct pair of placements (most strategies share a few) and spread by index (0 where either
    has none)."""
    rows, have_ids = _distinct(have)
    cols, want_ids = _distinct(want)
    key = (tuple(rows), tuple(cols), nbytes)
    small = resharder.tables.get(key)
    if small is None:  # the last row and column: no placement
        small = resharder.tables[key] = resharder.table(rows, cols, nbytes)
    grid = (have_ids[:, None], want_ids[None, :])  # np.ix_'s open mesh, without its checks
    return small[0][grid], small[1][grid]


def _distinct(places: list) -> tuple[list, np.ndarray]:
    """The distinct placements of a list (None apart) and each entry's index among them (None: the last)."""
    index: dict = {}
    for p in places:
        if p is not None and p not in index:
            index[p] = len(index)
    return list(index), np.array([index[p] if p is not None else len(index) for p in places], dtype=int)
