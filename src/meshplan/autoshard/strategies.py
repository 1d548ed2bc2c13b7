"""Each decision's strategies: the placements of every tensor its ops touch, their time and their bytes per device.

A node (dataflow.py) is an anchor op with its followers, a source op, or a source tensor (parameter, input, buffer).
Its strategies are the anchor's assignments of labels to mesh dimensions (rules.assignments; for a source tensor,
any even split of its dimensions); under each, the followers' placements follow from their leading argument
(rules.follow), in execution order.

Time of a strategy, per micro-batch, split into forward and backward:
- each op on the shapes each device holds, by meshplan's roofline (roofline.op_time on the op's OpCost, as
  trace/cost.py times the whole op): FLOPs divided by the devices that split its work (a mesh dimension that
  splits none of its labels repeats the work), HBM bytes by the share of its tensors a device holds, the GEMM
  shape (m, n, k) by the splits of its labels;
- the moves inside the node (a follower that must replicate what its owner split) by reshard.py;
- the extra collectives of a rule (the vocabulary-parallel loss's row statistics).
Bytes: each storage an op of the node creates, at the share a device holds (Partial: whole).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from meshplan.autoshard.dataflow import Flow
from meshplan.autoshard.mesh import DeviceMesh
from meshplan.autoshard.placement import Placements, shards, valid
from meshplan.autoshard.reshard import Resharder
from meshplan.autoshard.rules import Rule, assignments, follow, is_pass, place, split_factor
from meshplan.cost.records import alignment
from meshplan.roofline import op_time
from meshplan.specs.efficiency import Efficiency
from meshplan.trace.cost import op_cost, precision
from meshplan.trace.graph import TensorInfo, TracedOp

Slot = tuple[int, int]  # (node key or op index, result / argument index)


@dataclass(kw_only=True)
class Node:
    key: int
    name: str
    kind: str  # anchor | source | param | input | buffer | activation | …
    members: tuple[int, ...]  # ops the node owns, in execution order (none for a source tensor)
    combos: list[tuple[str | None, ...]]
    outs: list[dict[Slot, Placements]]  # per strategy: placement of each result of the node's ops
    needs: list[dict[Slot, Placements]]  # per strategy: placement each of its ops needs of each argument
    time: np.ndarray  # (strategies, 2): forward and backward compute seconds per micro-batch
    comm: np.ndarray  # (strategies, 2): forward and backward seconds of moves inside the node and rule collectives
    calls: np.ndarray  # (strategies, 2): the collectives of ``comm``, a host call each (problem.host_seconds)
    created: list[dict[int, float]]  # per strategy: bytes per device of each storage the node creates
    # per strategy: moved results, (pass, seconds, collectives) of their moves
    remake: list[dict[Slot, tuple[int, float, int]]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.combos)


def _local_bytes(t: TensorInfo, p: Placements, sizes: tuple[int, ...]) -> float:
    return t.nbytes / shards(p, sizes)


def _source_rule(flow: Flow, number: int) -> Rule:
    """A parameter, input, buffer or constant: any even split of its dimensions (never Partial)."""
    info = flow.sources[number].info
    return Rule(inputs=(), outputs=(tuple(f"d{i}" for i in range(len(info.shape))),))


def node_name(flow: Flow, key: int) -> str:
    n = len(flow.trace.ops)
    if key < n:
        return flow.trace.ops[key].name
    src = flow.sources[key - n]
    return f"{src.role}#{src.storage}:{'x'.join(map(str, src.info.shape))}"


def build_node(flow: Flow, key: int, members: tuple[int, ...], mesh: DeviceMesh, resharder: Resharder,
               eff: Efficiency) -> Node:
    """The node ``key`` (an op index, or a source's key) with the ops it owns (``members``, the head op first)."""
    ops, n = flow.trace.ops, len(flow.trace.ops)
    if key >= n:
        src = flow.sources[key - n]
        head_rule, shapes_in, shapes_out, kind = _source_rule(flow, key - n), [], [src.info.shape], src.role
    else:
        head_rule, kind = flow.rules[key], flow.roles[key]
        shapes_in, shapes_out = [t.shape for t in ops[key].inputs], [t.shape for t in ops[key].outputs]
    combos = assignments(head_rule, mesh.sizes, shapes_in, shapes_out) or [(None,) * len(mesh.sizes)]
    calls = np.zeros((len(combos), 2))
    node = Node(key=key, name=node_name(flow, key), kind=kind, members=members, combos=combos, outs=[], needs=[],
                time=np.zeros((len(combos), 2)), comm=np.zeros((len(combos), 2)), created=[], calls=calls)
    plan = [_Member(flow, i, key) for i in members]  # what each op brings whatever the strategy, found once
    for s, combo in enumerate(combos):
        produced: dict[Slot, Placements] = {}
        needed: dict[Slot, Placements] = {}
        created: dict[int, float] = {}
        remake: dict[Slot, tuple[int, float, int]] = {}
        moved: set[tuple] = set()  # (tensor, pass, placement) already moved inside the node: read again, not moved
        if key >= n:
            src = flow.sources[key - n]
            produced[(key, 0)] = place(head_rule, combo)[1][0]
            created[src.storage] = flow.trace.storages[src.storage].nbytes / shards(produced[(key, 0)], mesh.sizes)
        seconds, inside, count = [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]  # node.time, comm and calls of this strategy
        for m in plan:
            c = combo if m.head else _follower_combo(m, produced, mesh)
            p_in, p_out = place(m.rule, c, m.leader)
            produced.update(zip(m.placed, p_out, strict=True))
            needed.update(zip(m.arguments, p_in, strict=True))
            phase = m.phase
            compute, extra, extra_calls = _op_seconds(m.facts, m.rule, c, p_in, p_out, mesh, eff)
            seconds[phase] += compute
            (moves, inner_calls), (made, made_calls) = _inner_moves(m, p_in, produced, moved, mesh, resharder)
            again, again_calls = _remade(m.producers, phase, remake, moved) if remake else (0.0, 0)  # none moved yet
            inside[phase] += extra + moves + again
            count[phase] += extra_calls + inner_calls + again_calls
            carried, carried_calls = made, made_calls
            if remake:  # moves carried over from the arguments' own
                carried += sum(remake[src][1] for src in m.producers if src in remake)
                carried_calls += sum(remake[src][2] for src in m.producers if src in remake)
            if carried and m.facts.view or made:
                for result in m.results:
                    remake[result] = (phase, carried, carried_calls)
            for slot, storage, nbytes in m.creates:
                created[storage] = nbytes / shards(p_out[slot], mesh.sizes)
        node.time[s], node.comm[s], calls[s] = seconds, inside, count
        node.outs.append(produced)
        node.needs.append(needed)
        node.created.append(created)
        node.remake.append(remake)
    return node


class _Member:
    """What build_node reads of one op of a node whatever the strategy, looked up once rather than per strategy:
    its rule, its leading argument (-1: the node's head, placed by the strategy itself), its pass, its arguments'
    producers, the slots of what ``place`` gives and of its results, the storages it creates (result, storage,
    bytes), each argument's tensor as a move inside the node names it (``_inner_moves``) and its ``_Facts``."""

    def __init__(self, flow: Flow, i: int, key: int) -> None:
        op = flow.trace.ops[i]
        self.head = i == key
        self.rule, self.leader = flow.rules[i], flow.leaders[i] if i != key else -1
        self.phase = 0 if op.phase == "fwd" else 1
        self.producers: Sequence[Slot] = flow.producers[i]
        self.placed = [(i, slot) for slot in range(len(self.rule.outputs))]  # place() gives one per rule result
        self.arguments = [(i, j) for j in range(len(self.rule.inputs))]
        self.results = [(i, slot) for slot in range(len(op.outputs))]
        self.creates = [(slot, t.storage, flow.trace.storages[t.storage].nbytes) for slot, t in enumerate(op.outputs)
                        if flow.trace.storages[t.storage].created == i]
        self.inputs = op.inputs
        self.tensors = [(t.storage, t.shape, t.stride, t.offset, op.phase == "fwd") for t in op.inputs]
        self.shapes = [t.shape for t in (*op.inputs, *op.outputs)]
        self.facts = _Facts(op)


def _remade(producers: Sequence[Slot], phase: int, remake: dict[Slot, tuple[int, float, int]], moved: set[tuple]
            ) -> tuple[float, int]:
    """A result that was moved in one pass (a view of a split dimension gathered first) is a temporary of that
    pass: a reader in the other pass moves it again, once (Megatron-LM's sequence parallelism all-gathers a
    linear's input again for the weight gradient rather than keep the gathered copy): (seconds, collectives)."""
    total, calls = 0.0, 0
    for src in producers:
        hit = remake.get(src)
        if hit is not None and hit[0] != phase and ("again", src, phase) not in moved:
            moved.add(("again", src, phase))
            total, calls = total + hit[1], calls + hit[2]
    return total, calls


def _follower_combo(m: _Member, produced: dict[Slot, Placements], mesh: DeviceMesh) -> tuple[str | None, ...]:
    """The follower's strategy from its leader's placement; while its split does not fit the follower's tensors
    (uneven), its first label left is dropped, i.e. replicated first (a combo that fits is the answer: the check
    reads the whole combo, so it would pass again)."""
    leader, r = m.leader, m.rule
    src = m.producers[leader]
    p = produced.get(src) or produced.get((src[0], 0))
    combo = list(follow(r, leader, p)) if p is not None else [None] * len(mesh.sizes)
    for d in range(len(combo)):
        if combo[d] is None:
            continue
        p_in, p_out = place(r, tuple(combo), leader)
        if all(valid(s, q, mesh.sizes) for s, q in zip(m.shapes, (*p_in, *p_out), strict=True)):
            break
        combo[d] = None
    return tuple(combo)


def _inner_moves(m: _Member, p_in: Sequence[Placements], produced: dict[Slot, Placements], moved: set[tuple],
                 mesh: DeviceMesh, resharder: Resharder) -> tuple[tuple[float, int], tuple[float, int]]:
    """Moves to the placements op i needs of arguments its own node produced: (seconds, collectives) charged, and
    of the moves op i's arguments needed; a tensor moved to a placement in one pass is moved once, whoever reads it
    (Q, K and V read one gathered input)."""
    total = made = 0.0
    calls = made_calls = 0
    for j, src in enumerate(m.producers):
        have = produced.get(src)
        if have is None or have == p_in[j]:
            continue
        seconds, count = resharder.move(have, p_in[j], _local_bytes(m.inputs[j], have, mesh.sizes))
        made, made_calls = made + seconds, made_calls + count
        done = (*m.tensors[j], p_in[j])
        if done not in moved:
            moved.add(done)
            total, calls = total + seconds, calls + count
    return (total, calls), (made, made_calls)


class _Facts:
    """What ``_op_seconds`` needs of an op whatever its strategy, computed once per op rather than per strategy:
    its OpCost, precision and tensor bytes, and the roofline times already found by local shape (most strategies of
    a node give an op one of a few shares)."""

    def __init__(self, op: TracedOp) -> None:
        self.op = op
        self.view = op.kind == "view"
        if self.view:
            return
        self.cost = op_cost(op)
        self.precision = precision(op)
        self.ins = tuple(t.nbytes for t in op.inputs)
        self.outs = tuple(t.nbytes for t in op.outputs)
        self.seconds: dict[tuple, float] = {}
        self.bytes: dict[tuple, float] = {}  # HBM bytes per device by (argument, result) placements


def _op_seconds(facts: _Facts, r: Rule, combo: tuple[str | None, ...], p_in: tuple[Placements, ...],
                p_out: tuple[Placements, ...], mesh: DeviceMesh, eff: Efficiency) -> tuple[float, float, int]:
    """Roofline time of one op on the share each device computes (module docstring), and that of the rule's
    extra collectives with their count."""
    if facts.view:
        return 0.0, 0.0, 0
    op, cost, sizes = facts.op, facts.cost, mesh.sizes
    work = split_factor(combo, sizes)
    nbytes = facts.bytes.get((p_in, p_out))
    if nbytes is None:
        nbytes = facts.bytes[(p_in, p_out)] = (op.bytes_read * _share(facts.ins, p_in, sizes)
                                               + op.bytes_written * _share(facts.outs, p_out, sizes))
    m, n, k, align = cost.m, cost.n, cost.k, cost.align
    if cost.kind == "gemm" and any(r.gemm):
        m, n, k = (v / split_factor(combo, sizes, frozenset({lab})) if lab else v
                   for v, lab in zip((m, n, k), r.gemm, strict=True))
        split = [v for v, lab in zip((n, k), r.gemm[1:], strict=True) if lab]  # a shard's own leading dims
        align = min(align, alignment(*split)) if split else align
    elif cost.kind == "attention":
        m = m / work
    key = (work, nbytes, m, n, k, align)
    seconds = facts.seconds.get(key)
    if seconds is None:
        local = replace(cost, flops=cost.flops / work, nbytes=nbytes, m=m, n=n, k=k, align=align)
        seconds = facts.seconds[key] = float(op_time(local, mesh.cluster.accelerator, facts.precision, eff))
    extra, calls = 0.0, 0
    for label, kind, nbytes in r.extra:
        for dim, lab in enumerate(combo):
            if lab == label:
                extra += mesh.collective(kind, nbytes / max(work // sizes[dim], 1), dim)
                calls += 1
    return seconds, extra, calls


@lru_cache(maxsize=65536)
def _share(nbytes: tuple[int, ...], places: tuple[Placements, ...], sizes: tuple[int, ...]) -> float:
    """The share of an op's tensors' bytes (``nbytes``) one device holds (of what the op reads, or of what it
    writes: a factory such as zeros_like reads none of its argument, trace/capture.py). Memoised: ops of one shape
    recur (Llama-3-8B on 64 H100s: 6,848 calls, 1,245 distinct)."""
    whole = sum(nbytes)
    return sum(b / shards(p, sizes) for b, p in zip(nbytes, places, strict=True)) / whole if whole else 1.0


def is_split(combo: tuple[str | None, ...]) -> bool:
    return any(lab is not None and not is_pass(lab) for lab in combo)
