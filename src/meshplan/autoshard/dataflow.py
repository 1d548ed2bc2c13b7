"""The data flow of a traced step: who produced each argument of each op, and which decision owns each op.

The trace (trace/capture.py) records every aten op of one forward and backward pass with the storage, shape,
strides and offset of each tensor. An argument's producer is the latest earlier op that returned a tensor with the
same storage, shape, strides and offset (a view of the same bytes laid out the same way is the same tensor); an
argument nothing produced is a *source*: a parameter, an example input, a buffer or a constant, which the planner
places like an op's result.

Decisions (Alpa, Zheng et al. 2022, §4.2, "we merge … element-wise operators … into their operand"): every anchor
op and every source is a node with strategies of its own; a follower (a view, a copy, an element-wise op) joins
the node that owns its leading argument, so its placement follows from that node's strategy. Two exceptions make a
follower a node of its own: its leader comes from another block (blocks.py: no decision spans two blocks), or
its leader or another argument it is linear in comes from a node that may leave Partial sums (a contraction, or an
op that carries a Partial through: the scatter of a MoE combine's partial rows) and the follower is not a view. A
Partial sum can be completed by an all-reduce or by a reduce-scatter to any split (sequence parallelism is the
latter), or carried on through a linear op (the router's gradient: a product with the experts' partial rows), a
choice a follower could not make.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.autoshard.ops import packet, rule
from meshplan.autoshard.rules import Rule
from meshplan.autoshard.views import VIEWS
from meshplan.trace.graph import TensorInfo, Trace, TracedOp

STATE = ("param", "buffer")


@dataclass(frozen=True, slots=True)
class Source:
    """A tensor the step reads but no op produced: ``role`` is the storage's (param, input, buffer, …)."""

    storage: int
    role: str
    info: TensorInfo


@dataclass(frozen=True, kw_only=True)
class Flow:
    """Producers and owners of a trace (indices into trace.ops; sources numbered after the ops)."""

    trace: Trace
    producers: tuple[tuple[tuple[int, int], ...], ...]  # per op, per argument: (producer node key, result slot)
    roles: tuple[str, ...]  # per op: source | anchor | follow
    rules: tuple[Rule, ...]
    leaders: tuple[int, ...]  # per op: the leading argument of a follower (-1 otherwise)
    owners: tuple[int, ...]  # per op: the node key that owns it (an op index, or len(ops) + source number)
    sources: tuple[Source, ...]

    def key_of_source(self, number: int) -> int:
        return len(self.trace.ops) + number


def _key(t: TensorInfo) -> tuple:
    return (t.storage, t.shape, t.stride, t.offset)


def flow(trace: Trace, block_of: dict[int, tuple[int, int]] | None = None) -> Flow:
    """Producers, roles, rules, leaders and owners of every op of ``trace``. ``block_of`` (blocks.py): a follower
    whose leader comes from another block (or from outside the blocks) becomes an anchor, so that no decision
    spans two blocks and identical blocks have identical decisions."""
    block_of = block_of or {}
    producers, sources = _producers(trace)
    n = len(trace.ops)
    consumers: dict[int, set] = {}
    for i, found in enumerate(producers):
        for key, _ in found:
            if key >= n:
                consumers.setdefault(key, set()).add(block_of.get(i, (-1, -1)))
    where = {key: next(iter(b)) if len(b) == 1 else (-1, -1) for key, b in consumers.items()}
    roles, rules, leaders = [], [], []
    owners: list[int] = []
    summing: dict[int, bool] = {}  # per op: its owner may leave a Partial result (a contraction or a sum)
    members: dict[tuple[int, int], set[int]] = {}
    for i in range(n):
        members.setdefault(block_of.get(i, (-1, -1)), set()).add(i)
    for op in trace.ops:
        found = producers[op.index]
        mine = members[block_of.get(op.index, (-1, -1))]
        state = frozenset(j for j, (key, _) in enumerate(found)
                          if key >= n and sources[key - n].role in STATE)
        role, r = rule(op, state)
        leader = _leader(op, role)
        if role == "follow":
            src = found[leader][0]
            src_block = where.get(src, (-1, -1)) if src >= n else block_of.get(src, (-1, -1))
            partial = packet(op) not in VIEWS and any(
                found[j][0] < n and summing[found[j][0]] for j in {leader} | set(r.linear))
            if src_block != block_of.get(op.index, (-1, -1)) or partial:
                role, leader = "anchor", -1
        owner = op.index
        if role == "follow":
            src = found[leader][0]
            owner = src if src >= n else owners[src]
        roles.append(role)
        rules.append(r)
        leaders.append(leader)
        owners.append(owner)
        summing[op.index] = summing.get(owner, False) if owner != op.index else role == "anchor" and (any(
            r.result_sums(k) & set(r.labels) for k in range(len(r.outputs))) or _accumulates(r, found, summing, mine)
            or any(found[j][0] < n and summing[found[j][0]] for j in r.linear))
    return Flow(trace=trace, producers=tuple(producers), roles=tuple(roles), rules=tuple(rules),
                leaders=tuple(leaders), owners=tuple(owners), sources=tuple(sources))


def _accumulates(r: Rule, found: tuple, summing: dict[int, bool], mine: set[int]) -> bool:
    """An add of two results of its own block that may both be Partial sums (the input gradients of Q, K and V
    summed): its result may stay Partial too, so what follows it must be free to complete the sum its own way."""
    return bool(r.additive) and sum(1 for key, _ in found if key in mine and summing.get(key, False)) >= 2


def _producers(trace: Trace) -> tuple[list[tuple[tuple[int, int], ...]], list[Source]]:
    """Per op, per argument: (producer key, result slot); sources get keys after the ops (module docstring)."""
    n = len(trace.ops)
    latest: dict[tuple, tuple[int, int]] = {}
    by_storage: dict[int, tuple[int, int]] = {}
    source_of: dict[int, int] = {}
    sources: list[Source] = []
    producers = []
    for op in trace.ops:
        found = []
        for t in op.inputs:
            hit = latest.get(_key(t)) or by_storage.get(t.storage)
            if hit is None:
                if t.storage not in source_of:
                    source_of[t.storage] = len(sources)
                    sources.append(Source(storage=t.storage, role=trace.storages[t.storage].role, info=t))
                hit = (n + source_of[t.storage], 0)
            found.append(hit)
        producers.append(tuple(found))
        for slot, t in enumerate(op.outputs):
            latest[_key(t)] = (op.index, slot)
            by_storage[t.storage] = (op.index, slot)
    return producers, sources


def _leader(op: TracedOp, role: str) -> int:
    """A follower's leading argument: the first whose shape is the result's (not a broadcast operand), else the
    largest; -1 for anchors and sources."""
    if role != "follow" or not op.inputs:
        return -1
    out = op.outputs[0].shape
    for j, t in enumerate(op.inputs):
        if t.shape == out and t.numel > 0:
            return j
    return max(range(len(op.inputs)), key=lambda j: op.inputs[j].numel)
