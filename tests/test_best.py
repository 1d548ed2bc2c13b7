"""search/best.py: the k best plans so far, ties broken towards less memory."""

from __future__ import annotations

import numpy as np

from meshplan.search import Space, search
from meshplan.search.best import Best
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan


def test_equally_fast_plans_are_kept_by_the_smaller_memory():
    """Best.offer with k = 1: of two plans with the best time, the one with the smaller peak stays (the
    ranking's tie-break), whichever comes first in the chunk."""
    best = Best(1)
    plans = [Plan(dp=1, tp=t, pp=1, micro_batch=1, global_batch=8) for t in (1, 2, 4)]
    best.offer(np.array([1.0, 1.0, 2.0]), np.array([50.0, 30.0, 10.0]), lambda i: plans[i])
    assert [(r[0], r[1]) for r in best.rows] == [(1.0, 30.0)] and best.rows[0][2][1] == plans[1]
    assert best.threshold == 1.0
    # in a search: Llama-3-70B on 288 GB200s has equally fast plans with and without offloaded activations (hidden);
    # the best of one is the best of five, the lighter one (31.0 GB, not 52.4 GB)
    model, cluster = load_model("llama3-70b").with_seq_length(8192), load_system("gb200").cluster(288)
    one, five = (search(model, cluster, Space(global_batch=256), top_k=k, workers=1) for k in (1, 5))
    tied = [e for e in five.plans if e.step_time == five.plans[0].step_time]
    assert len(tied) > 1 and one.plans[0].peak_memory == min(e.peak_memory for e in tied)
