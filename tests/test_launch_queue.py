"""The launch queue as a two-machine flow line (step/host.py ``queue_step``, ``segment_time``; issue 79): the host
issues kernels asynchronously, the GPU runs them in issue order, so kernel j starts at max(its issue time, the end of
kernel j - 1) (CUDA C++ Programming Guide, "Asynchronous Concurrent Execution"; Johnson 1954's two-machine flow shop).
Where the host waits for each exposed collective (``HostCost.blocking_collectives``) every segment between them
starts from an empty queue and takes the flow line's makespan; a pass without such a sync keeps its lead."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.cost.blocks import collective
from meshplan.cost.records import OpCost
from meshplan.specs.host_cost import HostCost
from meshplan.specs.plan import Plan
from meshplan.step.host import host_idle, queue_step, segment_time

US = 1e-6
BLOCKING = HostCost(per_kernel=10 * US, blocking_collectives=True)


def kernel(name: str, phase: str = "fwd", n: float = 1.0) -> OpCost:
    return OpCost(name, phase, "memory", nbytes=1e6, kernels=n)


def sync(phase: str = "fwd") -> OpCost:
    """An all-reduce over 2 ranks: under BLOCKING the host waits for it (its call costs a launch, 10 µs)."""
    return collective("ar", phase, "all_reduce", 1e6, "tp", 2)


def queue(steps: list[tuple[float, float, float]]) -> float:
    """When the GPU is through kernels of (count, host, GPU) seconds queued from empty (``queue_step`` folded)."""
    issued, done = 0.0, 0.0
    for n, h, g in steps:
        issued, done = queue_step(issued, done, n, h, g)
    return done


def makespan(host: list[float], gpu: list[float]) -> float:
    """Johnson's closed form for a fixed order: max over k of (host of kernels 1..k + GPU of kernels k..n)."""
    return max(sum(host[: k + 1]) + sum(gpu[k:]) for k in range(len(host)))


def test_three_kernels_show_the_arithmetic():
    """10 µs a launch; GPU 2, 30 and 5 µs. Issued at 10, 20, 30 µs; the GPU runs 10-12, 20-50 and 50-55: 55 µs.
    Johnson's form: max(10 + 37, 20 + 35, 30 + 5) = 55. The pass-level max(Σ host, Σ GPU) = max(30, 37) = 37 says
    the GPU never waits after the first launch; it waits 10 µs before the first and 8 µs before the second."""
    assert queue([(1, 10, 2), (1, 10, 30), (1, 10, 5)]) == 55 == makespan([10, 10, 10], [2, 30, 5])
    # closed by a blocking all-reduce of 0 s (its call issued at 40 µs, before the GPU is through at 55): 55 µs, and
    # the GPU waits 55 - 37 = 18 µs beyond its kernels (host_idle: the larger of H - G and the queue's excess)
    ops, times = [kernel("a"), kernel("b"), kernel("c"), sync()], [2 * US, 30 * US, 5 * US, 0.0]
    assert segment_time(ops, times, BLOCKING)["f"] == pytest.approx(55 * US)
    idle = host_idle(ops, times, Plan(), BLOCKING, "none", {"f": 37 * US, "b": 0.0})
    assert idle["f"] == pytest.approx(18 * US)


def test_an_op_of_n_kernels_is_n_kernels_of_an_nth_each():
    """One record of 4 kernels (40 µs host, 20 µs GPU) queues as 4 kernels of 10 µs host and 5 µs GPU: issued at 10,
    20, 30, 40 µs, each 5 µs: done at 45 µs = issued + h + b."""
    assert queue([(4, 40, 20)]) == queue([(1, 10, 5)] * 4) == 45


def test_a_blocking_collective_drains_the_queue():
    """a (host 10, GPU 30) | all-reduce over 2 ranks (its call 10 µs, 7 µs) | b (host 10, GPU 2): the first segment
    is done at 40 µs (GPU), the call was issued by 20; the all-reduce runs 40-47 while the host waits; b is issued
    at 47 + 10 and done at 59: 59 µs."""
    seg = segment_time([kernel("a"), sync(), kernel("b")], [30 * US, 7 * US, 2 * US], BLOCKING)
    assert seg["f"] == pytest.approx(59 * US)


def test_a_pass_without_a_sync_keeps_its_lead():
    """No exposed collective: the host's lead carries in from the layer before, the flow line's steady state,
    max(Σ host, Σ GPU) = max(30, 37) µs, not the 55 µs of a queue started empty."""
    seg = segment_time([kernel("a"), kernel("b"), kernel("c")], [2 * US, 30 * US, 5 * US], BLOCKING)
    assert seg["f"] == pytest.approx(37 * US)


def test_the_backward_queues_in_reverse():
    """Autograd runs a layer's backward from its last op to its first: the backward of (a, b) queues as (b, a)."""
    fwd = segment_time([kernel("a"), kernel("b"), sync()], [30 * US, 2 * US, 0.0], BLOCKING)["f"]
    bwd = segment_time([sync("bwd_x"), kernel("a", "bwd_x"), kernel("b", "bwd_x")], [0.0, 2 * US, 30 * US],
                       BLOCKING)["b"]
    # 10 + 30 + 2 = 42 µs, the all-reduce's call issued by 30
    assert fwd == pytest.approx(bwd) == pytest.approx(makespan([10, 10], [30, 2]) * US) == pytest.approx(42 * US)


def _random_queue(rng: np.random.Generator, n: int) -> list[tuple[float, float, float]]:
    counts = rng.integers(1, 6, n).astype(float)
    return [(c, c * 10.0, g) for c, g in zip(counts, rng.uniform(0.0, 80.0, n), strict=True)]


def test_the_queue_lies_between_its_bounds_and_a_faster_gpu_or_host_never_slows_it():
    """Random queues: max(Σ host, Σ GPU) ≤ queue ≤ Σ over kernels of max(host, GPU) + the largest min(host, GPU) of
    one kernel (the k that sets Johnson's maximum pays both of its own) ≤ Σ host + Σ GPU; and halving any op's GPU
    time, or the host's cost per launch, never lengthens it, nor a segment closed by a blocking collective."""
    rng = np.random.default_rng(79)
    for _ in range(200):
        steps = _random_queue(rng, int(rng.integers(1, 9)))
        q = queue(steps)
        per_kernel = [(h / n, g / n) for n, h, g in steps]
        host, gpu = sum(h for _, h, _ in steps), sum(g for _, _, g in steps)
        high = (sum(n * max(a, b) for (n, _, _), (a, b) in zip(steps, per_kernel, strict=True))
                + max(min(a, b) for a, b in per_kernel))
        assert max(host, gpu) - 1e-9 <= q <= high + 1e-9 and high <= host + gpu + 1e-9
        i = int(rng.integers(len(steps)))
        assert queue([(n, h, g / 2 if j == i else g) for j, (n, h, g) in enumerate(steps)]) <= q + 1e-9
        assert queue([(n, h / 2, g) for n, h, g in steps]) <= q + 1e-9
        ops = [kernel(f"k{j}", n=n) for j, (n, _, _) in enumerate(steps)] + [sync()]
        times = [g * US for _, _, g in steps] + [3 * US]
        seg = segment_time(ops, times, BLOCKING)["f"]
        assert seg == pytest.approx(max(q * US, (host + 10) * US) + 3 * US)
        faster = [t / 2 if j == i else t for j, t in enumerate(times)]
        quicker = HostCost(per_kernel=5 * US, blocking_collectives=True)
        assert segment_time(ops, faster, BLOCKING)["f"] <= seg + 1e-15
        assert segment_time(ops, times, quicker)["f"] <= seg + 1e-15


def test_one_step_is_monotone_in_each_argument():
    """``queue_step`` is non-decreasing in issued, done, host and GPU seconds, and in the kernel count at a fixed
    cost per launch (more, smaller kernels never queue faster)."""
    rng = np.random.default_rng(46)
    for _ in range(500):
        i, d, g, p = rng.uniform(0, 50, 4)
        n = float(rng.integers(1, 8))
        base = queue_step(i, d, n, n * p, g)[1]
        for bumped in (queue_step(i + 1, d, n, n * p, g), queue_step(i, d + 1, n, n * p, g),
                       queue_step(i, d, n, n * p + 1, g), queue_step(i, d, n, n * p, g + 1),
                       queue_step(i, d, n + 1, (n + 1) * p, g)):
            assert bumped[1] >= base - 1e-12


def test_many_identical_layers_queue_at_the_larger_of_host_and_gpu_per_layer():
    """Why a pass no sync interrupts keeps max(H, G) (host.segment_time, host_idle): the host's lead carries from
    layer to layer, and L copies of a layer queue in L·max(H, G) plus at most one layer's worth, whatever the order
    inside it."""
    rng = np.random.default_rng(3)
    steps = _random_queue(rng, 6)
    host, gpu = sum(h for _, h, _ in steps), sum(g for _, _, g in steps)
    for layers in (1, 10, 100):
        q = queue(steps * layers)
        assert layers * max(host, gpu) <= q + 1e-9 <= layers * max(host, gpu) + host + gpu + 1e-9


def test_a_batch_of_plans_queues_as_each_plan_alone():
    ops = [kernel("a"), kernel("b", n=3.0), sync()]
    gpu_a, gpu_b = np.array([2.0, 40.0]) * US, np.array([30.0, 1.0]) * US
    batch = segment_time(ops, [gpu_a, gpu_b, 5 * US], BLOCKING)["f"]
    one = [segment_time(ops, [float(gpu_a[i]), float(gpu_b[i]), 5 * US], BLOCKING)["f"] for i in range(2)]
    assert np.allclose(batch, one)
