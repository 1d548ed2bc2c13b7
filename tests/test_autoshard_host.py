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
    python_host 1) each pass is max(GPU, (launches + collectives) x 25 us), the launches counted from the trace's ops
    (32 forward), the collectives from the plan's strategies and moves (Node.calls, Edge.calls)."""
    assert EAGER_HOST == load_stack("pytorch-fsdp").host_dispatch == 25e-6
    gpu, host = _plan(0.0), _plan(None)
    problem = host.problem
    ops = problem.flow.trace.ops
    fwd = sum(problem.weight[k] for k, node in problem.nodes.items() for i in node.members
              if ops[i].kind != "view" and ops[i].phase == "fwd")
    assert fwd > 0 and host_seconds(problem)[0] == pytest.approx(fwd * 25e-6)
    p = host.price
    assert p is not None and gpu.price is not None
    calls = sum(problem.weight[k] * node.calls[host.choice[k], 0] for k, node in problem.nodes.items()) + sum(
        e.calls[0, host.choice[u], host.choice[v]] for (u, v), e in problem.edges.items())
    assert fwd == 32 and calls > 0
    assert (p.host_fwd, gpu.price.host_fwd) == (pytest.approx((fwd + calls) * 25e-6), 0.0)
    assert host_seconds(problem, choice=host.choice)[0] == pytest.approx(p.host_fwd)
    assert p.fwd == pytest.approx(max(p.compute_fwd + p.comm_fwd, p.host_fwd))
    assert p.bwd == pytest.approx(max(p.compute_bwd + p.comm_bwd, p.host_bwd))
    assert host.step_time >= gpu.step_time
    # at 0.5 ms a kernel (20x eager PyTorch's) this MLP's 32 forward launches outlast its kernels: the host binds
    slow = _plan(0.5e-3)
    assert slow.price is not None and slow.price.host_fwd >= fwd * 0.5e-3
    assert slow.price.host_fwd > slow.price.compute_fwd + slow.price.comm_fwd and slow.step_time > gpu.step_time


def test_more_host_time_per_kernel_never_shortens_the_planners_step():
    steps = [_plan(h).step_time for h in (0.0, 25e-6, 0.5e-3, 2e-3)]
    assert steps == sorted(steps) and steps[-1] > steps[0]


def test_a_host_bound_step_is_planned_for_its_host(tmp_path, monkeypatch):
    """Where the host binds, a pass's GPU time up to the host's is free, and each collective a plan inserts costs the
    host a call (25 us, as a kernel), so the planner weighs the passes' GPU time less and the calls more and plans
    again (autoshard/solve.plan_for_host). The audit's transformer (test_autoshard_run.AUDIT) at width 64 on a 2 x 2
    mesh launches 0.775 ms of kernels forward and 2.000 ms backward. Planned for the GPU's time alone, it reshards
    activations between its ops: 5 collectives forward and 22 backward, a host of 0.900 and 2.550 ms, a step of
    3.600 ms; planned for the host, one collective is left (0.775 + 2.025 ms) and the step, 2.813 ms, is within 2 % of
    the kernels' floor, 2.775 ms."""
    from meshplan.autoshard import solve
    from meshplan.autoshard.problem import host_seconds
    from test_autoshard_run import AUDIT

    path = tmp_path / "audit64.py"
    path.write_text(AUDIT + "def make64(): return M(64)\n")

    def planned():  # type: ignore[no-untyped-def]
        return plan_sharding(Request(model=f"{path}:make64", gpus=4, mesh=(2, 2), input_shapes=((64, 512),),
                                     dtypes=("int64",), stages="off")).intra

    host_aware = planned()
    monkeypatch.setattr(solve, "HOST_STEPS", 0)
    gpu_only = planned()
    floor = host_seconds(gpu_only.problem)  # the kernels' launches alone, whatever the plan
    assert floor == (pytest.approx(0.775e-3, abs=1e-6), pytest.approx(2.000e-3, abs=1e-6))
    calls = {}
    for name, plan in (("gpu", gpu_only), ("host", host_aware)):
        p = plan.price
        assert p is not None and plan.fits
        # the host's time beyond the launches is whole collectives' calls, 25 us each
        extra = [(h - f) / 25e-6 for h, f in zip((p.host_fwd, p.host_bwd), floor, strict=True)]
        assert extra == [pytest.approx(round(x), abs=1e-6) for x in extra]
        calls[name] = sum(round(x) for x in extra)
        assert p.host_fwd > p.compute_fwd + p.comm_fwd and p.host_bwd > p.compute_bwd + p.comm_bwd
        assert plan.step_time == pytest.approx(p.host_fwd + p.host_bwd + p.grad_sync + p.optimizer)
    assert calls["gpu"] >= 20 and calls["host"] <= 2  # 27 and 1 here
    assert gpu_only.step_time >= sum(floor) + 20 * 25e-6
    assert sum(floor) <= host_aware.step_time <= 1.02 * sum(floor) < gpu_only.step_time
