"""Decode's tensor-parallel all-reduce as the one dispatcher prices it (collectives/price.py: the engines' own kernel
where it is measured, NCCL's or RCCL's protocols otherwise; allreduce.py, protocols.py): more tensor parallelism
never removes its cost, and its arithmetic on H100 at batch 1, where the per-call latency is all it costs.

A decode step all-reduces B·h·2 bytes twice a layer (serve/ops.py attn/tp, mlp/tp): 8 KB for Llama 2 7B at batch 1,
a few hundred KB at batch 32 of a 70B, whatever the tp. At those sizes an all-reduce is latency-bound (NCCL's LL
protocol, or the engine's one-shot kernel), so the time per call grows with the ranks it spans (2(g − 1) ring steps,
the one-shot kernel's 2(g − 1)/g of the bytes): a plan at a larger tp pays at least the smaller plan's all-reduce.
Larger messages on a switchless tier are another matter (each GPU drives more links in a larger group,
mesh.group_bandwidth), so the monotone property is checked at decode's sizes only.
"""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.collectives.comm import Collective
from meshplan.collectives.price import NCCL, SERVING, collective_seconds
from meshplan.collectives.protocols import tier0_busbw
from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.specs.hardware import load_system, system_names

# decode's all-reduce sizes: batch 1 of a 2048-wide model (4 KB) to batch 32 of an 8192-wide one (512 KB), 16-bit
DECODE_BYTES = np.geomspace(4096.0, 512 * 1024.0, 15)
BATCH_1_BYTES = 16 * 1024.0  # batch 1 up to an 8192-wide model: the steps' latency is all the call costs
RTOL = 1e-12


def decode_all_reduce(name: str, tp: int, nbytes, library):
    """Seconds of one decode all-reduce over ``tp`` GPUs of the system preset ``name``, inside its NVLink domain."""
    cluster = load_system(name).cluster(8)
    return collective_seconds(Collective("all_reduce", nbytes, "tp", tp), 1, cluster, SERVE_DEFAULT, library)


def domain_sizes(name: str) -> list[int]:
    """tp 1, 2, 4 and 8 where the preset's NVLink domain holds them."""
    domain = load_system(name).cluster(8).tiers[0].size
    return [tp for tp in (1, 2, 4, 8) if tp <= domain]


@pytest.mark.parametrize("library", (SERVING, NCCL), ids=("engine-kernels", "nccl"))
def test_more_tensor_parallelism_never_removes_the_decode_all_reduce(library):
    """tp 1 costs nothing; from tp 2 on every decode-sized all-reduce costs more than nothing, and no larger tp
    prices it below a smaller one, on every hardware preset, by the engines' kernels and by NCCL alone. On a
    switchless tier (DGX-1's hybrid cube-mesh, MI300X's xGMI) a larger group drives more links per GPU, so that a
    92 KB all-reduce on 4 V100s takes 12.6 µs where 2 take 16.9: there only batch 1's sizes,
    where the latency of the ring's steps is all a call costs, are held to it."""
    for name in system_names():
        sizes = domain_sizes(name)
        switched = not load_system(name).cluster(8).tiers[0].peers
        nbytes = DECODE_BYTES if switched else DECODE_BYTES[DECODE_BYTES <= BATCH_1_BYTES]
        times = [np.asarray(decode_all_reduce(name, tp, nbytes, library), dtype=float) for tp in sizes]
        assert np.all(times[0] == 0.0), name
        for tp, time in zip(sizes[1:], times[1:], strict=True):
            assert np.all(time > 0.0), (name, tp)
        for tp, smaller, larger in zip(sizes[2:], times[1:-1], times[2:], strict=True):
            assert np.all(larger >= smaller * (1 - RTOL)), (name, tp, DECODE_BYTES[np.argmin(larger - smaller)])


def test_llama_2_7b_at_batch_1_on_h100_pays_the_one_shot_kernel_or_ll_whichever_is_slower():
    """Llama 2 7B (h = 4096) at batch 1 all-reduces 4096 × 2 = 8192 bytes. On H100 at tp 4 (hardware/h100.toml: the
    engines' kernel 5.1 µs + 2(g − 1)/g · n / 61 GB/s, SGLang PR #2904; NVLink 450 GB/s at the serving efficiency):
        kernel = 5.1 µs + 1.5 × 8192 / 61e9          = 5.1 + 0.20 = 5.30 µs
        LL     = 3.6 + 6 × 0.47 µs + 1.5 × 8192 / (0.25 busbw) (NCCL tuning.cc v2.12.12-1: baseLat, hwLat per step)
    and the engines pay the slower, LL here (6.4 µs + its bandwidth term); NCCL alone pays LL too. 64 of them a
    token step (2 a layer, 32 layers) is 0.43 ms, against the +0.9 ms per step the Argonne H100 runs leave out at
    tp 4 over tp 1 (benchmarks/measure/serving_residuals.py): 14 µs more per call would be needed, and the 70B at
    tp 4, with 160 calls, leaves out the same 0.9 ms, so that miss is not this all-reduce's."""
    n, g = 8192.0, 4
    cluster = load_system("h100").cluster(8)
    busbw = float(tier0_busbw(cluster, g, SERVE_DEFAULT))
    kernel = 5.1e-6 + 1.5 * n / 61e9
    ll = 3.6e-6 + 6 * 0.47e-6 + 1.5 * n / (0.25 * busbw)
    assert kernel == pytest.approx(5.30e-6, abs=0.01e-6)
    assert decode_all_reduce("h100", g, n, SERVING) == pytest.approx(max(kernel, ll))
    assert decode_all_reduce("h100", g, n, NCCL) == pytest.approx(ll)
    assert 64 * max(kernel, ll) == pytest.approx(0.43e-3, abs=0.02e-3)
