"""search/evaluate.py: one share of the search, timing only the plans whose lower bound can reach the top k."""

from __future__ import annotations

import pytest

from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.search import evaluate as evaluate_module
from meshplan.search.batch import PlanBatch
from meshplan.search.candidates import candidates
from meshplan.search.keyed import KeyUnits
from meshplan.search.placements import PLACEMENTS
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from spaces import EVERY_PLAN
from test_keyed import unit_keys


def test_units_are_priced_only_for_keys_that_can_reach_the_top_k(monkeypatch):
    """The collectives of a unit key are priced only when one of its plans' lower bound can still reach the
    k-th best time: on this MoE space four in ten keys never are, and the search still equals estimate() on its best."""
    made = []

    class Recorded(KeyUnits):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(evaluate_module, "KeyUnits", Recorded)
    model, cluster = load_model("mixtral-8x7b").with_seq_length(2048), load_system("h100").cluster(32)
    space = Space(**EVERY_PLAN, global_batch=64, zero=(1,), recompute=("none", "full"), offload_optimizer=(False,),
                  offload_activations=(False,), layouts=("1d",), sequence_parallel=(True,))
    result = search(model, cluster, space, top_k=3)
    columns, _ = candidates(model, cluster, space)
    columns.pop("layout")
    plans = PlanBatch(**columns, placements=PLACEMENTS, **space.settings).select(
        columns["tp"] > 1, sequence_parallel=True)
    every = len(unit_keys(model, cluster, plans)[0])
    priced = sum(u.priced for u in made)
    assert made and 0 < priced < 0.7 * every  # 3,255 of 5,324
    assert result.plans[0].step_time == pytest.approx(estimate(model, cluster, result.plans[0].plan,
                                                               space.stack).step_time)
    assert result.bounded > 0
