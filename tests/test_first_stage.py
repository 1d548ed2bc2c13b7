"""An uneven first pipeline stage (Plan.first_stage_layers, Megatron-Core's decoder_first_pipeline_num_layers):
the layers each rank holds, that the estimate prices the first rank with its own layers (an even count reproduces
the even split exactly, fewer layers lighten the first rank's memory), the check's bounds, and that the Megatron
and NeMo emitters write it and read it back."""

from __future__ import annotations

import pytest

from meshplan.configs import emit, read
from meshplan.cost.params import layers_on_first, layers_on_last, layers_on_stage
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.search.refine import end_splits, refine_ends
from meshplan.specs.check import check
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.specs.supports import Supports

MODEL = load_model("llama3-8b")  # 32 layers
CLUSTER = load_system("h100").cluster(64)


def test_layers_per_rank():
    # 32 layers on p = 4, first f = 5: the middle and last ranks split 27 evenly, 9 each
    plan = Plan(dp=2, tp=8, pp=4, first_stage_layers=5)
    assert (layers_on_first(MODEL, plan), layers_on_stage(MODEL, plan), layers_on_last(MODEL, plan)) == (5, 9, 9)
    # with last l = 7 too: the 2 middle ranks split 32 - 5 - 7 = 20, 10 each
    plan = plan.with_(last_stage_layers=7)
    assert (layers_on_first(MODEL, plan), layers_on_stage(MODEL, plan), layers_on_last(MODEL, plan)) == (5, 10, 7)
    # p = 2 with both set: no middle rank (the divisor stays 1), each end keeps its own
    plan = Plan(dp=4, tp=8, pp=2, first_stage_layers=14, last_stage_layers=18)
    assert (layers_on_first(MODEL, plan), layers_on_last(MODEL, plan)) == (14, 18)
    # the even split without it: 32 / 4 = 8 everywhere
    plan = Plan(dp=2, tp=8, pp=4)
    assert (layers_on_first(MODEL, plan), layers_on_stage(MODEL, plan), layers_on_last(MODEL, plan)) == (8, 8, 8)


def test_estimate_prices_the_first_rank_with_its_layers():
    even = estimate(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4))
    # f = 8 is the even split's count: the same step and memory to the bit
    same = estimate(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4, first_stage_layers=8))
    assert (same.step_time, same.peak_memory) == (even.step_time, even.peak_memory)
    # f = 10 with last = 6: the 2 middle ranks 8 each, the first rank heavier (10 layers and the embedding) and slower
    first = estimate(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4, first_stage_layers=10, last_stage_layers=6))
    assert first.rank_memory[0] > even.rank_memory[0] and first.step_time > even.step_time
    # f = 11 with last = 7: 32 - 18 = 14 over the 2 middle ranks, 7 each; the first rank the busiest: slower still
    heavy = estimate(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4, first_stage_layers=11, last_stage_layers=7))
    assert heavy.rank_memory[0] > even.rank_memory[0] and heavy.step_time > even.step_time


def test_check_bounds():
    assert any("needs pp > 1" in r for r in check(MODEL, load_system("h100").cluster(8),
                                                     Plan(tp=8, first_stage_layers=4)))
    # 31 on the first of 4 ranks leaves 1 layer for 3 ranks
    assert any("leaves 1 of num_layers=32" in r for r in check(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4,
                                                                                     first_stage_layers=31)))
    assert not check(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4, first_stage_layers=9, last_stage_layers=5))
    # f = 5 leaves 9 layers on each other rank: a lighter first stage than the middle ones is priced rank by rank
    # (step/ranks.py, tests/test_stage_settings.py), refused only where the ranks cannot be priced apart
    assert not check(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4, first_stage_layers=5))
    assert any("more than the first" in r for r in check(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4, first_stage_layers=5,
                                                                               offload_weights=True)))
    # a framework without uneven stages refuses it
    assert "first_stage_layers=5" in Supports(uneven_stages=False).problems(Plan(dp=2, tp=8, pp=4,
                                                                                  first_stage_layers=5))


def test_megatron_and_nemo_write_and_read_it():
    plan = Plan(dp=2, tp=8, pp=4, first_stage_layers=5, last_stage_layers=6)
    text = emit("megatron", MODEL, plan, Stack())
    assert "--decoder-first-pipeline-num-layers 5" in text and "--decoder-last-pipeline-num-layers 6" in text
    assert read("megatron", MODEL, 64, text)[0].first_stage_layers == 5
    nemo = emit("nemo", MODEL, plan, Stack())
    assert "num_layers_in_first_pipeline_stage" in nemo
    assert read("nemo", MODEL, 64, nemo)[0].first_stage_layers == 5


def test_end_splits_keep_the_middle_ranks_even():
    # 32 layers on 4 ranks (even 8): f in 6..11 (2 below the even count: a lighter first stage, priced rank by rank),
    # l in 5..9, the 2 middle ranks splitting 32 - f - l evenly: (6, 6) leaves 20 = 2 * 10, (9, 5) 18 = 2 * 9; (8, 8)
    # is the even split itself, left out
    assert end_splits(32, 4, 1) == [(0, 0), (6, 6), (6, 8), (7, 5), (7, 7), (7, 9), (8, 6), (9, 5), (9, 7), (9, 9),
                                    (10, 6), (10, 8), (11, 5), (11, 7), (11, 9)]
    # DeepSeek-V3's 61 layers on 16 ranks (even ⌈61/16⌉ = 4): 4 + 1, 3 + 2 or 2 + 3 on the ends, 56 = 14 * 4 between
    assert end_splits(61, 16, 1) == [(0, 0), (2, 3), (3, 2), (4, 1)]
    for f, last in end_splits(80, 8, 1)[1:]:
        plan = Plan(dp=2, tp=4, pp=8, first_stage_layers=f, last_stage_layers=last)
        assert not check(load_model("llama3-70b"), CLUSTER, plan)


@pytest.mark.parametrize("name, gpus", [("llama3-70b", 64), ("llama3-8b", 16)])
def test_refined_first_plan_is_never_slower_nor_heavier_and_estimate_reproduces_it(name, gpus):
    model, cluster = load_model(name), load_system("h100").cluster(gpus)
    for plan in (Plan(dp=gpus // 16, tp=2, pp=8, recompute="none", global_batch=64),
                 Plan(dp=gpus // 16, tp=4, pp=4, global_batch=64)):
        even = estimate(model, cluster, plan)
        refined = refine_ends(model, cluster, even, even.stack, DEFAULT)
        assert refined.step_time <= even.step_time and refined.peak_memory <= even.peak_memory
        assert refined.fits == even.fits
        again = estimate(model, cluster, refined.plan)
        assert (again.step_time, again.peak_memory) == (refined.step_time, refined.peak_memory)
    # a framework without uneven stages keeps the plan as it is
    assert refine_ends(model, cluster, even, Stack(supports=Supports(uneven_stages=False)), DEFAULT) is even


def test_search_first_plan_is_refined_and_reproduced():
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(64)
    best = search(model, cluster, Space(global_batch=64), top_k=3).plans[0]
    assert estimate(model, cluster, best.plan).step_time == best.step_time
    if best.plan.pp > 1:  # the refinement never loses to the split the search found
        assert best.step_time <= refine_ends(model, cluster, best, Stack(), DEFAULT).step_time


def test_torchtitan_refuses_it():
    # torchtitan's pipeline stages hold equal layers: its emitter names the field and why
    with pytest.raises(Exception, match="first_stage_layers"):
        emit("torchtitan", MODEL, Plan(dp=2, tp=8, pp=4, zero=3, first_stage_layers=9), Stack())
