"""Op classes: what a per-kind table groups by, finer than the trace's gemm / attention / memory / view, because
on a CPU the memory-bound ops differ by an order of magnitude per byte (a random-number draw or an ``exp`` costs
far more than a copy). Read from the aten target and the op's tags (trace/calls.py); no torch.
"""

from __future__ import annotations

from meshplan.trace.graph import TracedOp

CLASSES = ("gemm", "conv", "attention", "norm", "softmax", "pointwise", "reduction", "random", "index", "copy",
           "view", "other")

_BY_NAME = {
    "gemm": ("_grouped_mm", "grouped_mm", "_grouped_mm_backward"),
    "conv": ("convolution", "convolution_backward", "_convolution", "mkldnn_convolution", "_slow_conv2d_forward",
             "_slow_conv2d_backward", "cudnn_convolution"),
    "norm": ("native_layer_norm", "native_layer_norm_backward", "native_batch_norm", "native_batch_norm_backward",
             "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "native_group_norm",
             "native_group_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward",
             "_batch_norm_with_update", "batch_norm_backward"),
    "softmax": ("_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "_safe_softmax"),
    "random": ("bernoulli", "bernoulli_", "native_dropout", "rand", "rand_like", "randn", "randn_like", "uniform_",
               "normal_", "randint", "randperm", "random_"),
    "index": ("embedding", "embedding_dense_backward", "index", "index_put", "index_put_", "index_select",
              "index_add", "index_add_", "gather", "scatter", "scatter_add", "scatter_add_", "nll_loss_forward",
              "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward", "one_hot", "topk", "sort", "nonzero",
              "masked_select", "_index_put_impl_", "index_copy", "scatter_reduce", "max_pool2d_with_indices",
              "max_pool2d_with_indices_backward", "embedding_backward"),
    "copy": ("clone", "copy_", "_to_copy", "cat", "stack", "constant_pad_nd", "contiguous", "_unsafe_view",
             "zeros", "zeros_like", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
             "new_zeros", "full", "full_like", "ones", "ones_like", "fill_", "zero_", "lift_fresh", "lift_fresh_copy",
             "scalar_tensor", "arange", "repeat", "expand_copy", "_unsafe_index", "slice_scatter", "select_scatter",
             "new_ones", "tril", "triu", "flip", "roll"),
}
_CLASS_OF = {name: cls for cls, names in _BY_NAME.items() for name in names}


def aten_name(target: str) -> str:
    """``"aten.addmm.default"`` → ``"addmm"``."""
    parts = target.split(".")
    return parts[1] if len(parts) >= 3 else parts[-1]


def op_class(op: TracedOp) -> str:
    """One of CLASSES for ``op``."""
    if op.kind == "view":
        return "view"
    if op.kind == "attention":
        return "attention"
    name = aten_name(op.target)
    if name in _CLASS_OF:
        return _CLASS_OF[name]
    if op.kind == "gemm":
        return "gemm"
    if "pointwise" in op.tags:
        return "pointwise"
    if "reduction" in op.tags or name in ("sum", "mean", "amax", "amin", "max", "min", "var_mean", "norm"):
        return "reduction"
    return "other"
