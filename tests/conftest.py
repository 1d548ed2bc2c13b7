"""Shared small specs: a GPT-3-style model (Korthikanti et al. 2022 layout) and clusters built from presets."""

from __future__ import annotations

import pytest

from meshplan.specs.hardware import load_system
from meshplan.specs.model import ModelSpec


def gpt(layers: int = 4, hidden: int = 1024, heads: int = 16, seq: int = 2048, vocab: int = 51200,
        **extra: object) -> ModelSpec:
    """Megatron GPT: MHA, GeLU MLP 4h, LayerNorm, dropout, learned positions, tied embeddings."""
    return ModelSpec(name="gpt-test", num_layers=layers, hidden_size=hidden, num_heads=heads,
                     ffn_hidden_size=4 * hidden, vocab_size=vocab, seq_length=seq, dropout=True,
                     position_embedding="learned", tied_embeddings=True, qkv_bias=True, linear_bias=True,
                     **extra)


@pytest.fixture
def small_gpt() -> ModelSpec:
    return gpt()


@pytest.fixture
def h100_64():
    return load_system("h100").cluster(64)
