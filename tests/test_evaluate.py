"""search/evaluate.py: one share of the search, timing only the plans whose lower bound can reach the top k."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.search import evaluate as evaluate_module
from meshplan.search.batch import NUMERIC, PlanBatch
from meshplan.search.candidates import candidates, size_rows
from meshplan.search.combos import valid_combos
from meshplan.search.keyed import KeyUnits
from meshplan.search.placements import PLACEMENTS
from meshplan.search.tally import Tally
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


def test_the_plans_timed_are_those_built_for_their_keys_selected():
    """While the k-th best time is unknown, a piece's plans are built once for their keys (``KeyUnits.slots``) and
    those of the combinations that fit selected from them for timing: every column, stride and shape is the one the
    plans built anew for those combinations alone have (Llama-3-8B on 16 H100, every other combination kept)."""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(16)
    space = Space(**EVERY_PLAN, global_batch=64, layouts=("1d",))
    sized = size_rows(valid_combos(model, cluster, space)[0], cluster, space, Tally())
    assert sized is not None
    columns = {k: v for k, v in sized.columns.items() if k != "layout"}
    sized = type(sized)(columns, sized.pids, sized.start, sized.count)
    pool = PlanBatch(**columns, placements=PLACEMENTS, **space.settings)
    rows, shapes = np.arange(len(sized.count)), np.arange(len(sized.count)) * 7  # a shape per combination
    fits = rows % 2 == 0
    built, built_shapes = evaluate_module._plans(pool, sized, rows, shapes)
    kept = np.repeat(fits, sized.count[rows])
    selected, anew = built.select(kept), evaluate_module._plans(pool, sized, rows[fits], shapes)
    assert len(selected) == len(anew[0]) == int(sized.count[fits].sum()) < len(built)
    for name in (*NUMERIC, "placement_id"):
        assert np.array_equal(getattr(selected, name), getattr(anew[0], name)), name
        assert getattr(selected, name).dtype == getattr(anew[0], name).dtype, name
    assert all(np.array_equal(selected.strides[a], anew[0].strides[a]) for a in anew[0].strides)
    assert np.array_equal(built_shapes[kept], anew[1])
