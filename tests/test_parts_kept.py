"""step/units.timed_parts keeps one plan's ops and times for the plans that differ from it only in the layers and the
recompute or offload setting of its ranks (the variants the search's refinements price: search/refine.py,
search/stage_dp.py): what it returns for each is what the plan's own ops and times are, record for record, and a
caller that changes the lists it got does not change what the next caller gets."""

from __future__ import annotations

import random

import pytest

from meshplan.cost.wrapper_work import work_of
from meshplan.search import Space, search
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.parts import _kept_parts, _timed  # noqa: PLC2701 (its own)
from meshplan.step.units import timed_parts, units_for_recomputes

CASES = [("llama3-70b", "h100", 256, 1024, "megatron-core"), ("mixtral-8x7b", "h100", 64, 256, "any"),
         ("llama3-8b", "a100", 16, 256, "deepspeed")]


def _variants(plan, layers: int, rng: random.Random):
    """The plan with its ranks' layers, recompute and offload redrawn (valid or not: the ops do not check)."""
    pp = plan.pp
    split = [layers // pp] * pp
    split[0] -= 1
    split[-1] += 1
    yield plan.with_(stage_layers=tuple(split), stage_recompute=("full",) + ("none",) * (pp - 1))
    yield plan.with_(recompute=rng.choice(("none", "selective", "full")), recompute_layers=rng.randint(0, 2))
    yield plan.with_(offload_activations=True, offload_layers=rng.randint(0, 3))
    yield plan.with_(first_stage_layers=1, last_stage_layers=2, stage_offload=(1,) * pp)
    yield plan.with_(offload_optimizer=not plan.offload_optimizer, zero=max(1, plan.zero))  # no op reads it


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kept_parts_are_each_plans_own(case):
    name, system, gpus, gbs, framework = case
    model, cluster, stack = load_model(name), load_system(system).cluster(gpus), load_stack(framework)
    result = search(model, cluster, Space(global_batch=gbs, stack=stack), top_k=6, workers=1)
    assert result.plans
    rng = random.Random(3)
    for est in result.plans:
        for plan in (est.plan, *_variants(est.plan, model.num_layers, rng)):
            own = work_of(plan, stack)
            works = (own,) if own else ()
            kept = timed_parts(model, cluster, plan, stack, DEFAULT, works=works)
            fresh = _timed(model, cluster, plan, stack, DEFAULT, None, works)
            assert kept == fresh  # computed afresh
            # and the units of kept parts, kept by their key (step/units._kept_units), are the plan's own
            modes = ("none", "selective", "full")
            assert units_for_recomputes(model, plan, stack, kept, modes) == units_for_recomputes(
                model, plan, stack, fresh, modes)


def test_a_caller_changing_its_parts_does_not_change_the_next():
    model, cluster, stack = load_model("llama3-8b"), load_system("h100").cluster(8), load_stack("megatron-core")
    plan = search(model, cluster, Space(global_batch=64, stack=stack), top_k=1, workers=1).plans[0].plan
    _kept_parts.cache_clear()
    first = timed_parts(model, cluster, plan, stack, DEFAULT, works=())
    for ops in first.ops.values():
        ops.clear()
    second = timed_parts(model, cluster, plan.with_(recompute="full"), stack, DEFAULT, works=())
    assert _kept_parts.cache_info().hits == 1  # the variant took the kept parts
    assert second.ops["dense"] and second == _timed(model, cluster, plan, stack, DEFAULT, None, ())


def test_kept_units_survive_their_store_filling(monkeypatch):
    """A plan's units asked for in two modes, the first kept: when the store is full as the second is computed, it is
    cleared, and the answer still holds both modes (the suite's process once filled it: a KeyError in --emit)."""
    import meshplan.step.units as units_module  # noqa: PLC0415

    model, cluster, stack = load_model("llama3-8b"), load_system("h100").cluster(8), load_stack("megatron-core")
    plan = search(model, cluster, Space(global_batch=64, stack=stack), top_k=1, workers=1).plans[0].plan
    parts = timed_parts(model, cluster, plan, stack, DEFAULT, works=())
    units_module._UNITS.clear()
    units_for_recomputes(model, plan, stack, parts, ("none",))  # one entry kept
    monkeypatch.setattr(units_module, "_UNITS_KEPT", 1)  # full: the next miss clears it
    both = units_for_recomputes(model, plan, stack, parts, ("none", "full"))
    assert set(both) == {"none", "full"}
    fresh = units_for_recomputes(model, plan, stack, _timed(model, cluster, plan, stack, DEFAULT, None, ()),
                                 ("none", "full"))
    assert both == fresh


def test_counts_share_the_parts_of_plans_differing_in_dp_alone():
    """A strong-scaling sweep's plans at each GPU count differ in dp alone: they share one timing of their ops
    where their groups split over the tiers alike, and each gets its own plan's ops and times."""
    model, system, stack = load_model("llama3-70b"), load_system("h100"), load_stack("megatron-core")
    plans = search(model, system.cluster(512), Space(global_batch=1024, stack=stack), top_k=6, workers=1).plans
    _kept_parts.cache_clear()
    for est in plans:
        for dp in (est.plan.dp, est.plan.dp // 2):
            plan, cluster = est.plan.with_(dp=dp), system.cluster(est.plan.num_gpus // est.plan.dp * dp)
            own = work_of(plan, stack)
            works = (own,) if own else ()
            assert timed_parts(model, cluster, plan, stack, DEFAULT, works=works) == _timed(
                model, cluster, plan, stack, DEFAULT, None, works)
    assert _kept_parts.cache_info().hits >= len(plans) - 1  # the halved dp's took the kept parts


def test_a_dp_that_moves_a_group_to_another_tier_is_timed_apart():
    """Where dp sets where a group sits (the pipeline's sends, strided by tp·dp: in one NVLink domain at dp = 1,
    across the network at dp = 8), the two plans are timed each on its own, and their sends' times differ."""
    model, system, stack = load_model("llama3-8b"), load_system("h100"), load_stack("megatron-core")
    one = Plan(dp=1, tp=2, pp=2, global_batch=64)
    eight = one.with_(dp=8)
    _kept_parts.cache_clear()
    near = timed_parts(model, system.cluster(4), one, stack, DEFAULT, works=())
    far = timed_parts(model, system.cluster(32), eight, stack, DEFAULT, works=())
    assert _kept_parts.cache_info().hits == 0
    assert near == _timed(model, system.cluster(4), one, stack, DEFAULT, None, ())
    assert far == _timed(model, system.cluster(32), eight, stack, DEFAULT, None, ())
    assert near.ops["p2p"] == far.ops["p2p"] and near.times["p2p"] != far.times["p2p"]
