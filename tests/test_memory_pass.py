"""search/memory_pass.py: a schedule group's memory computed once, in chunks of the natural order, read by the
branch and bound's blocks in the bound's order bit for bit; and reused by the expert-GEMM searches' twin jobs unless
the per-expert path saves more (gpt-oss's clamped GLU)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshplan.search import Space, search
from meshplan.search import evaluate as evaluate_module
from meshplan.search.batch import PlanBatch
from meshplan.search.memory_pass import FITS, IN_HEADROOM, OVER_HBM, OVER_HOST, REFUSED_FIRST, _fill, group_memory
from meshplan.search.refused import grid_refusals
from meshplan.search.run import searches
from meshplan.search.scoring import grid_memory
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.step.units import Saved, unit_costs
from spaces import EVERY_PLAN


def _spy(monkeypatch) -> list:
    """Each memory pass the searches compute: (model, space, the group's combinations, saved(rows), the pass)."""
    calls = []
    real = evaluate_module.group_memory

    def spy(model, space, pool, saved, chunk, limits, codes=None):
        memory = real(model, space, pool, saved, 7, limits, codes)  # chunks of 7: the pass is the same in any chunks
        calls.append((model, space, pool, saved, memory))
        return memory
    monkeypatch.setattr(evaluate_module, "group_memory", spy)
    return calls


def _space(gemm: str) -> Space:
    base = Space(global_batch=64, offload_activations=(False,))
    return replace(base, stack=base.stack.with_(expert_gemm=gemm))


def _alike(a, b) -> None:
    left, right = a.to_dict(), b.to_dict()
    for d in (left, right):
        d.pop("seconds"), d.pop("plans_per_second")
    assert left == right


@pytest.fixture(scope="module")
def qwen_grouped() -> tuple:
    """Qwen3-30B-A3B's grouped-GEMM search alone on 32 H100s, its memory passes spied: (its result, its passes).
    The first test reads the passes, the twin test compares its grouped twin with the result: one search for both
    (it is the same call under the same spy; the twin test searched it again after its twins)."""
    with pytest.MonkeyPatch.context() as patch:
        calls = _spy(patch)
        result = search(load_model("qwen3-30b-a3b"), load_system("h100").cluster(32), _space("grouped"), top_k=3,
                        workers=1)
    return result, calls


def test_a_block_in_the_bounds_order_reads_what_the_block_alone_computes(qwen_grouped):
    _, calls = qwen_grouped
    model, space, pool, saved, memory = max(calls, key=lambda c: len(c[2]))
    assert len(pool) > 100  # a group of many chunks of 7
    block = np.random.default_rng(0).permutation(len(pool))[: len(pool) // 2]  # any order, as the bound's
    status, peak = memory.at(block)
    alone = pool.select(block)
    want_peak, want_host = grid_memory(model, alone, saved(block), space)
    refusals = grid_refusals(model, alone, space)
    refused = np.zeros(want_peak.shape, dtype=bool)
    for rule, hit in refusals:  # each rule's plans: those of its status
        assert np.array_equal(status == REFUSED_FIRST + memory.rules.index(rule), hit)
        refused |= hit
    assert np.array_equal(peak, np.where(refused, np.nan, want_peak), equal_nan=True)  # bit for bit, NaN if refused
    assert np.array_equal(memory.host_at(block)[~refused], want_host[~refused])  # a refused plan's is never read
    assert any(h.any() for _, h in refusals)  # Megatron-Core refuses some of them (optimizer offload without ZeRO)
    capacity, usable, host_capacity = memory.limits  # the others' status: the comparisons with the limits
    runs = ~refused
    assert np.array_equal(status == FITS, runs & (want_peak <= usable) & (want_host <= host_capacity))
    assert np.array_equal(status == OVER_HBM, runs & (want_peak > capacity))
    assert np.array_equal(status == IN_HEADROOM, runs & (want_peak > usable) & (want_peak <= capacity))
    assert np.array_equal(status == OVER_HOST, runs & (want_peak <= usable) & ~(want_host <= host_capacity))
    plans = np.arange(1, len(block) + 1)  # each combination standing for a different number of plans
    counts = memory.plans_of(block, plans)
    assert counts == [int((status == s).reshape(-1, len(block)).sum(axis=0) @ plans) for s in range(len(counts))]


def test_a_combination_refused_under_every_setting_keeps_no_bytes_of_its_own(qwen_grouped):
    # Megatron-Core refuses an MoE layer's tp > 1 without sequence parallelism under every setting: such a combination
    # reads the one all-NaN row after the others' (memory_pass.group_memory), whose bytes are stored in their order.
    # The search leaves them out before its passes (memory_pass.left_out) unless it explores: here the pass of the
    # combinations of a group with sequence parallelism, taken without it (those of tp > 1 refused)
    _, calls = qwen_grouped
    model, space, pool, saved, searched = next(c for c in calls if c[2].sequence_parallel and (c[2].tp > 1).any())
    pool = pool.select(slice(None), sequence_parallel=False)
    memory = group_memory(model, space, pool, saved, 7, searched.limits)
    refused = (memory.status >= REFUSED_FIRST).reshape(len(pool), -1).all(axis=1)
    assert np.array_equal(refused, pool.tp > 1)  # every setting of tp > 1 refused, those of tp = 1 run
    assert memory.peak.shape == memory.host.shape == (len(pool) - refused.sum() + 1, *memory.status.shape[1:])
    assert np.array_equal(memory.index[~refused], np.arange(len(pool) - refused.sum()))
    assert (memory.index[refused] == len(memory.peak) - 1).all()
    assert np.isnan(memory.peak[-1]).all() and np.isnan(memory.host[-1]).all()
    status, peak = memory.at(np.flatnonzero(refused))  # what a block reads of them: their refusals, NaN bytes
    assert (status >= REFUSED_FIRST).all() and np.isnan(peak).all()


@pytest.mark.parametrize(("name", "passes"), [("qwen3-30b-a3b", 1), ("gpt-oss-20b", 2)])
def test_twin_searches_share_a_groups_memory_unless_the_saved_activations_differ(monkeypatch, request, name, passes):
    # Qwen3-30B-A3B: per-expert and grouped GEMMs save the same activations, one pass a group serves both searches;
    # gpt-oss-20b: the per-expert path's clamped GLU keeps fc1's output besides its clamped copy (cost/mlp_moe.py),
    # so each search computes its own. Either way each result is the one its search finds alone.
    calls = _spy(monkeypatch)
    model, cluster = load_model(name), load_system("h100").cluster(32)
    spaces = [_space(g) for g in ("per_expert", "grouped")]
    twins = searches(model, cluster, spaces, top_k=3, workers=1)
    groups = {(bool(c[2].sequence_parallel), c[2].schedule) for c in calls}
    assert len(calls) == passes * len(groups)
    # Qwen3-30B-A3B's grouped search alone is the module's (the same call, under the same spy)
    shared = {"grouped": request.getfixturevalue("qwen_grouped")[0]} if name == "qwen3-30b-a3b" else {}
    for space, result in zip(spaces, twins, strict=True):
        gemm = space.stack.expert_gemm
        _alike(result, shared[gemm] if gemm in shared else search(model, cluster, space, top_k=3, workers=1))


def test_a_chunk_partly_refused_computes_the_rest_as_the_whole_grid_does():
    """memory_pass._fill on a chunk of three combinations where the framework refuses the second under every
    setting, no-recompute under every setting of every combination, and activation offload likewise: the others
    (two combinations under two recompute modes without offload) are computed on those alone and written into their
    places, each the float32 bytes of the whole grid bit for bit; every refused element is NaN (no status reads it)."""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(64)
    plans = [Plan(dp=64, global_batch=64, sequence_parallel=True),
             Plan(dp=32, tp=2, global_batch=64, sequence_parallel=True),
             Plan(dp=16, tp=4, global_batch=64, sequence_parallel=True)]
    space = Space(global_batch=64, **EVERY_PLAN)
    batch = PlanBatch.of(plans)
    units = {rc: unit_costs(model, cluster, replace(batch, recompute=rc), space.stack) for rc in space.recompute}

    def saved(rows):
        return {rc: Saved(*(np.broadcast_to(np.asarray(getattr(u, f), dtype=np.float64), (3,))[rows]
                            for f in ("layer_saved", "embed_saved", "head_saved", "layer_working")))
                for rc, u in units.items()}

    want_peak, want_host = grid_memory(model, batch, saved(np.arange(3)), space)
    grid = tuple(len(g) for g in space.grid)
    refused = np.zeros((*grid, 3), dtype=np.uint8)
    none, offload = space.recompute.index("none"), space.offload_activations.index(True)
    refused[none] = 1
    refused[:, :, :, offload] = 1
    refused[..., 1] = 2
    peak, host = np.empty((3, *grid), dtype=np.float32), np.empty((3, *grid), dtype=np.float32)
    _fill(peak, host, (model, space, batch, saved, 0), refused)
    computed = np.moveaxis(refused == 0, -1, 0)
    assert computed.sum() == 2 * 2 * 4 * 2  # two combinations x two modes x four ZeRO stages x two optimizer offloads
    assert np.array_equal(peak[computed], np.moveaxis(want_peak, -1, 0)[computed])
    assert np.array_equal(host[computed], np.moveaxis(want_host, -1, 0)[computed])
    assert np.isnan(peak[~computed]).all() and np.isnan(host[~computed]).all()
