"""An uneven first pipeline stage (Plan.first_stage_layers, Megatron-Core's decoder_first_pipeline_num_layers):
the layers each rank holds, that the estimate prices the first rank with its own layers (an even count reproduces
the even split exactly, fewer layers lighten the first rank's memory), the check's bounds, and that the Megatron
and NeMo emitters write it and read it back."""

from __future__ import annotations

from meshplan.configs import emit, read
from meshplan.cost.params import layers_on_first, layers_on_last, layers_on_stage
from meshplan.estimate import estimate
from meshplan.specs.check import check
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
    # f = 5 leaves 9 on the others: the first rank lighter (memory), the step slower (9 > 8 layers on the others)
    light = estimate(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4, first_stage_layers=5))
    assert light.rank_memory[0] < even.rank_memory[0]
    assert light.step_time > even.step_time
    # f = 11 with last = 7: 32 - 18 = 14 over the 2 middle ranks, 7 each; the first rank the busiest: slower still
    heavy = estimate(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4, first_stage_layers=11, last_stage_layers=7))
    assert heavy.rank_memory[0] > even.rank_memory[0] and heavy.step_time > even.step_time


def test_check_bounds():
    assert any("needs pp > 1" in r for r in check(MODEL, load_system("h100").cluster(8),
                                                     Plan(tp=8, first_stage_layers=4)))
    # 31 on the first of 4 ranks leaves 1 layer for 3 ranks
    assert any("leaves 1 of num_layers=32" in r for r in check(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4,
                                                                                     first_stage_layers=31)))
    assert not check(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4, first_stage_layers=5))
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
