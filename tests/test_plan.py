"""Plan.check lists every violated constraint with its numbers."""

from __future__ import annotations

import pytest

from conftest import gpt
from meshplan.errors import PlanError
from meshplan.specs.check import check, validate
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


def test_valid_plan_has_no_reasons():
    assert check(gpt(), load_system("h100").cluster(16), Plan(dp=2, tp=8, global_batch=8)) == []


def test_tp_must_divide_heads():
    model = load_model("llama3-70b")  # 64 heads
    reasons = check(model, None, Plan(tp=6))
    assert "tp=6 does not divide num_heads=64" in reasons


def test_gpu_count_must_match():
    reasons = check(gpt(), load_system("h100").cluster(16), Plan(dp=3, tp=2))
    assert "dp*tp*pp*cp = 3*2*1*1 = 6 != gpus=16" in reasons


def test_every_violation_is_listed():
    reasons = check(gpt(heads=16), None, Plan(tp=3, pp=64, micro_batch=3, global_batch=8, zero=5))
    assert len(reasons) >= 4
    with pytest.raises(PlanError) as err:
        validate(gpt(heads=16), None, Plan(tp=3, pp=64, micro_batch=3, global_batch=8, zero=5))
    assert "tp=3" in str(err.value) and "zero=5" in str(err.value)


def test_zero_or_negative_sizes():
    assert check(gpt(), None, Plan(tp=0)) == ["tp=0 must be a positive integer"]


def test_expert_parallel_constraints():
    mixtral = load_model("mixtral-8x7b")  # 8 experts
    assert "ep=3 does not divide num_experts=8" in check(mixtral, None, Plan(dp=6, ep=3))
    assert check(gpt(), None, Plan(dp=4, ep=2)) == ["ep=2 but gpt-test has no experts"]


def test_interleaved_needs_vpp_and_divisible_micro_batches():
    reasons = check(gpt(layers=8), None, Plan(pp=2, vpp=2, global_batch=3, schedule="interleaved"))
    assert any("does not divide the 3 micro-batches" in r for r in reasons)
    assert any("needs schedule='interleaved'" in r for r in check(gpt(layers=8), None,
                                                                  Plan(pp=2, vpp=2, schedule="1f1b")))
    assert Plan(pp=2, vpp=2).schedule == "interleaved" and Plan(pp=2).schedule == "1f1b"  # the default follows vpp


def test_bf16_rejected_on_v100():
    reasons = check(gpt(), load_system("v100").cluster(16), Plan(dp=16, precision="bf16"))
    assert any("precision=bf16 is not supported" in r for r in reasons)
    assert check(gpt(), load_system("v100").cluster(16), Plan(dp=16, precision="fp16")) == []


def test_stride_follows_placement():
    plan = Plan(dp=4, tp=8, pp=2, cp=2)
    assert (plan.stride("tp"), plan.stride("cp"), plan.stride("dp"), plan.stride("pp")) == (1, 8, 16, 64)
    moved = plan.with_(placement=("dp", "tp", "cp", "pp"))
    assert moved.stride("tp") == 4 and moved.stride("dp") == 1



def test_offload_layers_needs_activation_offload_and_shows_in_the_description():
    model = load_model("llama3-8b")
    assert any("needs offload_activations" in r for r in check(model, None, Plan(offload_layers=8)))
    assert any("non-negative integer" in r for r in check(model, None, Plan(offload_activations=True,
                                                                             offload_layers=2.5)))
    plan = Plan(offload_activations=True, offload_layers=8, ep=1)
    assert "offload-act=8" in plan.describe()


@pytest.mark.parametrize(("changes", "needs"), [
    ({"ep": 1}, "ep > 1"),
    ({"recompute": "full"}, "a recompute other than full"),
    ({"pp": 2, "dp": 4}, "vpp > 1 with pp > 1"),
])
def test_the_combined_1f1b_schedule_has_megatron_cores_requirements(changes, needs):
    from dataclasses import replace as _replace

    from meshplan.specs.check import check
    from meshplan.specs.hardware import load_system
    from meshplan.specs.model_load import load_model

    model, cluster = load_model("mixtral-8x7b"), load_system("h100").cluster(8)
    plan, stack = Plan(dp=8, ep=8, global_batch=16), Stack(overlap_ep=True)
    assert not check(model, cluster, plan, stack)
    reasons = check(model, cluster, _replace(plan, **changes), stack)
    assert any(f"overlap_ep (Megatron-Core's combined 1F1B) needs {needs}" in r for r in reasons)


def test_revised_is_replace():
    """specs/plan.revised (Plan.with_, the search's decoding) builds the plan dataclasses.replace builds, field for
    field, for a Plan and a PlanBatch; a name that is not a field is refused as replace refuses it."""
    from dataclasses import replace

    import numpy as np

    from meshplan.search.batch import PlanBatch
    from meshplan.specs.plan import revised

    plan = Plan(dp=4, tp=8, pp=2, micro_batch=2, placement=("tp", "cp", "dp", "pp"), tags=("x",))
    for changes in ({}, {"tp": 4}, {"zero": 3, "recompute": "full", "recompute_layers": 2}, {"etp": 0, "tp": 2},
                    {"summa_panels": 0, "tp2": 2}, {"schedule": None, "vpp": 2},
                    {"placement": ("tp", "dp", "pp", "cp")}):
        assert revised(plan, changes).__dict__ == replace(plan, **changes).__dict__
        assert plan.with_(**changes) == replace(plan, **changes)
    batch = PlanBatch.of([plan, Plan(dp=8, tp=4, pp=2, micro_batch=2, placement=plan.placement)])
    got, want = revised(batch, {"zero": 3}), replace(batch, zero=3)
    assert all(np.array_equal(getattr(got, k), getattr(want, k)) for k in want.__dict__ if k != "strides")
    assert got.plan(1) == want.plan(1) == replace(batch.plan(1), zero=3)
    with pytest.raises(TypeError):
        revised(plan, {"not_a_field": 1})
