"""Small models whose planned programs tests/test_autoshard_run.py executes: a Llama-like transformer (separate
q, k, v projections, heads by ``view(..., -1, head_dim)`` as torchtitan writes them, so that a column split keeps
whole heads) and a CNN. ``make_*_plan`` builds the shapes the planner sees (fake tensors, nothing allocated),
``make_*`` the small ones the test runs: the same modules by the same names."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class GatedMLP(nn.Module):
    """SwiGLU with gate and up in one linear, chunked after it (Phi-3's ``mlp.gate_up_proj``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.gate_up_proj, self.down_proj = nn.Linear(dim, 8 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, gated: bool = False):
        super().__init__()
        self.attn_norm, self.attn, self.mlp_norm, self.mlp = nn.LayerNorm(dim), Attention(dim, heads), \
            nn.LayerNorm(dim), (GatedMLP(dim) if gated else MLP(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class LM(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, gated: bool = False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, gated) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h)).float().logsumexp(-1).mean()


class CNN(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.c = nn.Sequential(nn.Conv2d(3, width, 3), nn.BatchNorm2d(width), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                               nn.Flatten(), nn.Linear(width, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(x).float().logsumexp(-1).mean()


def make_lm_plan() -> LM:
    return LM(vocab=32000, dim=4096, heads=32, layers=2)


def make_lm() -> LM:
    return LM(vocab=64, dim=32, heads=4, layers=2)


def make_gated_plan() -> LM:
    return LM(vocab=32000, dim=4096, heads=32, layers=2, gated=True)


def make_gated() -> LM:
    return LM(vocab=64, dim=32, heads=4, layers=2, gated=True)


def make_cnn_plan() -> CNN:
    return CNN(width=64)


def make_cnn() -> CNN:
    return CNN(width=8)


def _fused(hidden: int, heads: int, kv: int, ffn: int, vocab: int) -> torch.nn.Module:
    """meshplan's own preset layers (autoshard/torch_models.py): ``self_attn.qkv_proj`` split into q, k, v and
    ``mlp.gate_up_proj`` chunked into gate and up, as Phi-3 names them."""
    from meshplan.autoshard.torch_models import CausalLM
    from meshplan.specs.model import ModelSpec

    spec = ModelSpec(name="fused", num_layers=2, hidden_size=hidden, num_heads=heads, num_kv_heads=kv,
                     ffn_hidden_size=ffn, vocab_size=vocab, mlp="swiglu", norm="rmsnorm", seq_length=4096)
    return CausalLM(spec, 2)


def make_fused_plan() -> torch.nn.Module:
    return _fused(4096, 32, 8, 14336, 32000)


def make_fused() -> torch.nn.Module:
    return _fused(32, 4, 2, 48, 64)
