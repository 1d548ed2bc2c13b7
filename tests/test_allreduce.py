"""The tensor-parallel all-reduce inside the NVLink domain (meshplan/allreduce.py) is monotone in every rate: more link
bandwidth, a faster measured kernel or less latency never make it slower, on every hardware preset, 2 to 8 ranks,
1 kB to 1 GB (the sizes around the largest measured one included, where the old excess term broke it)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshplan.collectives.allreduce import custom_kernel, nvlink_all_reduce
from meshplan.collectives.protocols import nccl_time, protocol_times
from meshplan.specs.hardware import load_system, system_names

SIZES = np.geomspace(1e3, 1e9, 241)
RTOL = 1e-12


def accelerators():
    return [(name, load_system(name).accelerator, load_system(name).cluster(8).tiers[0].bandwidth * 0.8)
            for name in sorted(system_names())]


@pytest.mark.parametrize("factor", (1.1, 2.0, 10.0))
def test_more_link_bandwidth_never_slows_the_all_reduce(factor):
    for name, acc, busbw in accelerators():
        for g in (2, 4, 8):
            base = nvlink_all_reduce(SIZES, g, busbw, acc)
            faster = nvlink_all_reduce(SIZES, g, busbw * factor, acc)
            assert np.all(faster <= base * (1 + RTOL)), (name, g, SIZES[np.argmax(faster - base)])


@pytest.mark.parametrize("factor", (1.1, 2.0, 10.0))
def test_a_faster_measured_kernel_never_slows_and_a_slower_one_never_speeds(factor):
    for name, acc, busbw in accelerators():
        if not acc.allreduce_bandwidth:
            continue
        base = nvlink_all_reduce(SIZES, 4, busbw, acc)
        wider = replace(acc, allreduce_bandwidth=acc.allreduce_bandwidth * factor)
        later = replace(acc, allreduce_latency=acc.allreduce_latency * factor)
        assert np.all(nvlink_all_reduce(SIZES, 4, busbw, wider) <= base * (1 + RTOL)), name
        assert np.all(nvlink_all_reduce(SIZES, 4, busbw, later) >= base * (1 - RTOL)), name


def test_the_measured_kernel_sets_a_floor_up_to_its_largest_size_and_its_excess_past_it():
    """H200 (h200.toml): the kernel 5.1 µs + 2(g − 1)/g · n / 61 GB/s measured up to 1 MiB. Up to 1 MiB the all-reduce
    is the slower of that and NCCL's fastest protocol; past it each protocol carries what the kernel added to it at
    1 MiB, and the fastest such sum is taken."""
    acc = load_system("h200").accelerator
    busbw, mib = 450e9 * 0.8, 2**20
    measured = (acc.allreduce_latency, acc.allreduce_bandwidth, acc.allreduce_measured)
    assert measured == pytest.approx((5.1e-6, 61e9, mib))
    half = mib / 2  # 5.1 µs + 1.5 · 524,288 / 61e9 = 5.1 + 12.9 = 18.0 µs
    assert nvlink_all_reduce(half, 4, busbw, acc) == pytest.approx(
        max(custom_kernel(half, 4, 5.1e-6, 61e9), nccl_time("all_reduce", half, 4, busbw)))
    assert nvlink_all_reduce(half, 4, busbw, acc) == pytest.approx(18.0e-6, abs=0.05e-6)
    kernel = custom_kernel(mib, 4, 5.1e-6, 61e9)
    sums = [t + max(kernel - t_at, 0.0) for t, t_at in zip(protocol_times("all_reduce", 4 * mib, 4, busbw),
                                                             protocol_times("all_reduce", mib, 4, busbw), strict=True)]
    assert nvlink_all_reduce(4 * mib, 4, busbw, acc) == pytest.approx(min(sums))


def test_the_old_excess_grew_with_the_bandwidth_and_this_one_does_not():
    """The excess of the protocol fastest at the largest measured size, added to the protocol fastest at n (the
    former rule), made a 1.3 MB all-reduce on 4 H200s slower on a 10 % faster NVLink; the rule of allreduce.py
    does not."""
    acc = load_system("h200").accelerator
    busbw, n, top = 360e9, 1.39e6, acc.allreduce_measured

    def former(bw: float) -> float:
        kernel = custom_kernel(top, 4, acc.allreduce_latency, acc.allreduce_bandwidth)
        return nccl_time("all_reduce", n, 4, bw) + max(kernel - nccl_time("all_reduce", top, 4, bw), 0.0)

    assert former(1.1 * busbw) > former(busbw)
    assert nvlink_all_reduce(n, 4, 1.1 * busbw, acc) <= nvlink_all_reduce(n, 4, busbw, acc)
