"""MLP-Mixer (Tolstikhin et al., "MLP-Mixer: An all-MLP Architecture for Vision", NeurIPS 2021): patches
embedded by a strided convolution, then blocks of a token-mixing MLP (across the patches, per channel) and a
channel-mixing MLP (per patch), each after a LayerNorm with a skip connection (§2, Eq. 1):

    U = X + W₂ σ(W₁ LayerNorm(X)ᵀ)ᵀ            token mixing, hidden width D_S
    Y = U + W₄ σ(W₃ LayerNorm(U))               channel mixing, hidden width D_C

σ is GELU; a final LayerNorm, global average pooling over the patches and a linear classifier head. Written
here because neither PyTorch nor Hugging Face transformers ships one.
"""

from __future__ import annotations

import torch
from torch import nn


class MlpBlock(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class MixerBlock(nn.Module):
    def __init__(self, patches: int, channels: int, token_hidden: int, channel_hidden: int) -> None:
        super().__init__()
        self.norm1, self.token_mlp = nn.LayerNorm(channels), MlpBlock(patches, token_hidden)
        self.norm2, self.channel_mlp = nn.LayerNorm(channels), MlpBlock(channels, channel_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: batch × patches × channels
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MlpMixer(nn.Module):
    """Mixer with ``depth`` blocks on ``image``² RGB images cut into ``patch``² patches; returns the mean
    cross-entropy loss against ``labels`` (the model's training objective)."""

    def __init__(self, *, image: int = 64, patch: int = 8, channels: int = 256, depth: int = 4,
                 token_hidden: int = 128, channel_hidden: int = 1024, classes: int = 100) -> None:
        super().__init__()
        patches = (image // patch) ** 2
        self.stem = nn.Conv2d(3, channels, kernel_size=patch, stride=patch)
        self.blocks = nn.Sequential(*(MixerBlock(patches, channels, token_hidden, channel_hidden)
                                      for _ in range(depth)))
        self.norm, self.head = nn.LayerNorm(channels), nn.Linear(channels, classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.stem(images).flatten(2).transpose(1, 2)  # batch × patches × channels
        x = self.norm(self.blocks(x)).mean(dim=1)
        return nn.functional.cross_entropy(self.head(x), labels)
