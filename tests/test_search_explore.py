"""The search's plan-space sample and Pareto front (search/explore.py): off by default, the same top plans with it,
the front exact (equal to the front of every plan timed), the sample uniform over the size combinations, the same
whatever the number of workers, and each sampled plan's verdict the search's."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import gpt
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.search.explore import STATUS, Explore, front_of
from meshplan.specs.hardware import load_system
from meshplan.specs.stack import Stack

MODEL = gpt(layers=32, hidden=5120, heads=40, seq=4096)  # 10 B parameters: many plans overflow 80 GB
CLUSTER = load_system("h100").cluster(16)
SPACE = Space(global_batch=32, headroom=0.09, stack=Stack(), prefer_simple=False)  # every plan, by time


@pytest.fixture(scope="module")
def plain():
    return search(MODEL, CLUSTER, SPACE, top_k=3, workers=1)


@pytest.fixture(scope="module")
def explored():
    return search(MODEL, CLUSTER, SPACE, top_k=3, workers=1, explore=Explore(sample=2000))


@pytest.fixture(scope="module")
def everything():
    """A sample larger than the space: every size combination timed, every plan kept."""
    return search(MODEL, CLUSTER, SPACE, top_k=3, workers=1, explore=Explore(sample=10**9))


def test_off_by_default_and_the_same_top_plans(plain, explored):
    assert plain.explored is None
    assert [e.plan for e in explored.plans] == [e.plan for e in plain.plans]
    assert (explored.evaluated, explored.feasible) == (plain.evaluated, plain.feasible)


def test_the_front_is_exact(explored, everything):
    """The front of the pruned search equals the front of all plans timed (the sample of everything)."""
    cols = everything.explored.columns
    assert len(everything.explored) == everything.evaluated  # every plan, every setting
    fit = cols["status"] == 0
    assert int(fit.sum()) == everything.feasible
    keep = front_of(cols["time"][fit].astype(float), cols["memory"][fit].astype(float))
    brute = sorted(zip(cols["time"][fit][keep].tolist(), cols["memory"][fit][keep].tolist(), strict=True))
    front = [(t, m) for t, m, _ in explored.explored.front]
    assert len(front) == len(brute) > 3
    assert np.allclose(front, brute, rtol=1e-6)
    # fastest first, each lighter than the one before; the fastest is the search's best plan (ties by memory)
    assert all(a[0] <= b[0] and a[1] > b[1] for a, b in zip(front, front[1:], strict=False))
    assert explored.explored.front[0][0] == pytest.approx(min(e.step_time for e in explored.plans), rel=1e-5)


def test_front_plans_are_re_estimated_to_their_point(explored):
    for t, m, plan in explored.explored.front[:: max(1, len(explored.explored.front) // 5)]:
        est = estimate(MODEL, CLUSTER, plan, SPACE.stack)
        assert est.step_time == pytest.approx(t, rel=1e-5) and est.peak_memory == pytest.approx(m, rel=1e-5)


def test_sample_size_verdicts_and_workers(explored):
    space = explored.explored
    assert len(space) == 2000 < space.drawn
    cols, hbm = space.columns, CLUSTER.accelerator.hbm_bytes
    fits, over, within = (cols["status"] == k for k in range(3))
    assert fits.any() and over.any()
    assert (cols["memory"][fits] <= hbm * (1 - SPACE.headroom) * (1 + 1e-6)).all()
    assert (cols["memory"][over] > hbm * (1 - 1e-6)).all()
    assert (cols["memory"][within] > hbm * (1 - SPACE.headroom) * (1 - 1e-6)).all()
    assert len(STATUS) == 4
    assert not np.isnan(cols["memory"]).any()  # no plan the framework refuses (search/refused.py) in the sample
    again = search(MODEL, CLUSTER, SPACE, top_k=3, workers=2, explore=Explore(sample=2000)).explored
    assert all(np.array_equal(again.columns[k], cols[k]) for k in cols)
    assert [p for _, _, p in again.front] == [p for _, _, p in space.front]
