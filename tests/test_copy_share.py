"""A GPU whose measured copy bandwidth is a smaller share of its datasheet HBM figure streams its kernels that much
slower (``Accelerator.hbm_copy_share``, roofline.stream_bandwidth): an MI300X's BabelStream copy reaches 4,256 of
5,300 GB/s (0.803), an H200's copy 4,599 of 4,800 (0.958, ``COPY_REFERENCE``: the NVIDIA parts whose kernels
``Efficiency.memory`` = 0.85 describes)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost.records import OpCost
from meshplan.errors import SpecError
from meshplan.roofline import COPY_REFERENCE, memory_time, stream_bandwidth
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system

GEMV = OpCost("mlp/fc1", "fwd", "memory", nbytes=58.7e6)  # one Llama-3-70B gate-up shard at tp 8 in fp8


def test_an_mi300x_streams_at_its_measured_copy_share() -> None:
    mi300x = load_system("mi300x").accelerator
    assert round(COPY_REFERENCE, 3) == 0.958
    rate = 5.3e12 * 0.85 * 0.803 / (4599 / 4800)  # datasheet x Efficiency.memory x the share over the H200's
    assert rate / 1e12 == pytest.approx(3.776, abs=1e-3)
    assert stream_bandwidth(mi300x, DEFAULT) == pytest.approx(rate)
    assert memory_time(GEMV, mi300x, DEFAULT) == pytest.approx(58.7e6 / rate)  # 15.5 us


def test_a_gpu_that_states_none_streams_as_before() -> None:
    h100 = load_system("h100").accelerator
    assert h100.hbm_copy_share == 0.0
    assert stream_bandwidth(h100, DEFAULT) == pytest.approx(3.35e12 * 0.85)
    faster = replace(h100, hbm_copy_share=0.99)  # a copy above the reference's share is not taken faster
    assert stream_bandwidth(faster, DEFAULT) == stream_bandwidth(h100, DEFAULT)


def test_more_bandwidth_or_a_better_copy_never_slows_a_kernel() -> None:
    mi300x = load_system("mi300x").accelerator
    times = [memory_time(GEMV, replace(mi300x, hbm_copy_share=s), DEFAULT) for s in (0.5, 0.7, 0.803, 0.95, 1.0)]
    assert times == sorted(times, reverse=True)
    doubled = replace(mi300x, hbm_bandwidth=2 * mi300x.hbm_bandwidth)  # the hbm_bandwidth what-if keeps the share
    assert memory_time(GEMV, doubled, DEFAULT) == pytest.approx(memory_time(GEMV, mi300x, DEFAULT) / 2)


def test_a_share_above_one_is_refused() -> None:
    with pytest.raises(SpecError, match=r"hbm_copy_share=1\.2"):
        replace(load_system("mi300x").accelerator, hbm_copy_share=1.2)
