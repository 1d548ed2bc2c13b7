"""The TP overlap a plan runs (specs/host_cost.py): Megatron-Bridge and NeMo turn their TP communication overlap off
in a plan with tp > 1 and sequence parallelism off (Megatron-Bridge training/comm_overlap.py:439-445 @ v0.3.1, NeMo
callbacks/megatron_comm_overlap.py:122-128 @ v2.0.0), where Megatron-LM refuses the plan. One place says which (
``tp_hidden``), read by the pass's overlap rules, its selective recompute and its host segments, and by the search's
array path as by estimate(); the emitters write the overlap as the framework runs it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from meshplan.collectives.comm import Collective
from meshplan.configs import emit, read
from meshplan.cost.records import OpCost
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.host_cost import plan_host, tp_hidden
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.refusals import refused
from meshplan.specs.stack import Stack, frameworks_running, load_stack
from meshplan.step.passes import pass_times

US = 1e-6
BRIDGE_LIKE = Stack(overlap_tp=True, overlap_tp_needs_sp=True)  # the generic stack, with Megatron-Bridge's rule
# a layer's forward at tp 4: a 200 us GEMM and its 50 us TP collective, which may hide behind it
LAYER = [OpCost("fc", "fwd", "gemm", 1e9, 1e3),
         OpCost("rs", "fwd", "collective", nbytes=1e3, collective=Collective("reduce_scatter", 1e3, "tp", 4),
                overlap="tp")]
LAYER_TIMES = [200 * US, 50 * US]


def test_the_presets_that_turn_the_overlap_off_without_sequence_parallelism():
    for name in ("megatron-bridge", "nemo"):
        stack = load_stack(name)
        assert stack.overlap_tp and stack.overlap_tp_needs_sp, name
        assert tp_hidden(stack, True) and not tp_hidden(stack, False), name
        assert tp_hidden(stack) is True  # no plan: the stack as stated
    # Megatron-LM refuses the plan instead (specs/refusals.py tp_overlap_without_sp): its stack keeps the flag as stated
    core = load_stack("megatron-core").with_(overlap_tp=True)
    assert not core.overlap_tp_needs_sp and tp_hidden(core, False)
    assert not tp_hidden(Stack(overlap_tp_needs_sp=True), True)  # no overlap to turn off


def test_without_sequence_parallelism_the_bridge_s_tp_collective_is_exposed():
    sd = DEFAULT.overlap_slowdown
    off = pass_times(LAYER, LAYER_TIMES, Plan(tp=4, sequence_parallel=False), BRIDGE_LIKE, "none")
    # the overlap turned off: 200 us GEMM + 50 us exposed, nothing hidden
    assert (off.fwd, off.tp, off.hidden_f) == pytest.approx((200 * US, 50 * US, 0.0))
    assert off.total == pytest.approx(250 * US)
    on = pass_times(LAYER, LAYER_TIMES, Plan(tp=4, sequence_parallel=True), BRIDGE_LIKE, "none")
    # with sequence parallelism it hides behind the GEMM, slowing it by sd per second hidden: 200 + sd x 50 us
    assert (on.tp, on.hidden_f) == pytest.approx((sd * 50 * US, 50 * US))
    assert on.total == pytest.approx((200 + sd * 50) * US) and on.total < off.total
    # a stack without the rule (Megatron-LM's, which refuses the plan) prices it as stated: hidden
    stated = pass_times(LAYER, LAYER_TIMES, Plan(tp=4, sequence_parallel=False), BRIDGE_LIKE.with_(
        overlap_tp_needs_sp=False), "none")
    assert stated.total == pytest.approx(on.total)


def test_the_host_s_segments_close_at_the_tp_collective_it_runs_exposed():
    # eager Megatron's forward at tp 2 (test_host_time's SEGMENTED), its all-reduce a TP collective that may hide
    ops = [OpCost("norm", "fwd", "memory", 0.0, 1e3, kernels=10),
           OpCost("ar", "fwd", "collective", nbytes=1e3, collective=Collective("all_reduce", 1e3, "tp", 2),
                  overlap="tp"),
           OpCost("fc", "fwd", "gemm", 1e9, 1e3)]
    times = [10 * US, 5 * US, 200 * US]
    stack = BRIDGE_LIKE.with_(host_dispatch=10 * US, blocking_collectives=True)
    assert plan_host(stack, True).hidden_tp and not plan_host(stack, False).hidden_tp
    # hidden (sp on): no sync, one max over the pass: host 12 x 10 = 120 us against the GPU's 210 us: no idle
    assert pass_times(ops, times, Plan(tp=2, sequence_parallel=True), stack, "none").host == 0.0
    # exposed (sp off): the host waits the all-reduce out: 110 us of issue against 10 us of GPU, then the GEMM from an
    # empty queue 10 us late: 110 us idle, and the all-reduce's 5 us exposed on top of the 210 us of kernels
    off = pass_times(ops, times, Plan(tp=2, sequence_parallel=False), stack, "none")
    assert off.host == pytest.approx(110 * US) and off.total == pytest.approx((215 + 110) * US)


@pytest.fixture(scope="module")
def small():
    return load_model("llama3-8b").with_seq_length(2048), load_system("h100").cluster(8)


@pytest.mark.parametrize("name", ["megatron-bridge", "nemo"])
def test_a_bridge_plan_without_sequence_parallelism_prices_as_its_overlap_off(small, name):
    """Every path that reads the overlap (the passes, selective recompute's re-run collectives, the host) at once: the
    plan priced under the preset equals the plan priced with overlap_tp off, to the last bit; with sequence
    parallelism the overlap hides TP time."""
    model, cluster = small
    stack = load_stack(name)
    plan = Plan(dp=2, tp=4, sequence_parallel=False, recompute="selective", global_batch=16)
    est, off = estimate(model, cluster, plan, stack), estimate(model, cluster, plan, stack.with_(overlap_tp=False))
    assert est.step_time == off.step_time and est.breakdown == off.breakdown
    sp = replace(plan, sequence_parallel=True)
    hidden = estimate(model, cluster, sp, stack)
    assert hidden.breakdown["tp"] < estimate(model, cluster, sp, stack.with_(overlap_tp=False)).breakdown["tp"]
    # Bridge and NeMo run it; Megatron-LM refuses it under its TP overlap (it does not drop it)
    assert {"megatron-bridge", "nemo"} <= set(frameworks_running(plan, model))
    core = load_stack("megatron-core").with_(overlap_tp=True)
    assert [r.name for r in refused(core.supports.refuses, plan, model, core)] == ["tp_overlap_without_sp"]
    assert not refused(stack.supports.refuses, plan, model, stack)


def test_the_search_s_array_path_prices_such_plans_as_estimate_does(small):
    model, cluster = small
    stack = load_stack("megatron-bridge")
    space = Space(global_batch=16, stack=stack, zero=(1,), recompute=("selective",), offload_optimizer=(False,),
                  offload_activations=(False,), max_micro_batch=2, headroom=0.0, prefer_simple=False)
    result = search(model, cluster, space, top_k=400)
    off = [p for p in result.plans if p.plan.tp > 1 and not p.plan.sequence_parallel]
    assert off and any(p.plan.tp > 1 and p.plan.sequence_parallel for p in result.plans)
    for p in result.plans:
        assert p.step_time == pytest.approx(estimate(model, cluster, p.plan, stack).step_time, rel=1e-9), p.plan


def test_the_emitters_write_the_overlap_as_the_framework_runs_it(small):
    model, _ = small
    plan = Plan(dp=2, tp=4, sequence_parallel=False, global_batch=16)
    bridge = load_stack("megatron-bridge")
    # Megatron-LM would refuse --tp-comm-overlap without --sequence-parallel: not written, the stack's flag carried
    # in the meshplan comment, so that the file runs and reads back as the stack priced
    text = emit("megatron", model, plan, bridge)
    assert "--tp-comm-overlap" not in text and "stack.overlap_tp=true" in text
    assert read("megatron", model, 8, text) == (plan, bridge)
    assert "--tp-comm-overlap" in emit("megatron", model, replace(plan, sequence_parallel=True), bridge)
    # Megatron-Bridge turns it off itself (with a warning): its own flag written as the stack says, with a note
    text = emit("nemo", model, plan, bridge)
    assert "comm_overlap.tp_comm_overlap=true" in text.splitlines() and "priced exposed" in text
    assert read("nemo", model, 8, text) == (plan, bridge)
    assert "priced exposed" not in emit("nemo", model, replace(plan, sequence_parallel=True), bridge)


def test_a_megatron_core_stack_read_back_from_bridge_overrides_runs_as_bridge_runs_it(small):
    """A megatron-core stack with the TP overlap, written as Megatron-Bridge overrides and read back, carries Bridge's
    rule (the megatron-bridge preset's overlap_tp_needs_sp): at tp 4 without sequence parallelism the TP collectives
    are priced exposed, as Bridge would run the file, and the file says so; with it they stay hidden."""
    model, cluster = small
    core = load_stack("megatron-core").with_(overlap_tp=True)
    plan = Plan(dp=2, tp=4, sequence_parallel=False, global_batch=16)
    assert tp_hidden(core, False) and not core.overlap_tp_needs_sp
    text = emit("nemo", model, plan, core)
    assert "overlap_tp_needs_sp" not in text and "priced exposed" in text
    read_plan, stack = read("nemo", model, 8, text)
    assert read_plan == plan and stack == core.with_(overlap_tp_needs_sp=True)
    assert stack.overlap_tp_needs_sp == load_stack("megatron-bridge").overlap_tp_needs_sp
    assert estimate(model, cluster, plan, stack).step_time == estimate(
        model, cluster, plan, stack.with_(overlap_tp=False)).step_time
    assert "priced exposed" not in emit("nemo", model, replace(plan, sequence_parallel=True), core)
    # a comment that carries the rule off is still Bridge's file: its setup decides
    carried = text.replace("# meshplan: ", "# meshplan: stack.overlap_tp_needs_sp=false ")
    assert read("nemo", model, 8, carried)[1].overlap_tp_needs_sp


def test_estimate_says_the_framework_runs_the_tp_collectives_exposed():
    from click.testing import CliRunner

    from meshplan.cli.main import cli

    args = ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--tp", "4", "--framework"]
    note = "note: megatron-bridge turns its TP overlap off without sequence parallelism"
    off = CliRunner().invoke(cli, [*args, "megatron-bridge", "--no-sp"])
    assert off.exit_code == 0, off.output
    assert note in off.stderr
    assert note not in CliRunner().invoke(cli, [*args, "megatron-bridge", "--sp"]).stderr
    core = CliRunner().invoke(cli, [*args, "megatron-core", "--no-sp", "--overlap-tp"]).stderr
    assert "refuses this plan: TP communication overlap without sequence parallelism" in core and "turns" not in core
    # --json: the same notes, in the object (stderr left empty), and none where the overlap stays hidden
    off_json = CliRunner().invoke(cli, [*args, "megatron-bridge", "--no-sp", "--json"])
    assert off_json.exit_code == 0 and not off_json.stderr, off_json.output
    assert [f"note: {n}" for n in json.loads(off_json.stdout)["notes"]] == off.stderr.strip().splitlines()
    assert "notes" not in json.loads(CliRunner().invoke(cli, [*args, "megatron-bridge", "--sp", "--json"]).stdout)
