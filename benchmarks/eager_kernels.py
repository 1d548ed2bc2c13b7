"""Kernels an eager transformer layer launches, counted with PyTorch itself (issue 46): the aten ops that reach the
dispatcher in the forward and the backward pass of a reference layer, less the ones that launch nothing (views,
allocations), each booked to the record of cost/ that stands for it (``attn/qkv``, ``attn/core``, ``mlp/fc1`` ...).

Two reference layers, written the way eager PyTorch runs them:
- ``gpt``: a Megatron-LM / Megatron-DeepSpeed GPT layer in plain PyTorch (megatron/model/transformer.py,
  ParallelAttention / CoreAttention / ParallelMLP, their unfused paths: no apex layer norm, no fused softmax, no jit
  fusions): LayerNorm; the column-parallel QKV linear with its bias; the [s, b, np, 3·hn] view split into q, k, v;
  baddbmm of the scores with the 1/√d scale (beta 0 into an empty buffer); the causal mask (masked_fill) and softmax;
  attention dropout; bmm with V; the context's permute made contiguous; the row-parallel dense linear with its bias
  added after the reduction; bias-dropout-add into the residual; LayerNorm; fc1 with bias + GeLU; fc2; bias-dropout-
  add. With tp > 1 Megatron's mapping regions: copy_to_tensor_model_parallel_region (identity forward, all-reduce of
  the input gradient) before each column-parallel linear, reduce_from_tensor_model_parallel_region (all-reduce
  forward, identity backward) after each row-parallel one (megatron/mpu/mappings.py), counted as collective calls.
- ``llama``: a torchtitan / Hugging Face Llama layer (torchtitan models/llama/model.py): RMSNorm as torchtitan's
  eager RMSNorm, separate wq / wk / wv linears without bias, rotary embedding by complex multiply (apply_rotary_emb),
  repeat_kv for grouped queries, F.scaled_dot_product_attention (one flash kernel each way on the GPU; on this CPU
  its flash-for-CPU op, also one call each way), wo, residual add, RMSNorm, SwiGLU (w1, silu, w3, mul, w2), residual.

The backward pass is that of a micro-batch after the first one of a step: every parameter already holds a gradient,
so autograd's AccumulateGrad adds into it (one add per parameter and micro-batch; Megatron's fp32 main_grad hooks
add the same one kernel per parameter). The autograd node each op runs under (``torch._C._current_autograd_node``)
names its record: the nodes a section of the forward created, found by walking the graph back from the section's
outputs. Run ``python benchmarks/eager_kernels.py`` to print the table; cost/eager.py's ``EAGER_KERNELS`` holds it,
and tests/test_eager_kernels.py recounts it on a tiny layer.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that launch no kernel on the GPU: allocations (their memory comes from the caching allocator) and
# results that alias their input
# (views: the schema's return carries a non-writing alias annotation; _unsafe_view and _reshape_alias are views whose
# schema does not say so)
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach",
               "_unsafe_view", "_reshape_alias"}


def launches_kernel(func: Any) -> bool:
    """Whether an aten op launches a GPU kernel: not an allocation, not a view of its input."""
    if func.__name__.split(".")[0] in ALLOCATIONS:
        return False
    returns = func._schema.returns
    return not (returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns))


def squeezed(t: torch.Tensor) -> tuple[int, ...]:
    """A tensor's shape without its unit dimensions (a bias gradient summed with keepdim is [1, 1, h])."""
    return tuple(n for n in t.shape if n != 1)


class Counting(TorchDispatchMode):
    """Counts the kernels of each aten op by the record its autograd node (backward) or section (forward) names, and
    in the backward by what it computes: ``bwd_w`` a parameter's gradient (a result of a parameter's shape: the weight
    GEMM, the bias sum), ``accumulate`` AccumulateGrad's add of it into the former micro-batches' gradient,
    ``bwd_x`` the rest."""

    def __init__(self, owner: Callable[[], str], phase: str, weights: set[tuple[int, ...]]) -> None:
        super().__init__()
        self.owner, self.phase, self.weights = owner, phase, weights
        self.counts: Counter[tuple[str, str, str]] = Counter()  # (record, phase, aten op) -> kernels

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if launches_kernel(func):
            phase = self.phase
            name, record = func.__name__.split(".")[0], self.owner()
            if phase == "bwd":
                phase = "bwd_w" if isinstance(out, torch.Tensor) and squeezed(out) in self.weights else "bwd_x"
                if name == "add_" and phase == "bwd_w":
                    phase = "accumulate"  # AccumulateGrad's add into the gradient of a former micro-batch
                elif name == "add" and record.endswith("/norm") and out.dtype == torch.bfloat16:
                    # the residual fork's two gradients summed where they meet (autograd's input buffer, run under
                    # the norm's node): the skip connection's backward, booked to the block's residual record (in the
                    # activations' bf16; an eager RMSNorm's own sum of its two paths to x is in fp32)
                    record = record.replace("/norm", "/residual")
            self.counts[(record, phase, name)] += 1
        return out


class Sections:
    """The record each forward section and each autograd node belongs to."""

    def __init__(self) -> None:
        self.current = "other"
        self.nodes: dict[Any, str] = {}

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        before, self.current = self.current, name
        try:
            yield
        finally:
            self.current = before

    def claim(self, name: str, *outputs: torch.Tensor) -> None:
        """Book the autograd nodes that produced ``outputs`` and are not yet booked to the record ``name``."""
        stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
        while stack:
            node = stack.pop()
            if node is None or node in self.nodes:
                continue
            self.nodes[node] = name
            stack.extend(n for n, _ in node.next_functions)

    def owner(self) -> str:
        node = torch._C._current_autograd_node()
        if node is None:
            return self.current
        return self.nodes.get(node, "other")


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """F.dropout as it runs on a GPU: one fused native_dropout kernel (mask and output) forward, native_dropout_backward
    backward (ATen/native/Dropout.cpp: ``is_fused_kernel_acceptable`` holds for CUDA inputs only; on a CPU F.dropout
    runs bernoulli_, div_ and mul instead)."""
    return torch.ops.aten.native_dropout(x, p, True)[0]


class CopyToTP(torch.autograd.Function):
    """copy_to_tensor_model_parallel_region: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g  # the all-reduce of the input gradient: a collective record of cost/blocks.py (tp_in)


class ReduceFromTP(torch.autograd.Function):
    """reduce_from_tensor_model_parallel_region: all-reduce forward (a collective record: tp_out), identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


class GPTLayer(nn.Module):
    """Megatron-DeepSpeed's GPT layer, unfused (module docstring), on [s, b, h] activations of one TP rank."""

    def __init__(self, h: int, heads: int, ffn: int, tp: int = 1, dropout: float = 0.1) -> None:
        super().__init__()
        self.heads, self.hn, self.p = heads // tp, h // heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h // tp)
        self.dense = nn.Linear(h // tp, h)
        self.fc1 = nn.Linear(h, ffn // tp)
        self.fc2 = nn.Linear(ffn // tp, h)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, sec: Sections) -> torch.Tensor:
        s, b, _ = x.shape
        with sec.section("attn/norm"):
            y = CopyToTP.apply(self.ln1(x))
            sec.claim("attn/norm", y)
        with sec.section("attn/qkv"):
            mixed = F.linear(y, self.qkv.weight, self.qkv.bias)
            sec.claim("attn/qkv", mixed)
        with sec.section("attn/core"):
            mixed = mixed.view(s, b, self.heads, 3 * self.hn)
            q, k, v = torch.split(mixed, self.hn, dim=-1)
            q, k, v = (t.reshape(s, b * self.heads, self.hn) for t in (q, k, v))
            buf = torch.empty(b * self.heads, s, s, dtype=x.dtype)
            scores = torch.baddbmm(buf, q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2), beta=0.0,
                                   alpha=1.0 / math.sqrt(self.hn))
            scores = scores.view(b, self.heads, s, s).masked_fill(mask, -10000.0)
            probs = dropout(F.softmax(scores, dim=-1), self.p)
            ctx = torch.bmm(probs.view(b * self.heads, s, s), v.transpose(0, 1))
            ctx = ctx.view(b, self.heads, s, self.hn).permute(2, 0, 1, 3).contiguous().view(s, b, -1)
            sec.claim("attn/core", ctx)
        with sec.section("attn/out"):
            out = ReduceFromTP.apply(F.linear(ctx, self.dense.weight))
            sec.claim("attn/out", out)
        with sec.section("attn/residual"):  # bias-dropout-add
            x = x + dropout(out + self.dense.bias, self.p)
            sec.claim("attn/residual", x)
        with sec.section("mlp/norm"):
            y = CopyToTP.apply(self.ln2(x))
            sec.claim("mlp/norm", y)
        with sec.section("mlp/fc1"):
            z = F.linear(y, self.fc1.weight)
            sec.claim("mlp/fc1", z)
        with sec.section("mlp/act"):  # bias-gelu
            z = F.gelu(z + self.fc1.bias, approximate="tanh")
            sec.claim("mlp/act", z)
        with sec.section("mlp/fc2"):
            out = ReduceFromTP.apply(F.linear(z, self.fc2.weight))
            sec.claim("mlp/fc2", out)
        with sec.section("mlp/residual"):
            x = x + dropout(out + self.fc2.bias, self.p)
            sec.claim("mlp/residual", x)
        return x


class RMSNorm(nn.Module):
    """torchtitan's eager RMSNorm (models/norms.py): x·rsqrt(mean(x²) + eps) in fp32, cast back, times the weight."""

    def __init__(self, h: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(h)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """torchtitan's apply_rotary_emb for one of q, k: a complex multiply on fp32 views."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(3).type_as(x)


class LlamaLayer(nn.Module):
    """torchtitan's Llama layer (module docstring), on [b, s, h] activations of one TP rank."""

    def __init__(self, h: int, heads: int, kv_heads: int, ffn: int, tp: int = 1) -> None:
        super().__init__()
        self.heads, self.kv, self.hn = heads // tp, kv_heads // tp, h // heads
        self.n1, self.n2 = RMSNorm(h), RMSNorm(h)
        self.wq = nn.Linear(h, h // tp, bias=False)
        self.wk = nn.Linear(h, kv_heads * self.hn // tp, bias=False)
        self.wv = nn.Linear(h, kv_heads * self.hn // tp, bias=False)
        self.wo = nn.Linear(h // tp, h, bias=False)
        self.w1 = nn.Linear(h, ffn // tp, bias=False)
        self.w3 = nn.Linear(h, ffn // tp, bias=False)
        self.w2 = nn.Linear(ffn // tp, h, bias=False)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor, sec: Sections) -> torch.Tensor:
        b, s, _ = x.shape
        with sec.section("attn/norm"):
            y = CopyToTP.apply(self.n1(x))
            sec.claim("attn/norm", y)
        with sec.section("attn/qkv"):
            q = self.wq(y).view(b, s, self.heads, self.hn)
            k, v = (w(y).view(b, s, self.kv, self.hn) for w in (self.wk, self.wv))
            sec.claim("attn/qkv", q, k, v)
        with sec.section("attn/rope"):
            q, k = rope(q, freqs), rope(k, freqs)
            sec.claim("attn/rope", q, k)
        with sec.section("attn/repeat_kv"):
            n = self.heads // self.kv
            k, v = (t[:, :, :, None, :].expand(b, s, self.kv, n, self.hn).reshape(b, s, self.heads, self.hn)
                    for t in (k, v))
            sec.claim("attn/repeat_kv", k, v)
        with sec.section("attn/core"):
            o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
            o = o.transpose(1, 2).contiguous().view(b, s, -1)
            sec.claim("attn/core", o)
        with sec.section("attn/out"):
            out = ReduceFromTP.apply(self.wo(o))
            sec.claim("attn/out", out)
        with sec.section("attn/residual"):
            x = x + out
            sec.claim("attn/residual", x)
        with sec.section("mlp/norm"):
            y = CopyToTP.apply(self.n2(x))
            sec.claim("mlp/norm", y)
        with sec.section("mlp/fc1"):
            gate, up = self.w1(y), self.w3(y)
            sec.claim("mlp/fc1", gate, up)
        with sec.section("mlp/act"):
            z = F.silu(gate) * up
            sec.claim("mlp/act", z)
        with sec.section("mlp/fc2"):
            out = ReduceFromTP.apply(self.w2(z))
            sec.claim("mlp/fc2", out)
        with sec.section("mlp/residual"):
            x = x + out
            sec.claim("mlp/residual", x)
        return x


PHASES = ("fwd", "bwd_x", "bwd_w", "accumulate")


def count_layer(style: str, h: int = 64, heads: int = 4, ffn: int = 256, seq: int = 12, batch: int = 3,
                tp: int = 1) -> dict[str, dict[str, Counter[str]]]:
    """Kernels per record, pass and aten op of one ``style`` ("gpt" / "llama") layer in bf16: {record: {phase:
    Counter}}, the backward that of a micro-batch whose parameters already hold gradients (module docstring). The
    sizes must give no activation gradient a parameter's shape (seq · batch rows differ from every width)."""
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    if style == "gpt":
        layer: nn.Module = GPTLayer(h, heads, ffn, tp).to(bf16)
        x = torch.randn(seq, batch, h, dtype=bf16, requires_grad=True)
        extra: Any = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)
    else:
        layer = LlamaLayer(h, heads, heads // 2, ffn, tp).to(bf16)
        x = torch.randn(batch, seq, h, dtype=bf16, requires_grad=True)
        angles = torch.outer(torch.arange(seq).float(), torch.ones(h // heads // 2))
        extra = torch.polar(torch.ones_like(angles), angles)[None, :, None, :]
    weights = {squeezed(p) for p in layer.parameters()}
    for p in layer.parameters():
        p.grad = torch.zeros_like(p)  # a later micro-batch: AccumulateGrad adds
    grad = torch.ones(*x.shape, dtype=bf16)
    sec = Sections()
    table: dict[str, dict[str, Counter[str]]] = {}
    for phase in ("fwd", "bwd"):
        mode = Counting(sec.owner, phase, weights)
        with mode:
            if phase == "fwd":
                out = layer(x, extra, sec)
            else:
                out.backward(grad)
        for (record, ph, op), n in mode.counts.items():
            table.setdefault(record, {p: Counter() for p in PHASES})[ph][op] += n
    return dict(sorted(table.items()))


def kernel_table(style: str, **sizes: int) -> dict[str, tuple[int, int, int, int]]:
    """{record: (forward, input-gradient, weight-gradient, accumulation kernels)} of ``count_layer``."""
    return {r: (sum(n["fwd"].values()), sum(n["bwd_x"].values()), sum(n["bwd_w"].values()),
                sum(n["accumulate"].values())) for r, n in count_layer(style, **sizes).items()}


def main() -> None:
    for style in ("gpt", "llama"):
        table = count_layer(style)
        print(f"{style}: record, forward / input-gradient / weight-gradient / accumulation kernels, by aten op")
        for record, n in table.items():
            ops = " | ".join(" ".join(f"{op}{'x' + str(k) if k > 1 else ''}" for op, k in sorted(n[ph].items()))
                             for ph in PHASES)
            counts = " ".join(f"{sum(n[ph].values()):3d}" for ph in PHASES)
            print(f"  {record:16s} {counts}   {ops}")
        print(f"  {'total':16s} " + " ".join(f"{sum(sum(n[ph].values()) for n in table.values()):3d}" for ph in PHASES))
        print(f"  EAGER_KERNELS[{style!r}] = {kernel_table(style)}")


if __name__ == "__main__":
    main()
