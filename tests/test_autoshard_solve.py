"""The intra-operator program: a replicated plan is the traced step on one GPU (time and liveness memory exactly),
tied blocks make a model traced at depth 2 plan as the full depth, the memory limit holds, and physics is monotone
(more bandwidth never slows the optimum)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan import load_model
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import Tier, load_system

torch = pytest.importorskip("torch")
pytest.importorskip("scipy")

from meshplan.autoshard.blocks import find_blocks  # noqa: E402
from meshplan.autoshard.dataflow import flow  # noqa: E402
from meshplan.autoshard.memory import Accounting  # noqa: E402
from meshplan.autoshard.mesh import device_mesh  # noqa: E402
from meshplan.autoshard.problem import build_problem  # noqa: E402
from meshplan.autoshard.solve import plan, price, replicated_choice  # noqa: E402
from meshplan.autoshard.torch_models import build_preset  # noqa: E402
from meshplan.trace import trace_module  # noqa: E402
from meshplan.trace.cost import time_traced_ops  # noqa: E402
from meshplan.trace.liveness import peak_memory  # noqa: E402

TINY = replace(load_model("llama3-8b"), name="tiny", num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2,
               head_dim=16, ffn_hidden_size=128, vocab_size=256, seq_length=32)
SYSTEM = load_system("h100")


def _trace(layers: int):
    return trace_module(build_preset(TINY, layers), [((16, 32), "int64")], param_dtype="bfloat16")


TRACES = {}


def problem(traced_layers: int = 3, layers: int = 3, cluster=None):
    if traced_layers not in TRACES:
        TRACES[traced_layers] = _trace(traced_layers)
    tr = TRACES[traced_layers]
    blocks = find_blocks(tr, layers=layers)
    return tr, build_problem(flow(tr, blocks.block_of), blocks, device_mesh(cluster or SYSTEM.cluster(16)), DEFAULT)


def test_replicated_plan_is_the_traced_step_on_one_gpu():
    tr, pr = problem()
    choice = replicated_choice(pr)
    cost = price(pr, choice)
    one_gpu = sum(t.seconds for t in time_traced_ops(tr, SYSTEM.accelerator))  # trace/cost.py, op by op
    assert cost.compute_fwd + cost.compute_bwd == pytest.approx(one_gpu, rel=1e-9)
    assert cost.comm_fwd == cost.comm_bwd == cost.grad_sync == 0.0  # nothing is split, nothing moves
    assert Accounting(pr).evaluate(choice).peak == peak_memory(tr).peak  # liveness, byte for byte


def test_tied_blocks_plan_a_shallow_trace_as_the_full_depth():
    """3 layers traced vs 2 traced and weighed as 3: the same optimum; memory adds the third layer's bytes."""
    _, full = problem(3, 3)
    _, shallow = problem(2, 3)
    a, b = plan(full, 80e9), plan(shallow, 80e9)
    assert a.step_time == pytest.approx(b.step_time, rel=1e-9)
    assert price(full, replicated_choice(full)).step(1) == pytest.approx(
        price(shallow, replicated_choice(shallow)).step(1))
    exact = peak_memory(TRACES[3]).peak
    extended = Accounting(shallow).evaluate(replicated_choice(shallow)).peak
    assert exact <= extended <= 1.02 * exact  # an upper bound, exact where all activations are live


def test_memory_limit_holds_or_the_plan_says_why():
    tr, pr = problem(cluster=SYSTEM.cluster(8))  # one NVLink domain: a 1-D mesh
    free = plan(pr, 80e9)
    limit = 0.5 * peak_memory(tr).peak  # half of one GPU's peak: the state must be split
    tight = plan(pr, limit)
    assert tight.fits and tight.memory.peak <= limit
    assert tight.step_time >= free.step_time  # a constraint never speeds the optimum
    assert tight.memory.peak == Accounting(pr).evaluate(tight.choice).peak
    hopeless = plan(pr, 1e3)  # 1 kB per GPU
    assert not hopeless.fits and "GiB" in hopeless.reason


def _faster_network(factor: float):
    cluster = SYSTEM.cluster(16)
    tiers = tuple(replace(t, bandwidth=t.bandwidth * factor) if t.name == "network" else t for t in cluster.tiers)
    return replace(cluster, tiers=tiers)


@pytest.mark.parametrize("factor", [2.0, 10.0])
def test_more_bandwidth_never_slows_the_optimum(factor):
    _, slow = problem()
    _, fast = problem(cluster=_faster_network(factor))
    assert plan(fast, 80e9).step_time <= plan(slow, 80e9).step_time * (1 + 1e-9)


def test_the_program_prices_the_plan_it_returns():
    """The reduced program's optimum (reduce.py eliminates and drops strategies) is the price of the expanded plan."""
    from meshplan.autoshard.ilp import solve

    _, pr = problem()
    sol = solve(pr, 2, [])
    assert sol.status == "optimal" and set(sol.choice) == set(pr.nodes)
    assert price(pr, sol.choice).step(2) == pytest.approx(sol.objective, rel=1e-9)
    assert isinstance(SYSTEM.cluster(16).tiers[0], Tier)


def test_the_collector_is_paused_while_planning_and_put_back_as_it_was():
    import gc

    from meshplan.autoshard.solve import collector_paused

    was = gc.isenabled()
    try:
        for before in (True, False):
            (gc.enable if before else gc.disable)()
            with collector_paused():
                assert not gc.isenabled()
            assert gc.isenabled() is before
        gc.enable()
        with pytest.raises(ValueError), collector_paused():
            raise ValueError("a planner's error")
        assert gc.isenabled()
        before = gc.get_freeze_count()
        with collector_paused(frozen=True):  # the console script's: what is alive is frozen before it is on again
            made = [[] for _ in range(10)]
        assert gc.isenabled() and gc.get_freeze_count() >= before + len(made)
    finally:
        gc.unfreeze()
        (gc.enable if was else gc.disable)()
