"""The sharding rule of every aten op a training step runs: contractions, attention, normalisations, losses.

``rule(op)`` returns the op's role and its ``Rule`` (rules.py):

    source   no data arguments (arange, zeros, new_zeros, *_like): any placement of its result, made in place
    anchor   a decision of its own, every strategy enumerated: GEMMs, convolutions, attention, embeddings,
             reductions, softmax, normalisations, losses, gathers and scatters, sorts
    follow   merged into its leading argument's owner (Alpa §4.2): element-wise ops, views, copies, cat

The einsum of each anchor (labels m, n, k, b for batch, h for heads, s for queries …) follows DTensor's strategy
for the same op (torch/distributed/tensor/_ops/_matrix_ops.py, _math_ops.py, _tensor_ops.py, _embedding_ops.py,
and loss.py for the vocabulary-parallel loss); ops without a rule keep every tensor replicated (one strategy,
correct and usually slow: ``Plan.replicated_ops`` lists them).

Batch normalisation split on the batch keeps per-device statistics, as DistributedDataParallel runs it without
SyncBatchNorm. The token-reordering ops of a mixture-of-experts dispatch (a sort of the routed token list, the
histogram of tokens per expert, the gather and scatter by the sorted indices) may split their token dimension
*locally*: each device sorts and groups its own tokens, as a data-parallel replica does; DTensor has no placement
for such per-device indices, and a gather from a parameter or buffer never splits this way.
"""

from __future__ import annotations

from functools import cache

from meshplan.autoshard.rules import Labels, Rule, replicated_rule
from meshplan.autoshard.views import VIEWS, view_rule
from meshplan.trace.classes import aten_name
from meshplan.trace.graph import TracedOp

SOURCES = {"arange", "zeros", "ones", "full", "empty", "empty_strided", "scalar_tensor", "rand", "randn", "randint",
           "new_zeros", "new_ones", "new_empty", "new_full", "new_empty_strided", "zeros_like", "ones_like",
           "empty_like", "full_like", "rand_like", "randn_like", "randint_like", "tensor", "lift_fresh_copy"}
ELEMENTWISE = {"_to_copy", "copy_", "copy", "fill_", "fill", "zero_", "floor_divide", "native_dropout",
               "native_dropout_backward", "bernoulli_", "bernoulli", "masked_fill_", "clamp_", "where"}
# element-wise ops a Partial passes through: the arguments (by position) that may be Partial
LINEAR = {"neg": {0}, "clone": {0}, "_to_copy": {0}, "copy_": {1}, "copy": {1}, "mul": {0, 1}, "div": {0},
          "add": {0, 1}, "sub": {0, 1}, "add_": {0, 1}, "sub_": {0, 1}, "mul_": {0, 1}, "div_": {0}}
ADDITIVE = {"add", "sub", "add_", "sub_"}
PRODUCTS = {"mul", "mul_", "div", "div_"}
SUM_REDUCTIONS = {"sum", "mean"}
REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "var_mean", "logsumexp",
              "prod", "any", "all", "linalg_vector_norm", "norm", "std_mean"}
GEMMS = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_grouped_mm"}
ATTENTION = {"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
             "_scaled_dot_product_cudnn_attention_backward", "_scaled_dot_product_flash_attention_for_cpu_backward",
             "_flash_attention_forward", "_flash_attention_backward", "_efficient_attention_forward",
             "_efficient_attention_backward"}
BSHD = {"_flash_attention_forward", "_flash_attention_backward", "_efficient_attention_forward",
        "_efficient_attention_backward"}


def packet(op: TracedOp) -> str:
    """``aten.mm.default`` -> ``mm`` (trace.classes.aten_name)."""
    return aten_name(op.target)


def _pointwise(op: TracedOp) -> bool:
    """torch's own tag: the op maps elements to elements (with broadcasting). A traced op carries its tags (capture
    records them with the call), so a trace kept on disk is planned without importing torch; a record made by hand
    (no call) asks torch."""
    return "pointwise" in op.tags if op.call else _pointwise_target(op.target)


@cache
def _pointwise_target(target: str) -> bool:
    try:
        import torch
    except ModuleNotFoundError:  # pragma: no cover (a Trace exists only where torch does)
        return False
    _, name, overload = (target.split(".") + ["default"])[:3]
    op = getattr(getattr(torch.ops.aten, name, None), overload, None)
    return op is not None and torch.Tag.pointwise in op.tags


def op_shapes(op: TracedOp) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    return [t.shape for t in op.inputs], [t.shape for t in op.outputs]


def rule(op: TracedOp, state_inputs: frozenset[int] = frozenset()) -> tuple[str, Rule]:
    """(role, rule) of one traced op; ``state_inputs``: arguments that are parameters or buffers."""
    name = packet(op)
    ins, outs = op_shapes(op)
    if name in SOURCES or not ins:
        return "source", Rule(inputs=tuple((None,) * len(s) for s in ins), outputs=tuple(_dims(s, "o") for s in outs))
    if name in VIEWS:
        return "follow", view_rule(op, name)
    from meshplan.autoshard.ops_nn import FOLLOWERS

    if name in FOLLOWERS:
        return "follow", FOLLOWERS[name](op, state_inputs)
    if name in ELEMENTWISE or name in LINEAR or _pointwise(op) or name == "cat":
        return "follow", broadcast_elementwise(op, name)
    made = _anchor(op, name, state_inputs)
    return "anchor", made if made is not None else replicated_rule(ins, outs)


def _anchor(op: TracedOp, name: str, state: frozenset[int]) -> Rule | None:
    from meshplan.autoshard import ops_nn  # the neural-network ops' rules

    if name in GEMMS:
        return ops_nn.matmul(op, name)
    if name in ATTENTION:
        return ops_nn.attention(op, name in BSHD)
    if name in REDUCTIONS:
        return reduction(op, name)
    maker = ops_nn.RULES.get(name)
    return maker(op, state) if maker is not None else None


def _dims(shape: tuple[int, ...], prefix: str = "d", skip_ones: bool = False) -> tuple[str | None, ...]:
    return tuple(None if skip_ones and s == 1 else f"{prefix}{i}" for i, s in enumerate(shape))


def broadcast_elementwise(op: TracedOp, name: str) -> Rule:
    """Broadcasting element-wise op: the result's dimensions are the labels; an argument's dimensions align from
    the right, a broadcast (size-1) one unlabelled. ``cat`` keeps a split of the concatenated dimension as a packed
    layout (views.py: each device holds its share of every piece), when every piece divides evenly."""
    out = op.outputs[0].shape
    labels = _dims(out)
    inputs: list[Labels] = []
    for t in op.inputs:
        if name == "cat" and t.shape == (0,):  # torch.cat skips empty 1-D tensors
            inputs.append((None,))
            continue
        offset = len(out) - len(t.shape)
        inputs.append(tuple(None if offset + j < 0 or (s == 1 and out[offset + j] != 1) else labels[offset + j]
                            for j, s in enumerate(t.shape)))
    outputs = tuple(labels if o.shape == out else (None,) * len(o.shape) for o in op.outputs)
    linear = frozenset(i for i in LINEAR.get(name, ()) if i < len(inputs))  # mul: either, the other replicated
    return Rule(inputs=tuple(inputs), outputs=outputs, linear=linear, one_partial=name in PRODUCTS,
                additive=frozenset(range(len(inputs))) if name in ADDITIVE else frozenset())


def _norm_dim(dim: object, ndim: int) -> int:
    d = int(dim) if isinstance(dim, int) else 0
    return d + ndim if d < 0 else d


def reduce_dims(op: TracedOp, ndim: int) -> set[int]:
    dims = op.attr("dim", None)
    if dims is None or dims == ():
        return set(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    return {_norm_dim(d, ndim) for d in dims}


def reduction(op: TracedOp, name: str) -> Rule:
    """sum / mean over some dimensions: those labels are summed (Partial results when split); max-like reductions
    may not split them. ``keepdim`` results keep a size-1 dimension there."""
    x = op.inputs[0].shape
    dims = reduce_dims(op, len(x))
    labels = _dims(x)
    kept = tuple(lab for i, lab in enumerate(labels) if i not in dims)
    outputs = []
    for o in op.outputs:
        if len(o.shape) == len(x):
            outputs.append(tuple(None if i in dims else lab for i, lab in enumerate(labels)))
        elif len(o.shape) == len(kept):
            outputs.append(kept)
        else:
            outputs.append((None,) * len(o.shape))
    reduced = frozenset(lab for lab in (labels[i] for i in dims) if lab is not None)  # all named: no skip_ones
    return Rule(inputs=((labels,) + tuple((None,) * len(t.shape) for t in op.inputs[1:])), outputs=tuple(outputs),
                no_partial=frozenset() if name in SUM_REDUCTIONS else reduced,
                linear=frozenset({0}) if name in SUM_REDUCTIONS else frozenset())
