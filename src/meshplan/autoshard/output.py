"""A plan as PyTorch runs it: DTensor placements of every parameter, a ``parallelize_module`` plan per mesh
dimension (ColwiseParallel / RowwiseParallel / SequenceParallel where the placements are those styles, explicit
placements otherwise), and the collectives the plan inserts between ops.

Styles (torch.distributed.tensor.parallel.style), read per mesh dimension from what the forward op that reads a
parameter splits there: a GEMM splitting its output features (``n``) is ColwiseParallel, its contraction (``k``)
RowwiseParallel; an embedding splitting its rows (the vocabulary) RowwiseParallel, its columns ColwiseParallel; a
replicated norm weight whose activations are split along the sequence SequenceParallel. A parameter replicated where
the op splits the batch is data parallel (``replicate``); one split there but read whole is FSDP (``fully_shard``,
gathered before use). Layers of a tied group print once, their index as ``*`` (parallelize_module's patterns).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from meshplan.autoshard.ops import ATTENTION, GEMMS, packet
from meshplan.autoshard.placement import REPLICATE, Placements, describe
from meshplan.autoshard.problem import HUB, Problem, to_view
from meshplan.autoshard.reshard import moves
from meshplan.autoshard.solve import Sharding

BATCH = {"m", "b", "s", "i0", "n", "d0", "l0", "t"}
SPLITS = {"split", "split_with_sizes", "chunk", "_unsafe_split", "unbind", "slice", "narrow"}
NORM_SUFFIXES = ("norm", "layernorm", "ln_1", "ln_2", "ln_f")


@dataclass(frozen=True, kw_only=True)
class ParamPlan:
    name: str  # with a tied layer's index as *
    shape: tuple[int, ...]
    placements: Placements
    styles: tuple[str, ...]  # per mesh dimension
    batch: tuple[bool, ...] = ()  # per mesh dimension: whether the op reading it splits the batch there
    count: int = 1  # the full model's layers a tied parameter stands for
    reader: str = ""  # the kind of the forward op that reads it


@dataclass(frozen=True, kw_only=True)
class Move:
    producer: str
    consumer: str
    shape: tuple[int, ...]
    src: Placements
    dst: Placements
    kinds: tuple[str, ...]
    per_step: bool
    seconds: float  # per step, all its occurrences


def pattern(problem: Problem, name: str) -> str:
    """``hf.model.layers.0.mlp.gate_up_proj.weight`` -> ``model.layers.*.mlp.gate_up_proj.weight``."""
    name = name.removeprefix("hf.")
    for group in problem.blocks.groups:
        prefix = group.prefix.removeprefix("hf.")
        name = re.sub(rf"^{re.escape(prefix)}\.\d+(?=\.)", f"{prefix}.*", name)
    return name


def _reader(problem: Problem, key: int, choice: dict[int, int]) -> tuple[str, tuple[str | None, ...]] | None:
    """(op kind, its strategy) of the forward op that reads the parameter node ``key`` (through a hub too)."""
    ops = problem.flow.trace.ops
    n = len(ops)
    for (u, v), edge in problem.edges.items():
        if u != key:
            continue
        for _, needed, _, per_step in edge.uses:
            target = problem.hubs[v][1] if v >= HUB else needed
            if per_step or target[0] >= n or ops[target[0]].phase != "fwd":
                continue
            op = ops[target[0]]
            reader = problem.flow.owners[target[0]]
            reader = problem.template.get(reader, reader)
            if reader in problem.nodes:
                return packet(op), problem.nodes[reader].combos[choice[reader]]
    return None


def _style(kind: str, label: str | None, placement: int) -> str:
    """A parallel style only where the parameter is sharded as that style shards it: a replicated weight that a GEMM
    reads in slices (its k split over a replicated operand) is replicated."""
    if kind in GEMMS and placement >= 0:
        style = {"n": "ColwiseParallel", "k": "RowwiseParallel"}
        if label in style:
            return style[label]
    if kind == "embedding" and label in ("v", "o") and placement >= 0:
        return "RowwiseParallel" if label == "v" else "ColwiseParallel"
    if kind in ATTENTION and label == "h":
        return "heads"
    if _batch(label):
        return "fully_shard" if placement >= 0 else "replicate"
    return "replicate" if placement == REPLICATE else describe((placement,))


def _batch(label: str | None) -> bool:
    return label is not None and (label in BATCH or label.startswith(("i", "l", "d")))


def params(sharding: Sharding) -> list[ParamPlan]:
    """Every parameter's placements and styles (module docstring), tied layers once."""
    problem, choice = sharding.problem, sharding.choice
    trace = problem.flow.trace
    found = []
    for key, node in sorted(problem.nodes.items()):
        if node.kind != "param":
            continue
        src = problem.flow.sources[key - len(trace.ops)]
        p = node.outs[choice[key]][(key, 0)]
        read = _reader(problem, key, choice)
        labels = [read[1][dim] if read is not None else None for dim in range(len(p))]
        styles = tuple(_style(read[0] if read else "", label, x) for label, x in zip(labels, p, strict=True))
        name = pattern(problem, trace.names.get(src.storage, node.name))
        count = next((g.layers for g in problem.blocks.groups if name.startswith(f"{g.prefix.removeprefix('hf.')}.*.")),
                     1)
        found.append(ParamPlan(name=name, shape=src.info.shape, placements=p, styles=styles,
                               batch=tuple(_batch(label) for label in labels), count=count,
                               reader=read[0] if read else ""))
    return found


def fused_parts(sharding: Sharding, module: str) -> tuple[str, tuple[int, ...]]:
    """(the op, the widths) the forward cuts ``module``'s output into along its last dimension, where a split, chunk
    or slice reads the output whole (a fused projection: Phi-3's ``qkv_proj`` split into q, k, v by
    ``split_with_sizes``, ``gate_up_proj`` chunked into gate and up by ``split``); ("", ()) where no such op reads
    it. ``module`` is a pattern (a tied layer's index as *)."""
    problem = sharding.problem
    last: dict[str, object] = {}
    for op in problem.flow.trace.ops:
        if op.phase != "fwd" or not op.outputs:
            continue
        if pattern(problem, op.module) == module:
            last[op.module] = op.outputs[0]
        elif op.inputs and op.inputs[0] in last.values() and op.target.split(".")[1] in SPLITS and \
                op.outputs[0].shape[-1:] != op.inputs[0].shape[-1:]:
            return op.target.split(".")[1], tuple(o.shape[-1] for o in op.outputs)
    return "", ()


def sequence_parallel(sharding: Sharding, dim: int) -> bool:
    """Whether the forward pass keeps (batch, sequence, hidden) activations split along the sequence on ``dim``
    between the tensor-parallel regions (Megatron's sequence parallelism)."""
    problem, choice = sharding.problem, sharding.choice
    ops = problem.flow.trace.ops
    for key, node in problem.nodes.items():
        if key < len(ops) and ops[key].phase == "fwd" and len(ops[key].outputs[0].shape) == 3 and is_norm(
                ops[key].module) and node.outs[choice[key]].get((key, 0), (REPLICATE,) * (dim + 1))[dim] == 1:
            return True
    return False


def is_norm(module: str) -> bool:
    return module.rsplit(".", 1)[-1].endswith(NORM_SUFFIXES)


def inserted(sharding: Sharding, top: int = 12) -> list[Move]:
    """The moves the plan inserts, by total seconds per step."""
    problem, choice = sharding.problem, sharding.choice
    ops, n, sizes = problem.flow.trace.ops, len(problem.flow.trace.ops), problem.mesh.sizes
    merged: dict[tuple, list] = defaultdict(lambda: [0.0])
    m = sharding.micro_batches
    for (u, v), edge in problem.edges.items():
        a, b = choice[u], choice[v]
        cost = m * (edge.fwd[a, b] + edge.bwd[a, b]) + edge.step[a, b]
        if cost <= 0:
            continue
        for produced, needed, _, per_step in edge.uses:
            have = problem.nodes[u].outs[a].get(produced)
            if have is not None and (produced[0], needed) in problem.views:
                have = to_view(have, problem.views[(produced[0], needed)])
            use_outs = per_step or needed[0] >= HUB
            want = (problem.nodes[v].outs[b] if use_outs else problem.nodes[v].needs[b]).get(needed)
            if have is None or want is None or have == want:
                continue
            tensor = problem.hubs.get(produced[0], (produced, None))[0]
            info = ops[tensor[0]].outputs[tensor[1]] if tensor[0] < n else problem.flow.sources[tensor[0] - n].info
            held = info.nbytes / max(1, _shards(have, sizes))
            kinds = tuple(c.kind for c in moves(have, want, held, problem.mesh))
            if not kinds:
                continue
            names = (_short(problem, u), _short(problem, v))
            key = (*names, info.shape, have, want, kinds, per_step)
            merged[key][0] += cost / max(len(edge.uses), 1)
    found = [Move(producer=k[0], consumer=k[1], shape=k[2], src=k[3], dst=k[4], kinds=k[5], per_step=k[6],
                  seconds=v[0]) for k, v in merged.items()]
    return sorted(found, key=lambda mv: -mv.seconds)[:top]


def _shards(p: Placements, sizes: tuple[int, ...]) -> int:
    out = 1
    for x, s in zip(p, sizes, strict=True):
        out *= s if x >= 0 else 1
    return out


def _short(problem: Problem, key: int) -> str:
    node = problem.nodes[key]
    if node.kind == "param":
        src = problem.flow.sources[key - len(problem.flow.trace.ops)]
        return pattern(problem, problem.flow.trace.names.get(src.storage, node.name))
    if node.kind == "hub":
        return pattern(problem, node.name.removesuffix(" (shared move)"))
    return pattern(problem, node.name)

