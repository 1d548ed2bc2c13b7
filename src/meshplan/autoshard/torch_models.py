"""meshplan's presets as small PyTorch modules: a decoder-only transformer of a ModelSpec's shape, for the planner to
trace without importing transformers (a second or more of imports; the benchmark's budget is five seconds).

The layers are Megatron-LM's (megatron/core/transformer: ``linear_qkv`` one GEMM for Q, K and V, ``linear_fc1`` one
for the gate and up projections, split after it), which is the layout meshplan's analytic estimate prices, with the
Hugging Face classes' arithmetic (LlamaForCausalLM: RMSNorm in float32, rotary positions, grouped-query SDPA
attention, SwiGLU; GPT2LMHeadModel: LayerNorm, learned positions, tanh-GELU, biases, tied head), the names of
Hugging Face's fused-projection Llama (Phi-3: ``self_attn.qkv_proj``, ``mlp.gate_up_proj``), the same parameter
counts (ModelSpec.params(), tests/test_autoshard_models.py), and the loss as transformers computes it (logits upcast
to float32, cross-entropy over the shifted labels). Mixture-of-experts presets go through transformers (models.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from meshplan.autoshard.models import supported
from meshplan.errors import SpecError
from meshplan.specs.model import ModelSpec


class RMSNorm(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: Any) -> Any:  # as LlamaRMSNorm: in float32, then back
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        return self.weight * h.to(x.dtype)

class Attention(nn.Module):
    def __init__(self, s: ModelSpec) -> None:
        super().__init__()
        self.heads, self.kv, self.d = s.num_heads, s.num_kv_heads, s.head_dim
        self.qkv_proj = nn.Linear(s.hidden_size, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim, bias=s.qkv_bias)
        self.o_proj = nn.Linear(s.num_heads * s.head_dim, s.hidden_size, bias=s.linear_bias)

    def forward(self, x: Any, rope: Any) -> Any:
        b, t, _ = x.shape
        q, k, v = self.qkv_proj(x).split([self.heads * self.d, self.kv * self.d, self.kv * self.d], dim=-1)
        q = q.view(b, t, self.heads, self.d).transpose(1, 2)
        k = k.view(b, t, self.kv, self.d).transpose(1, 2)
        v = v.view(b, t, self.kv, self.d).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.heads)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.heads * self.d))

def _rotate(x: Any) -> Any:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

class MLP(nn.Module):
    def __init__(self, s: ModelSpec) -> None:
        super().__init__()
        self.gated = s.mlp == "swiglu"
        width = 2 * s.ffn_hidden_size if self.gated else s.ffn_hidden_size
        self.gate_up_proj = nn.Linear(s.hidden_size, width, bias=s.linear_bias)
        self.down_proj = nn.Linear(s.ffn_hidden_size, s.hidden_size, bias=s.linear_bias)

    def forward(self, x: Any) -> Any:
        if self.gated:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.gelu(self.gate_up_proj(x), approximate="tanh"))

class Experts(nn.Module):
    """E experts' SwiGLU MLPs as 3-D weights (transformers' MixtralExperts layout: gate_up_proj (E, 2F, H),
    down_proj (E, H, F))."""

    def __init__(self, s: ModelSpec) -> None:
        super().__init__()
        e, f, h = s.num_experts, s.moe_ffn_hidden_size, s.hidden_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * f, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, f))


class MoE(nn.Module):
    """Megatron-Core's MoE layer as one device runs it (megatron/core/transformer/moe: a router, top-k, the tokens
    permuted by expert, one grouped GEMM per projection, unpermuted by a weighted scatter-add), with Mixtral's names
    (``mlp.gate``, ``mlp.experts``)."""

    def __init__(self, s: ModelSpec) -> None:
        super().__init__()
        self.k, self.e = s.moe_topk, s.num_experts
        self.gate = nn.Linear(s.hidden_size, s.num_experts, bias=False)
        self.experts = Experts(s)

    def forward(self, x: Any) -> Any:
        b, t, h = x.shape
        tokens = x.reshape(b * t, h)
        probs = F.softmax(self.gate(tokens).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        order = chosen.reshape(-1).argsort()
        offs = torch.histc(chosen.reshape(-1).float(), bins=self.e, min=0, max=self.e - 1).cumsum(0).to(torch.int32)
        rows = order // self.k
        y = F.grouped_mm(tokens[rows], self.experts.gate_up_proj.transpose(-2, -1), offs=offs)
        gate, up = y.chunk(2, dim=-1)
        y = F.grouped_mm(F.silu(gate) * up, self.experts.down_proj.transpose(-2, -1), offs=offs)
        y = y * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(tokens).index_add(0, rows, y).reshape(b, t, h)


class Layer(nn.Module):
    def __init__(self, s: ModelSpec) -> None:
        super().__init__()
        norm = (lambda: RMSNorm(s.hidden_size)) if s.norm == "rmsnorm" else (lambda: nn.LayerNorm(s.hidden_size))
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.self_attn, self.mlp = Attention(s), (MoE(s) if s.num_experts else MLP(s))

    def forward(self, x: Any, rope: Any) -> Any:
        x = x + self.self_attn(self.input_layernorm(x), rope)
        return x + self.mlp(self.post_attention_layernorm(x))

class Decoder(nn.Module):
    inv_freq: torch.Tensor  # a buffer (with rope)

    def __init__(self, s: ModelSpec, layers: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        if s.position_embedding == "learned":
            self.embed_positions = nn.Embedding(s.max_position_embeddings or s.seq_length, s.hidden_size)
        self.layers = nn.ModuleList(Layer(s) for _ in range(layers))
        self.norm = RMSNorm(s.hidden_size) if s.norm == "rmsnorm" else nn.LayerNorm(s.hidden_size)
        self.rope = s.position_embedding == "rope"
        if self.rope:
            inv = 1.0 / (500000.0 ** (torch.arange(0, s.head_dim, 2, dtype=torch.float32) / s.head_dim))
            self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, ids: Any) -> Any:
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        x = self.embed_tokens(ids)
        rope = None
        if self.rope:
            freqs = torch.outer(pos.to(torch.float32), self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            rope = (emb.cos().to(x.dtype), emb.sin().to(x.dtype))
        else:
            x = x + self.embed_positions(pos)
        for layer in self.layers:
            x = layer(x, rope)
        return self.norm(x)

class CausalLM(nn.Module):
    def __init__(self, s: ModelSpec, layers: int) -> None:
        super().__init__()
        self.model = Decoder(s, layers)
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)
        if s.tied_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids: Any) -> Any:
        logits = self.lm_head(self.model(ids)).float()
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def build_preset(spec: ModelSpec, layers: int) -> Any:
    """The preset's model with ``layers`` layers, on fake tensors (no memory), in training mode."""
    if not supported(spec):
        raise SpecError(f"model={spec.name}: no built-in module for its layers; meshplan builds it with transformers")
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = CausalLM(spec, layers)
    model.train()
    return model
