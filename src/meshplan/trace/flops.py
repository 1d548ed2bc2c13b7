"""FLOPs, kind and GEMM shape of one aten op, from its arguments and results (tensors or fake tensors).

Sources, in order of precedence:
1. ``torch.utils.flop_counter.flop_registry`` (PyTorch's FlopCounterMode formulas; flops_source
   ``"flop_counter"``): mm / addmm / bmm / baddbmm 2·m·k·n, convolutions, and the fused attention kernels
   (scaled_dot_product_{flash,efficient,cudnn}_attention and their backward passes). As there, the GEMM
   bias add is not counted and fused attention counts the full S×S square (``sdpa_flop_count``: "We aren't
   accounting for causal attention here"); cost.py halves causal attention when it times the kernel.
2. meshplan's own (flops_source ``"meshplan"``):
   - CPU fused attention (``_scaled_dot_product_flash_attention_for_cpu`` and its backward), which
     flop_counter has no entry for: the same ``sdpa_flop_count`` / ``sdpa_backward_flop_count`` formulas.
   - ops tagged ``torch.Tag.pointwise``: one FLOP per output element ("elementwise = numel").
   - ops tagged ``torch.Tag.reduction``: one FLOP per input element.
   - ``PER_ELEMENT``: fused normalisation / softmax / loss kernels, one FLOP per add, mul, exp or max per
     element of the op's largest tensor (counted below beside each op); backward kernels twice the forward
     where they recompute it (as blocks.elementwise: backward = 2 × forward).
3. Everything else (copies, casts, gathers, views, allocations): 0 FLOPs, ``"none"``; its bytes still count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten


def _heads_of(query, kv) -> tuple[int, ...]:
    """``kv``'s shape with the query's heads: grouped-query attention (``enable_gqa``) computes every query head
    against its group's key and value, so the FLOPs are those of as many key / value heads as query heads (older
    PyTorch's counter asserts equal heads; 2.13's expands them the same way)."""
    shape = tuple(kv.shape)
    return (*shape[:-3], query.shape[-3], *shape[-2:]) if len(shape) >= 3 else shape


def _cpu_sdpa(query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_flop_count(query.shape, _heads_of(query, key), _heads_of(query, value))


def _cpu_sdpa_backward(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out.shape, query.shape, _heads_of(query, key), _heads_of(query, value))


def _grouped_mm(mat_a, mat_b, *args, out_val=None, **kwargs) -> int:
    """``torch._grouped_mm`` (one GEMM per group of rows, the MoE experts of torchtitan and transformers'
    ``grouped_mm`` experts): each row of the routed dimension meets one group, so the FLOPs are those of one GEMM
    over all rows, 2·m·k·n, whatever the offsets (the group sizes) are. 2-D × 3-D: (m, k) × (g, k, n) → (m, n);
    2-D × 2-D (the weight gradient): (n, m) × (m, k) → (g, n, k), m the routed rows."""
    if mat_a.dim() == 2 and mat_b.dim() == 3:
        return 2 * mat_a.shape[0] * mat_a.shape[1] * mat_b.shape[2]
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        return 2 * mat_a.shape[0] * mat_a.shape[1] * mat_b.shape[1]
    if mat_a.dim() == 3 and mat_b.dim() == 2:  # (g, m, k) × (k, n): every group meets every column block
        return 2 * mat_a.shape[1] * mat_a.shape[2] * mat_b.shape[1]
    return 2 * mat_a.numel() * mat_b.shape[-1]


OWN_FORMULAS: dict[Any, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward,
    aten._grouped_mm: _grouped_mm,
}

PER_ELEMENT: dict[Any, float] = {
    aten.native_layer_norm: 7.0,  # mean, x - mean, square, mean, · rstd, · gamma, + beta
    aten.native_layer_norm_backward: 14.0,  # 2 × forward
    aten.native_batch_norm: 7.0,  # as layer norm, over the batch and spatial dimensions
    aten._native_batch_norm_legit: 7.0,
    aten.native_batch_norm_backward: 14.0,
    aten.native_group_norm: 7.0,
    aten.native_group_norm_backward: 14.0,
    aten._fused_rms_norm: 5.0,  # square, mean, · rstd, · gamma (+ the per-row rsqrt, not counted)
    aten._fused_rms_norm_backward: 10.0,
    aten._softmax: 5.0,  # max, x - max, exp, sum, / sum
    aten._log_softmax: 5.0,  # max, x - max, exp, sum, - log(sum)
    aten._softmax_backward_data: 4.0,  # y·dy, sum, dy - sum, · y
    aten._log_softmax_backward_data: 4.0,  # exp(y), sum(dy), · sum, dy - …
    aten.embedding_dense_backward: 1.0,  # scatter-add of the output gradient into the table
    aten.nll_loss_forward: 1.0,  # one add per target
}

NO_ARITHMETIC = {aten.clone, aten.copy, aten.copy_, aten._to_copy, aten.lift_fresh_copy, aten.fill_, aten.zero_,
                 aten.fill, aten.zeros_like, aten.ones_like, aten.full_like}

GEMM_PACKETS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten._scaled_mm}
CONVOLUTIONS = {aten.convolution, aten._convolution, aten.cudnn_convolution, aten.convolution_overrideable,
                aten._slow_conv2d_forward, aten.convolution_backward}
# attention kernels whose query / key are (batch, heads, seq, head_dim); _flash/_efficient_attention_forward
# take (batch, seq, heads, head_dim)
ATTENTION_BHSD = {aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_efficient_attention,
                  aten._scaled_dot_product_cudnn_attention, aten._scaled_dot_product_flash_attention_backward,
                  aten._scaled_dot_product_efficient_attention_backward,
                  aten._scaled_dot_product_cudnn_attention_backward,
                  aten._scaled_dot_product_flash_attention_for_cpu,
                  aten._scaled_dot_product_flash_attention_for_cpu_backward}
ATTENTION_BSHD = {aten._flash_attention_forward, aten._efficient_attention_forward, aten._flash_attention_backward,
                  aten._efficient_attention_backward}


def counted(func: Any) -> bool:
    """Whether flop_counter has a formula for this op (FlopCounterMode decomposes the others first)."""
    return func._overloadpacket in flop_registry


def named_args(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The op's arguments by their schema names."""
    names = [a.name for a in func._schema.arguments]
    return {**dict(zip(names, args, strict=False)), **kwargs}


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _numel(tensors: list[torch.Tensor]) -> int:
    return max((t.numel() for t in tensors), default=0)


def count(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[float, str]:
    """(FLOPs, source) of one op call."""
    packet = func._overloadpacket
    if packet in flop_registry:
        return float(flop_registry[packet](*args, **kwargs, out_val=out)), "flop_counter"
    if packet in OWN_FORMULAS:
        return float(OWN_FORMULAS[packet](*args, **kwargs, out_val=out)), "meshplan"
    if packet in NO_ARITHMETIC:
        return 0.0, "none"
    if packet in PER_ELEMENT:
        return PER_ELEMENT[packet] * _numel(_tensors((args, kwargs)) + _tensors(out)), "meshplan"
    if torch.Tag.pointwise in func.tags:
        return float(_numel(_tensors(out))), "meshplan"
    if torch.Tag.reduction in func.tags:
        return float(_numel(_tensors((args, kwargs)))), "meshplan"
    return 0.0, "none"


def shape(func: Any, args: tuple, kwargs: dict, out: Any, flops: float) -> dict[str, Any]:
    """Kind and the shape the efficiency model needs: ``{"kind": "gemm", "m", "n", "k", "groups"}`` for
    GEMMs (bmm: ``groups`` = batch), ``{"kind": "attention", "m": batch·heads·queries, "n": keys,
    "k": head dim, "causal"}`` for fused attention, else ``{"kind": "memory"}``."""
    packet = func._overloadpacket
    a = named_args(func, args, kwargs)
    if packet in GEMM_PACKETS:
        # mm / bmm / _scaled_mm (self, mat2), addmm (self, mat1, mat2), baddbmm (self, batch1, batch2)
        x = a.get("mat1", a.get("batch1", a.get("self")))
        w = a.get("batch2", a.get("mat2"))
        assert x is not None and w is not None  # a matrix product's two operands
        if x.dim() == 3:
            return {"kind": "gemm", "m": x.shape[1], "n": w.shape[2], "k": x.shape[2], "groups": x.shape[0]}
        return {"kind": "gemm", "m": x.shape[0], "n": w.shape[1], "k": x.shape[1], "groups": 1}
    if packet is aten._grouped_mm:  # one GEMM over all routed rows (see _grouped_mm)
        x, w = a["self"], a["mat2"]
        groups = a["offs"].shape[0] if a.get("offs") is not None else 1
        if x.dim() == 2 and w.dim() == 2:  # the routed rows are the contraction, split among the groups
            return {"kind": "gemm", "m": x.shape[0], "n": w.shape[1], "k": x.shape[1] / groups, "groups": groups}
        return {"kind": "gemm", "m": x.shape[-2] * (x.shape[0] if x.dim() == 3 else 1) / groups, "n": w.shape[-1],
                "k": x.shape[-1], "groups": groups}
    if packet in CONVOLUTIONS:  # implicit GEMM: n output channels, k = input channels × kernel window / groups
        w = a["weight"]
        n, k = w.shape[0], w[0].numel()
        return {"kind": "gemm", "m": flops / (2.0 * n * k) if n * k else 0.0, "n": n, "k": k, "groups": 1}
    if packet in ATTENTION_BHSD or packet in ATTENTION_BSHD:
        q, key = a["query"], a["key"]
        if packet in ATTENTION_BHSD:
            (b, h, s, d), keys = q.shape, key.shape[2]
        else:
            (b, s, h, d), keys = q.shape, key.shape[1]
        causal = bool(a.get("is_causal", False)) or a.get("custom_mask_type", 0) == 1
        return {"kind": "attention", "m": b * h * s, "n": keys, "k": d, "groups": 1, "causal": causal}
    return {"kind": "memory"}
