"""Rules of the neural-network ops (ops.py says what each role means and where the einsums come from).

Labels: m n k of a matrix product (k contracted), b batch, h heads, s queries, v vocabulary or classes, c input
channels, o output channels or features, e experts, i0 i1 … index dimensions, l0 l1 … leading dimensions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from meshplan.autoshard.rules import Labels, Rule
from meshplan.trace.graph import TracedOp

NO_SUMS: frozenset[str] = frozenset()


def _none(shape: tuple[int, ...]) -> Labels:
    return (None,) * len(shape)


def _by_name(op: TracedOp, table: Mapping[str, Labels]) -> tuple[Labels, ...]:
    """Labels of each argument by its schema name; arguments not in ``table`` stay replicated."""
    return tuple(table.get(name, _none(t.shape)) if len(table.get(name, ())) == len(t.shape) else _none(t.shape)
                 for name, t in zip(op.args, op.inputs, strict=True))


def _right(shape: tuple[int, ...], labels: Labels) -> Labels:
    """An argument broadcast against ``labels`` from the right (a bias)."""
    off = len(labels) - len(shape)
    return tuple(labels[off + j] if off + j >= 0 and s != 1 else None for j, s in enumerate(shape))


def matmul(op: TracedOp, name: str) -> Rule:
    """mm ``mk,kn->mn``; addmm with its bias added (additive); bmm / baddbmm with a batch b; _scaled_mm as mm;
    _grouped_mm (routed rows s, experts e): ``sk,ekn->sn`` (experts contracted: each device runs its experts'
    rows, the others zero, a Partial sum) and its weight gradient ``ns,sk->enk``."""
    shapes = {a: t.shape for a, t in zip(op.args, op.inputs, strict=True)}
    out = op.outputs[0].shape
    table: dict[str, Labels]
    res: Labels
    if name == "_grouped_mm":
        a, b = shapes["self"], shapes["mat2"]
        if len(a) == 2 and len(b) == 3:
            table, res = {"self": ("s", "k"), "mat2": ("e", "k", "n")}, ("s", "n")
            return Rule(inputs=_by_name(op, table), outputs=(res,), gemm=("s", "n", "k"))
        if len(a) == 2 and len(b) == 2:
            table, res = {"self": ("n", "s"), "mat2": ("s", "k")}, ("e", "n", "k")
            return Rule(inputs=_by_name(op, table), outputs=(res,), gemm=("n", "k", "s"))
        return Rule(inputs=tuple(_none(t.shape) for t in op.inputs), outputs=(_none(out),))
    batched = len(out) == 3
    res = ("b", "m", "n") if batched else ("m", "n")
    x, w = (("b", "m", "k"), ("b", "k", "n")) if batched else (("m", "k"), ("k", "n"))
    first = "batch1" if name == "baddbmm" else "mat1" if name == "addmm" else "self"
    second = "batch2" if name == "baddbmm" else "mat2"
    table = {first: x, second: w}
    additive: frozenset[int] = frozenset()
    if name in ("addmm", "baddbmm"):
        table["self"] = _right(shapes["self"], res)
        additive = frozenset({op.args.index("self")})
    return Rule(inputs=_by_name(op, table), outputs=(res,), additive=additive, gemm=("m", "n", "k"))


def attention(op: TracedOp, bshd: bool) -> Rule:
    """Fused attention over (batch b, heads h, queries s); keys and head dimensions whole, so splitting s is
    context parallelism by an all-gather of K and V (the move to replicated keys), and the key and value gradients
    of a split s are Partial sums. Grouped-query K/V split their (fewer) heads with the query heads."""
    q = ("b", "s", "h", None) if bshd else ("b", "h", "s", None)
    kv = ("b", None, "h", None) if bshd else ("b", "h", None, None)
    lse = ("b", "h", "s")
    backward = op.target.split(".")[1].endswith("_backward")
    qshape = next(t.shape for a, t in zip(op.args, op.inputs, strict=True) if a == "query")
    table = {"query": q, "key": kv, "value": kv, "grad_out": q, "grad_out_": q, "out": q, "output": q,
             "logsumexp": lse, "softmax_lse": lse}
    inputs = list(_by_name(op, table))
    for i, (a, t) in enumerate(zip(op.args, op.inputs, strict=True)):
        if a in ("attn_mask", "attn_bias", "bias") and len(t.shape) == 4:  # broadcastable mask
            inputs[i] = tuple(lab if s != 1 and s == qs else None
                              for lab, s, qs in zip(q, t.shape, (*qshape[:3], -1), strict=True))
    outputs: list[Labels] = []
    labels: Labels
    for slot, t in zip(op.results or range(len(op.outputs)), op.outputs, strict=True):
        if backward:
            labels = q if slot == 0 else kv
        else:
            labels = q if slot == 0 else lse if len(t.shape) == 3 else _none(t.shape)
        outputs.append(labels if len(labels) == len(t.shape) else _none(t.shape))
    sums = tuple(None if any(lab for lab in o) else NO_SUMS for o in outputs)
    return Rule(inputs=tuple(inputs), outputs=tuple(outputs), sums=sums)


def embedding(op: TracedOp, state: frozenset[int]) -> Rule:
    """``vh,i->ih``: a vocabulary-split table gives Partial rows (each device looks up its own rows, zeros
    elsewhere: DTensor's MaskPartial)."""
    idx = tuple(f"i{j}" for j in range(len(op.inputs[1].shape)))
    return Rule(inputs=(("v", "o"), idx), outputs=((*idx, "o"),))


def embedding_backward(op: TracedOp, state: frozenset[int]) -> Rule:
    """``io,i->vo``: the rows a device's tokens hit, summed over tokens (Partial when the tokens are split)."""
    idx = tuple(f"i{j}" for j in range(len(op.inputs[1].shape)))
    return Rule(inputs=((*idx, "o"), idx), outputs=(("v", "o"),))


def convolution(op: TracedOp, state: frozenset[int]) -> Rule:
    """Batch n only; weight, bias and spatial dimensions whole. A split of the channels (output o or contracted input
    c) is valid arithmetic but no PyTorch program can run it: ColwiseParallel / RowwiseParallel accept only nn.Linear
    and nn.Embedding (torch/distributed/tensor/parallel/style.py, ``_apply``: NotImplementedError otherwise) and
    DTensor's convolution rule gives the output the input's placements, a replicated weight assumed
    (torch/distributed/tensor/_ops/_conv_ops.py, ``convolution_rules``); a spatial split would need halo exchanges.
    So a convolution is data parallel, as the printed plan (output.py) can write it."""
    x = op.inputs[0].shape
    rest = (None,) * (len(x) - 2)
    table = {"input": ("n", None, *rest)}
    return Rule(inputs=_by_name(op, table), outputs=(("n", None, *rest),))


def convolution_backward(op: TracedOp, state: frozenset[int]) -> Rule:
    """The forward's batch split: the input gradient split with it, the weight's and bias's gradients Partial."""
    grad = op.inputs[0].shape
    rest = (None,) * (len(grad) - 2)
    table = {"grad_output": ("n", None, *rest), "input": ("n", None, *rest)}
    by_slot = {0: ("n", None, *rest)}
    outputs = tuple(by_slot.get(slot, _none(t.shape)) for slot, t in zip(op.results, op.outputs, strict=True))
    return Rule(inputs=_by_name(op, table), outputs=outputs)


def _leading(shape: tuple[int, ...], normalized: int) -> Labels:
    return tuple(f"l{j}" if j < len(shape) - normalized else None for j in range(len(shape)))


def layer_norm(op: TracedOp, state: frozenset[int]) -> Rule:
    """Layer / RMS norm: the leading dimensions split, the normalised ones whole; the weight and bias gradients
    of a split row are Partial sums. Statistics (mean, rstd) keep the leading labels."""
    x = op.inputs[1].shape if op.target.split(".")[1].endswith("_backward") else op.inputs[0].shape
    shape = op.attr("normalized_shape", ()) or ()
    lead = _leading(x, len(shape) if isinstance(shape, tuple) else 1)

    def labels(t: tuple[int, ...]) -> Labels:
        """The input's leading labels where a tensor of the same rank matches its size (the statistics keep the
        leading dimensions, size 1 elsewhere)."""
        if len(t) != len(x):
            return _none(t)
        return tuple(lab if s == xs else None for lab, s, xs in zip(lead, t, x, strict=True))

    inputs = tuple(labels(t.shape) if a in ("input", "grad_out", "mean", "rstd") else _none(t.shape)
                   for a, t in zip(op.args, op.inputs, strict=True))
    return Rule(inputs=inputs, outputs=tuple(labels(t.shape) for t in op.outputs))


def batch_norm(op: TracedOp, state: frozenset[int]) -> Rule:
    """Batch n and channels c split; statistics per device (module docstring of ops.py): R, not Partial."""
    backward = op.target.split(".")[1].endswith("_backward")
    x = op.inputs[1].shape if backward else op.inputs[0].shape
    full = ("n", "c", *(None,) * (len(x) - 2))
    table = {"input": full, "grad_out": full, "weight": ("c",), "bias": ("c",), "running_mean": ("c",),
             "running_var": ("c",), "save_mean": ("c",), "save_invstd": ("c",), "save_var": ("c",)}
    outputs = tuple(full if t.shape == x else ("c",) if len(t.shape) == 1 else _none(t.shape) for t in op.outputs)
    sums = tuple(None if backward else NO_SUMS for _ in outputs)
    return Rule(inputs=_by_name(op, table), outputs=outputs, sums=sums)


def group_norm(op: TracedOp, state: frozenset[int]) -> Rule:
    backward = op.target.split(".")[1].endswith("_backward")
    x = op.inputs[1].shape if backward else op.inputs[0].shape
    full = ("n", *(None,) * (len(x) - 1))
    table = {"input": full, "grad_out": full, "mean": ("n", None), "rstd": ("n", None)}
    outputs = tuple(full if t.shape == x else ("n", None) if len(t.shape) == 2 else _none(t.shape)
                    for t in op.outputs)
    return Rule(inputs=_by_name(op, table), outputs=outputs)


def softmax(op: TracedOp, state: frozenset[int]) -> Rule:
    """Softmax over ``dim``: that dimension whole. The log-softmax of a loss may split it (vocabulary-parallel
    cross-entropy, Megatron-LM's and DTensor's ``loss_parallel``), all-reducing two float32 row statistics (max and
    sum of exponentials) forward and one (the sum of the gradient) backward."""
    name = op.target.split(".")[1]
    x = op.inputs[0].shape
    dim = int(op.attr("dim", -1))
    dim = dim + len(x) if dim < 0 else dim
    parallel = name.startswith("_log_softmax") and dim == len(x) - 1
    labels = tuple(("v" if parallel else None) if j == dim else f"l{j}" for j in range(len(x)))
    rows = 1
    for j, s in enumerate(x):
        rows *= s if j != dim else 1
    extra = (("v", "all_reduce", rows * (4.0 if name.endswith("_backward_data") else 8.0)),) if parallel else ()
    return Rule(inputs=tuple(labels if t.shape == x else _none(t.shape) for t in op.inputs),
                outputs=tuple(labels if t.shape == x else _none(t.shape) for t in op.outputs), extra=extra)


def nll_loss(op: TracedOp, state: frozenset[int]) -> Rule:
    """Negative log-likelihood over rows n and classes v: the loss sums both (Partial), the count of targets only
    the rows; the gradient keeps both."""
    x = next(t.shape for a, t in zip(op.args, op.inputs, strict=True) if a == "self")
    full = ("n", "v") if len(x) == 2 else ("v",)
    table = {"self": full, "target": ("n",) if len(x) == 2 else (), "grad_output": ("n",)}
    if op.target.split(".")[1] == "nll_loss_backward":
        return Rule(inputs=_by_name(op, table), outputs=(full,))
    per_row = op.attr("reduction", 1) == 0 and len(x) == 2
    outputs = (("n",) if per_row else (), ())
    sums = (frozenset({"v"}) if per_row else frozenset(full), frozenset({"n"}) & frozenset(full))
    return Rule(inputs=_by_name(op, table), outputs=outputs[:len(op.outputs)], sums=sums[:len(op.outputs)])


def index(op: TracedOp, state: frozenset[int]) -> Rule:
    """``x[idx]`` along dimension 0 with one index vector: a gather, every row of x reachable (x whole along 0), or
    the local gather of a MoE dispatch (ops.py) where x, the index and the result split their rows alike."""
    x = op.inputs[0].shape
    if len(op.inputs) != 2 or len(op.inputs[1].shape) != 1:
        return Rule(inputs=tuple(_none(t.shape) for t in op.inputs), outputs=(_none(op.outputs[0].shape),))
    rest = tuple(f"l{j}" for j in range(1, len(x)))
    local = 0 not in state
    return Rule(inputs=(("t" if local else None, *rest), ("t",)), outputs=(("t", *rest),), linear=frozenset({0}))


def index_put(op: TracedOp, state: frozenset[int]) -> Rule:
    """``x[idx] = v`` / ``+= v`` along dimension 0: the local scatter of a MoE combine, or (into a parameter or
    buffer) rows summed from every device (Partial, x added once: additive)."""
    x = op.inputs[0].shape
    if len(op.inputs) != 3 or len(op.inputs[1].shape) != 1:
        return Rule(inputs=tuple(_none(t.shape) for t in op.inputs), outputs=(_none(op.outputs[0].shape),))
    rest = tuple(f"l{j}" for j in range(1, len(x)))
    if 0 not in state:  # a scatter of Partial rows into Partial zeros is the Partial scatter
        return Rule(inputs=(("t", *rest), ("t",), ("t", *rest)[:len(op.inputs[2].shape)]), outputs=(("t", *rest),),
                    linear=frozenset({2}), additive=frozenset({0}))
    return Rule(inputs=((None, *rest), ("t",), ("t", *rest)[:len(op.inputs[2].shape)]), outputs=((None, *rest),),
                additive=frozenset({0}))


def index_add(op: TracedOp, state: frozenset[int]) -> Rule:
    """``x.index_add(0, idx, src)``: the unpermute of a MoE combine, a scatter-add of the routed rows (local, as
    ``index_put``; Partial rows pass into Partial zeros)."""
    if int(op.attr("dim", 0) or 0) != 0 or len(op.inputs) != 3 or len(op.inputs[1].shape) != 1:
        return Rule(inputs=tuple(_none(t.shape) for t in op.inputs), outputs=(_none(op.outputs[0].shape),))
    return index_put(op, state)


def index_select(op: TracedOp, state: frozenset[int]) -> Rule:
    """``x.index_select(0, idx)``: the gather of a MoE permute (as ``index``)."""
    if int(op.attr("dim", 0) or 0) != 0:
        return Rule(inputs=tuple(_none(t.shape) for t in op.inputs), outputs=(_none(op.outputs[0].shape),))
    return index(op, state)


def along(op: TracedOp, state: frozenset[int]) -> Rule:
    """Ops along one dimension (sort, topk, cumsum, gather, scatter): that dimension whole, the others split; a
    sort of a 1-D routed token list sorts each device's tokens (local, ops.py)."""
    x = op.inputs[0].shape
    dim = int(op.attr("dim", -1) or 0)
    dim = dim + len(x) if dim < 0 else dim
    name = op.target.split(".")[1]
    local = name in ("sort", "argsort") and len(x) == 1
    labels = tuple(("t" if local else None) if j == dim else f"l{j}" for j in range(len(x)))
    fit = [labels if len(t.shape) == len(x) else _none(t.shape) for t in op.inputs]
    return Rule(inputs=tuple(fit), outputs=tuple(labels if len(t.shape) == len(x) else _none(t.shape)
                                                  for t in op.outputs))


def histogram(op: TracedOp, state: frozenset[int]) -> Rule:
    """Tokens per expert of a MoE dispatch: each device counts its own tokens (local; R, not Partial)."""
    return Rule(inputs=(("t",) if len(op.inputs[0].shape) == 1 else _none(op.inputs[0].shape),)
                + tuple(_none(t.shape) for t in op.inputs[1:]), outputs=(_none(op.outputs[0].shape),), sums=(NO_SUMS,))


def last_two_whole(op: TracedOp, state: frozenset[int]) -> Rule:
    """triu / tril: the last two dimensions whole, the leading ones split."""
    x = op.inputs[0].shape
    labels = tuple(f"l{j}" if j < len(x) - 2 else None for j in range(len(x)))
    return Rule(inputs=(labels,), outputs=(labels,), linear=frozenset({0}))


def slice_backward(op: TracedOp, state: frozenset[int]) -> Rule:
    """The gradient of a slice: zeros with the gradient placed in the slice; that dimension whole."""
    x = op.inputs[0].shape
    dim = int(op.attr("dim", 0) or 0)
    out = op.outputs[0].shape
    dim = dim + len(out) if dim < 0 else dim
    if len(x) == len(out):
        labels = tuple(None if j == dim else f"l{j}" for j in range(len(x)))
        return Rule(inputs=(labels,), outputs=(labels,), linear=frozenset({0}))
    kept = tuple(f"l{j}" for j in range(len(out)) if j != dim)
    return Rule(inputs=(kept,), outputs=(tuple(None if j == dim else f"l{j}" for j in range(len(out))),),
                linear=frozenset({0}))


def channels(op: TracedOp, state: frozenset[int]) -> Rule:
    """Pooling and resampling over the spatial dimensions of (N, C, …) tensors: batch and channels split, the
    spatial dimensions whole (a split would need halos)."""
    def labels(shape: tuple[int, ...]) -> tuple[str | None, ...]:
        return (("n", "c") + (None,) * (len(shape) - 2))[:len(shape)] if len(shape) >= 3 else _none(shape)

    return Rule(inputs=tuple(labels(t.shape) for t in op.inputs), outputs=tuple(labels(t.shape) for t in op.outputs),
                sums=tuple(NO_SUMS for _ in op.outputs))


def pointwise_loss(op: TracedOp, state: frozenset[int]) -> Rule:
    """mse / l1 / smooth-l1 / binary cross-entropy losses and their backward: element-wise, the loss a sum over
    every element (Partial where split) unless reduction is none."""
    x = next(t.shape for a, t in zip(op.args, op.inputs, strict=True) if a == "self")
    labels = tuple(f"l{j}" for j in range(len(x)))
    inputs = tuple(labels if t.shape == x else _none(t.shape) for t in op.inputs)
    return Rule(inputs=inputs, outputs=tuple(labels if t.shape == x else () for t in op.outputs))


def unsafe_index(op: TracedOp, state: frozenset[int]) -> Rule:
    """``x[..., idx_h, idx_w]`` with index tensors on the trailing dimensions (nearest upsampling decomposed): the
    leading dimensions split, the indexed ones whole."""
    x, out = op.inputs[0].shape, op.outputs[0].shape
    lead = len(x) - (len(op.inputs) - 1)
    labels = tuple(f"l{j}" if j < lead else None for j in range(len(out)))
    return Rule(inputs=(labels[:lead] + (None,) * (len(x) - lead),) + tuple(_none(t.shape) for t in op.inputs[1:]),
                outputs=(labels,))


RULES: dict[str, Callable[[TracedOp, frozenset[int]], Rule]] = {
    "embedding": embedding, "embedding_dense_backward": embedding_backward,
    "convolution": convolution, "convolution_backward": convolution_backward,
    "native_layer_norm": layer_norm, "native_layer_norm_backward": layer_norm,
    "_fused_rms_norm": layer_norm, "_fused_rms_norm_backward": layer_norm,
    "native_batch_norm": batch_norm, "_native_batch_norm_legit": batch_norm,
    "_native_batch_norm_legit_functional": batch_norm, "native_batch_norm_backward": batch_norm,
    "native_group_norm": group_norm, "native_group_norm_backward": group_norm,
    "_softmax": softmax, "_log_softmax": softmax, "_softmax_backward_data": softmax,
    "_log_softmax_backward_data": softmax, "nll_loss_forward": nll_loss, "nll_loss_backward": nll_loss,
    "index": index, "index_put": index_put, "index_put_": index_put, "sort": along, "argsort": along,
    "topk": along, "cumsum": along, "gather": along, "scatter": along, "scatter_add": along,
    "index_add": index_add, "index_select": index_select, "histc": histogram, "bincount": histogram,
    "_unsafe_index": unsafe_index,
    **{name: pointwise_loss for name in ("mse_loss", "mse_loss_backward", "l1_loss", "smooth_l1_loss",
                                         "smooth_l1_loss_backward", "binary_cross_entropy",
                                         "binary_cross_entropy_backward", "huber_loss", "huber_loss_backward")},
    **{name: channels for name in (
        "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "max_pool3d_with_indices",
        "max_pool3d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward", "avg_pool3d", "avg_pool3d_backward",
        "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d",
        "_adaptive_avg_pool3d_backward", "adaptive_max_pool2d", "adaptive_max_pool2d_backward",
        "upsample_nearest2d", "upsample_nearest2d_backward", "upsample_bilinear2d", "upsample_bilinear2d_backward",
        "_upsample_nearest_exact2d", "_upsample_nearest_exact2d_backward", "reflection_pad2d",
        "reflection_pad2d_backward", "constant_pad_nd")},
}
FOLLOWERS: dict[str, Callable[[TracedOp, frozenset[int]], Rule]] = {
    "triu": last_two_whole, "tril": last_two_whole, "slice_backward": slice_backward,
    "select_backward": slice_backward,
}
