"""The layer-cell split of benchmarks/measure/small_work_cell_parts.py on made-up ops: GPU seconds by part, the pass's
host, the exposed all-reduces, Σ max(H, G) per pass plus those, where a trace lies between the bounds, and the four
all-reduces vTrain's graph adds to a layer."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "measure"))

import small_work_cell_parts as cp  # noqa: E402
from meshplan.cost.blocks import collective  # noqa: E402
from meshplan.cost.records import OpCost  # noqa: E402
from meshplan.specs.host_cost import HostCost  # noqa: E402

US = 1e-6


def test_split_of_a_made_up_layer():
    """10 µs a launch. Forward: the QKV GEMM (1 kernel, 30 µs), the attention core (2 kernels, 8 µs), a norm (1, 2 µs)
    and a 2-rank all-reduce (its call a launch, 50 µs); backward: the QKV GEMM's input gradient (1, 60 µs). GPU: GEMM
    90, attention 8, other 2 µs; host 10 + 20 + 10 + 10 = 50 forward, 10 backward; all-reduces 50. Flow: max(50, 40)
    + 50 + max(10, 60) = 160 µs."""
    ops = [OpCost("attn/qkv", "fwd", "gemm", flops=1e9, kernels=1.0),
           OpCost("attn/core", "fwd", "attention", flops=1e8, kernels=2.0),
           OpCost("attn/norm", "fwd", "memory", nbytes=1e6, kernels=1.0),
           collective("attn/tp_out", "fwd", "all_reduce", 1e6, "tp", 2),
           OpCost("attn/qkv", "bwd_x", "gemm", flops=1e9, kernels=1.0)]
    times = [30 * US, 8 * US, 2 * US, 50 * US, 60 * US]
    s = cp.split(ops, times, HostCost(per_kernel=10 * US))
    assert s == pytest.approx({"gemm": 90 * US, "attention": 8 * US, "other": 2 * US, "host": 60 * US,
                               "all_reduce": 50 * US, "flow": 160 * US})
    # a trace of 130 µs (all-reduces apart) lies (130 - 110) / (160 - 110) = 0.4 of the way from Σ max (110) to H + G
    assert cp.additive_share(130 * US, s) == pytest.approx(0.4)


def test_the_graph_adds_four_all_reduces_at_tp_above_one():
    """Micro-batch 2, hidden 1024: 2 x 1024 x 1024 x 2 bytes = 4 MiB, the table's 4-MiB row over 4 GPUs (60 µs):
    240 µs a layer; none at tp 1."""
    lut = {4: {4: (60e-6, 140.0)}}
    assert cp.graph_all_reduce((4, 2, 1024), lut) == pytest.approx(240e-6)
    assert cp.graph_all_reduce((1, 2, 1024), lut) == 0.0


def test_kind_of_a_record():
    assert [cp.kind(n) for n in ("mlp/fc1", "attn/core", "mlp/act")] == ["gemm", "attention", "other"]
