"""The asynchronous pipeline schedules, PipeDream (Narayanan et al., SOSP 2019) and PipeDream-2BW (Narayanan et al.,
ICML 2021): their steady state on the one simulator, their weight versions off the tables against memory.py's closed
form, the step's cadence of weight updates, the search's opt-in, and the lines that refuse what makes no sense."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan import Plan, load_model, load_system
from meshplan.cli import main
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.memory import model_state_memory, weight_versions
from meshplan.pipeline.equal_ranks import in_flight, step_time
from meshplan.pipeline.names import ASYNC
from meshplan.pipeline.simulator import simulate
from meshplan.pipeline.steady import steady_step, table_weight_versions
from meshplan.pipeline.tables import build
from meshplan.search import Space, search
from meshplan.specs.check import check
from meshplan.specs.stack import load_stack

F, B = 1.0, 2.0  # forward and backward of one micro-batch through one stage


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 4), (4, 8), (8, 8), (8, 32)])
def test_2bw_steady_step_is_m_passes_with_no_bubble(p, m):
    # p = 4, m = 8: the steady step is 8 * (1 + 2) = 24 s; 1F1B flushes: (8 + 4 - 1) * 3 = 33 s, a bubble of 3 * 3 = 9
    assert steady_step("pipedream-2bw", p, m, F, B) == m * (F + B)
    synchronous = simulate(build("1f1b", p, m), F, B)
    assert synchronous.step_time == step_time("1f1b", p, m, 1, F, B) == (m + p - 1) * (F + B)
    assert synchronous.bubble_time == (p - 1) * (F + B)
    assert step_time("pipedream-2bw", p, m, 1, F, B) == m * (F + B)


@pytest.mark.parametrize(("p", "m"), [(4, 1), (4, 3), (3, 5), (8, 2)])
def test_pipedream_steady_step_has_no_bubble_even_with_fewer_micro_batches_than_stages(p, m):
    # p = 4, m = 1: 1 * 3 = 3 s per step, where a flushed 1F1B step takes (1 + 3) * 3 = 12 s
    assert steady_step("pipedream", p, m, F, B) == m * (F + B)


def test_the_steady_step_is_the_slowest_stage_on_unequal_stages():
    # stage 1 takes 2 + 4 = 6 s per micro-batch: 3 micro-batches take 18 s; the others wait for it
    assert steady_step("pipedream", 4, 3, [1, 2, 1, 1], [2, 4, 2, 2]) == 3 * 6
    assert steady_step("pipedream-2bw", 4, 4, [1, 1, 1, 3], [2, 2, 2, 3]) == 4 * 6


def test_p2p_latency_only_lengthens_the_steady_step():
    base = steady_step("pipedream-2bw", 4, 8, F, B)
    assert steady_step("pipedream-2bw", 4, 8, F, B, 0.25) >= base


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 4), (4, 6), (8, 8)])
def test_weight_versions_off_the_tables_match_the_closed_form(p, m):
    # PipeDream: rank r stashes one version per micro-batch in flight, p - r (p = 4: 4, 3, 2, 1);
    # 2BW: two, one on the last rank (its forward and backward of a micro-batch are adjacent)
    stash = table_weight_versions(build("pipedream", p, m, steps=4), every=1)
    double = table_weight_versions(build("pipedream-2bw", p, m, steps=4), every=m)
    assert stash == tuple(p - r for r in range(p))
    assert double == tuple(min(2, p - r) for r in range(p))
    assert table_weight_versions(build("1f1b", p, m), every=m) == (1,) * p
    for schedule, table in (("pipedream", stash), ("pipedream-2bw", double)):
        plan = Plan(dp=1, pp=p, global_batch=m, schedule=schedule)
        assert (weight_versions(plan), weight_versions(plan, last=True)) == (table[0], table[-1])


@pytest.mark.parametrize("schedule", ASYNC)
def test_in_flight_is_p_minus_r_without_a_flush(schedule):
    # steps follow without a flush: rank r holds p - r micro-batches whatever m (4, 3, 2, 1 for p = 4)
    p, m = 4, 4
    timeline = simulate(build(schedule, p, m, steps=3), F, B)
    assert timeline.max_in_flight == tuple(in_flight(schedule, p, m, 1, r) for r in range(p)) == (4, 3, 2, 1)


def test_extra_weight_versions_in_memory():
    # Llama-3-8B, pp = 4: the first rank keeps 4 (PipeDream) or 2 (2BW) copies of its weights, the last rank one
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(32)
    base = Plan(dp=2, tp=4, pp=4, global_batch=64, sequence_parallel=True, zero=1)
    (w1, _, _), (l1, _, _) = model_state_memory(model, base, load_stack("any"))
    for schedule, versions in (("pipedream", 4), ("pipedream-2bw", 2)):
        (w, _, _), (last, _, _) = model_state_memory(model, replace(base, schedule=schedule), load_stack("any"))
        assert w == pytest.approx(versions * w1, rel=1e-12)
        assert last == l1
    assert estimate(model, cluster, replace(base, schedule="pipedream")).peak_memory > estimate(
        model, cluster, base).peak_memory


def test_step_cadence_and_no_bubble():
    # m = 16 micro-batches: 2BW is 1F1B without its bubble; PipeDream updates after every micro-batch: 16 optimizer
    # steps and 16 gradient reductions (each beside one backward) per step
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(32)
    base = Plan(dp=2, tp=4, pp=4, global_batch=32, sequence_parallel=True, zero=0)
    sync, two, stash = (estimate(model, cluster, replace(base, schedule=s))
                        for s in ("1f1b", "pipedream-2bw", "pipedream"))
    assert sync.breakdown["bubble"] > 0 and two.breakdown["bubble"] == stash.breakdown["bubble"] == 0
    assert two.step_time == pytest.approx(sync.step_time - sync.breakdown["bubble"], rel=1e-12)
    assert stash.breakdown["optimizer"] == pytest.approx(16 * two.breakdown["optimizer"], rel=1e-12)
    assert stash.breakdown["dp"] >= two.breakdown["dp"]
    rows = {r.name: r.count for r in stash.ops}
    assert rows["optimizer/adam"] == 16 and rows["dp/grad_all_reduce"] == 16


def test_more_rate_never_slows_and_more_latency_never_speeds_an_asynchronous_step():
    """The property tests' draws (test_properties.triples) with a pipeline of one chunk per rank, rescheduled
    asynchronously: every rate x2 and x10, every latency x100."""
    from test_properties import latencies, rates, triples, with_latency, with_rate

    checked = 0
    for model, cluster, plan, stack in triples():
        if plan.pp == 1 or plan.vpp > 1:
            continue
        schedule = "pipedream-2bw" if plan.grad_accum >= plan.pp else "pipedream"
        plan = replace(plan, schedule=schedule)
        if check(model, cluster, plan, stack):
            continue
        t = estimate(model, cluster, plan, stack).step_time
        for rate in rates(cluster):
            for factor in (2.0, 10.0):
                faster = estimate(model, with_rate(cluster, rate, factor, plan.precision), plan, stack).step_time
                assert faster <= t * (1 + 1e-9), (rate, factor, plan.describe())
        for latency in latencies(cluster):
            slower = estimate(model, with_latency(cluster, latency, 100.0), plan, stack).step_time
            assert slower >= t * (1 - 1e-9), (latency, plan.describe())
        checked += 1
        if checked == 40:
            break
    assert checked == 40


def test_the_search_adds_them_only_when_asked_and_the_framework_runs_them():
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(64)
    narrow = {"global_batch": 64, "zero": (1,), "recompute": ("none",), "offload_optimizer": (False,),
              "offload_activations": (False,), "layouts": ("1d",), "all_placements": False}
    any_stack = load_stack("any")
    plain = search(model, cluster, Space(**narrow, stack=any_stack), top_k=200)
    asked = search(model, cluster, Space(**narrow, stack=any_stack, async_pipeline=True), top_k=200)
    assert not {e.plan.schedule for e in plain.plans} & set(ASYNC)
    found = [e for e in asked.plans if e.plan.schedule in ASYNC]
    assert {e.plan.schedule for e in found} == set(ASYNC)
    for e in found[:5]:  # the search's step equals estimate's
        assert e.step_time == pytest.approx(estimate(model, cluster, e.plan, any_stack).step_time, rel=1e-9)
    with pytest.raises(SpecError, match="async_pipeline: framework megatron-core runs the schedules 1f1b, interleaved"):
        Space(**narrow, stack=load_stack("megatron-core"), async_pipeline=True)  # refused, as on the command line
    for name in ("megatron-core", "torchtitan", "deepspeed", "nemo", "megatron-bridge"):
        assert not set(load_stack(name).supports.schedules) & set(ASYNC), name


@pytest.mark.parametrize(("args", "line"), [
    (["--schedule", "pipedream"], "schedule=pipedream needs pp > 1 (got pp=1)"),
    (["--pp", "4", "--vpp", "2", "--schedule", "pipedream-2bw"], "vpp=2 with schedule=pipedream-2bw"),
    (["--pp", "4", "--global-batch", "48", "--schedule", "pipedream-2bw"],
     "schedule=pipedream-2bw needs micro-batches per step m >= pp (m = global_batch/(dp*micro_batch) = 3, pp=4)"),
])
def test_estimate_refuses_what_makes_no_sense_in_one_line(args, line, capsys):
    code = main(["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "64", "--global-batch", "64", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert line in err and len(err.strip().splitlines()) == 1


def test_plan_refuses_async_pipeline_for_a_framework_without_it(capsys):
    code = main(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "64", "--global-batch", "64",
                 "--async-pipeline"])
    err = capsys.readouterr().err
    assert code == 2
    assert "async_pipeline: framework megatron-core runs the schedules 1f1b, interleaved" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan", "deepspeed", "nemo"])
def test_no_framework_config_is_written_for_an_asynchronous_plan(fmt):
    from meshplan.configs import emit
    from meshplan.errors import SpecError

    plan = Plan(dp=2, pp=4, global_batch=64, schedule="pipedream-2bw")
    with pytest.raises(SpecError, match=f"{fmt} cannot express schedule=pipedream-2bw"):
        emit(fmt, load_model("llama3-8b"), plan, load_stack("any"))


def test_build_refuses_async_arguments():
    with pytest.raises(ValueError, match="needs pp >= 2, vpp=1"):
        build("pipedream", 4, 8, vpp=2)
    with pytest.raises(ValueError, match="micro_batches >= pp"):
        build("pipedream-2bw", 4, 2)
    with pytest.raises(ValueError, match="flushes every step"):
        build("1f1b", 4, 8, steps=2)
    with pytest.raises(ValueError, match="asynchronous schedules"):
        steady_step("1f1b", 4, 8, F, B)
