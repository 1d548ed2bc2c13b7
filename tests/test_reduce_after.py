"""A pipeline runtime that reduces a stage's gradients after its last backward (specs/pipeline_runtime.py
``reduces_after``: NeMo AutoModel's patched torch stage backward @01926a5c, torch 2.13.0's perform_reduce_grad): the
reduce-scatter runs after the pass, the compute stream waiting for it, so the last backward of each run of the
schedule pays it whole (step/channels.step_channels, Collectives.after) where an overlapping runtime hides it beside
the pass."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from meshplan.cost.params import stage_params
from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.channels import Collectives, Offload, Passes, dp_collectives, step_channels
from meshplan_validation.source_automodel import AUTOMODEL_MOE_STACK
from meshplan_validation.sources import SOURCES

SD = 0.189
TITAN = load_stack("torchtitan")
AFTER = TITAN.with_(pipeline_runtime="torch-reduce-after")
TINY = replace(load_model("llama3-8b"), num_layers=4).with_seq_length(2048)
H100 = load_system("h100")
PIPED = Plan(dp=2, pp=2, micro_batch=1, global_batch=8, zero=1, recompute="none")  # 4 micro-batches a step


def test_the_last_backward_pays_its_reduce_scatter_whole_by_hand():
    # ZeRO-1 over m = 4 micro-batches, T_f = K_f = 1 s, T_b = K_b = 2 s, a 3 s gather and a 1.5 s reduce-scatter.
    # Overlapped: the gather beside the first forward, (3 - 1) + 0.189·1 = 2.189 s; the scatter beside the last
    # backward, max(0, 1.5 - 2) + 0.189·1.5 = 0.2835 s; 2.4725 s in all.
    p = Passes(t_f=1.0, t_b=2.0, k_f=1.0, k_b=2.0, h_f=0.0, h_b=0.0)
    beside = Collectives(all_reduce=3.0, gather=3.0, scatter=1.5)
    assert step_channels(p, 4, beside, (1,), Offload(), SD, True)[1][0] == pytest.approx(2.189 + 0.2835)
    # reduced after the pass: the gather as before, the scatter whole after it: 2.189 + 1.5 = 3.689 s
    after = beside._replace(after=1.5)
    assert step_channels(p, 4, after, (1,), Offload(), SD, True)[1][0] == pytest.approx(2.189 + 1.5)
    # ZeRO-0 all-reduces instead (DDP's own path): nothing of it moves
    assert step_channels(p, 4, after, (0,), Offload(), SD, True)[0] == step_channels(
        p, 4, beside, (0,), Offload(), SD, True)[0]


def test_reducing_after_the_pass_never_costs_less():
    """On random passes and collectives, the scatter after the pass (exposed, nothing slowed) costs at least what it
    costs beside the pass (its excess over the pass plus the slowdown of what it overlaps), and at most that plus the
    scatter itself. Where it would share a tier with the layers' traffic (contention.py), running after the pass
    also spares it that wait, at most its shared seconds."""
    rng = random.Random(23)
    for _ in range(300):
        k_f, k_b = rng.uniform(0.01, 3), rng.uniform(0.01, 6)
        h_f, h_b = rng.uniform(0, k_f), rng.uniform(0, k_b)
        p = Passes(t_f=k_f + h_f * rng.random(), t_b=k_b + h_b * rng.random(), k_f=k_f, k_b=k_b, h_f=h_f, h_b=h_b,
                   c_f=rng.uniform(0, 1), c_b=rng.uniform(0, 1))
        c = Collectives(*(rng.uniform(0, 4) for _ in range(3)))
        shared = Collectives(*(x * rng.random() for x in c))
        late_c, m = c._replace(after=c.scatter), rng.choice((1, 2, 8))
        for zero in (1, 2, 3):
            base = step_channels(p, m, c, (zero,), Offload(), SD, True)[zero][0]
            late = step_channels(p, m, late_c, (zero,), Offload(), SD, True)[zero][0]
            assert base - 1e-12 <= late <= base + c.scatter + 1e-12
            base = step_channels(p, m, (c, shared), (zero,), Offload(), SD, True)[zero][0]
            late = step_channels(p, m, (late_c, shared), (zero,), Offload(), SD, True)[zero][0]
            assert base - shared.scatter - 1e-12 <= late <= base + c.scatter + 1e-12


def test_only_a_pipelined_plan_on_that_runtime_reduces_after():
    params = stage_params(TINY, PIPED, True)
    on = dp_collectives(TINY, H100.cluster(4), PIPED, params, DEFAULT, AFTER)
    assert on.after == pytest.approx(on.scatter) and on.after > 0
    assert dp_collectives(TINY, H100.cluster(4), PIPED, params, DEFAULT, TITAN).after == 0.0  # torch: beside the pass
    flat = replace(PIPED, pp=1, dp=4)
    assert dp_collectives(TINY, H100.cluster(4), flat, params, DEFAULT, AFTER).after == 0.0  # no pipeline: hooks on


def test_the_step_grows_by_at_most_the_exposed_reduce_scatter():
    """Llama-3-8B cut to 4 layers, pp 2, dp 2, 4 micro-batches in one run: the runtime that reduces after the pass
    adds the reduce-scatter beyond what hid beside the last backward, nothing else (memory alike)."""
    cluster = H100.cluster(4)
    beside, after = estimate(TINY, cluster, PIPED, TITAN), estimate(TINY, cluster, PIPED, AFTER)
    scatter = dp_collectives(TINY, cluster, PIPED, stage_params(TINY, PIPED, True), DEFAULT, AFTER).scatter
    assert 0.0 < after.step_time - beside.step_time <= scatter + 1e-12
    assert after.breakdown["dp"] > beside.breakdown["dp"]
    assert {k: v for k, v in after.breakdown.items() if k != "dp"} == {
        k: v for k, v in beside.breakdown.items() if k != "dp"}


def test_automodel_moe_runs_reduce_after_and_torchtitan_does_not():
    assert AUTOMODEL_MOE_STACK["pipeline_runtime"] == "torch-reduce-after"
    automodel = next(s for s in SOURCES if s.name == "NeMo AutoModel MoE")
    assert automodel.stack.pipeline_runtime_mode.reduces_after
    assert automodel.stack.pipeline_runtime_mode.fsdp_nosync  # ZeRO-1 under the pipeline, as before
    assert not automodel.stack.pipeline_runtime_mode.keeps_microbatches  # its memory as priced before
    assert not TITAN.pipeline_runtime_mode.reduces_after

