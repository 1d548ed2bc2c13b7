"""search/best.py: the k best plans so far, ties broken towards less memory."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.search import Space, search
from meshplan.search.best import RANK_SLACK, Best, staircase
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from spaces import EVERY_PLAN


def test_equally_fast_plans_are_kept_by_the_smaller_memory():
    """Best.offer with k = 1: of two plans with the best time, the one with the smaller peak stays (the
    ranking's tie-break), whichever comes first in the chunk."""
    best = Best(1)
    plans = [Plan(dp=1, tp=t, pp=1, micro_batch=1, global_batch=8) for t in (1, 2, 4)]
    best.offer(np.array([1.0, 1.0, 2.0]), np.array([50.0, 30.0, 10.0]), lambda i: plans[i])
    assert [(r[0], r[1]) for r in best.rows] == [(1.0, 30.0)] and best.rows[0][2][1] == plans[1]
    assert best.threshold == 1.0
    # in a search: Llama-3-70B on 288 GB200s with sequence parallelism has equally fast plans with and without
    # offloaded activations (hidden); the best of one is the best of five, the lighter one (30.2 GB, not 52.4 GB)
    model, cluster = load_model("llama3-70b").with_seq_length(8192), load_system("gb200").cluster(288)
    space = Space(**EVERY_PLAN, global_batch=256, sequence_parallel=(True,))
    one, five = (search(model, cluster, space, top_k=k, workers=1) for k in (1, 5))
    tied = [e for e in five.plans if e.step_time == five.plans[0].step_time]
    assert len(tied) > 1 and one.plans[0].peak_memory == min(e.peak_memory for e in tied)


def test_the_staircase_keeps_every_plan_that_can_be_among_the_k_first_within_a_band():
    """A plan is dropped only when k plans ranked before it (simpler, or as simple and lighter) are faster: they are
    in the band whenever it is. Four plans (time, peak, simplicity) ranked d (s 0), c, b, a (s 1, lighter first):
    a = (1.0, 9, 1), b = (1.2, 8, 1), c = (1.1, 7, 1), d = (1.3, 9, 0)."""
    times, peaks, simple = np.array([1.0, 1.2, 1.1, 1.3]), np.array([9.0, 8.0, 7.0, 9.0]), np.array([1, 1, 1, 0])
    # k = 1: b is after c (heavier) and slower (1.2 > 1.1): whatever the band, c is in it when b is
    assert staircase(times, peaks, simple, 1).tolist() == [True, False, True, True]
    # k = 2: b has one plan before it that is faster (c; d is slower): kept; a has none faster
    assert staircase(times, peaks, simple, 2).tolist() == [True, True, True, True]
    # equally fast plans do not drop each other (float32 sums: only a margin of RANK_SLACK counts)
    assert staircase(np.array([1.0, 1.0]), np.array([5.0, 6.0]), np.array([0, 0]), 1).all()
    # in blocks: 1,200 plans of one simplicity, heavier ones faster: nothing before any of them is faster
    n = 1200
    assert staircase(np.linspace(2, 1, n), np.arange(n, dtype=float), np.zeros(n, dtype=int), 3).all()
    # and lighter ones faster: only the k first stay
    assert staircase(np.linspace(1, 2, n), np.arange(n, dtype=float), np.zeros(n, dtype=int), 3).sum() == 3


def test_with_a_band_best_keeps_the_band_and_prunes_by_its_edge():
    """Best(k = 1, band 10 %): the threshold the bound prunes by is the fastest time x 1.1 (not the fastest), and a
    simpler plan inside the band stays though the fastest was offered first."""
    plans = [Plan(dp=8), Plan(dp=4, tp=2), Plan(dp=2, tp=2, pp=2)]
    best = Best(1, band=0.1)
    best.offer(np.array([1.0, 1.05, 1.2]), np.array([3.0, 2.0, 1.0]), lambda i: plans[[2, 1, 0][i]],
               np.array([2, 1, 0]))
    assert best.threshold == pytest.approx(1.1 * (1 + RANK_SLACK))  # 1.0 x (1 + 0.1)
    assert [k[1] for k in best.close_keys] == [plans[2], plans[1]]  # 1.2 is outside the band: dropped
    best.offer(np.array([1.08]), np.array([2.5]), lambda i: plans[0], np.array([0]))
    assert [k[1] for k in best.close_keys][-1] == plans[0] and best.rows[0][0] == 1.0
