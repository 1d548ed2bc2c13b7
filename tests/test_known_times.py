"""step/known_times.py: the compute-op times a twin search (another expert-GEMM choice) met are reused only for records
equal field by field, and the times are the ones computed afresh, bit for bit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from meshplan.cost.records import OpCost
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import DEFAULT as STACK
from meshplan.step.known_times import same_op
from meshplan.step.units import compute_times, plan_ops


def test_records_are_the_same_only_field_by_field_with_their_types_and_shapes():
    a = OpCost("fc1", "fwd", "gemm", flops=np.array([1.0, 2.0]), m=np.array([4.0, 8.0]), launches=3.0)
    assert same_op(a, replace(a, flops=np.array([1.0, 2.0])))  # another array of the same values
    assert not same_op(a, replace(a, launches=4.0))  # the expert GEMMs' launch count
    assert not same_op(a, replace(a, flops=np.array([1.0, 2.5])))
    assert not same_op(a, replace(a, flops=np.array([1, 2])))  # same values, other dtype
    assert not same_op(a, replace(a, flops=np.array([[1.0, 2.0]])))  # other shape
    assert not same_op(a, replace(a, launches=np.array(3.0)))  # a number against an array
    assert not same_op(a, replace(a, m=np.array([4.0, np.nan])))  # NaN is never the same: timed again


def test_a_twin_reuses_the_times_of_its_same_records_and_times_the_others_bit_for_bit():
    model, cluster = load_model("qwen3-30b-a3b"), load_system("h100").cluster(32)
    plan = Plan(tp=2, ep=4, dp=16, micro_batch=1, global_batch=64)
    known: dict = {}
    first = compute_times(model, cluster, plan, STACK.with_(expert_gemm="grouped"), DEFAULT, known)
    twin = STACK.with_(expert_gemm="per_expert")
    shared = compute_times(model, cluster, plan, twin, DEFAULT, known)
    alone = compute_times(model, cluster, plan, twin, DEFAULT)
    assert shared.keys() == alone.keys()
    grouped, per_expert = (plan_ops(model, plan, s) for s in (STACK.with_(expert_gemm="grouped"), twin))
    reused = timed = 0
    for k, times in alone.items():
        for i, t in enumerate(times):
            assert np.array_equal(shared[k][i], t) if t is not None else shared[k][i] is None  # bit for bit
            if t is None:
                continue
            same = same_op(grouped[k][i], per_expert[k][i])
            assert (shared[k][i] is first[k][i]) == same  # reused exactly where the records are the same
            reused, timed = reused + same, timed + (not same)
    assert reused > timed > 0  # most ops the twin's, the expert GEMMs timed again
