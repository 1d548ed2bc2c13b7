"""search/keyed.py: per-key units, one per distinct key (its shape, panels and tier splits), priced once."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from meshplan.cost.records import same_record
from meshplan.roofline import op_time
from meshplan.search import Space, key_store
from meshplan.search.batch import PlanBatch
from meshplan.search.candidates import candidates
from meshplan.search.key_store import shared_units
from meshplan.search.keyed import KeyUnits, distinct, split_codes
from meshplan.search.placements import PLACEMENTS
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.step.passes import PassTimes
from meshplan.step.units import compute_times, plan_ops
from spaces import EVERY_PLAN


def unit_keys(model, cluster, batch):
    """The reference unit key (what keyed.KeyUnits.price packs into one code): the unit columns and the tier splits
    of the groups their collectives use; the first plan of each distinct key and each plan's key index."""
    columns = ("tp", "tp2", "cp", "micro_batch", "ep", "etp", "summa_panels")
    return distinct(np.stack([getattr(batch, k) for k in columns] + split_codes(model, cluster, batch)))


@pytest.mark.parametrize(("name", "layout"), [("mixtral-8x7b", "1d"), ("llama3-8b", "summa")])
def test_one_key_per_shape_gives_every_keys_kernel_times_and_saved_activations(name, layout):
    """keyed.KeyUnits: the forward and backward kernel times and the saved bytes of a unit depend on its op shapes
    alone, not on the placement or SUMMA panels: the key computed for its shape stands for every key of it (what
    memory and the lower bound use), on a two-tier mesh where placements split the groups differently."""
    model, cluster = load_model(name).with_seq_length(2048), load_system("h100").cluster(32)
    space = Space(**EVERY_PLAN, global_batch=64, layouts=(layout,), sequence_parallel=(True,))
    columns, _ = candidates(model, cluster, space)
    columns.pop("layout")
    pool = PlanBatch(**columns, placements=PLACEMENTS, **space.settings).select(
        columns["tp"] > 1, sequence_parallel=True, tensor_layout=layout)
    units = KeyUnits(model, cluster, pool, space.stack, space.recompute, DEFAULT)
    full, saved = units.price(pool, units.shape_of)[0], units.saved(units.shape_of)  # saved: what memory reads
    by_shape = {rc: u.take(units.shape_of) for rc, u in units.shapes.items()}
    # the key table knows a key by (shape, panels, tier splits): as many as the distinct unit keys of the plans
    assert units.n_shapes < units.priced == len(unit_keys(model, cluster, pool)[0])
    for rc in space.recompute:
        for f in ("layer_saved", "embed_saved", "head_saved"):
            assert np.allclose(getattr(full[rc], f), getattr(saved[rc], f), rtol=1e-12)
            assert np.allclose(getattr(full[rc], f), getattr(by_shape[rc], f), rtol=1e-12)
        for part, f in itertools.product(("layer", "layer_plain", "embed", "head"), ("fwd", "bwd")):
            assert np.allclose(getattr(getattr(full[rc], part), f), getattr(getattr(by_shape[rc], part), f),
                               rtol=1e-12)


def test_a_key_is_priced_once_whatever_the_batches():
    """keyed.KeyUnits.price: plans priced in two batches get the units they get in one, and pricing them again adds
    no key (the memo table finds every code it has met)."""
    model, cluster = load_model("mixtral-8x7b").with_seq_length(2048), load_system("h100").cluster(32)
    space = Space(**EVERY_PLAN, global_batch=64, layouts=("1d",), sequence_parallel=(True,))
    columns, _ = candidates(model, cluster, space)
    columns.pop("layout")
    pool = PlanBatch(**columns, placements=PLACEMENTS, **space.settings).select(
        columns["tp"] > 1, sequence_parallel=True)
    whole = KeyUnits(model, cluster, pool, space.stack, space.recompute, DEFAULT)
    at_once, panels = whole.price(pool, whole.shape_of)
    halves = KeyUnits(model, cluster, pool, space.stack, space.recompute, DEFAULT)
    cut = np.arange(len(pool)) % 3 == 0
    parts = [halves.price(pool.select(rows), halves.shape_of[rows])[0] for rows in (cut, ~cut)]
    assert halves.priced == whole.priced
    again, again_panels = whole.price(pool, whole.shape_of)
    assert whole.priced == halves.priced
    for rc in space.recompute:
        assert np.array_equal(again[rc].layer.total, at_once[rc].layer.total)
        assert again_panels[rc].keys() == panels[rc].keys()  # a panel count per kind of wrapper work ("": none)
        assert all(np.array_equal(again_panels[rc][w], nb) for w, nb in panels[rc].items())
        for rows, part in zip((cut, ~cut), parts, strict=True):
            for name in ("layer", "embed", "head", "p2p"):
                assert np.array_equal(getattr(part[rc], name).total, getattr(at_once[rc], name).total[rows])


def _pool(model, cluster, space):
    columns, _ = candidates(model, cluster, space)
    columns.pop("layout")
    return PlanBatch(**columns, placements=PLACEMENTS, **space.settings).select(
        columns["tp"] > 1, sequence_parallel=True)


def _leaves(units):
    """Every number of some units, field by field (PassTimes' fields, the wrapped twins' too), as arrays."""
    for f in type(units).__slots__:
        v = getattr(units, f)
        if isinstance(v, dict):
            for w in sorted(v):
                yield from _leaves(v[w])
        elif isinstance(v, PassTimes):
            yield from (np.asarray(getattr(v, g), dtype=np.float64) for g in PassTimes.__slots__)
        elif v is not None:
            yield np.asarray(v, dtype=np.float64)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "llama3-8b"])
def test_a_store_shared_across_gpu_counts_prices_each_count_as_alone(name):
    """key_store.shared_units: the searches of one model on 16, 32 and 64 H100s (2, 4 and 8 nodes: the outermost
    tier's size differs) share one store of priced keys, the later ones pricing only the keys the earlier did not
    meet; each count's units, panel counts, kernel units and compute-op times are bit for bit those of a store of
    its own (outside shared_units, each search's own store, as before)."""
    model = load_model(name).with_seq_length(2048)
    space = Space(**EVERY_PLAN, global_batch=64, layouts=("1d",), sequence_parallel=(True,))
    alone, priced = {}, 0
    for gpus in (16, 32, 64):  # each count's own store (outside shared_units)
        cluster = load_system("h100").cluster(gpus)
        pool = _pool(model, cluster, space)
        units = KeyUnits(model, cluster, pool, space.stack, space.recompute, DEFAULT)
        alone[gpus] = units, units.price(pool, units.shape_of)
        priced += units.priced
    with shared_units():
        shared = [_shared(model, gpus, space) for gpus in (16, 32, 64)]
    for gpus, (units, (full, panels)) in zip((16, 32, 64), shared, strict=True):
        own, (own_full, own_panels) = alone[gpus]
        for rc in space.recompute:
            for a, b in zip(_leaves(full[rc]), _leaves(own_full[rc]), strict=True):
                assert np.array_equal(a, b)
            for a, b in zip(_leaves(units.shapes[rc]), _leaves(own.shapes[rc]), strict=True):
                assert np.array_equal(*np.broadcast_arrays(a, b))  # one number for all shapes, or each its own
                assert np.shape(a) in ((), (units.n_shapes,))
            assert panels[rc].keys() == own_panels[rc].keys()
            assert all(np.array_equal(panels[rc][w], own_panels[rc][w]) for w in panels[rc])
        for group, times in own.compute.items():
            for a, b in zip(units.compute[group], times, strict=True):
                assert (a is None) == (b is None)
                assert a is None or np.array_equal(*np.broadcast_arrays(a, b))
    assert units.priced < priced  # one store for the three counts: the later met keys the earlier had priced


def _shared(model, gpus, space):
    cluster = load_system("h100").cluster(gpus)
    pool = _pool(model, cluster, space)
    units = KeyUnits(model, cluster, pool, space.stack, space.recompute, DEFAULT)
    return units, units.price(pool, units.shape_of)


def test_distinct_keys_survive_int64_overflow():
    """Five columns of values up to 2^20 pack into 2^100 > int64: the code is renumbered instead."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**20, size=(5, 40))
    keys = np.concatenate([base, base[:, :10]], axis=1)  # rows 40..49 repeat rows 0..9
    first, inverse = distinct(keys)
    assert len(first) == len({tuple(c) for c in base.T}) == 40
    assert (keys[:, first][:, inverse] == keys).all()  # every row maps back to its own key
    assert (inverse[40:] == inverse[:10]).all()


def test_twin_times_reuses_the_previous_calls_equal_ops_within_and_forgets_them_on_leaving():
    """key_store.twin_times: within it, shape_compute_times takes the time of each compute op equal (field for field,
    bit for bit) to the op at its place in the previous call, on rows grouped the same way by the op keys: the very
    objects that call priced; an op that differs (here the first GEMM's m + 1) is priced afresh. On leaving, the
    previous call is let go: a call after prices every op again, to the same values."""
    model, cluster, stack = load_model("llama3-8b"), load_system("h100").cluster(16), Space(global_batch=16).stack
    shaped = PlanBatch.of([Plan(dp=16, global_batch=16, sequence_parallel=True),
                           Plan(dp=8, tp=2, sequence_parallel=True, global_batch=16)])
    ops = plan_ops(model, shaped, stack)
    kind = next(iter(ops))
    gemm = next(i for i, op in enumerate(ops[kind]) if op.kind == "gemm")
    changed = {k: [replace(op, m=op.m + 1) if (k, i) == (kind, gemm) else op for i, op in enumerate(v)]
               for k, v in ops.items()}
    with key_store.twin_times():
        first = key_store.shape_compute_times(model, cluster, shaped, stack, DEFAULT, ops)
        again = key_store.shape_compute_times(model, cluster, shaped, stack, DEFAULT, changed)
        assert key_store._LAST  # the last call's, for the next
    assert not key_store._LAST
    after = key_store.shape_compute_times(model, cluster, shaped, stack, DEFAULT, ops)
    reused = fresh = 0
    for k, v in ops.items():
        for i, op in enumerate(v):
            if first[k][i] is None or op.kind == "collective":
                continue
            if (k, i) == (kind, gemm):
                assert again[k][i] is not first[k][i]
            else:
                assert again[k][i] is first[k][i]
                reused += 1
            assert after[k][i] is not first[k][i] and np.array_equal(after[k][i], first[k][i])
            fresh += 1
    assert reused > 10 and fresh == reused + 1


def test_an_op_equal_to_an_earlier_one_takes_its_time_each_the_roofline_s_alone():
    """step/parts.compute_times prices an op equal to an earlier one (records.same_record: field for field, bit for bit)
    once: DeepSeek-V3's dense and MoE layers share their attention, whose ops take the dense layer's times, the very
    objects; every op's time is op_time's of that op alone, bit for bit; an op that differs in one bit is priced."""
    model, cluster, stack = load_model("deepseek-v3"), load_system("h100").cluster(64), Space(global_batch=64).stack
    shaped = PlanBatch.of([Plan(dp=8, tp=8, ep=8, sequence_parallel=True, global_batch=64),
                           Plan(dp=16, tp=4, ep=16, sequence_parallel=True, global_batch=64)])
    ops = plan_ops(model, shaped, stack)
    times = compute_times(model, cluster, shaped, stack, DEFAULT, ops)
    shared = 0
    for k, v in ops.items():
        for op, t in zip(v, times[k], strict=True):
            if op.kind == "collective":
                assert t is None
                continue
            alone = op_time(op, cluster.accelerator, shaped.precision, DEFAULT)
            assert np.asarray(t).tobytes() == np.asarray(alone).tobytes()
            if k == "moe" and op.name.startswith("attn/"):
                twin = next(u for o, u in zip(ops["dense"], times["dense"], strict=True)
                            if o.name == op.name and o.phase == op.phase)
                shared += twin is t
    assert shared >= 10
    gemm = next(op for op in ops["dense"] if op.kind == "gemm")
    nudged = replace(gemm, m=np.nextafter(gemm.m, np.inf))
    assert not same_record(gemm, nudged) and same_record(gemm, replace(gemm, m=gemm.m.copy()))
    assert not same_record(gemm, replace(gemm, m=np.repeat(gemm.m, 2)[::2]))  # the same numbers, another layout
