"""A small classifier for tests/test_check_step.py: ``make`` returns (module, inputs), ``make_module`` the module
alone (its inputs then come from --input-shape)."""

import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 10))

    def forward(self, x, labels):
        return nn.functional.cross_entropy(self.net(x), labels)


def make():
    torch.manual_seed(0)
    return Classifier(), (torch.randn(16, 64), torch.randint(0, 10, (16,)))


def make_module():
    return Classifier()
