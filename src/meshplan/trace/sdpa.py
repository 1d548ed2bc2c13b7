"""Attention as the target GPU runs it: ``F.scaled_dot_product_attention`` with dropout is one fused kernel on a GPU
(FlashAttention applies the dropout mask inside the kernel from a Philox seed: Dao et al. 2022, §3.1 and Algorithm 2;
PyTorch's SDPA dispatches it to ``_scaled_dot_product_flash_attention`` / ``_efficient_attention`` with
``dropout_p``), but the CPU the trace runs on has no fused kernel with dropout and falls back to the math path,
which materialises the S × S scores, the softmax and the dropout mask: GPT-2-medium traced 267 ms / 51 GiB for an
H100 with dropout against 74.7 ms / 14.8 GiB without (issue 48).

So a fake trace calls SDPA without dropout, which the CPU runs as its fused kernel, and counts the calls it changed
(``Trace.fused_dropout``, said in the trace's summary). The dropout's own work inside the fused kernel (a random
number per score) is not priced. A real trace (``real=True``) runs what it is given.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_SDPA = torch.nn.functional.scaled_dot_product_attention
_DROPOUT = 4  # scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


class FusedAttention(TorchFunctionMode):
    """Runs every SDPA call with ``dropout_p = 0`` and counts those that had dropout (``calls``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is _SDPA:
            if len(args) > _DROPOUT:
                if args[_DROPOUT]:
                    self.calls += 1
                args = (*args[:_DROPOUT], 0.0, *args[_DROPOUT + 1:])
            elif kwargs.get("dropout_p"):
                self.calls += 1
                kwargs["dropout_p"] = 0.0
        return func(*args, **kwargs)
