"""Passes that start from an empty GPU queue (Stack.drained_passes): a training loop that synchronises the host between
its passes (KempnerForge: the loss's label branch after the forward, loss.item() after the backward) leaves nothing
before a pass to hide its first FSDP gathers behind, so they run alone (cost/fsdp.lead_params, lead_times;
step/channels.py: X = max(T' + L, D, ...) + σ·...). Also KempnerForge's profile (cuDNN's SDPA, separate projections,
both passes drained) and a run stated without torch.compile priced eager."""

from __future__ import annotations

import pytest

from draws import draw_kept
from meshplan.cost.fsdp import lead_params, lead_times
from meshplan.cost.params import end_params, kind_params
from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.channels import Collectives, Offload, Passes, _pass, step_channels
from test_properties import rates, with_rate

FSDP = load_stack("pytorch-fsdp")
BOTH, FORWARD = FSDP.with_(drained_passes="both"), FSDP.with_(drained_passes="forward")
SD = 0.189


def test_a_drained_forward_gathers_the_root_unit_and_a_layer_a_backward_a_layer():
    # Llama 3 70B at tp 4: the root unit holds the embedding and the head (V·H / 4 each) and the final norm (H); a layer
    # its block over 4 (kind_params)
    model, plan = load_model("llama3-70b"), Plan(dp=8, tp=4, zero=3, micro_batch=2, global_batch=64)
    root, layer = lead_params(model, plan)
    v, h = model.vocab_size, model.hidden_size
    assert root == end_params(model, 4, True, True) == 2 * v * h / 4 + h == 525_344_768
    assert layer == kind_params(model, plan, "dense").total == 213_925_888
    per_param = 1e-9  # seconds a parameter: one call each, the root then the first layer
    assert lead_times(model, plan, BOTH, 10.0, lambda n: n * per_param) == pytest.approx((root * 1e-9 + layer * 1e-9,
                                                                                          layer * 1e-9))
    assert lead_times(model, plan, FORWARD, 10.0, lambda n: n * per_param)[1] == 0.0
    assert lead_times(model, plan, FSDP, 10.0, lambda n: n * per_param) == (0.0, 0.0)
    assert lead_times(model, plan, None, 10.0, lambda n: n * per_param) == (0.0, 0.0)
    # never more than the whole gather (a rank that holds less than those units: LoRA's trainable share)
    assert lead_times(model, plan, BOTH, 0.1, lambda n: n * per_param) == (0.1, 0.1)


def test_the_lead_runs_before_the_compute_and_hides_nothing_where_the_gathers_bind():
    # compute-bound: T' = 10, D = 4, lead 1: the pass is 1 + 10, so DP adds the lead (+ the slowdown of D under K)
    dp, _ = _pass(10.0, 10.0, 0.0, 4.0, 0.0, 1.0, SD, True, lead=1.0)
    assert dp == pytest.approx(1.0 + SD * 4.0)
    assert _pass(10.0, 10.0, 0.0, 4.0, 0.0, 1.0, SD, True)[0] == pytest.approx(SD * 4.0)
    # gather-bound: T' = 3, D = 8: the pass is D already, the lead inside it
    assert _pass(3.0, 3.0, 0.0, 8.0, 0.0, 1.0, SD, True, lead=1.0) == _pass(3.0, 3.0, 0.0, 8.0, 0.0, 1.0, SD, True)
    # after the pass (not overlapped): D is exposed whole, the lead with it
    assert _pass(10.0, 10.0, 0.0, 4.0, 0.0, 1.0, SD, False, lead=1.0) == (4.0, 0.0)
    # ZeRO-3 at m = 4: every pass gathers, each adds its lead (forward 1, backward 0.5); ZeRO-1 gathers beside the
    # first forward alone
    p = Passes(t_f=10.0, t_b=20.0, k_f=10.0, k_b=20.0, h_f=0.0, h_b=0.0)
    c, lean = Collectives(0.0, 2.0, 3.0, True, 1.0, 0.5), Collectives(0.0, 2.0, 3.0, True)
    with_lead, without = (step_channels(p, 4, x, (1, 3), Offload(), SD, True) for x in (c, lean))
    assert with_lead[3][0] - without[3][0] == pytest.approx(4 * 1.0 + 4 * 0.5)
    assert with_lead[1][0] - without[1][0] == pytest.approx(1.0)


def test_a_kempnerforge_like_step_pays_its_first_gathers_each_micro_batch():
    # 13B-class, tp 4 x FSDP 8 over 8 nodes, 4 micro-batches of 4: compute-bound passes, so each drained pass adds
    # its first gathers; at dp 1 there is nothing to gather
    model, cluster = load_model("llama2-13b"), load_system("h100").cluster(32)
    plan = Plan(dp=8, tp=4, zero=3, micro_batch=4, global_batch=128, recompute="full", sequence_parallel=True)
    none, fwd, both = (estimate(model, cluster, plan, s).step_time for s in (FSDP, FORWARD, BOTH))
    assert none < fwd < both
    assert both - none <= 4 * 2 * max(lead_times(model, plan, BOTH, 1e9, lambda n: n * 2 / 1e9)) + 1e-9
    alone, four = Plan(dp=1, tp=4, zero=3, micro_batch=4, global_batch=16, recompute="full"), load_system("h100")
    assert estimate(model, four.cluster(4), alone, BOTH).step_time == estimate(model, four.cluster(4), alone,
                                                                               FSDP).step_time


@pytest.fixture(scope="module")
def drained_triples() -> list:
    return draw_kept(7979, 40, lambda m, c, plan, stack: stack.fsdp != "none" and plan.zero >= 3
                     and plan.dp * plan.cp >= 2)


def test_draining_never_shortens_a_step_and_more_rate_never_lengthens_one(drained_triples):
    worse = []
    for model, cluster, plan, stack in drained_triples:
        steps = [estimate(model, cluster, plan, stack.with_(drained_passes=d)).step_time
                 for d in ("none", "forward", "both")]
        assert steps[0] <= steps[1] * (1 + 1e-9) and steps[1] <= steps[2] * (1 + 1e-9), (model.name, plan.describe())
        drained = stack.with_(drained_passes="both")
        for rate in rates(cluster):
            faster = estimate(model, with_rate(cluster, rate, 2.0, plan.precision), plan, drained).step_time
            if faster > steps[2] * (1 + 1e-9):
                worse.append(f"{model.name} {plan.describe()} {rate}: {steps[2]:.6g} -> {faster:.6g}")
    assert not worse, "; ".join(worse[:5])


def test_kempnerforges_profile_and_a_run_without_torch_compile():
    from meshplan_validation.map_kernels import kernels
    from meshplan_validation.sources import source_defaults

    src = source_defaults({"framework": "KempnerForge (PyTorch FSDP2 + TP, torch.compile)"})
    stack = src.stack
    assert (stack.attention_kernel, stack.projections, stack.drained_passes) == ("fused", "separate", "both")
    model = load_model("llama3-8b")
    compiled = {"framework": "KempnerForge (PyTorch FSDP2 + TP, torch.compile)", "notes": ""}
    eager = {**compiled, "notes": "torch.compile=true (except experiment 08 which used compile=false)"}
    assert kernels(compiled, model, src, [])[1] == "fused"
    assert kernels(eager, model, src, [])[1] == "eager"
