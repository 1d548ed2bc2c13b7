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


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attn_norm, self.attn, self.mlp_norm, self.mlp = nn.LayerNorm(dim), Attention(dim, heads), \
            nn.LayerNorm(dim), MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class LM(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
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


def make_cnn_plan() -> CNN:
    return CNN(width=64)


def make_cnn() -> CNN:
    return CNN(width=8)
