"""search/bound.py: the lower bound on a plan's step time never exceeds it, and pruning by it loses no plan of the
top k."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np

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
from meshplan.xp import stable_order
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


def test_the_bounds_order_is_numpys_stable_argsort():
    """evaluate scores the size combinations by their bound, in ``xp.stable_order``: NumPy's unstable argsort with
    each run of equal values put back in index order, which must be ``np.argsort(kind="stable")`` element for element.
    E.g. values [2, 1, 2, 1]: the unstable sort may give [3, 1, 2, 0]; the runs {1: [3, 1]} and {2: [2, 0]} put back
    in index order give [1, 3, 0, 2], the stable sort's. Drawn: values in no order (few ties), many ties (NumPy's own
    stable sort then), NaNs (last, together), -0.0 beside 0.0 (equal), whole numbers, and arrays below the size where
    NumPy's own sort is used."""
    rng = np.random.default_rng(83)
    assert stable_order(np.array([2.0, 1.0, 2.0, 1.0] * 1024))[:4].tolist() == [1, 3, 5, 7]
    for n in (0, 1, 5, 2047, 2048, 5000, 91_546):
        draws = {"distinct": rng.random(n) * 1e3,
                 "some ties": np.where(rng.random(n) < 0.01, 7.0, rng.random(n)),
                 "many ties": np.round(rng.random(n) * 50) / 7,
                 "nan": np.where(rng.random(n) < 0.005, np.nan, rng.random(n)),
                 "signed zeros": np.where(rng.random(n) < 0.002, rng.choice([0.0, -0.0], n), rng.random(n)),
                 "integers": rng.integers(0, 10 * n + 1, n)}
        for name, values in draws.items():
            assert np.array_equal(stable_order(values), np.argsort(values, kind="stable")), (n, name)
