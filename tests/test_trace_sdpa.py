"""Attention with dropout is traced as the target GPU runs it (trace/sdpa.py, issue 48): one fused kernel, not the
CPU's math fallback that materialises the S × S scores and the dropout mask."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from meshplan.trace import trace_module  # noqa: E402


class Attention(torch.nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.qkv, self.dropout = torch.nn.Linear(64, 192), dropout

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 4, 16).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout, is_causal=True)


def _targets(trace) -> list[str]:
    return [op.target for op in trace.ops]


def test_sdpa_with_dropout_is_one_fused_kernel_as_without():
    inputs = [((2, 128, 64), "float32")]
    with_dropout, without = trace_module(Attention(0.1), inputs), trace_module(Attention(0.0), inputs)
    assert with_dropout.fused_dropout == 1 and without.fused_dropout == 0
    assert _targets(with_dropout) == _targets(without)  # the same kernels, op for op
    assert not any("bernoulli" in t or "softmax" in t for t in _targets(with_dropout))
    attention = [op for op in with_dropout.ops if op.kind == "attention"]
    assert len(attention) == 2 and attention[0].causal  # the fused forward and its backward
    # the S × S scores are never materialised: no tensor holds 2·4·128·128 elements
    assert all(math.prod(t.shape) < 2 * 4 * 128 * 128 for op in with_dropout.ops for t in op.outputs)


def test_a_real_trace_runs_the_dropout_it_is_given():
    x = torch.randn(2, 128, 64)
    trace = trace_module(Attention(0.1), [x], real=True)
    assert trace.fused_dropout == 0 and any("bernoulli" in t for t in _targets(trace))


def test_inputs_follow_the_model_when_no_dtype_is_given():
    """Issue 48: a float-input CNN failed on an int64 default. Token ids for a model with an embedding, the parameters'
    dtype for any other, and a floating input follows --param-dtype."""
    from meshplan.trace.command import input_dtypes

    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten())
    lm = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    assert input_dtypes(cnn, [(2, 3, 8, 8)], (), None) == [((2, 3, 8, 8), "float32")]
    assert input_dtypes(lm, [(2, 5)], (), None) == [((2, 5), "int64")]
    assert input_dtypes(cnn, [(2, 3, 8, 8)], ("float32",), "bfloat16") == [((2, 3, 8, 8), "bfloat16")]
    assert input_dtypes(lm, [(2, 5), (2, 5)], ("int64", "float16"), None) == [((2, 5), "int64"), ((2, 5), "float16")]
