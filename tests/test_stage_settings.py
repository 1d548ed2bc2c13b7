"""Every pipeline rank priced apart (step/ranks.py; issue 50 item 3): it reproduces the end-rank step of
step/assemble.py where the ranks are alike beyond the ends, prices a first stage lighter than the middle ones (the
middle rank then bounds the step and, with the first ranks' micro-batches in flight, the memory), and per-rank
recompute and offload (Plan.stage_recompute, Plan.stage_offload): each rank's memory and time move with its own
setting only, and the first rank, holding p micro-batches in flight under 1F1B against the last rank's 1, is the one
that needs the recompute."""

from __future__ import annotations

import dataclasses
import json

import pytest

from meshplan.configs import emit, read
from meshplan.cost.params import kind_params, middle_params, stage_params
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.memory import layer_input_bytes
from meshplan.search import Space, search
from meshplan.search.stage_settings import refine_stages
from meshplan.specs.check import check
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.specs.supports import Supports
from meshplan.step.ranks import assemble_ranks, priced_apart
from meshplan.step.units import timed_parts, units_for_recomputes

MODEL = load_model("llama3-8b")  # 32 layers
CLUSTER = load_system("h100").cluster(64)
ANY = load_stack("any")
GIB = 2**30


def _apart(plan: Plan):
    """``plan`` priced rank by rank even where estimate would price its end ranks only."""
    parts = timed_parts(MODEL, CLUSTER, plan, ANY, DEFAULT)
    units = units_for_recomputes(MODEL, plan, ANY, parts, (plan.recompute,), DEFAULT)
    return assemble_ranks(MODEL, CLUSTER, plan, ANY, units, DEFAULT)


@pytest.mark.parametrize("plan", [
    Plan(dp=2, tp=8, pp=4, global_batch=64),
    Plan(dp=2, tp=8, pp=4, global_batch=64, recompute="full", recompute_layers=3),
    Plan(dp=4, tp=4, pp=4, vpp=2, global_batch=64, last_stage_layers=5),
    Plan(dp=2, tp=8, pp=4, global_batch=64, schedule="zb-h1"),
    Plan(dp=2, tp=8, pp=4, global_batch=64, offload_activations=True, offload_layers=2),
    Plan(dp=4, tp=8, pp=2, global_batch=64, first_stage_layers=15),
])
def test_ranks_apart_reproduce_the_end_ranks(plan):
    # ranks alike beyond the ends: the busiest and the heaviest rank are an end one, and the flow-shop bubble
    # (Σ t_r − max t_r)/v is ((p − 2)·t_middle + t_other_end)/v: the same step and peak to rounding
    even, apart = estimate(MODEL, CLUSTER, plan, ANY), _apart(plan)
    assert not priced_apart(MODEL, plan)
    assert apart.step_time == pytest.approx(even.step_time, rel=1e-12)
    assert apart.peak_memory == pytest.approx(even.peak_memory, rel=1e-12)
    assert apart.stage_memory[0] == pytest.approx(even.rank_memory[0], rel=1e-12)
    assert apart.stage_memory[-1] == pytest.approx(even.rank_memory[1], rel=1e-12)


def test_a_lighter_first_stage_is_priced_by_its_middle_ranks():
    # f = 5 of 32 layers on p = 4: the others hold 9 each; 1F1B with m = 64 / 2 = 32 micro-batches
    plan = Plan(dp=2, tp=8, pp=4, global_batch=64, first_stage_layers=5)
    assert priced_apart(MODEL, plan) and not check(MODEL, CLUSTER, plan)
    e = estimate(MODEL, CLUSTER, plan, ANY)
    steps, mem = e.stage_steps, e.stage_memory
    # the middle ranks (9 layers) are busier than the first (5 layers and the embedding): rank 1 bounds the step
    # unless the last (9 layers and the head) is busier still; the step is the busiest rank's plus the bubble
    assert steps[1] > steps[0] and steps[1] == steps[2]
    assert e.step_time == pytest.approx(max(steps) + e.breakdown["bubble"], rel=1e-12)
    # rank 1 holds p − 1 = 3 micro-batches of 9 layers (27 layer-micro-batches), the first p = 4 of 5 (20): rank 1
    # is the heavier and the peak is its own
    assert mem[1] > mem[0] and e.peak_memory == max(mem)
    # the even split's first rank (8 layers and the embedding) is slower than f = 5's
    even = estimate(MODEL, CLUSTER, plan.with_(first_stage_layers=0), ANY)
    assert not even.stage_steps and e.rank_memory[0] < even.rank_memory[0]


def test_stage_recompute_moves_each_rank_by_its_own_setting():
    base = Plan(dp=2, tp=8, pp=4, global_batch=64, recompute="none")
    none = estimate(MODEL, CLUSTER, base.with_(stage_recompute=("none",) * 4), ANY)
    # full recompute on rank 0 only: its memory drops and its step grows (a forward again), the others unchanged
    full0 = estimate(MODEL, CLUSTER, base.with_(stage_recompute=("full", "none", "none", "none")), ANY)
    assert full0.stage_memory[0] < none.stage_memory[0] and full0.stage_steps[0] > none.stage_steps[0]
    assert full0.stage_memory[1:] == none.stage_memory[1:] and full0.stage_steps[1:] == none.stage_steps[1:]
    # N = 3 of rank 0's 8 layers fully recomputed lies between none and full in both
    three = estimate(MODEL, CLUSTER, base.with_(stage_recompute=("3", "none", "none", "none")), ANY)
    assert full0.stage_memory[0] < three.stage_memory[0] < none.stage_memory[0]
    assert none.stage_steps[0] < three.stage_steps[0] < full0.stage_steps[0]
    # every rank "none" is the uniform plan's numbers rank by rank (its ends: estimate's end ranks)
    uniform = estimate(MODEL, CLUSTER, base, ANY)
    assert none.step_time == pytest.approx(uniform.step_time, rel=1e-12)
    assert none.peak_memory == pytest.approx(uniform.peak_memory, rel=1e-12)


def test_the_first_ranks_hold_the_most_micro_batches():
    # 1F1B on p = 4, m = 32: rank r holds p − r micro-batches of its 8 layers, ranks 1 and 2 (no embedding nor head)
    # 3 and 2
    e = estimate(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4, global_batch=64, recompute="none",
                                      stage_recompute=("none",) * 4), ANY)
    states = estimate(MODEL, CLUSTER, Plan(dp=2, tp=8, pp=4, global_batch=64, recompute="none",
                                           stage_recompute=("none", "full", "full", "none")), ANY)
    # under full recompute a middle rank keeps each layer's input I instead of its saved S for its (p − r)·8
    # layer-micro-batches, and holds one layer's S while it recomputes: it saves (p − r)·8·(S − I) − S
    plan = Plan(dp=2, tp=8, pp=4, global_batch=64, recompute="none")
    big_s = units_for_recomputes(MODEL, plan, ANY, timed_parts(MODEL, CLUSTER, plan, ANY, DEFAULT), ("none",),
                                 DEFAULT)["none"].layer_saved
    big_i = layer_input_bytes(MODEL, plan)
    for rank, in_flight in ((1, 3), (2, 2)):
        saved = e.stage_memory[rank] - states.stage_memory[rank]
        assert saved == pytest.approx(in_flight * 8 * (big_s - big_i) - big_s, rel=1e-9)


def test_stage_offload_lightens_its_rank():
    base = Plan(dp=2, tp=8, pp=4, global_batch=64, recompute="none")
    off = estimate(MODEL, CLUSTER, base.with_(stage_offload=(4, 0, 0, 0)), ANY)
    none = estimate(MODEL, CLUSTER, base.with_(stage_recompute=("none",) * 4), ANY)
    assert off.stage_memory[0] < none.stage_memory[0] and off.stage_memory[1:] == none.stage_memory[1:]
    assert off.host_memory > 0 and none.host_memory == 0


def test_checks_and_frameworks():
    plan = Plan(dp=2, tp=8, pp=4, global_batch=64)
    assert any("one entry per pipeline rank (pp=4)" in r for r in check(MODEL, CLUSTER, plan.with_(
        stage_recompute=("full", "none"))))
    assert any("entry 'most'" in r for r in check(MODEL, CLUSTER, plan.with_(stage_recompute=("most",) * 4)))
    assert any("dualpipe" in r for r in check(MODEL, CLUSTER, plan.with_(schedule="dualpipe",
                                                                         stage_offload=(1, 0, 0, 0))))
    assert "stage_recompute=full,none,none,none" in Supports(stage_settings=False).problems(
        plan.with_(stage_recompute=("full", "none", "none", "none")))
    # Megatron-Core runs one recompute setting on every rank (TransformerConfig): its preset refuses per-rank ones
    assert not load_stack("megatron-core").supports.stage_settings and ANY.supports.stage_settings


BIG = load_model("llama3-70b")  # 80 layers
SMALL = load_system("h100").cluster(32)
NO_OFFLOAD = ANY.with_(supports=dataclasses.replace(ANY.supports, offload_activations=False))


def _weight(entry: str) -> int:
    """How much a per-rank recompute entry recomputes: none < selective < N layers < full."""
    return {"none": 0, "selective": 1, "full": 1000}.get(entry, 2 + int(entry) if entry.isdigit() else 0)


def test_the_first_ranks_recompute_the_most():
    # 70B on 32 H100 at tp=4, pp=8, m = 64: no recompute needs 82.4 GiB on rank 0 (8 micro-batches of 10 layers in
    # flight), past the 71.6 GiB the 10 % headroom leaves; full recompute everywhere fits at 43.5 GiB, 22.6 s
    uniform = estimate(BIG, SMALL, Plan(dp=1, tp=4, pp=8, global_batch=64, recompute="full"), NO_OFFLOAD)
    refined = refine_stages(BIG, SMALL, uniform, Space(global_batch=64, stack=NO_OFFLOAD), DEFAULT)
    entries = refined.plan.stage_recompute
    assert refined.fits and refined.step_time < 0.8 * uniform.step_time  # 22.6 -> 17.5 s
    assert max(refined.stage_memory) <= 0.91 * CLUSTER.accelerator.hbm_bytes
    # rank r holds p − r micro-batches: the recompute each rank needs falls along the pipeline, the last ranks none
    weights = [_weight(e) for e in entries]
    assert weights == sorted(weights, reverse=True) and weights[0] > 0 and entries[-1] == "none"
    # estimate reproduces the refined plan from its fields alone
    again = estimate(BIG, SMALL, refined.plan, NO_OFFLOAD)
    assert (again.step_time, again.peak_memory) == (refined.step_time, refined.peak_memory)


@pytest.mark.parametrize("plan, stack", [
    (Plan(dp=1, tp=4, pp=8, global_batch=64, recompute="full"), ANY),
    (Plan(dp=1, tp=4, pp=8, global_batch=64, recompute="full"), NO_OFFLOAD),
    (Plan(dp=2, tp=4, pp=4, global_batch=64, recompute="full"), NO_OFFLOAD),
    (Plan(dp=1, tp=8, pp=4, global_batch=32, recompute="full", recompute_layers=10), NO_OFFLOAD),
    (Plan(dp=1, tp=4, pp=8, vpp=2, global_batch=64, recompute="full"), NO_OFFLOAD),
    (Plan(dp=2, tp=4, pp=4, global_batch=64, recompute="selective"), ANY),
    (Plan(dp=1, tp=4, pp=8, global_batch=64, recompute="none", offload_activations=True), ANY),
])
def test_per_rank_settings_are_never_slower_than_the_uniform_plan(plan, stack):
    uniform = estimate(BIG, SMALL, plan, stack)
    refined = refine_stages(BIG, SMALL, uniform, Space(global_batch=64, stack=stack), DEFAULT)
    assert refined.step_time <= uniform.step_time
    assert refined.fits == uniform.fits
    if refined is not uniform:
        assert refined.peak_memory <= 0.91 * SMALL.accelerator.hbm_bytes
        assert estimate(BIG, SMALL, refined.plan, stack).step_time == refined.step_time


def test_frameworks_without_per_rank_settings_keep_the_plan():
    uniform = estimate(BIG, SMALL, Plan(dp=1, tp=4, pp=8, global_batch=64, recompute="full"))
    assert refine_stages(BIG, SMALL, uniform, Space(global_batch=64), DEFAULT) is uniform


def test_search_first_plan_runs_per_rank_settings():
    # no offload at all (the optimizer's on the host would leave rank 0 room without recompute): tp=4, pp=8
    stack = NO_OFFLOAD.with_(supports=dataclasses.replace(NO_OFFLOAD.supports, offload_optimizer=False))
    space = Space(global_batch=64, stack=stack, pinned=(("tp", (4,)), ("pp", (8,)), ("vpp", (1,))))
    best = search(BIG, SMALL, space, top_k=3, workers=1).plans[0]
    assert best.plan.stage_recompute and best.fits
    again = estimate(BIG, SMALL, best.plan, stack)
    assert again.step_time == best.step_time


def test_megatron_writes_the_most_any_rank_needs():
    plan = Plan(dp=1, tp=4, pp=8, global_batch=64, stage_recompute=("3", "1", *("none",) * 6))
    text = emit("megatron", BIG, plan, load_stack("megatron-core"))
    # one recompute setting for every rank: rank 0's 3 layers (--recompute-method block), and a comment that says so
    assert "--recompute-method block" in text and "--recompute-num-layers 3" in text
    assert "per-rank recompute 3,1,none,none,none,none,none,none" in text
    back = read("megatron", BIG, 32, text)[0]
    assert (back.recompute, back.recompute_layers, back.stage_recompute) == ("full", 3, ())
    written, ours = (estimate(BIG, SMALL, p, ANY) for p in (back, plan))
    # every rank recomputing rank 0's 3 layers: no rank heavier than under its own setting, the step no faster
    assert written.step_time >= ours.step_time and written.peak_memory <= ours.peak_memory
    with pytest.raises(SpecError, match="stage_offload"):
        emit("megatron", BIG, plan.with_(stage_offload=(2, *(0,) * 7)), load_stack("megatron-core"))
    with pytest.raises(SpecError, match="stage_recompute"):
        emit("torchtitan", BIG, plan.with_(zero=3), load_stack("torchtitan"))


def test_estimate_and_plan_on_the_command_line(capsys):
    from meshplan.cli import main

    base = ["--model", "llama3-70b", "--system", "h100", "--gpus", "32", "--global-batch", "64", "--framework", "any"]
    assert main(["estimate", *base, "--tp", "4", "--pp", "8", "--stage-recompute", "3,1,none,none,none,none,none,none",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["stage_recompute"] == ["3", "1", *["none"] * 6] and len(data["stage_steps_s"]) == 8
    assert data["peak_memory_bytes"] == max(data["stage_memory_bytes"])
    # the text report lists every rank: its layers, its recompute, its step and memory
    assert main(["estimate", *base, "--tp", "4", "--pp", "8", "--stage-recompute", "full,2,none,none,none,none,none,"
                 "none", "--stage-offload", "1,0,0,0,0,0,0,0"]) == 0
    out = capsys.readouterr().out
    assert "pipeline ranks" in out and "full 2" in out
    # bad input: one line naming the field, exit code 2
    assert main(["estimate", *base, "--tp", "4", "--pp", "8", "--stage-recompute", "full,none"]) == 2
    assert "stage_recompute=full,none needs one entry per pipeline rank (pp=8)" in capsys.readouterr().err
    assert main(["estimate", *base, "--tp", "4", "--pp", "8", "--stage-offload", "1,x"]) == 2
    assert "stage-offload=1,x must list" in capsys.readouterr().err
    # plan: the first plan's recompute column per rank (3,1,-,…: rank 0 three layers, rank 1 one, the others none)
    # (without the stage DP, which finds per-rank layer counts beat it here: tests/test_stage_dp.py)
    assert main(["plan", *base, "--tp", "4", "--pp", "8", "--vpp", "1", "--no-offload", "--no-per-stage",
                 "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    assert first["stage_recompute"] and first["stage_recompute"][0] != "none"
    assert main(["plan", *base, "--tp", "4", "--pp", "8", "--vpp", "1", "--no-offload", "--no-per-stage"]) == 0
    cell = ",".join({"none": "-", "selective": "sel"}.get(e, e) for e in first["stage_recompute"])
    out = capsys.readouterr().out
    assert f"│ {cell}" in out and "pipeline ranks" in out  # the table's recompute column, #1's per-rank table


def test_a_middle_rank_with_more_expert_layers_is_priced():
    # DeepSeek-V3 (61 layers, the first 3 dense) on 16 ranks, the last holding 1: the first rank holds 3 dense + 1
    # MoE layers, every middle rank 4 MoE layers (56 = 14 · 4), each MoE layer 256 routed experts over ep = 8
    model, cluster = load_model("deepseek-v3"), load_system("b200").cluster(1024)
    plan = Plan(dp=64, tp=1, pp=16, ep=8, last_stage_layers=1, global_batch=4096)
    first, middle = stage_params(model, plan, True), middle_params(model, plan)
    per_layer = kind_params(model, plan, "moe").expert
    assert (first.expert, middle.expert) == (pytest.approx(1 * per_layer), pytest.approx(4 * per_layer))
    e = estimate(model, cluster, plan, ANY)
    apart = _apart_of(model, cluster, plan)
    # the middle rank 1 (15 micro-batches in flight, 4 MoE layers' states) is the heaviest and, its expert gradients
    # reduced over the expert-data-parallel ranks, the busiest: estimate's step and peak are its own, rank by rank
    assert apart.stage_memory[1] == max(apart.stage_memory) > apart.stage_memory[0]
    assert apart.stage_steps[1] == max(apart.stage_steps) > apart.stage_steps[0]
    assert e.step_time == pytest.approx(apart.step_time, rel=1e-12)
    assert e.peak_memory == pytest.approx(apart.peak_memory, rel=1e-12)


def _apart_of(model, cluster, plan):
    parts = timed_parts(model, cluster, plan, ANY, DEFAULT)
    units = units_for_recomputes(model, plan, ANY, parts, (plan.recompute,), DEFAULT)
    return assemble_ranks(model, cluster, plan, ANY, units, DEFAULT)


@pytest.mark.parametrize("name, gpus, plan, stack", [
    ("llama3-70b", 64, Plan(dp=2, tp=4, pp=8, global_batch=256), "any"),
    ("llama3-70b", 64, Plan(dp=2, tp=4, pp=8, vpp=5, global_batch=256, recompute="full"), "any"),
    ("mixtral-8x7b", 64, Plan(dp=4, tp=4, pp=4, ep=4, global_batch=256), "any"),
    ("deepseek-v3", 1024, Plan(dp=64, tp=1, pp=16, ep=8, last_stage_layers=1, global_batch=4096), "any"),
    # torch.distributed.pipelining's boundaries: a middle rank keeps 4·m·v of them (m = 64 here)
    ("llama3-8b", 64, Plan(dp=2, tp=8, pp=4, zero=2, global_batch=128, recompute="none"), "torchtitan"),
])
def test_the_ranks_estimate_prices_are_every_rank(name, gpus, plan, stack):
    # estimate prices the ends and, where it may bind (step/grid.middle_may_bind), the middle rank 1: the same step and
    # peak as every rank priced one by one
    model, cluster, preset = load_model(name), load_system("h100" if gpus < 1024 else "b200").cluster(gpus), load_stack(
        stack)
    e = estimate(model, cluster, plan, preset)
    parts = timed_parts(model, cluster, plan, preset, DEFAULT)
    units = units_for_recomputes(model, plan, preset, parts, (plan.recompute,), DEFAULT)
    apart = assemble_ranks(model, cluster, plan, preset, units, DEFAULT)
    assert e.step_time == pytest.approx(apart.step_time, rel=1e-12)
    assert e.peak_memory == pytest.approx(apart.peak_memory, rel=1e-12)


def test_hardware_flops_count_each_ranks_recompute():
    # every rank recomputing in full, given per rank, counts the same recomputed FLOPs as the uniform plan; rank 0
    # alone of 4 (8 of the 32 layers) a quarter of them
    plan = Plan(dp=2, tp=8, pp=4, global_batch=64, recompute="full")
    full = estimate(MODEL, CLUSTER, plan, ANY)
    each = estimate(MODEL, CLUSTER, plan.with_(stage_recompute=("full",) * 4), ANY)
    one = estimate(MODEL, CLUSTER, plan.with_(stage_recompute=("full", "none", "none", "none")), ANY)
    redone = full.hardware_flops - full.model_flops
    assert each.hardware_flops == pytest.approx(full.hardware_flops, rel=1e-12)
    assert one.hardware_flops - one.model_flops == pytest.approx(redone / 4, rel=1e-12)
