"""The stage DP (search/stage_dp.py, issue 84 item 2): a layer count and a setting per pipeline rank
(Plan.stage_layers beside stage_recompute / stage_offload), proposed on the ranks' cost lines (stage_lines.py) and
kept only where estimate() says it is faster and fits: the search's #1 is never slower than the uniform plan (a
property over random draws), Megatron-Core's own layout parser reads what the emitter writes, and ``meshplan plan``
leads with a per-stage plan where one wins."""

from __future__ import annotations

import json
import math
import random

import pytest

from meshplan.cli import main
from meshplan.configs import emit, read
from meshplan.configs.layout import layout_string, stage_layers_of
from meshplan.errors import PlanError, SpecError
from meshplan.estimate import estimate
from meshplan.fields import usable_hbm
from meshplan.search import Space, search
from meshplan.search.stage_dp import (
    Allowed,
    dp_kinds,
    least_threshold,
    partition,
    per_rank_table,
    stage_dp,
    uniform_settings,
    written_out,
)
from meshplan.search.stage_lines import ends_reach, ends_step, priced_ranks, rank_lines
from meshplan.specs.check import check
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

L70 = load_model("llama3-70b")  # 80 layers
H100_32 = load_system("h100").cluster(32)
CORE, ANY = load_stack("megatron-core"), load_stack("any")
UNIFORM = Plan(dp=1, tp=4, pp=8, global_batch=128, recompute="full")
KINDS = dp_kinds(("none", "selective", "full"), False)


def test_stage_layers_of_the_even_split_is_the_uniform_plan():
    # 80 layers on 8 ranks: 10 each, priced rank by rank, the same step and memory as the end-rank composition
    even = estimate(L70, H100_32, UNIFORM, ANY)
    apart = estimate(L70, H100_32, UNIFORM.with_(stage_layers=(10,) * 8), ANY)
    assert apart.step_time == pytest.approx(even.step_time, rel=1e-12)
    assert apart.peak_memory == pytest.approx(even.peak_memory, rel=1e-12)
    assert len(apart.stage_memory) == 8


def test_the_even_split_written_out_is_not_priced_again():
    # stage_dp skips the proposal that is the plan itself, 10 layers a rank under its own setting (priced as it is,
    # above), and no other
    even = UNIFORM.with_(stage_layers=(10,) * 8, recompute_layers=0)
    assert written_out(L70, even, UNIFORM)
    assert not written_out(L70, UNIFORM.with_(stage_layers=(9,) + (10,) * 6 + (11,)), UNIFORM)
    assert not written_out(L70, even.with_(recompute="selective"), UNIFORM)
    assert not written_out(L70, even.with_(stage_recompute=("full",) * 8), UNIFORM)
    assert not written_out(L70, even, UNIFORM.with_(stage_layers=(10,) * 8))  # a split of its own: priced


def test_the_end_ranks_floor_the_step_as_the_estimate_prices_them():
    # refine_ranked skips a proposal whose end ranks alone take the refined plan's step: their steps are the
    # estimate's own (the same parts, units and price_rank), and the step adds the bubble to the busiest rank's
    for split in ((10,) * 8, (8, 10, 10, 10, 10, 10, 10, 12), (12, 10, 10, 10, 10, 10, 10, 8)):
        plan = UNIFORM.with_(stage_layers=split, stage_recompute=("selective",) + ("full",) * 7)
        est = estimate(L70, H100_32, plan, ANY)
        ends = ends_step(L70, H100_32, plan, ANY, DEFAULT)
        assert ends == max(est.stage_steps[0], est.stage_steps[-1])
        assert max(est.stage_steps) <= est.step_time
        for ceiling in (min(est.stage_steps[0], est.stage_steps[-1]), ends, math.nextafter(ends, math.inf)):
            assert ends_reach(L70, H100_32, plan, ANY, DEFAULT, ceiling) == (ends >= ceiling)


def test_a_rank_with_more_layers_is_slower_and_heavier():
    plan = UNIFORM.with_(stage_layers=(8, 10, 10, 10, 10, 10, 10, 12))
    est = estimate(L70, H100_32, plan, ANY)
    even = estimate(L70, H100_32, UNIFORM.with_(stage_layers=(10,) * 8), ANY)
    # the last rank's 12 layers against 10: its step grows by about 2/10 of its layers' time
    assert est.stage_steps[7] > even.stage_steps[7] * 1.1
    assert est.stage_steps[0] < even.stage_steps[0]
    assert est.step_time > even.step_time  # the last rank now bounds the step


@pytest.mark.parametrize("layers, why", [
    ((10,) * 7, "one count per pipeline rank"), ((10,) * 7 + (11,), "sums to 81"),
    ((0, 20) + (10,) * 6, "positive multiple of vpp"),
])
def test_check_refuses_a_wrong_split(layers, why):
    reasons = check(L70, H100_32, UNIFORM.with_(stage_layers=layers), ANY)
    assert any(why in r for r in reasons), reasons


def test_check_refuses_stage_layers_beside_the_end_counts():
    plan = UNIFORM.with_(stage_layers=(10,) * 8, first_stage_layers=9)
    assert any("must be 0 beside it" in r for r in check(L70, H100_32, plan, ANY))


def test_frameworks_without_a_layout_refuse_it():
    plan = UNIFORM.with_(stage_layers=(9, 11) + (10,) * 6)
    assert CORE.supports.runs(plan, L70, CORE)
    for name in ("torchtitan", "deepspeed", "nemo"):
        assert "stage_layers=9,11,10,10,10,10,10,10" in load_stack(name).supports.problems(plan)


def test_layout_string_round_trips_and_megatron_core_parses_it():
    from megatron.core.transformer import pipeline_parallel_layer_layout as layout  # the dev extra's megatron-core
    from megatron.core.transformer.enums import LayerType

    split = (8, 9, 10, 11, 11, 11, 11, 9)
    text = layout_string(split, 1)
    assert text.startswith("Et*8|t*9|") and text.endswith("|t*9L")
    assert stage_layers_of(text, 8) == (split, 1)
    parsed = layout.PipelineParallelLayerLayout(text, 8)  # Megatron-Core 0.16.1's own parser and checks
    parsed.validate_layer_layout(num_layers=80, mtp_num_layers=None)
    assert tuple(row[0].count(LayerType.decoder) for row in parsed.layout) == split
    # two chunks a rank and one MTP layer (DeepSeek-V3's 61 layers: 6 + 7 x 6 + 13 ... as the split says)
    split2 = (6, 8, 8, 8, 8, 8, 8, 7)
    text2 = layout_string((12, 16, 16, 16, 16, 16, 16, 14), 2, mtp_layers=1)
    parsed2 = layout.PipelineParallelLayerLayout(text2, 8)
    parsed2.validate_layer_layout(num_layers=122, mtp_num_layers=1)
    assert parsed2.virtual_pipeline_model_parallel_size == 2
    assert tuple(row[1].count(LayerType.decoder) for row in parsed2.layout) == split2
    assert stage_layers_of(text2, 8) == ((12, 16, 16, 16, 16, 16, 16, 14), 2)


def test_layout_string_read_refuses_garbage():
    with pytest.raises(SpecError, match="chunks of E, t, m and L"):
        stage_layers_of("Et*3|x", 2)


def test_megatron_emits_the_layout_and_reads_it_back():
    plan = UNIFORM.with_(recompute="none", stage_layers=(8, 9, 10, 11, 11, 11, 11, 9))
    text = emit("megatron", L70, plan, CORE)
    assert "--pipeline-model-parallel-layout 'Et*8|t*9|t*10|t*11|t*11|t*11|t*11|t*9L'" in text
    assert "--decoder-first-pipeline-num-layers" not in text
    back, stack = read("megatron", L70, 32, text=text)
    assert back.stage_layers == plan.stage_layers
    assert estimate(L70, H100_32, back, stack).step_time == pytest.approx(
        estimate(L70, H100_32, plan, CORE).step_time, rel=1e-12)
    with pytest.raises(SpecError, match="torchtitan cannot express stage_layers"):
        emit("torchtitan", L70, plan, load_stack("torchtitan"))
    # Megatron-Bridge's override of its TransformerConfig field, read back
    bridge = emit("nemo", L70, plan, load_stack("megatron-bridge"))
    assert "model.pipeline_model_parallel_layout=Et*8|t*9|t*10|t*11|t*11|t*11|t*11|t*9L" in bridge
    assert read("nemo", L70, 32, text=bridge)[0].stage_layers == plan.stage_layers


def test_priced_ranks_are_the_ends_and_the_runs_edges():
    a, b = H100_32, load_system("a100").cluster(32)
    assert priced_ranks([a] * 8) == [0, 1, 6, 7]
    assert priced_ranks([a, a, a, b, b, b]) == [0, 1, 2, 3, 4, 5]
    assert priced_ranks([a] * 4 + [b] * 4) == [0, 1, 3, 4, 6, 7]


def test_lines_pass_through_the_ranks_priced():
    # a middle rank's lines interpolated between its priced neighbours hold its own price within 1 %
    lines = rank_lines(L70, [H100_32] * 8, UNIFORM, ANY, DEFAULT)
    from meshplan.search.stage_lines import _priced, units_on  # noqa: PLC2701 (the module's own pricing)

    units = units_on(L70, H100_32, UNIFORM, ANY, DEFAULT)
    (cost,) = _priced(L70, H100_32, UNIFORM, ANY, units, DEFAULT, 4, 10, [("none", False)])
    line = lines[4][("none", False)]
    assert line.step.at(10) == pytest.approx(cost.step, rel=0.01)
    assert line.memory.at(10) == pytest.approx(cost.memory.total, rel=0.01)


@pytest.mark.parametrize("rank", [0, 3, 7])
def test_the_settings_of_a_rank_share_its_parameters_pricing_exactly(rank):
    # the lines price a rank's parameters' share once for its four settings (step.ranks.rank_shared): each setting's
    # price is the one price_rank makes on its own, to the bit
    from meshplan.search.stage_lines import BASES, _priced, _trial, units_on  # noqa: PLC2701 (the module's own)
    from meshplan.step.ranks import price_rank

    units = units_on(L70, H100_32, UNIFORM, ANY, DEFAULT)
    shared = _priced(L70, H100_32, UNIFORM, ANY, units, DEFAULT, rank, 10, BASES)
    alone = [price_rank(L70, H100_32, _trial(UNIFORM, 10, s), ANY, units, DEFAULT, rank) for s in BASES]
    assert shared == alone
    assert len({c.step for c in alone}) > 1  # the settings do price differently
    # the middle ranks of a cluster share it too: rank 3 priced after rank 1 (both holding 10 layers) is itself
    middle: dict = {}
    _priced(L70, H100_32, UNIFORM, ANY, units, DEFAULT, 1, 10, BASES, middle)
    assert _priced(L70, H100_32, UNIFORM, ANY, units, DEFAULT, rank, 10, BASES, middle) == alone
    assert len(middle) == 1


def test_the_middle_ranks_of_equal_counts_share_their_parameters_pricing_exactly():
    # assemble_ranks prices rank_shared once per middle layer count: each rank's price is the one price_rank makes
    # on its own, to the bit (ranks 1 to 6 hold 10, 10, 12, 12, 10 and 10 layers)
    from meshplan.step.ranks import assemble_ranks, price_rank, stage_modes
    from meshplan.step.units import timed_parts, units_for_recomputes

    plan = UNIFORM.with_(stage_layers=(8, 10, 10, 12, 12, 10, 10, 8), first_stage_layers=0, last_stage_layers=0)
    parts = timed_parts(L70, H100_32, plan, ANY, DEFAULT)
    units = units_for_recomputes(L70, plan, ANY, parts, stage_modes(plan), DEFAULT)
    alone = [price_rank(L70, H100_32, plan, ANY, units, DEFAULT, r) for r in range(8)]
    costs = assemble_ranks(L70, H100_32, plan, ANY, units, DEFAULT)
    assert costs.stage_steps == tuple(c.step for c in alone)
    assert costs.stage_memory == tuple(c.memory.total for c in alone)
    assert len({c.step for c in alone[1:-1]}) > 1  # the counts do price differently


def test_partition_is_the_least_step_split_under_the_lines():
    lines = rank_lines(L70, [H100_32] * 8, UNIFORM, ANY, DEFAULT)
    limits = [usable_hbm(H100_32.accelerator.hbm_bytes, 0.12)] * 8
    table = per_rank_table(lines, 80, limits, KINDS, 1)
    values, lo = least_threshold(table, 80)
    found = partition(table, 80, 1)
    best, split = found[0]
    assert sum(split) == 80 and best >= values[lo]  # the least threshold bounds the step from below
    # the even split under the same lines is no better
    steps, times, _ = table
    even = max(steps[r, 10] for r in range(8)) + (sum(times[r, 10] for r in range(8)) - max(
        times[r, 10] for r in range(8)))
    assert best <= even


def test_uniform_settings_are_megatron_cores():
    assert uniform_settings(("none", "full"), 4, 1) == [("none", 0), ("full", 0), ("recompute", 1),
                                                        ("recompute", 2), ("recompute", 3)]
    assert uniform_settings(("none", "full"), 4, 2) == [("none", 0), ("full", 0)]  # chunks: all or none


@pytest.mark.parametrize("stack", [CORE, ANY], ids=["megatron-core", "any"])
def test_the_dp_beats_uniform_full_recompute_on_llama3_70b(stack):
    # 80 layers on 8 ranks of 4 H100s, 128 micro-batches: uniform full recompute 43.5 s; the first ranks hold up to
    # 8 micro-batches in flight, the last 1, so fewer layers on the first ranks and no recompute fit: 33.5 s
    best = estimate(L70, H100_32, UNIFORM, stack)
    found = stage_dp(L70, [H100_32] * 8, best, best.plan, stack, DEFAULT, Allowed(KINDS, 0.12),
                     lambda q: estimate(L70, H100_32, q, stack))
    assert found.plan.stage_layers and sum(found.plan.stage_layers) == 80
    assert found.plan.stage_layers[0] < 10  # the first rank holds the most in flight
    assert found.step_time < 0.8 * best.step_time
    assert found.peak_memory <= usable_hbm(H100_32.accelerator.hbm_bytes, 0.12)
    assert stack.supports.runs(found.plan, L70, stack)
    assert estimate(L70, H100_32, found.plan, stack).step_time == found.step_time


def _random_pipelined(rng: random.Random):
    """A random pipelined plan of a preset on H100 / A100 / H200 that fits."""
    names = ("llama3-8b", "llama3-70b", "gpt3-175b", "mixtral-8x7b", "qwen3-30b-a3b", "llama3.1-405b")
    for _ in range(200):
        model = load_model(rng.choice(names))
        system = load_system(rng.choice(("h100", "a100", "h200")))
        pp = rng.choice([p for p in (2, 4, 8) if model.num_layers % p == 0] or [2])
        tp = rng.choice((2, 4, 8))
        dp = rng.choice((1, 2))
        cluster = system.cluster(dp * tp * pp)
        plan = Plan(dp=dp, tp=tp, pp=pp, global_batch=dp * rng.choice((8, 16, 32)),
                    recompute=rng.choice(("none", "selective", "full")))
        if check(model, cluster, plan, ANY):
            continue
        est = estimate(model, cluster, plan, ANY)
        if est.fits and est.peak_memory <= usable_hbm(cluster.accelerator.hbm_bytes, 0.12):
            return model, cluster, est
    raise AssertionError("no plan drawn")


@pytest.mark.parametrize("seed", range(8))
def test_property_the_dp_is_never_slower_than_the_uniform_plan(seed):
    rng = random.Random(8400 + seed)
    model, cluster, best = _random_pipelined(rng)
    for stack in (ANY, CORE):
        base = estimate(model, cluster, best.plan, stack)
        found = stage_dp(model, [cluster] * base.plan.pp, base, base.plan, stack, DEFAULT, Allowed(KINDS, 0.12),
                         lambda q, s=stack: estimate(model, cluster, q, s))
        assert found.step_time <= base.step_time
        assert found.fits and found.peak_memory <= max(usable_hbm(cluster.accelerator.hbm_bytes, 0.12),
                                                       base.peak_memory)
        if found is not base:
            assert stack.supports.runs(found.plan, model, stack)
            assert estimate(model, cluster, found.plan, stack).step_time == found.step_time


@pytest.mark.parametrize("name, n, gbs", [("llama3-70b", 32, 128), ("llama3-8b", 16, 64), ("mixtral-8x7b", 32, 64)])
def test_property_the_search_with_the_dp_leads_no_slower(name, n, gbs):
    model, cluster = load_model(name), load_system("h100").cluster(n)
    off = search(model, cluster, Space(global_batch=gbs), top_k=3, workers=1)
    on = search(model, cluster, Space(global_batch=gbs, stage_layers=True), top_k=3, workers=1)
    assert on.evaluated == off.evaluated and on.rejected == off.rejected  # the same space, refined after
    assert on.fastest.step_time <= off.fastest.step_time
    assert on.plans[0].step_time <= off.plans[0].step_time or on.plans[0].plan == off.plans[0].plan


def test_space_drops_the_dp_where_the_framework_has_no_layout():
    assert not Space(global_batch=64, stage_layers=True, stack=load_stack("torchtitan")).stage_layers
    assert Space(global_batch=64, stage_layers=True).stage_layers


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_leads_with_a_per_stage_plan_from_the_command_line(capsys):
    # Llama 3.1 405B on 256 H100 without offload: uniform #1 (tp 2, pp 32, cp 4, full recompute, first and last
    # stages of 3) 54.5 s; the stage DP on the fastest pipelined plans finds tp 4, pp 16, cp 4 with layers 7,8x14,7
    # and 4 layers a rank recomputed: 48.5 s, emitted as Megatron-Core's layout; at a 12 % headroom (the default's
    # 10 % fits a uniform plan without recompute, tp 8, pp 16, cp 2: 44.7 s, and leaves the stage DP nothing to win)
    args = ["plan", "--model", "llama3.1-405b", "--system", "h100", "--gpus", "256", "--global-batch", "256",
            "--no-offload", "--top", "3", "--headroom", "0.12"]
    on, off = (json.loads(_cli(capsys, *args, *extra, "--json")[1]) for extra in ((), ("--no-per-stage",)))
    lead, uniform = on["plans"][0], off["plans"][0]
    assert lead["plan"]["stage_layers"] and sum(lead["plan"]["stage_layers"]) == 126
    assert not uniform["plan"]["stage_layers"]
    assert lead["step_time_s"] < 0.95 * uniform["step_time_s"]
    code, text, _ = _cli(capsys, *args, "--emit", "megatron")
    first = lead["plan"]["stage_layers"][0]
    assert code == 0 and f"--pipeline-model-parallel-layout 'Et*{first}|" in text and "layers" in text


def test_estimate_takes_stage_layers_and_refuses_a_bad_one(capsys):
    base = ["estimate", "--model", "llama3-70b", "--system", "h100", "--gpus", "32", "--tp", "4", "--pp", "8"]
    code, out, _ = _cli(capsys, *base, "--global-batch", "128", "--recompute", "none", "--stage-layers",
                        "8,9,10,11,11,11,11,9", "--json")
    assert code == 0 and json.loads(out)["plan"]["stage_layers"] == [8, 9, 10, 11, 11, 11, 11, 9]
    code, _, err = _cli(capsys, *base, "--stage-layers", "8,9,x")
    assert code == 2 and "stage-layers=8,9,x" in err and "Traceback" not in err
    code, _, err = _cli(capsys, *base, "--stage-layers", "10,10")
    assert code == 2 and "stage_layers=10,10" in err


def test_plan_error_names_the_field():
    with pytest.raises(PlanError, match="stage_layers"):
        estimate(L70, H100_32, UNIFORM.with_(stage_layers=(40, 40)), ANY)


def test_the_least_threshold_is_the_least_largest_step_of_any_split():
    # every split of a few layers over a few ranks enumerated: the least T with a split whose every s_r <= T is the
    # least over the splits of their largest s_r (the min-max DP's answer), ∞ (the values' length) where none exists
    import itertools

    import numpy as np

    from meshplan.search.stage_dp import _least_times  # noqa: PLC2701 (the module's own DP)

    rng = np.random.default_rng(7)
    for _ in range(300):
        ranks, layers = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        steps = rng.integers(1, 20, size=(ranks, layers + 1)).astype(float)
        steps[rng.random(steps.shape) < rng.random()] = np.inf
        largest = [max(steps[r, n] for r, n in enumerate(split))
                   for split in itertools.product(range(layers + 1), repeat=ranks) if sum(split) == layers]
        least = min(largest, default=np.inf)
        values, lo = least_threshold((steps, steps, []), layers)
        assert (values[lo] if lo < len(values) else np.inf) == least
        # and the min-plus DP (on each rank's span of layer totals alone) finds a split of the least sum
        sums = [sum(steps[r, n] for r, n in enumerate(split))
                for split in itertools.product(range(layers + 1), repeat=ranks) if sum(split) == layers]
        (found,) = _least_times(steps[None], layers)
        assert (np.inf if found is None else sum(steps[r, n] for r, n in enumerate(found))) == min(sums, default=np.inf)


def test_the_dps_of_many_tables_in_one_pass_are_each_tables_own():
    # the uniform settings' min-max DPs and a table's thresholds' min-plus DPs run stacked (a count only another
    # table allows is ∞ in this one's): each table's answer is the one its DP alone gives, ties and none included
    import numpy as np

    from meshplan.search.stage_dp import _least_largest, _least_times, threshold_values  # noqa: PLC2701 (its own)

    rng = np.random.default_rng(11)
    for _ in range(300):
        tables, ranks, layers = int(rng.integers(1, 6)), int(rng.integers(1, 6)), int(rng.integers(1, 12))
        steps = rng.integers(1, 6, size=(tables, ranks, layers + 1)).astype(float)  # few values: many ties
        steps[rng.random(steps.shape) < rng.random()] = np.inf
        stacked = [(t, t, []) for t in steps]
        alone = [least_threshold(t, layers) for t in stacked]
        together = [threshold_values(t, least) for t, least in zip(steps, _least_largest(steps, layers), strict=True)]
        assert [(list(v), lo) for v, lo in together] == [(list(v), lo) for v, lo in alone]
        assert _least_times(steps, layers) == [_least_times(t[None], layers)[0] for t in steps]


def test_the_dp_prices_only_the_lines_it_reads():
    # one setting for every rank (Megatron-Core): no rank offloads N layers, so the offloaded lines are not priced;
    # a rank of its own setting (any) prices them where it may offload, and without chunks only
    from meshplan.search.stage_dp import bases

    assert bases(KINDS, False, 1) == (("none", False), ("selective", False), ("full", False))
    assert bases(("none", "full", "recompute", "offload"), True, 1) == (("none", False), ("full", False),
                                                                          ("none", True))
    assert bases(("none", "full", "recompute", "offload"), True, 2) == (("none", False), ("full", False))
    assert bases(("none",), True, 1) == (("none", False),)
