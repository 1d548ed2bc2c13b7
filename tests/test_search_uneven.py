"""The search's uneven pipeline stages (Plan.last_stage_layers, combos.stage_options): the split counts it tries,
that it finds a faster uneven plan where the LM head weighs on the last rank and prices it as estimate() does, and
that a framework without uneven stages (Supports.uneven_stages) never gets one."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.search.candidates import candidates
from meshplan.search.combos import stage_options, valid_combos
from meshplan.search.evaluate import evaluate
from meshplan.specs.check import check
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.specs.supports import Supports
from spaces import EVERY_PLAN

NO_UNEVEN = Stack(supports=Supports(uneven_stages=False))


def test_stage_options_are_megatrons_exact_splits_below_the_even_one():
    # 32 layers on p = 4: even 8; last l in 4..7 with 32 - l split over 3 ranks: only l = 5 (27 = 3 * 9)
    assert stage_options(32, 4, [1], 1) == [(1, 0), (1, 5)]
    # interleaved v = 2: 9 layers per other rank is not 2 whole chunks, so v = 2 keeps the even split only
    assert stage_options(32, 4, [1, 2], 1) == [(1, 0), (1, 5), (2, 0)]
    # p = 2: any l in 12..15 leaves the other rank 32 - l; the nearest ones to the even 16 are kept
    assert stage_options(32, 2, [1], 1) == [(1, 0), (1, 15)]
    assert stage_options(32, 2, [1], 2) == [(1, 0), (1, 14), (1, 15)]
    assert stage_options(32, 2, [1], 9) == [(1, 0), (1, 12), (1, 13), (1, 14), (1, 15)]
    # DeepSeek-V3's 61 layers on p = 16: ⌈61/16⌉ = 4, l = 1 leaves 60 = 15 * 4 (the recipes' layout)
    assert stage_options(61, 16, [1], 1) == [(1, 0), (1, 1)]
    assert stage_options(32, 4, [1, 2], 0) == [(1, 0), (2, 0)]
    assert stage_options(32, 1, [1], 1) == [(1, 0)]


def test_every_uneven_candidate_passes_check():
    model, cluster = load_model("llama3-8b").with_seq_length(2048), load_system("h100").cluster(8)
    columns, _ = candidates(model, cluster, Space(**EVERY_PLAN, global_batch=32, layouts=("1d",), max_micro_batch=2))
    last, pp, vpp = columns["last_stage_layers"], columns["pp"], columns["vpp"]
    assert (last > 0).any() and not (last[pp == 1] > 0).any()
    for i in np.unique(np.flatnonzero(last > 0)[:: 50]):
        plan = Plan(dp=int(columns["dp"][i]), tp=int(columns["tp"][i]), pp=int(pp[i]), cp=int(columns["cp"][i]),
                    vpp=int(vpp[i]), last_stage_layers=int(last[i]), micro_batch=int(columns["micro_batch"][i]),
                    global_batch=32, schedule="interleaved" if vpp[i] > 1 else "1f1b")
        assert not check(model, cluster, plan), plan.describe()


def _best_pp4(model, cluster, space):
    """The fastest plan with pp = 4 as the search's vectorised path times it (float32), and the plan."""
    combos = [c for c in valid_combos(model, cluster, space)[0] if c.pp == 4]
    rows = []
    for mode in space.modes():
        part = evaluate(mode, [c for c in combos if c.layout == mode[0]], model, cluster, space, 1, DEFAULT)
        rows += part.best.rows[:1]
    time, _, (_, plan) = min(rows, key=lambda r: r[0])
    return time, plan


def test_llama3_8b_on_four_stages_runs_faster_with_fewer_layers_on_the_last():
    """Llama-3-8B's 128k-vocabulary LM head and loss sit on the last pipeline rank: with pp = 4 the search finds
    5 layers there (27 = 3 * 9 on the others) faster than the even 8, and estimate() gives the plan the same time."""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(8)
    even_time, even = _best_pp4(model, cluster, Space(**{**EVERY_PLAN, "stack": NO_UNEVEN}, global_batch=64))
    time, plan = _best_pp4(model, cluster, Space(**EVERY_PLAN, global_batch=64))
    assert even.last_stage_layers == 0 and plan.last_stage_layers == 5
    assert time < even_time * 0.99
    again = estimate(model, cluster, plan, Stack())
    assert again.fits and again.step_time == pytest.approx(time, rel=1e-6)
    # the same plan with the even split is slower
    assert estimate(model, cluster, plan.with_(last_stage_layers=0), Stack()).step_time > again.step_time


def test_the_whole_search_reports_an_uneven_winner_that_re_estimates_the_same():
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(8)
    space = Space(**EVERY_PLAN, global_batch=64, layouts=("1d",), cp_max=1, zero=(1,), recompute=("none",),
                  offload_optimizer=(False,), offload_activations=(False,))
    result = search(model, cluster, space, top_k=5, workers=1)
    top = result.plans[0]
    assert any(e.plan.last_stage_layers for e in result.plans)
    assert estimate(model, cluster, top.plan, space.stack).step_time == top.step_time


def test_a_framework_without_uneven_stages_never_gets_one():
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(8)
    space = Space(**{**EVERY_PLAN, "stack": NO_UNEVEN}, global_batch=64, uneven_stages=2)
    assert space.uneven_stages == 0  # narrowed to what the stack runs
    columns, _ = candidates(model, cluster, space)
    assert (columns["pp"] > 1).any() and not columns["last_stage_layers"].any()
    result = search(model, cluster, space, top_k=10, workers=1)
    assert result.plans and not any(e.plan.last_stage_layers for e in result.plans)
    assert all(NO_UNEVEN.supports.runs(e.plan) for e in result.plans)
