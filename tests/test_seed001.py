"""Seed 001: a 2D tensor-parallel linear layer on an H100 under the notebook's own assumptions."""

from __future__ import annotations

import pytest

from meshplan.cost.linear_2d import linear_2d
from meshplan.roofline import optimistic_time
from meshplan.specs.hardware import Accelerator


def test_seed_001_worked_example():
    # The seed's device: H100 SXM5, 1979 TFLOP/s at 8 bits (so 989.5 at 16 bits), 3352 GB/s HBM,
    # 900 GB/s network, base_util 0.8; layer d_in=16384, d_out=5·16384, tp_in=8, tp_out=40, dp=32,
    # b = 2048²/128 = 32768 tokens, 2-byte elements.
    h100 = Accelerator(name="H100 SXM5 (seed 001)", peak_flops={"fp8": 1979e12, "bf16": 1979e12 / 2},
                       hbm_bytes=80e9, hbm_bandwidth=3352e9, nvlink_bandwidth=900e9)
    ops = linear_2d(16384, 5 * 16384, 2048**2 / 128, tp_in=8, tp_out=40, dp=32)
    seconds = optimistic_time(ops, h100, network_bandwidth=900e9, utilization=0.8, algorithm="multicast")
    assert seconds == pytest.approx(3.2554072481051035e-05, rel=1e-6)
    # It is FLOP-bound: 3 passes · 2 · (2048·2048 weights) · 1024 rows = 2.577e10 FLOP at 0.8·989.5e12
    assert seconds == pytest.approx(3 * 2 * 2048 * 2048 * 1024 / (0.8 * 989.5e12), rel=1e-12)
