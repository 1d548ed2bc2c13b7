"""search/workers.py: the search split into jobs finds the same in one process as in two."""

from __future__ import annotations

from meshplan.search import Space, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model


def test_two_workers_find_what_one_finds():
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(64)
    space = Space(global_batch=64, offload_optimizer=(False,), offload_activations=(False,))
    one = search(model, cluster, space, top_k=5, workers=1)
    two = search(model, cluster, space, top_k=5, workers=2)
    assert [e.plan for e in one.plans] == [e.plan for e in two.plans]
    assert (one.evaluated, one.feasible, one.rejected) == (two.evaluated, two.feasible, two.rejected)
