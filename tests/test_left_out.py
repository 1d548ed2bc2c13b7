"""search/memory_pass.left_out: the size combinations the stack refuses under every setting are left out before
their kernel units and lower bound are computed, their plans tallied under the refusal's reason and counted as
evaluated as before; the plans found, their step times and memory, the counts and the rejection counts are the same
as when their units are priced and their memory passed (only the count of plans the bound skipped moves: those it
counted)."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.search import Space, search
from meshplan.search import evaluate as evaluate_module
from meshplan.search.candidates import candidates, mode_pool
from meshplan.search.combos import valid_combos
from meshplan.search.memory_pass import REFUSED_FIRST, _firsts, refusal_codes, refused_plans
from meshplan.search.refused import grid_refusals
from meshplan.search.tally import Tally, first_set
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.refusals import stack_refusals

MODEL, CLUSTER = load_model("mixtral-8x7b"), load_system("h100").cluster(32)
REASON = "megatron-core refuses MoE with tp > 1 without sequence parallelism"
SOURCE = "(megatron-core 0.16.1 megatron/core/transformer/moe/moe_layer.py:379-383)"


def _priced(monkeypatch: pytest.MonkeyPatch) -> list:
    """The pools whose kernel units the searches compute (evaluate's KeyUnits), recorded."""
    pools = []
    real = evaluate_module.KeyUnits

    class Spy(real):  # type: ignore[misc, valid-type]
        def __init__(self, model, cluster, pool, *rest, **kw) -> None:
            pools.append(pool)
            super().__init__(model, cluster, pool, *rest, **kw)
    monkeypatch.setattr(evaluate_module, "KeyUnits", Spy)
    return pools


def _kept_all(model, space, pool, sized, groups, twin, chunk):
    """left_out as if the stack refused no combination under every setting: every row searched, as before."""
    return (pool, sized, [None] * len(groups)), Tally(), 0  # no refusal codes: each memory pass finds its own


def test_moe_at_tp_over_1_without_sequence_parallelism_is_refused_before_its_units_are_priced(monkeypatch):
    # Mixtral-8x7B on 32 H100s without activation offload (the three offload refusals listed before it in
    # megatron-core's ``refuses`` then refuse nothing): every setting of every plan of tp > 1 without sequence
    # parallelism is counted under the MoE refusal, its (tp > 1) plans times the 3 x 2 x 2 x 1 settings grid
    pools = _priced(monkeypatch)
    space = Space(global_batch=64, offload_activations=(False,))
    result = search(MODEL, CLUSTER, space, top_k=3, workers=1)
    columns, _ = candidates(MODEL, CLUSTER, space)
    assert space.grid_size == 3 * 2 * 2 * 1
    assert result.rejected[REASON] == int((columns["tp"] > 1).sum()) * space.grid_size > 0
    example = result.examples[REASON]  # a refused plan: tp > 1, no sequence parallelism, and the refusal's source
    fields = dict(f.split("=") if "=" in f else (f, "") for f in example.removesuffix(f" {SOURCE}").split())
    assert example.endswith(SOURCE) and int(fields["tp"]) > 1 and "sp" not in fields
    without_sp = [p for p in pools if not p.sequence_parallel]
    assert without_sp and all((p.tp == 1).all() for p in without_sp)  # no unit priced for a refused combination
    assert any((p.tp > 1).any() for p in pools if p.sequence_parallel)  # with SP they are searched


def test_leaving_them_out_changes_only_the_count_the_bound_skipped(monkeypatch):
    # the default grid (activation offload too: each setting under the first rule that refuses it) with and without
    # leaving out; the counts of rejections are the same, their examples may be other plans
    space = Space(global_batch=64)
    new = search(MODEL, CLUSTER, space, top_k=5, workers=1).to_dict()
    monkeypatch.setattr(evaluate_module, "left_out", _kept_all)
    old = search(MODEL, CLUSTER, space, top_k=5, workers=1).to_dict()
    for d in (new, old):
        d.pop("seconds"), d.pop("plans_per_second"), d["rejected"].pop("examples")
    assert new.pop("bounded") < old.pop("bounded")  # the refused combinations whose bound could not reach the top
    assert new == old
    assert new["rejected"]["reasons"][REASON] > 0


def test_the_refusal_codes_are_each_plans_first_refusal():
    # memory_pass.refusal_codes (refused.grid_codes: each refusal written where it holds, the last first) against the
    # definition, refused.grid_refusals' disjoint masks (each plan under the first refusal that refuses it), in
    # chunks of 7 combinations: the default grid refuses by several rules (offload, MoE without SP, ...)
    space = Space(global_batch=64)
    combos, _ = valid_combos(MODEL, CLUSTER, space)
    mode = next(m for m in space.modes() if not m[1])
    pooled = mode_pool(mode, [c for c in combos if c.layout == mode[0]], CLUSTER, space, Tally())
    assert pooled is not None
    pool, _ = pooled
    codes, rules = refusal_codes(MODEL, space, pool, 7), stack_refusals(space.stack)
    want = np.zeros_like(codes)
    for rule, hit in grid_refusals(MODEL, pool, space):
        want[hit] = rules.index(rule) + 1
    assert np.array_equal(codes, want)
    assert len(np.unique(codes)) >= 3  # none, and at least two rules


def test_the_refused_plans_are_each_settings_codes_counted_by_their_plans():
    # memory_pass.refused_plans (one bincount per distinct number of plans, times it) against a bincount of each
    # setting's codes weighted by the plans: 2 x 3 settings of 5 combinations standing for 1, 4, 1, 2, 4 plans; code
    # c counts under status REFUSED_FIRST - 1 + c (e.g. the first rule, code 1, under REFUSED_FIRST)
    codes = np.array([[[1, 2, 1, 3, 1], [1, 1, 1, 1, 2], [3, 3, 1, 1, 1]],
                      [[2, 2, 2, 2, 2], [1, 3, 3, 1, 1], [1, 1, 1, 1, 1]]], dtype=np.uint8)
    plans = np.array([1, 4, 1, 2, 4])
    want = np.zeros(REFUSED_FIRST + 3, dtype=np.int64)
    for setting in codes.reshape(-1, 5):
        for code, n in zip(setting, plans, strict=True):
            want[REFUSED_FIRST - 1 + code] += n
    assert refused_plans(codes, plans, 3) == list(want)
    assert sum(want) == 6 * plans.sum()  # every setting of every combination, once
    assert refused_plans(codes, np.ones(5, dtype=np.int64), 3)[REFUSED_FIRST] == int((codes == 1).sum())  # 18


def test_each_refusals_first_plan_is_first_sets():
    # memory_pass._firsts (a setting at a time, until each code is met) against tally.first_set of each code's mask,
    # on drawn settings-first statuses (3 x 2 x 2 x 2 settings of 50 combinations): a code met late, one met in the
    # first setting only, one in every setting
    rng = np.random.default_rng(7)
    for _ in range(20):
        status = rng.choice(np.array([5, 6, 7], dtype=np.uint8), size=(3, 2, 2, 2, 50), p=[0.9, 0.09, 0.01])
        status[0, 0, 0, 0, rng.integers(50)] = 8
        status[2, 1, 1, 1, rng.integers(50)] = 9
        codes = [int(c) for c in np.unique(status)]
        assert _firsts(status, codes) == {c: first_set(status == c) for c in codes}
