"""search/bound.py: the lower bound on a plan's step time never exceeds it, and pruning by it loses no plan of the
top k."""

from __future__ import annotations

import itertools
from dataclasses import replace

from meshplan.estimate import estimate
from meshplan.search import evaluate as evaluate_module
from meshplan.search import search
from meshplan.search.batch import PlanBatch
from meshplan.search.bound import lower_bound
from meshplan.search.candidates import candidates
from meshplan.search.keyed import KeyUnits
from meshplan.search.placements import PLACEMENTS
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from test_search import SMALL


def test_the_lower_bound_loses_none_of_the_top_k(monkeypatch):
    """In small chunks the k-th best time is known early, and later plans whose lower bound exceeds it are
    not timed: the same top k and counts as in one chunk per schedule group, where only the groups scored after
    the first can be skipped."""
    model, cluster = load_model("llama3-8b").with_seq_length(2048), load_system("h100").cluster(8)
    whole = search(model, cluster, SMALL, top_k=5)
    monkeypatch.setattr(evaluate_module, "PLAN_CHUNK", 32)
    chunked = search(model, cluster, SMALL, top_k=5)
    assert whole.bounded < chunked.bounded < chunked.evaluated
    assert [e.plan for e in chunked.plans] == [e.plan for e in whole.plans]
    assert (chunked.evaluated, chunked.feasible, chunked.rejected) == (whole.evaluated, whole.feasible, whole.rejected)


def test_the_lower_bound_holds_for_every_plan_and_setting():
    """bound.lower_bound: m·(L_stage·c + max(e, h)) + ((p − 1)·L_stage·c + min(e, h)) / v from the kernel
    times of a plan's shape, never above its step time under any setting; on pipelined plans it counts the bubble,
    so it exceeds the busiest rank's layer kernels alone."""
    model, cluster = load_model("llama3-8b").with_seq_length(2048), load_system("h100").cluster(8)
    space = replace(SMALL, layouts=("1d",), sequence_parallel=(False,))
    columns, _ = candidates(model, cluster, space)
    columns.pop("layout")
    pool = PlanBatch(**columns, placements=PLACEMENTS, **space.settings)
    units = KeyUnits(model, cluster, pool, space.stack, space.recompute, DEFAULT)
    bound = lower_bound(model, pool, units.shapes, units.shape_of)
    kernels = units.shapes["none"].layer
    for i in range(len(pool)):
        plan = replace(pool.plan(i), schedule="interleaved" if pool.vpp[i] > 1 else "1f1b")
        for rc, z, oa in itertools.product(space.recompute, space.zero, space.offload_activations):
            step = estimate(model, cluster, replace(plan, recompute=rc, zero=z, offload_activations=oa)).step_time
            assert bound[i] <= step * (1 + 1e-12)
        layers = -(-model.num_layers // plan.pp)
        c = (kernels.fwd + kernels.bwd)[units.shape_of[i]]
        if plan.pp > 1:
            assert bound[i] > plan.grad_accum * layers * c * (1 + 1 / plan.grad_accum / plan.vpp)
