"""Kernels an eager transformer layer launches, counted with PyTorch itself (issue 46): the aten ops that reach the
dispatcher in the forward and the backward pass of a reference layer, less the ones that launch nothing (views,
allocations), each booked to the record of cost/ that stands for it (``attn/qkv``, ``attn/core``, ``mlp/fc1`` ...).

Three reference layers, written the way eager PyTorch runs them:
- ``gpt``: Megatron-Core 0.16.1's GPT layer with the local (non-Transformer-Engine) spec and its fusions off, the
  module code benchmarks/measure/small_work_megatron.py measured on an H200 (Megatron-DeepSpeed's model code is its
  parent): LayerNorm; the column-parallel QKV linear (LinearWithGradAccumulationAndAsyncCommunication: torch.matmul,
  then ``output + bias``); the [s, b, np, 3·hn] view split into q, k, v (torch.split); DotProductAttention's baddbmm of
  the scores with the 1/√d scale (beta 0 into a buffer); FusedScaleMaskSoftmax's torch path with
  attention_softmax_in_fp32 (its default): the scores cast to fp32, attention_mask_func's in-place masked_fill_,
  softmax, cast back to bf16; attention dropout; bmm with V; the context's permute made contiguous; the row-parallel
  dense linear, its bias left to the bias-dropout-add (x + bias, dropout, residual + x); LayerNorm; fc1, its bias
  added before the GeLU (bias_activation_fusion off); fc2; bias-dropout-add. ``gpt-no-dropout``: dropout 0, which
  launches nothing (ATen Dropout.cpp ``_dropout_impl`` returns the input for p = 0). Megatron-LM before Megatron-Core
  defaulted to query-key layer scaling, one mul more each way in the softmax (``input * self.scale``), not counted.
  With tp > 1 Megatron's mapping regions (tensor_parallel/mappings.py) add collective calls: copy_to_tensor_model_
  parallel_region before each column-parallel linear (an all-reduce backward), reduce_from_... after each row one.
- ``sdpa``: benchmarks/measure/small_work_gpu.py's plain-PyTorch GPT layer (measured on the H200 too): LayerNorm,
  nn.Linear QKV with bias (addmm) viewed [b, s, 3, heads, hn], permuted and unbound into q, k, v, causal SDPA, the
  context transposed back, nn.Linear projection, residual add, LayerNorm, fc1, tanh GeLU, fc2, residual add; no dropout.
- ``llama``: a torchtitan / Hugging Face Llama layer (torchtitan models/llama/model.py): RMSNorm as torchtitan's
  eager RMSNorm, separate wq / wk / wv linears without bias, rotary embedding by complex multiply (apply_rotary_emb),
  repeat_kv for grouped queries, F.scaled_dot_product_attention (on this CPU its flash-for-CPU op, one call each
  way, standing for the GPU's flash kernels), wo, residual add, RMSNorm, SwiGLU (w1, silu, w3, mul, w2), residual.

Kernels, not aten ops: a few aten ops launch more than one CUDA kernel, added to the CPU's one (``CUDA_EXTRA``: the
kernels torch.profiler saw under each op on an H200, data/measured/gpu/2026-11-26-nvidia-h200-kernel-names.json).
Memsets and device-to-device memcpys are no kernels, as small_work_gpu.py's count leaves them out.

The backward pass is that of a micro-batch after the first one of a step: every parameter already holds a gradient,
so autograd's AccumulateGrad adds into it (one add per parameter and micro-batch; Megatron's fp32 main_grad hooks
add the same one kernel per parameter). The autograd node each op runs under (``torch._C._current_autograd_node``)
names its record: the nodes a section of the forward created, found by walking the graph back from the section's
outputs. Run ``python benchmarks/measure/eager_kernels.py`` to print the table; cost/eager.py's ``EAGER_KERNELS`` holds
it, and tests/test_eager_kernels.py recounts it on a tiny layer.
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

from meshplan.trace.launches import CUDA_EXTRA

# aten ops that launch no kernel on the GPU: allocations (their memory comes from the caching allocator) and results
# that alias their input (views: a non-writing alias annotation on the schema's return; _unsafe_view and
# _reshape_alias are views whose schema does not say so)
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach",
               "_unsafe_view", "_reshape_alias"}

# aten ops that launch more than one CUDA kernel: src/meshplan/trace/launches.py's CUDA_EXTRA (one table for this
# count and the traced ops' price)


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
            for extra in CUDA_EXTRA.get(name, ()):
                self.counts[(record, extra or phase, name)] += 1
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
    runs bernoulli_, div_ and mul instead); p = 0 returns the input, no kernel (``_dropout_impl``)."""
    return torch.ops.aten.native_dropout(x, p, True)[0] if p > 0 else x


class Region(torch.autograd.Function):
    """Megatron's mapping regions, identity both ways here (their all-reduces are collective records of cost/blocks.py):
    copy_to_tensor_model_parallel_region (the input gradient's all-reduce backward: tp_in) and
    reduce_from_tensor_model_parallel_region (the all-reduce forward: tp_out)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


CopyToTP = ReduceFromTP = Region


class GPTLayer(nn.Module):
    """Megatron-Core's GPT layer, local spec, unfused (module docstring), on [s, b, h] activations of one TP rank."""

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
            mixed = torch.matmul(y, self.qkv.weight.t()) + self.qkv.bias  # LinearWithGradAccumulation...
            sec.claim("attn/qkv", mixed)
        with sec.section("attn/core"):
            mixed = mixed.view(s, b, self.heads, 3 * self.hn)
            q, k, v = torch.split(mixed, self.hn, dim=-1)
            q, k, v = (t.reshape(s, b * self.heads, self.hn) for t in (q, k, v))
            buf = torch.empty(b * self.heads, s, s, dtype=x.dtype)
            scores = torch.baddbmm(buf, q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2), beta=0.0,
                                   alpha=1.0 / math.sqrt(self.hn))
            scores = scores.view(b, self.heads, s, s).float().masked_fill_(mask, -10000.0)  # softmax in fp32
            probs = dropout(F.softmax(scores, dim=-1).bfloat16(), self.p)
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


class PlainGPTLayer(nn.Module):
    """benchmarks/measure/small_work_gpu.py's plain-PyTorch GPT layer (module docstring), on [b, s, h] activations."""

    def __init__(self, h: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.hn = heads, h // heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, ffn), nn.Linear(ffn, h)

    def attend(self, qkv: torch.Tensor) -> torch.Tensor:
        b, s, _ = qkv.shape
        q, k, v = qkv.view(b, s, 3, self.heads, self.hn).permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)

    def forward(self, x: torch.Tensor, _: Any, sec: Sections) -> torch.Tensor:
        steps = (("attn/norm", self.ln1), ("attn/qkv", self.qkv), ("attn/core", self.attend), ("attn/out", self.proj),
                 ("attn/residual", None), ("mlp/norm", self.ln2), ("mlp/fc1", self.fc1),
                 ("mlp/act", lambda t: F.gelu(t, approximate="tanh")), ("mlp/fc2", self.fc2), ("mlp/residual", None))
        y = x
        for name, f in steps:
            with sec.section(name):
                if f is None:  # the residual: the block's input plus its output
                    x = y = x + y
                else:
                    y = f(y)
                sec.claim(name, y)
        return y


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
STYLES = ("gpt", "gpt-no-dropout", "sdpa", "llama")


def count_layer(style: str, h: int = 64, heads: int = 4, ffn: int = 256, seq: int = 12, batch: int = 3,
                tp: int = 1) -> dict[str, dict[str, Counter[str]]]:
    """Kernels per record, pass and aten op of one ``style`` (``STYLES``) layer in bf16: {record: {phase: Counter}},
    the backward that of a micro-batch whose parameters already hold gradients (module docstring). The sizes must
    give no activation gradient a parameter's shape (seq · batch rows differ from every width)."""
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    extra: Any = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)
    if style in ("gpt", "gpt-no-dropout"):
        layer: nn.Module = GPTLayer(h, heads, ffn, tp, dropout=0.1 if style == "gpt" else 0.0).to(bf16)
        x = torch.randn(seq, batch, h, dtype=bf16, requires_grad=True)
    elif style == "sdpa":
        layer = PlainGPTLayer(h, heads, ffn).to(bf16)
        x = torch.randn(batch, seq, h, dtype=bf16, requires_grad=True)
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
    for style in STYLES:
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
