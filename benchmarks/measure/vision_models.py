"""Small non-transformer models for the sharding planner's tests and docs (tests/test_autoshard_models.py,
benchmarks/docs/autoshard.py): ViT, ResNet and ConvNeXt from transformers, an MLP-Mixer and a U-Net written here. Each
entry of MODELS is (a factory returning the module, on fake tensors, that returns its training loss; its inputs as
(shape, dtype) pairs)."""

from __future__ import annotations

import torch
import transformers
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    """MLP-Mixer (Tolstikhin et al. 2021) over 16 x 16 patches of a 128 x 128 image."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 256, kernel_size=16, stride=16)
        self.blocks = nn.ModuleList(MixerBlock(64, 256) for _ in range(4))
        self.head = nn.Linear(256, 100)

    def forward(self, x, y):
        x = self.stem(x).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return nn.functional.cross_entropy(self.head(x.mean(1)), y)


class UNet(nn.Module):
    """A two-level U-Net (Ronneberger et al. 2015): convolutions, pooling, upsampling and skip concatenations."""

    def __init__(self) -> None:
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU())
        self.down2 = nn.Sequential(nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU())
        self.up = nn.Sequential(nn.Conv2d(192, 64, 3, padding=1), nn.ReLU())
        self.out = nn.Conv2d(64, 1, 1)

    def forward(self, x, y):
        a = self.down1(x)
        b = self.down2(nn.functional.max_pool2d(a, 2))
        u = nn.functional.interpolate(b, scale_factor=2.0, mode="nearest")
        return nn.functional.mse_loss(self.out(self.up(torch.cat([u, a], dim=1))), y)


class Classifier(nn.Module):
    def __init__(self, hf) -> None:
        super().__init__()
        self.hf = hf

    def forward(self, x, y):
        return self.hf(pixel_values=x, labels=y).loss


def _hf(cls, config):
    """Built on the meta device (their initialisers read values), then given fake CPU storage."""
    with torch.device("meta"):
        model = Classifier(cls(config))
    with FakeTensorMode(allow_non_fake_inputs=True):
        return model.to_empty(device="cpu").train()


IMAGE, LABELS = ((32, 3, 224, 224), "bfloat16"), ((32,), "int64")
MODELS = {
    "vit": (lambda: _hf(transformers.ViTForImageClassification, transformers.ViTConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)), [IMAGE, LABELS]),
    "resnet": (lambda: _hf(transformers.ResNetForImageClassification, transformers.ResNetConfig(
        embedding_size=32, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic")),
        [IMAGE, LABELS]),
    "convnext": (lambda: _hf(transformers.ConvNextForImageClassification, transformers.ConvNextConfig(
        hidden_sizes=[48, 96, 192, 384], depths=[2, 2, 4, 2])), [IMAGE, LABELS]),
    "mlp-mixer": (Mixer, [((32, 3, 128, 128), "bfloat16"), LABELS]),
    "u-net": (UNet, [((8, 3, 128, 128), "bfloat16"), ((8, 1, 128, 128), "bfloat16")]),
}
