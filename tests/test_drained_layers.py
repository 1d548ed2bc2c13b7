"""Every layer's pass from an empty queue (Stack.drained_passes "layers", HostCost.drained_layers; step/host.py): a
pass is priced as its kernels' flow line from an empty launch queue (Johnson's makespan), not at the steady state
max(host, GPU) a lead carried from the layer before would give; its collectives close segments only where the host
also waits for them (blocking_collectives). vTrain's released times are such a graph (sources.VTRAIN,
meshplan_validation/source_vtrain.py: one layer traced between the profiler's flushes, after the embedding's
synchronising boolean index)."""

from __future__ import annotations

import pytest

from draws import draw_kept
from meshplan.cost.blocks import collective
from meshplan.cost.records import OpCost
from meshplan.estimate import estimate
from meshplan.specs.host_cost import HostCost
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.host import host_idle, segment_time
from test_properties import rates, with_rate

US = 1e-6
LEAD = HostCost(per_kernel=10 * US)
DRAINED = HostCost(per_kernel=10 * US, drained_layers=True)


def kernel(name: str, phase: str = "fwd") -> OpCost:
    return OpCost(name, phase, "memory", nbytes=1e6, kernels=1.0)


def test_a_drained_pass_pays_its_flow_line():
    """10 µs a launch; GPU 2 µs then 10 µs. From an empty queue: issued at 10 and 20 µs, the GPU runs 10-12 and
    20-30: 30 µs (Johnson: max(10 + 12, 20 + 10) = 30). With a lead carried, max(Σ host, Σ GPU) = max(20, 12) = 20:
    the GPU waits 20 - 12 = 8 µs; drained it waits 30 - 12 = 18."""
    ops, times = [kernel("a"), kernel("b")], [2 * US, 10 * US]
    assert segment_time(ops, times, DRAINED)["f"] == pytest.approx(30 * US)
    assert segment_time(ops, times, LEAD)["f"] == pytest.approx(20 * US)  # no sync, not drained: the steady state
    gpu = {"f": 12 * US, "b": 0.0}
    assert host_idle(ops, times, Plan(), LEAD, "none", gpu)["f"] == pytest.approx(8 * US)
    assert host_idle(ops, times, Plan(), DRAINED, "none", gpu)["f"] == pytest.approx(18 * US)


def test_a_collective_the_host_does_not_wait_for_stays_in_the_line():
    """The same two kernels with a 40 µs all-reduce over 2 ranks between them (its call a launch, 10 µs): drained
    without blocking_collectives it is a kernel of the line: issued 10, 20, 30 µs; GPU 10-12, 20-60, 60-70: 70 µs.
    With the host waiting for it, it closes a segment: (max(20, 12) + 40) + (from empty: 10 + 10) = 80 µs."""
    ar = collective("ar", "fwd", "all_reduce", 1e6, "tp", 2)
    ops, times = [kernel("a"), ar, kernel("b")], [2 * US, 40 * US, 10 * US]
    assert segment_time(ops, times, DRAINED)["f"] == pytest.approx(70 * US)
    both = HostCost(per_kernel=10 * US, drained_layers=True, blocking_collectives=True)
    assert segment_time(ops, times, both)["f"] == pytest.approx(80 * US)


def test_the_stack_choice_sets_the_host_record():
    assert Stack(drained_passes="layers").host.drained_layers
    assert not any(Stack(drained_passes=d).host.drained_layers for d in ("none", "forward", "both"))


@pytest.fixture(scope="module")
def eager_triples() -> list:
    return draw_kept(8080, 12, lambda m, c, plan, stack: stack.host_dispatch > 0 and not stack.cuda_graphs)


def test_draining_every_layer_never_shortens_a_step_and_more_rate_never_lengthens_one(eager_triples):
    """Property: a flow line from empty is never shorter than max(host, GPU), so "layers" never prices a step below
    "none"; and under "layers" a faster GPU, link or memory never lengthens it."""
    worse = []
    for model, cluster, plan, stack in eager_triples:
        lead = estimate(model, cluster, plan, stack.with_(drained_passes="none")).step_time
        drained = stack.with_(drained_passes="layers")
        step = estimate(model, cluster, plan, drained).step_time
        assert lead <= step * (1 + 1e-9), (model.name, plan.describe())
        for rate in rates(cluster):
            faster = estimate(model, with_rate(cluster, rate, 2.0, plan.precision), plan, drained).step_time
            if faster > step * (1 + 1e-9):
                worse.append(f"{model.name} {plan.describe()} {rate}: {step:.6g} -> {faster:.6g}")
    assert not worse, "; ".join(worse[:5])
