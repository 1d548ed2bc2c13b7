"""search/shapes_ahead.py: a strong-scaling plan's op shapes priced at once before its searches, and the combinations
and pools built for that handed to the searches."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.search import Space, candidates, key_store, shapes_ahead
from meshplan.search.batch import PlanBatch, joined
from meshplan.search.combos import valid_combos
from meshplan.search.key_store import shared_units
from meshplan.search.tally import Tally
from meshplan.search.variants import search_switches
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from spaces import EVERY_PLAN

COUNTS = (16, 32, 64)  # 2, 4 and 8 nodes: the outermost tier's size differs, the counts share one store a mode


def _result(found):
    """What a search answers, every number as its bits: the plans and their times, memory and detail's step, the
    counts, the refusals and their examples."""
    return ([(e.plan, e.step_time.hex(), e.peak_memory.hex()) for e in found.plans],
            None if found.fastest is None else (found.fastest.plan, found.fastest.step_time.hex()),
            found.evaluated, found.feasible, found.bounded, found.rejected, found.examples)


@pytest.mark.parametrize(("name", "gemms"), [("llama3-8b", ()), ("mixtral-8x7b", ("per_expert", "grouped"))])
def test_a_sweep_with_its_shapes_priced_ahead_answers_each_count_as_before(name, gemms, monkeypatch):
    """Three GPU counts searched in one ``shared_units`` (cli/plan.py's strong-scaling sweep), with every count's
    shapes priced before the searches (``shapes_ahead``; Mixtral's two expert-GEMM twins too) and without: the same
    plans, step times, memory, counts and refusals, bit for bit. With them priced ahead, no search prices a shape of
    its own (``shape_compute_times`` is not called again), and each search takes the combinations and pools built for
    it, once: none is left when the sweep ends."""
    model = load_model(name).with_seq_length(2048)
    space = Space(**EVERY_PLAN, global_batch=64, layouts=("1d",), expert_gemms=gemms)
    clusters = [load_system("h100").cluster(n) for n in COUNTS]
    with shared_units():
        before = [_result(search_switches(model, c, space, top_k=5)) for c in clusters]
    calls = []
    priced = key_store.shape_compute_times
    monkeypatch.setattr(key_store, "shape_compute_times", lambda *a: calls.append(1) or priced(*a))
    monkeypatch.setattr("meshplan.search.keyed.shape_compute_times", key_store.shape_compute_times)
    with shared_units(), shapes_ahead.shapes_ahead([(model, c, space) for c in clusters]):
        ahead = len(calls)
        after = [_result(search_switches(model, c, space, top_k=5)) for c in clusters]
        left = dict(candidates.AHEAD[-1])
    assert after == before
    assert ahead == (2 if gemms else 1) * len(list(space.modes()))  # one batch a store: every count's shapes
    assert len(calls) == ahead  # the searches found every shape priced
    assert not left  # every combination list and pool taken by its search
    assert not candidates.AHEAD


def test_outside_shared_units_nothing_is_priced_or_handed():
    """Without stores shared across the searches there is nowhere to price ahead into: nothing is done, nothing
    handed."""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(16)
    with shapes_ahead.shapes_ahead([(model, cluster, Space(global_batch=16))]):
        assert not candidates.AHEAD
        assert candidates.taken(("combos", model, cluster, Space(global_batch=16))) is None


def test_handed_combinations_and_pools_are_taken_once_with_their_build_tally():
    """A search asking for what was built for it takes it once (a second ask finds none: it builds its own); the pool
    comes with the build rejections its building tallied, added to the search's tally as building it there would
    have added them (here, interleaved plans whose micro-batches pp does not divide)."""
    model, cluster = load_model("llama3-8b").with_seq_length(2048), load_system("h100").cluster(32)
    space = Space(**EVERY_PLAN, global_batch=48, layouts=("1d",))
    with shared_units(), shapes_ahead.shapes_ahead([(model, cluster, space)]):
        combos, tally = candidates.taken(("combos", model, cluster, space))
        assert candidates.taken(("combos", model, cluster, space)) is None
        own, own_tally = valid_combos(model, cluster, space)
        assert combos == own and tally == own_tally
        mode = next(iter(space.modes()))
        mine = [c for c in combos if c.layout == mode[0]]
        took = Tally()
        pool, sized = candidates.mode_pool(mode, mine, cluster, space, took)
        assert candidates.taken(candidates.pool_key(mode, mine, cluster, space)) is None
    built = Tally()
    own_pool, own_sized = candidates.mode_rows(mode, *candidates.layout_rows(mine, cluster, space, built))
    assert took == built and built.counts  # the same rejections, and there are some
    for name in ("dp", "tp", "pp", "micro_batch", "vpp", "placement_id"):
        assert np.array_equal(getattr(pool, name), getattr(own_pool, name))
    assert np.array_equal(sized.count, own_sized.count)


def test_joined_batches_hold_their_columns_end_to_end():
    """batch.joined: the plans of the batches in their order (every column and stride end to end); batches that
    differ in a categorical setting are refused."""
    plain = {"global_batch": 16, "sequence_parallel": False}
    a = PlanBatch.of([Plan(dp=8, **plain), Plan(dp=4, tp=2, **plain)])
    b = PlanBatch.of([Plan(dp=2, pp=4, **plain)])
    both = joined([a, b])
    assert [both.plan(i) for i in range(3)] == [a.plan(0), a.plan(1), b.plan(0)]
    assert all(np.array_equal(both.stride(x), np.concatenate([a.stride(x), b.stride(x)])) for x in a.strides)
    with pytest.raises(ValueError, match="categorical"):
        joined([a, PlanBatch.of([Plan(dp=8, zero=3, **plain)])])
