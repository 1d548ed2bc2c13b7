"""The sharding planner pays the host (issue 46: training, serving and the sharding planner all pay it): each pass of
the traced step takes at least the host's time to launch its kernels, those each aten op's GPU implementation
launches (step/host.launches, as the estimate counts them), at eager PyTorch's cost per kernel at the cluster's host
speed (autoshard/problem.host_seconds, planner.kernel_host)."""

from __future__ import annotations

import pytest

pytest.importorskip("scipy")

from meshplan.autoshard.planner import EAGER_HOST, Request, plan_sharding  # noqa: E402
from meshplan.autoshard.problem import host_seconds  # noqa: E402
from meshplan.specs.stack import load_stack  # noqa: E402
from test_autoshard_run import MODELS  # noqa: E402


def _plan(host: float | None):
    return plan_sharding(Request(model=f"{MODELS}:make_gated_plan", gpus=2, input_shapes=((1, 4096),),
                                 dtypes=("int64",), stages="off", host_dispatch=host)).intra


def test_each_pass_takes_at_least_its_launches():
    """Without host time (host_dispatch 0) the price is the GPU's; with eager PyTorch's 25 us a kernel (an H100's host:
    python_host 1) each pass is max(GPU, launches x 25 us), the launches counted from the trace's ops."""
    assert EAGER_HOST == load_stack("pytorch-fsdp").host_dispatch == 25e-6
    gpu, host = _plan(0.0), _plan(None)
    problem = host.problem
    ops = problem.flow.trace.ops
    fwd = sum(problem.weight[k] for k, node in problem.nodes.items() for i in node.members
              if ops[i].kind != "view" and ops[i].phase == "fwd")
    assert fwd > 0 and host_seconds(problem)[0] == pytest.approx(fwd * 25e-6)
    p = host.price
    assert p is not None and gpu.price is not None
    assert (p.host_fwd, gpu.price.host_fwd) == (pytest.approx(fwd * 25e-6), 0.0)
    assert p.fwd == pytest.approx(max(p.compute_fwd + p.comm_fwd, p.host_fwd))
    assert p.bwd == pytest.approx(max(p.compute_bwd + p.comm_bwd, p.host_bwd))
    assert host.step_time >= gpu.step_time
    # at 0.5 ms a kernel (20x eager PyTorch's) this MLP's 32 forward launches outlast its kernels: the host binds
    slow = _plan(0.5e-3)
    assert slow.price is not None and slow.price.host_fwd == pytest.approx(fwd * 0.5e-3)
    assert slow.price.host_fwd > slow.price.compute_fwd + slow.price.comm_fwd and slow.step_time > gpu.step_time


def test_more_host_time_per_kernel_never_shortens_the_planners_step():
    steps = [_plan(h).step_time for h in (0.0, 25e-6, 0.5e-3, 2e-3)]
    assert steps == sorted(steps) and steps[-1] > steps[0]


def test_a_host_bound_step_is_planned_for_its_host(tmp_path, monkeypatch):
    """Where the host binds, a pass's GPU time up to the host's is free, so the planner weighs that pass less and
    plans again (autoshard/solve.host_bound). The audit's transformer (test_autoshard_run.AUDIT) at width 64 on a
    2 x 2 mesh: both passes host-bound (0.775 ms forward, 2.000 ms backward to launch at 25 us a kernel). Planned
    for the GPU's time alone, its step is 0.775 + 2.000 + its gradient reductions and optimizer (2.925 ms); planned
    for the host, it picks a plan whose communication lies in the passes, which wait on the host anyway (here its
    gradient reductions go: 0.147 ms to none), and the step is within 1 % of the host's floor, 2.775 ms."""
    from meshplan.autoshard import solve
    from test_autoshard_run import AUDIT

    path = tmp_path / "audit64.py"
    path.write_text(AUDIT + "def make64(): return M(64)\n")

    def planned():  # type: ignore[no-untyped-def]
        return plan_sharding(Request(model=f"{path}:make64", gpus=4, mesh=(2, 2), input_shapes=((64, 512),),
                                     dtypes=("int64",), stages="off")).intra

    host_aware = planned()
    monkeypatch.setattr(solve, "HOST_STEPS", 0)
    gpu_only = planned()
    for plan in (host_aware, gpu_only):
        p = plan.price
        assert p is not None and plan.fits
        assert (p.host_fwd, p.host_bwd) == (pytest.approx(0.775e-3, abs=1e-6), pytest.approx(2.000e-3, abs=1e-6))
        assert p.host_fwd > p.compute_fwd + p.comm_fwd and p.host_bwd > p.compute_bwd + p.comm_bwd
        assert plan.step_time == pytest.approx(p.host_fwd + p.host_bwd + p.grad_sync + p.optimizer)
    assert gpu_only.step_time == pytest.approx(2.925e-3, abs=0.01e-3)
    floor = host_aware.price.host_fwd + host_aware.price.host_bwd
    assert floor <= host_aware.step_time <= 1.01 * floor < gpu_only.step_time
