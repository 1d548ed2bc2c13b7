"""The training loop's own host work (Stack.microbatch_host, Stack.iteration_host; step/stages.loop_times,
step/host.iteration_host): how often each schedule pays it, the per-op table's loop/ rows, the host-bound note, and
the rank-by-rank path agreeing with the composed one. GPT-2 on 8 DGX A100 GPUs (python_host 1.34) throughout."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.estimate import estimate
from meshplan.report.host_note import host_note
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

MODEL, CLUSTER, STACK = load_model("gpt2"), load_system("a100").cluster(8), load_stack("megatron-core")
HOST = 1.34  # the DGX A100 host against the DGX H100 one the constants refer to (SPECspeed ratio: presets)


def _added(plan: Plan, **loop: float) -> float:
    """Seconds the loop's host work adds to ``plan``'s step, in units of the given constant at this host's speed."""
    base = estimate(MODEL, CLUSTER, plan, STACK).step_time
    (name, value), = loop.items()
    return (estimate(MODEL, CLUSTER, plan, STACK.with_(**{name: value})).step_time - base) / (value * HOST)


@pytest.mark.parametrize("schedule, vpp, slots", [
    ("1f1b", 1, 8 + 4 - 1),         # the busiest rank's m, and each other rank once in the bubble
    ("gpipe", 1, 8 + 4 - 1),
    ("interleaved", 2, 8 + 3 / 2),  # the bubble's other ranks over v
    ("zb-h1", 1, 8 + 3 / 2),        # its bubble counts the forward passes: half of the loop is the forward's
    ("pipedream", 1, 8),            # asynchronous: no bubble
])
def test_each_schedule_pays_the_micro_batch_loop_on_its_critical_path(schedule, vpp, slots):
    plan = Plan(dp=2, pp=4, vpp=vpp, micro_batch=4, global_batch=64, schedule=schedule, recompute="none")
    assert plan.grad_accum == 8
    assert _added(plan, microbatch_host=1e-3) == pytest.approx(slots, rel=1e-6)


@pytest.mark.parametrize("schedule", ["1f1b", "pipedream", "pipedream-2bw", "zb-v", "dualpipe"])
def test_the_step_loop_is_paid_once_a_step_whatever_the_updates(schedule):
    """PipeDream updates the weights after every micro-batch (8 optimizer steps a step), the logging still once."""
    plan = Plan(dp=2, pp=4, vpp=2 if schedule == "zb-v" else 1, micro_batch=4, global_batch=64, schedule=schedule,
                recompute="none")
    assert _added(plan, iteration_host=1e-3) == pytest.approx(1.0, rel=1e-6)


def test_the_estimate_shows_the_loop_and_the_host_note_counts_it():
    """dp 8, 4 micro-batches a step under Megatron-DeepSpeed's module code: 1 ms a micro-batch and 2 ms a step at
    DGX H100 speed add 4 x 1.34 + 2 x 1.34 = 8.04 ms, shown as loop/micro_batch (4 a step) and loop/step (1); the
    host-bound note's wait counts both and says CUDA graphs of the layers leave them."""
    plan = Plan(dp=8, micro_batch=4, global_batch=128, recompute="none", zero=1)
    stack = load_stack("megatron-deepspeed")
    base = estimate(MODEL, CLUSTER, plan, stack)
    est = estimate(MODEL, CLUSTER, plan, stack.with_(microbatch_host=1e-3, iteration_host=2e-3))
    assert est.step_time - base.step_time == pytest.approx(6 * 1e-3 * HOST, rel=1e-6)
    rows = {r.name: r for r in est.ops}
    assert (rows["loop/micro_batch"].count, rows["loop/micro_batch"].seconds) == (4, pytest.approx(1.34e-3))
    assert (rows["loop/step"].count, rows["loop/step"].seconds) == (1, pytest.approx(2.68e-3))
    before, after = host_note(base), host_note(est)
    assert before is not None and after is not None
    assert after.wait - before.wait == pytest.approx(6 * 1.34e-3, rel=1e-6)
    assert after.training_loop == pytest.approx(6 * 1.34e-3, rel=1e-6) and before.training_loop == 0.0
    assert "8.04 ms in the training loop's own work" in after.text()


def test_ranks_priced_one_by_one_pay_the_loop_as_the_composed_step():
    """A per-rank setting sends a plan down the rank-by-rank path (step/ranks.py); with the same setting on every
    rank it must price the loop's work as the composed step does."""
    stack = STACK.with_(microbatch_host=1e-3, iteration_host=2e-3)
    plan = Plan(dp=2, pp=4, micro_batch=1, global_batch=16, recompute="full")
    composed = estimate(MODEL, CLUSTER, plan, stack).step_time
    by_rank = estimate(MODEL, CLUSTER, replace(plan, stage_recompute=("full",) * 4), stack).step_time
    assert by_rank == pytest.approx(composed, rel=1e-9)
