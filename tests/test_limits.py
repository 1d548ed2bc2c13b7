"""search/limits.py: a space's size, counted before any plan is built, and the refusal of one too large."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cli import main
from meshplan.errors import SpecError
from meshplan.search import Space, search
from meshplan.search.combos import valid_combos
from meshplan.search.limits import plan_count
from meshplan.search.placements import PLACEMENTS
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from test_search import SMALL

INTERLEAVE_REJECTED = "interleaved: pp does not divide the micro-batches"


@pytest.mark.parametrize("name, gpus", [("llama3-8b", 64), ("mixtral-8x7b", 32)])
def test_plan_count_is_what_the_search_evaluates_or_rejects_for_interleaving(name, gpus):
    """The space's size, counted before any plan is built, is the plans the search evaluates plus the
    interleaved ones it rejects because pp does not divide their micro-batches (both count every placement)."""
    model, cluster = load_model(name), load_system("h100").cluster(gpus)
    space = Space(global_batch=64, offload_optimizer=(False,))
    result = search(model, cluster, space, top_k=1, workers=1)
    combos, _ = valid_combos(model, cluster, space)
    count = plan_count(combos, cluster, space)
    assert count == result.evaluated + result.rejected.get(INTERLEAVE_REJECTED, 0)
    every_order = sum(c.unplaced for c in combos) * len(PLACEMENTS)
    assert count < every_order  # distinct placements are counted, not every axis order


def test_a_space_beyond_max_plans_is_refused_with_its_size(capsys):
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(64)
    combos, _ = valid_combos(model, cluster, SMALL)
    count = plan_count(combos, cluster, SMALL)
    search(model, cluster, replace(SMALL, max_plans=count), top_k=1)  # exactly at the limit: searched
    with pytest.raises(SpecError, match=f"holds {count:,} plans, more than max-plans={count - 1:,}: narrow it"):
        search(model, cluster, replace(SMALL, max_plans=count - 1), top_k=1)
    code = main(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "64", "--max-plans", "1000"])
    err = capsys.readouterr().err
    assert code == 2 and "more than max-plans=1,000" in err and err.count("\n") == 1
