"""Repeated layers: find identical blocks of ops, so that one block's decisions stand for all of them.

A transformer's layers are the same module L times (``model.layers.0`` … ``model.layers.31``); the trace tags every
op, forward and backward, with the module path of its forward op (trace/capture.py). Blocks are the ops under
``PREFIX.<i>`` for a module list ``PREFIX``; two blocks are identical when their ops match one for one in target,
phase, shapes, arguments and the path below the index. The largest set of identical blocks of the list holding the
most ops is tied first, then other lists among the ops left (ResNet's stages, each its own set).

Tying (the solver's side, problem.py): all blocks of a set take the same strategies, so the integer program keeps
one block's variables and weighs its costs by the number of blocks. That is the uniform plan Megatron-LM, torchtitan
and Alpa's layer-wise solutions use; a plan that treats one layer differently (e.g. to fit memory) is outside it.
With tied variables the program is exactly the full model's restricted to uniform plans, so a 100-layer model costs
what one layer costs to solve; and a model built with fewer layers than it has (models.py traces a Hugging Face
config at depth 2) weighs the traced blocks as the full count (``Blocks.scale``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from meshplan.trace.graph import Trace, TracedOp

INDEX = re.compile(r"\.(\d+)(?=\.|$)")


@dataclass(frozen=True, kw_only=True)
class Group:
    """A set of identical blocks: ``blocks[b]`` the op indices of block b, in order (position k matches)."""

    prefix: str
    blocks: tuple[tuple[int, ...], ...]
    layers: int  # blocks in the full model (>= len(blocks) when the trace holds fewer)

    @property
    def traced(self) -> int:
        return len(self.blocks)


@dataclass(frozen=True, kw_only=True)
class Blocks:
    groups: tuple[Group, ...]
    block_of: dict[int, tuple[int, int]] = field(hash=False)  # op -> (group, block)
    rep: dict[int, int] = field(hash=False)  # op -> the op at its position in its group's first block

    def group_block(self, op: int) -> tuple[int, int]:
        return self.block_of.get(op, (-1, -1))


def _candidates(op: TracedOp) -> list[tuple[str, int, str]]:
    """(list prefix, index, path below) for every ``.<int>`` segment of the op's module path."""
    found = []
    for m in INDEX.finditer(op.module):
        found.append((op.module[:m.start()], int(m.group(1)), op.module[m.end():]))
    return found


def _signature(trace: Trace, ops: list[int], prefix: str) -> tuple:
    sig = []
    for i in ops:
        op = trace.ops[i]
        below = op.module[len(prefix):]
        below = INDEX.sub("", below, count=1) if below.startswith(".") else below
        sig.append((op.target, op.phase, below, tuple(t.shape for t in op.inputs),
                    tuple(t.shape for t in op.outputs), op.attrs))
    return tuple(sig)


def find_blocks(trace: Trace, layers: int | None = None) -> Blocks:
    """The tied groups of ``trace`` (module docstring); ``layers``: the full model's layer count when the trace
    holds fewer blocks of its largest group."""
    taken: set[int] = set()
    groups: list[Group] = []
    while True:
        group = _best_group(trace, taken)
        if group is None:
            break
        if not groups and layers is not None and layers > group.traced:
            group = Group(prefix=group.prefix, blocks=group.blocks, layers=layers)
        groups.append(group)
        for block in group.blocks:
            taken.update(block)
    block_of, rep = {}, {}
    for g, group in enumerate(groups):
        for b, block in enumerate(group.blocks):
            for pos, i in enumerate(block):
                block_of[i] = (g, b)
                rep[i] = group.blocks[0][pos]
    return Blocks(groups=tuple(groups), block_of=block_of, rep=rep)


def _best_group(trace: Trace, taken: set[int]) -> Group | None:
    """The largest set of identical blocks among the ops not yet tied (None when no list repeats a block)."""
    members: dict[str, dict[int, list[int]]] = {}
    for op in trace.ops:
        if op.index in taken:
            continue
        for prefix, index, _ in _candidates(op):
            members.setdefault(prefix, {}).setdefault(index, []).append(op.index)
    best, saved = None, 0
    for prefix, blocks in members.items():
        if len(blocks) < 2:
            continue
        sigs = {b: _signature(trace, ops, prefix) for b, ops in blocks.items()}
        common, count = Counter(sigs.values()).most_common(1)[0]
        if count < 2:
            continue
        gain = (count - 1) * len(common)
        if gain > saved:
            chosen = tuple(tuple(blocks[b]) for b in sorted(blocks) if sigs[b] == common)
            best, saved = Group(prefix=prefix, blocks=chosen, layers=len(chosen)), gain
    return best
