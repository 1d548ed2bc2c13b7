"""torchtitan's FSDP2 under pipeline parallelism (issue 79, the reviewer's "ZeRO-3 with pp > 1 is priced as something
torchtitan does not do"): with pp > 1 every FSDP unit of a stage stays gathered and its gradients whole over the
step's micro-batches (torchtitan 9dec370 parallelize_llama.py:326-329, 0.2.2's "default" policy, parallelize.py:
325-327), and torch's pipelining syncs them once, after the last micro-batch (torch 2.13.0 torch/distributed/
pipelining/stage.py:844-848 and :1164-1191): meshplan's ZeRO-1 on the torch runtime. The stack runs it, refuses
ZeRO-2 / 3 with pp > 1 (specs/refusals.py fsdp_stage_under_pp), the job TOML asks for it ("default") and reads it
back, and the search prices it as estimate() does."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from meshplan.configs import emit, read
from meshplan.errors import PlanError, SpecError
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.specs import stack_variants
from meshplan.specs.check import check
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.refusals import REFUSALS, fsdp_zero_reason, stack_refusals
from meshplan.specs.stack import frameworks_running, load_stack
from meshplan.step.channels import zero_counts
from test_search import every_plan

TITAN = load_stack("torchtitan")
TINY = replace(load_model("llama3-8b"), num_layers=4).with_seq_length(2048)
H100 = load_system("h100")
PIPED = Plan(dp=2, pp=2, micro_batch=1, global_batch=8, zero=1, recompute="none")  # 4 micro-batches a step


def test_the_bytes_a_pipelined_stage_holds_by_hand():
    """Llama-3-8B cut to 4 layers, pp 2, dp 2: the last stage, whose peak the estimate shows, holds 2 layers
    (2 · 218,112,000), the final norm (4096) and the untied head (128,256 · 4096 = 525,336,576), P = 961,564,672
    parameters. FSDP2 under the pipeline keeps their bf16 weights
    gathered (2·P = 1.92 GB) and their fp32 gradients whole (4·P = 3.85 GB) all step, the fp32 master and Adam's
    moments sharded over dp (12·P / 2 = 5.77 GB), and gathers nothing per layer (no ZeRO-3 buffers). ZeRO-3 as
    meshplan prices it (the fp32 shard its own master, no 16-bit shard: cost/model_states; gradients sharded, two
    layers gathered at a time) would hold 4·P = 3.85 GB of model states less and 1.49 GB of buffers more: 2.36 GB
    under what torchtitan holds."""
    p = 2 * 218_112_000 + 4096 + 128_256 * 4096
    assert p == 961_564_672
    est = estimate(TINY, H100.cluster(4), PIPED, TITAN)
    assert est.memory["weights"] == 2 * p
    assert est.memory["grads"] == 4 * p
    assert est.memory["optimizer"] == 12 * p / 2
    assert est.memory["buffers"] == 0.0
    zero3 = estimate(TINY, H100.cluster(4), replace(PIPED, zero=3), TITAN)
    held = sum(est.memory[k] for k in ("weights", "grads", "optimizer"))
    priced = sum(zero3.memory[k] for k in ("weights", "grads", "optimizer"))
    assert held - priced == pytest.approx(4 * p, rel=1e-5)
    assert est.peak_memory - zero3.peak_memory == pytest.approx(4 * p - zero3.memory["buffers"], rel=1e-5)
    assert est.peak_memory - zero3.peak_memory == pytest.approx(2.36e9, rel=0.01)
    # traffic per step of m = 4 micro-batches: one all-gather and one reduce-scatter, not 2·m and m
    assert zero_counts(1, 4) == {"scatter": 1, "gather": 1}
    assert zero_counts(3, 4) == {"gather": 8, "scatter": 4}
    assert est.breakdown["dp"] < zero3.breakdown["dp"]


def test_the_stack_runs_zero1_exactly_under_the_pipeline():
    assert TITAN.supports.runs(PIPED, TINY, TITAN) and not check(TINY, H100.cluster(4), PIPED, TITAN)
    for zero in (2, 3):
        assert "ZeRO-2 or ZeRO-3 with pp > 1" in TITAN.supports.problems(replace(PIPED, zero=zero), TINY, TITAN)[0]
    # ZeRO-1 at pp = 1 is FSDP's own rule, not torchtitan's refusal: check's reason is the one reason given, by check
    # and by the stack (which framework presets run a plan: stack.frameworks_running)
    alone = Plan(dp=4, micro_batch=1, global_batch=8, zero=1, recompute="none")
    reason = [fsdp_zero_reason("fsdp2", 1)]
    assert check(TINY, H100.cluster(4), alone, TITAN) == TITAN.supports.problems(alone, TINY, TITAN) == reason
    assert "torchtitan" not in frameworks_running(alone, TINY)
    assert "torchtitan" in frameworks_running(replace(PIPED, zero=1), TINY)
    with pytest.raises(PlanError, match="has no ZeRO-1"):
        estimate(TINY, H100.cluster(4), alone, TITAN)


def test_the_search_reads_fsdps_zero1_rule_as_check_does():
    # one rule (FsdpMode.has_zero): on a grid of plans (the search's arrays) as on one plan, the search's FSDP rule
    # (refusals.fsdp_stages) refuses ZeRO-1 exactly where check says FSDP has none (pp = 1), with check's reason;
    # torchtitan's refusal refuses ZeRO-2 / 3 at pp > 1 alone, and comes first (the search counts a plan once)
    grid = SimpleNamespace(pp=np.array([1, 1, 1, 1, 2, 2, 2, 2]), zero=np.array([0, 1, 2, 3, 0, 1, 2, 3]))
    assert REFUSALS["fsdp_stage_under_pp"].test(grid, TINY, TITAN).tolist() == [False] * 6 + [True, True]
    rules = stack_refusals(TITAN)
    assert [r.name for r in rules] == [*TITAN.supports.refuses, "fsdp_lacks_zero"]
    own = rules[-1]
    assert own.reason("torchtitan") == fsdp_zero_reason("fsdp2", 1)
    assert own.test(grid, TINY, TITAN).tolist() == [False, True] + [False] * 6
    for pp, zero in zip(grid.pp.tolist(), grid.zero.tolist(), strict=True):
        plan = replace(PIPED, dp=8 // pp, pp=pp, zero=zero)
        assert (own.reason("torchtitan") in check(TINY, H100.cluster(8), plan, TITAN)) == (zero == 1 and pp == 1)
    assert [r.name for r in stack_refusals(load_stack("megatron-core"))] == list(
        load_stack("megatron-core").supports.refuses)  # no FSDP: no rule of its own


def test_check_reads_the_runtimes_own_nosync_behaviour(monkeypatch):
    # ZeRO-1 under FSDP rests on the runtime holding FSDP's gradient sync to the last micro-batch
    # (PipelineRuntime.fsdp_nosync), not on its keeping the micro-batches' boundary tensors (a memory property)
    registry = stack_variants.STACK_CHOICES["pipeline_runtime"]
    monkeypatch.setitem(registry, "torch", replace(registry["torch"], fsdp_nosync=False))
    assert TITAN.pipeline_runtime_mode.keeps_microbatches
    assert any("has no ZeRO-1" in r for r in check(TINY, H100.cluster(4), PIPED, TITAN))


def test_the_job_toml_asks_for_what_is_priced():
    text = emit("torchtitan", TINY, PIPED, TITAN)
    assert 'fsdp_reshard_after_forward = "default"' in text
    assert read("torchtitan", TINY, 4, text=text) == (PIPED, TITAN)
    assert read("torchtitan", TINY, 4, text=text.replace('"default"', '"never"'))[0] == PIPED  # the same under PP
    with pytest.raises(SpecError, match=r"torchtitan cannot express fsdp_reshard_after_forward=always: with "
                                        "pipeline parallelism") as err:
        read("torchtitan", TINY, 4, text=text.replace('"default"', '"always"'))
    assert "\n" not in str(err.value)
    for zero in (2, 3):
        with pytest.raises(SpecError, match=f"torchtitan cannot express zero={zero}: under pipeline parallelism"):
            emit("torchtitan", TINY, replace(PIPED, zero=zero), TITAN)
    alone = replace(PIPED, dp=4, pp=1, zero=3)
    assert 'fsdp_reshard_after_forward = "always"' in emit("torchtitan", TINY, alone, TITAN)


def _draws(n: int):
    rng = random.Random(79)
    for _ in range(n):
        pp, dp, tp = rng.choice((2, 4)), rng.choice((2, 4)), rng.choice((1, 2))
        vpp = rng.choice((1, 2)) if pp == 2 else 1
        m = pp * rng.choice((1, 2))
        yield Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, sequence_parallel=tp > 1, micro_batch=rng.choice((1, 2)),
                   global_batch=0, zero=1, recompute=rng.choice(("none", "full")),
                   schedule="interleaved" if vpp > 1 else rng.choice(("1f1b", "gpipe"))), m


@pytest.mark.parametrize("draw", range(6))
def test_a_pipelined_fsdp_gathers_once_a_step_whatever_the_micro_batches(draw):
    """Property: under the torchtitan stack, a pipelined plan's ZeRO-1 model states do not depend on the number of
    micro-batches m, nor does its data-parallel time (one all-gather beside the first forward, one reduce-scatter
    beside the last backward), while ZeRO-3's, as meshplan prices it, grows with m; and the job TOML reads back."""
    plan, m = list(_draws(6))[draw]
    model = replace(load_model("llama3-8b"), num_layers=8).with_seq_length(1024)
    cluster = H100.cluster(plan.dp * plan.tp * plan.pp)
    one, two = (replace(plan, global_batch=plan.dp * plan.micro_batch * k) for k in (m, 2 * m))
    a, b = (estimate(model, cluster, p, TITAN) for p in (one, two))
    if plan.vpp == 1:  # an interleaved schedule's chunk gradients live one at a time in a single round only
        assert [a.memory[k] for k in ("weights", "grads", "optimizer")] == \
            [b.memory[k] for k in ("weights", "grads", "optimizer")]
    assert a.breakdown["dp"] == pytest.approx(b.breakdown["dp"], rel=1e-9)
    z3a, z3b = (estimate(model, cluster, replace(p, zero=3), TITAN) for p in (one, two))
    assert z3b.breakdown["dp"] > z3a.breakdown["dp"]
    assert read("torchtitan", model, cluster.num_gpus, text=emit("torchtitan", model, one, TITAN))[0] == one


def test_search_equals_estimate_for_torchtitans_pipelined_fsdp():
    """The search over the torchtitan stack with pp > 1 ranks ZeRO-1, leaves ZeRO-2 / 3 out under the refusal's
    reason and pp = 1 ZeRO-1 under check's, and prices every plan it keeps as estimate() does."""
    model, cluster = TINY, H100.cluster(8)
    space = Space(stack=TITAN, headroom=0.0, prefer_simple=False, global_batch=16, zero=(1, 2, 3),
                  recompute=("none",), offload_activations=(False,), max_micro_batch=2)
    assert space.zero == (1, 2, 3)
    result = search(model, cluster, space, top_k=500)
    runs = [[estimate(model, cluster, p, TITAN) for p in options] for options in every_plan(model, cluster, space)
            if TITAN.supports.runs(options[0], model, TITAN) and not check(model, cluster, options[0], TITAN)]
    feasible = sorted(min(e.step_time for e in v) for v in runs if v[0].fits)
    assert result.feasible == len(feasible)
    assert [e.step_time for e in result.plans] == pytest.approx(feasible[: len(result.plans)], rel=1e-9)
    assert any(e.plan.pp > 1 and e.plan.zero == 1 for e in result.plans)
    assert all((e.plan.pp > 1) == (e.plan.zero == 1) for e in result.plans)
    assert any("ZeRO-2 or ZeRO-3 with pp > 1" in reason for reason in result.rejected)
    assert fsdp_zero_reason("fsdp2", 1) in result.rejected  # ZeRO-1 at pp = 1: rejected with check's reason
