"""Views, reshapes and slices as rules: which dimensions of the result carry which of the argument's.

A view moves no data, so a split dimension stays split where the result keeps it (DTensor's view ops,
torch/distributed/tensor/_ops/_view_ops.py, ``view_groups`` and ``propagate_shape_and_sharding``):

- a reshape groups the argument's dimensions and the result's into runs of equal product; a run keeps the split of
  its *first* non-unit dimension on its first result dimension (``(B, S, H) -> (B·S, H)`` keeps Shard(0) as
  Shard(0)); a split of any other dimension of a run cannot be kept (it would interleave), so that dimension is
  unlabelled and the follower replicates it first;
- transpose / permute permute the labels; unsqueeze / squeeze insert or drop unlabelled size-1 dimensions;
- expand's broadcast dimensions are unlabelled; slice / select / narrow along a dimension leave it unlabelled,
  unless the slice is the whole dimension;
- split / chunk along a dimension: each piece keeps that dimension's split when its size divides evenly, which is
  a *packed* layout (each device holds its share of every piece, as Megatron-LM stores a fused gate/up or QKV
  weight per tensor-parallel rank); cat of such pieces (elementwise in ops.py) likewise.
"""

from __future__ import annotations

from meshplan.autoshard.rules import Labels, Rule
from meshplan.trace.graph import TracedOp

RESHAPES = {"view", "_unsafe_view", "reshape", "_reshape_alias", "view_copy", "_unsafe_view_copy"}
IDENTITY = {"alias", "detach", "lift_fresh", "contiguous", "clone", "_conj", "resolve_conj", "resolve_neg",
            "view_as", "_to_copy_view"}
VIEWS = RESHAPES | IDENTITY | {"t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "slice", "select",
                               "split", "split_with_sizes", "unbind", "narrow", "chunk", "as_strided",
                               "numpy_T", "movedim", "expand_as", "_unsafe_split", "unflatten", "flatten"}


def _norm(dim: object, ndim: int) -> int:
    d = int(dim) if isinstance(dim, int) else 0
    return d + ndim if d < 0 and ndim else d


def view_rule(op: TracedOp, name: str) -> Rule:
    x = op.inputs[0].shape
    labels = tuple(f"d{i}" for i in range(len(x)))
    inputs: list[Labels] = [labels] + [(None,) * len(t.shape) for t in op.inputs[1:]]
    outs: list[Labels]
    if name in IDENTITY:
        outs = [labels if o.shape == x else (None,) * len(o.shape) for o in op.outputs]
    elif name in RESHAPES or name in ("unflatten", "flatten"):
        ins, out = reshape_labels(x, op.outputs[0].shape)
        inputs[0] = ins
        outs = [out]
    elif name in ("t", "transpose", "numpy_T", "permute", "movedim"):
        outs = [_permute(op, name, labels)]
    elif name in ("unsqueeze", "squeeze"):
        outs = [_squeeze(x, op.outputs[0].shape, labels)]
    elif name in ("expand", "expand_as"):
        y = op.outputs[0].shape
        off = len(y) - len(x)
        outs = [tuple(None if i < off or x[i - off] != y[i] else labels[i - off] for i in range(len(y)))]
    elif name in ("split", "split_with_sizes", "unbind", "chunk", "_unsafe_split"):
        outs = [_piece(op, name, labels, o.shape) for o in op.outputs]
    elif name in ("slice", "select", "narrow"):
        outs = [_slice(op, name, labels)]
    else:  # as_strided and other views whose layout the shape does not say: replicated
        inputs[0] = (None,) * len(x)
        outs = [(None,) * len(o.shape) for o in op.outputs]
    kept = {lab for o in outs for lab in o}
    inputs[0] = tuple(lab if lab in kept else None for lab in inputs[0])  # a split the result cannot keep
    return Rule(inputs=tuple(inputs), outputs=tuple(outs), linear=frozenset({0}))


def reshape_labels(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[tuple[str | None, ...], tuple[str | None, ...]]:
    """Labels of a reshape's argument and result: runs of equal product; each run's first non-unit argument
    dimension names the run's first non-unit result dimension, the rest of the run unlabelled."""
    ins: list[str | None] = [None] * len(x)
    out: list[str | None] = [None] * len(y)
    i = j = 0
    while i < len(x) or j < len(y):
        run_i, run_j = [i] if i < len(x) else [], [j] if j < len(y) else []
        pi = x[i] if i < len(x) else 1
        pj = y[j] if j < len(y) else 1
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj and i < len(x):
                pi *= x[i]
                run_i.append(i)
                i += 1
            elif j < len(y):
                pj *= y[j]
                run_j.append(j)
                j += 1
            else:
                break
        first_i = next((k for k in run_i if x[k] != 1), None)
        first_j = next((k for k in run_j if y[k] != 1), None)
        if first_i is not None and first_j is not None:
            ins[first_i] = out[first_j] = f"d{first_i}"
    return tuple(ins), tuple(out)


def _permute(op: TracedOp, name: str, labels: tuple[str, ...]) -> tuple[str | None, ...]:
    n = len(labels)
    if name in ("t", "numpy_T"):
        return tuple(reversed(labels))
    if name == "transpose":
        a, b = _norm(op.attr("dim0", 0), n), _norm(op.attr("dim1", 1), n)
        order = list(range(n))
        order[a], order[b] = order[b], order[a]
        return tuple(labels[k] for k in order)
    if name == "movedim":
        src, dst = _norm(op.attr("source", 0), n), _norm(op.attr("destination", 0), n)
        order = [k for k in range(n) if k != src]
        order.insert(dst, src)
        return tuple(labels[k] for k in order)
    dims = op.attr("dims", tuple(range(n)))
    return tuple(labels[_norm(d, n)] for d in dims)


def _squeeze(x: tuple[int, ...], y: tuple[int, ...], labels: tuple[str, ...]) -> tuple[str | None, ...]:
    """Match the non-unit dimensions in order; unit ones are unlabelled."""
    kept = [lab for lab, s in zip(labels, x, strict=True) if s != 1]
    out: list[str | None] = []
    for s in y:
        out.append(kept.pop(0) if s != 1 and kept else None)
    return tuple(out)


def _piece(op: TracedOp, name: str, labels: tuple[str, ...], shape: tuple[int, ...]) -> tuple[str | None, ...]:
    n = len(labels)
    dim = _norm(op.attr("dim", 0), n)
    if name == "unbind":
        return tuple(lab for k, lab in enumerate(labels) if k != dim)
    return labels  # a packed layout keeps the split (module docstring); divisibility is checked on the shapes


def _slice(op: TracedOp, name: str, labels: tuple[str, ...]) -> tuple[str | None, ...]:
    x = op.inputs[0].shape
    dim = _norm(op.attr("dim", 0), len(x))
    if name == "select":
        return tuple(lab for k, lab in enumerate(labels) if k != dim)
    if op.outputs[0].shape[dim] == x[dim]:  # the whole dimension: an alias
        return labels
    return tuple(None if k == dim else lab for k, lab in enumerate(labels))
