"""The optimizer step's per-tensor loops in the order they run (Stack.tensor_host_queued, step/host.optimizer_loops,
step/host.queued_reduction): the part before the step's first synchronisation hides under the gradient all-reduce
queued ahead of it, the rest adds. Megatron-DeepSpeed's own fp16 step (sources.MDS_FP16_TENSOR, MDS_FP16_QUEUED) counts
it so: Megatron's fp16 wrapper casts each fp16 main_grad before its found-inf .item(). vTrain's released times hold
none of these loops (sources.VTRAIN's scope: benchmarks/measure/small_work_scope.py), so the stack here is vTrain's
with Megatron's counted loops put back, as a run timed end to end would pay them. GPT-2 on 8 DGX A100 GPUs
(python_host 1.34)."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.cost.params import stage_params
from meshplan.cost.tensors import stepped, tensors_on_rank
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT as EFFICIENCY
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.channels import dp_collectives
from meshplan.step.host import optimizer_loops, queued_reduction
from meshplan_validation.sources import MDS_FP16_QUEUED, MDS_FP16_TENSOR, VTRAIN

MODEL, CLUSTER = load_model("gpt2"), load_system("a100").cluster(8)
HOST = 1.34  # the DGX A100 host against the DGX H100 one the constants refer to
STACK = VTRAIN.stack.with_(tensor_host=MDS_FP16_TENSOR, tensor_host_queued=MDS_FP16_QUEUED)
PLAN = Plan(dp=8, micro_batch=1, global_batch=8, precision="fp16", recompute="full", zero=0)


def test_the_megatron_deepspeed_count_in_the_order_it_runs():
    # before found_inf.item(): main_grad.float() (a launching op), one .data read, three Python passes
    assert MDS_FP16_QUEUED == pytest.approx(14.5e-6 + 0.2e-6 + 3 * 0.1e-6) == pytest.approx(15.0e-6)
    # after it: the copy-back's copy_ (the overflow_buf test is False), clip's detach, 5 .data reads, 11 passes
    assert pytest.approx(14.5e-6 + 0.6e-6 + 5 * 0.2e-6 + 11 * 0.1e-6) == MDS_FP16_TENSOR - MDS_FP16_QUEUED
    assert pytest.approx(32.2e-6) == MDS_FP16_TENSOR
    assert (VTRAIN.stack.tensor_host, VTRAIN.stack.tensor_host_queued) == (0.0, 0.0)  # not in vTrain's scope


def test_the_cast_loop_hides_under_the_queued_all_reduce_up_to_its_time():
    tensors = tensors_on_rank(MODEL, PLAN, STACK, 0)
    n = float(stepped(tensors, PLAN, STACK))
    whole, pre = n * 32.2e-6 * HOST, n * 15.0e-6 * HOST
    assert optimizer_loops(tensors, PLAN, STACK, HOST) == pytest.approx(whole)  # nothing queued: all added
    assert optimizer_loops(tensors, PLAN, STACK, HOST, all_reduce=1e-4) == pytest.approx(whole - 1e-4)
    assert optimizer_loops(tensors, PLAN, STACK, HOST, all_reduce=1.0) == pytest.approx(whole - pre)  # all of it hides
    # a stack without the split adds every loop whatever is queued
    plain = STACK.with_(tensor_host_queued=0.0)
    assert optimizer_loops(tensors, PLAN, plain, HOST, all_reduce=1.0) == pytest.approx(whole)


def test_only_an_exposed_all_reduce_without_zero_is_queued_ahead():
    assert queued_reduction(2e-3, 0, STACK) == 2e-3
    assert queued_reduction(2e-3, 1, STACK) == 0.0  # ZeRO's reductions are its optimizer's own
    assert queued_reduction(2e-3, 0, STACK.with_(overlap_dp=True)) == 0.0  # spent under the backward pass
    # optimizer_loops asks it itself, under the ZeRO stage the plan's wrapper partitions
    tensors = tensors_on_rank(MODEL, PLAN, STACK, 0)
    whole = optimizer_loops(tensors, PLAN, STACK, HOST)
    assert optimizer_loops(tensors, PLAN, STACK, HOST, all_reduce=1e-4) == pytest.approx(whole - 1e-4)
    zero1 = Plan(dp=8, micro_batch=1, global_batch=8, precision="fp16", recompute="full", zero=1)
    assert optimizer_loops(tensors, zero1, STACK, HOST, all_reduce=1e-4) == optimizer_loops(tensors, zero1, STACK, HOST)


def test_the_step_saves_what_hides_under_the_all_reduce():
    eff = EFFICIENCY
    reduce = float(np.max(dp_collectives(MODEL, CLUSTER, PLAN, stage_params(MODEL, PLAN, True), eff).all_reduce))
    n = float(stepped(tensors_on_rank(MODEL, PLAN, STACK, 0), PLAN, STACK))
    split = estimate(MODEL, CLUSTER, PLAN, STACK).step_time
    added = estimate(MODEL, CLUSTER, PLAN, STACK.with_(tensor_host_queued=0.0)).step_time
    assert reduce > 0 and added - split == pytest.approx(min(n * 15.0e-6 * HOST, reduce), rel=1e-6)
    # at dp 1 nothing is queued: the split changes nothing
    single = Plan(dp=1, micro_batch=1, global_batch=8, precision="fp16", recompute="full", zero=0)
    assert estimate(MODEL, load_system("a100").cluster(1), single, STACK).step_time == pytest.approx(
        estimate(MODEL, load_system("a100").cluster(1), single, STACK.with_(tensor_host_queued=0.0)).step_time)


def test_the_queued_part_is_part_of_the_loops():
    with pytest.raises(SpecError, match="tensor_host_queued"):
        load_stack("megatron-core").with_(tensor_host=10e-6, tensor_host_queued=20e-6)


def test_the_loops_are_monotone_on_random_draws():
    rng = np.random.default_rng(79)
    tensors = tensors_on_rank(MODEL, PLAN, STACK, 0)
    for _ in range(200):
        pre, post, q, dq = rng.uniform(0, 100e-6), rng.uniform(0, 100e-6), rng.uniform(0, 0.02), rng.uniform(0, 1e-2)
        stack = STACK.with_(tensor_host=pre + post, tensor_host_queued=pre)
        base = optimizer_loops(tensors, PLAN, stack, HOST, all_reduce=q)
        assert 0 <= base <= optimizer_loops(tensors, PLAN, stack.with_(tensor_host=pre + post + 1e-6), HOST,
                                            all_reduce=q) + 1e-15
        later = optimizer_loops(tensors, PLAN, stack, HOST, all_reduce=q + dq)
        assert later <= base + 1e-15  # more queued GPU work hides more
        assert q + dq + later >= q + base - 1e-15  # but the segment max(pre, queued) never shrinks
        assert optimizer_loops(tensors, PLAN, stack, HOST * 1.5, all_reduce=q) >= base - 1e-15  # a slower host


def test_the_rank_by_rank_path_and_the_op_table_hide_it_alike():
    from meshplan.step.ranks import rank_shared
    reduce = float(np.max(dp_collectives(MODEL, CLUSTER, PLAN, stage_params(MODEL, PLAN, True),
                                         EFFICIENCY).all_reduce))
    hidden = min(float(stepped(tensors_on_rank(MODEL, PLAN, STACK, 0), PLAN, STACK)) * 15.0e-6 * HOST, reduce)
    plain = STACK.with_(tensor_host_queued=0.0)
    split, added = (rank_shared(MODEL, CLUSTER, PLAN, s, EFFICIENCY, 0).optimizer for s in (STACK, plain))
    assert float(added - split) == pytest.approx(hidden, rel=1e-6)
    rows = [{r.name: r.seconds for r in estimate(MODEL, CLUSTER, PLAN, s).ops} for s in (STACK, plain)]
    assert rows[1]["optimizer/host"] - rows[0]["optimizer/host"] == pytest.approx(hidden, rel=1e-6)
