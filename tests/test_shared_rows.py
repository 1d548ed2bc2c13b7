"""What a search chunk's step and memory compute once for the rows that share it (issue 83: the per-combination work
moved into fewer array elements), each the same numbers, bit for bit, as computed row by row: the weights' side of
the step on the rows without their micro-batch (step/assemble._weight_side), the micro-batches per step of the
batches that share their columns (PlanBatch.grad_accum) and the stage layers of a batch's settings
(cost/params.layers_on_stage, _uneven)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from meshplan.cost.params import _uneven, layers_on_last, layers_on_stage
from meshplan.search.batch import PlanBatch
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import DEFAULT as STACK
from meshplan.step import assemble
from meshplan.step.assemble import _micro_free, _side, _weight_side
from meshplan.step.stages import real


def _batch() -> PlanBatch:
    """12 plans of DeepSeek-V3 on 256 GPUs (sequence parallel): 3 layouts (dp, tp, pp, ep) x 2 last stages x 2
    micro-batches, so each row but the micro-batch repeats once (6 distinct of 12)."""
    plans = [Plan(dp=dp, tp=tp, pp=pp, ep=ep, micro_batch=mbs, global_batch=1024, last_stage_layers=last,
                  sequence_parallel=True)
             for dp, tp, pp, ep in ((16, 4, 4, 8), (8, 8, 4, 16), (32, 2, 4, 32)) for last in (0, 5)
             for mbs in (1, 2)]
    return PlanBatch.of(plans)


def _same(a: object, b: object) -> bool:
    """Equal bit for bit (arrays by their bytes and shape; tuples and dataclasses field by field)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        return x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "__slots__"):
        return all(_same(getattr(a, f), getattr(b, f)) for f in a.__slots__)
    return a == b


def test_the_weight_side_on_the_rows_without_their_micro_batch_is_every_row_s(monkeypatch):
    """6 distinct rows of 12 (the micro-batch aside); the parameters, data-parallel collectives, embedding sync,
    shared tiers and optimizer steps computed on them and spread back equal those of every row, bit for bit (the
    batch taken as a large one: ``SHARE_ABOVE`` lowered)."""
    model, cluster = load_model("deepseek-v3"), load_system("h100").cluster(256)
    batch = _batch()
    assert _micro_free(batch) is None  # 12 rows: below SHARE_ABOVE, every row computed
    monkeypatch.setattr(assemble, "SHARE_ABOVE", 2)
    rows = _micro_free(batch)
    assert rows is not None and len(rows[0]) == 6
    parted = {(z, False): z for z in (0, 1, 2, 3)}
    for n in (2, 3):
        assert _same(_weight_side(model, cluster, batch, STACK, n, parted, DEFAULT),
                     _side(model, cluster, batch, STACK, n, parted, DEFAULT))


def test_one_plans_kept_weight_side_is_read_only():
    """A kept answer is shared with every later caller: its arrays refuse a write (as memory_grid's kept states), and
    it equals the side computed afresh, bit for bit."""
    model, cluster = load_model("deepseek-v3"), load_system("h100").cluster(256)
    plan = Plan(dp=16, tp=4, pp=4, ep=8, global_batch=1024, last_stage_layers=5, sequence_parallel=True)
    parted = {(z, False): z for z in (0, 1, 2, 3)}
    kept = _weight_side(model, cluster, plan, STACK, 2, parted, DEFAULT)
    assert kept is _weight_side(model, cluster, plan, STACK, 2, parted, DEFAULT)
    params, first, host, last, parts = kept
    arrays = [x for x in (*(getattr(params, f) for f in params.__slots__), *first, host, *last, *parts.values())
              if isinstance(x, np.ndarray)]
    assert arrays and not any(a.flags.writeable for a in arrays)
    assert _same(kept, _side(model, cluster, plan, STACK, 2, parted, DEFAULT))


def test_one_plan_and_distinct_rows_take_the_whole_path(monkeypatch):
    """One plan has no rows to share, nor a batch whose rows differ beyond the micro-batch: ``_micro_free`` is None."""
    monkeypatch.setattr(assemble, "SHARE_ABOVE", 2)
    assert _micro_free(Plan(dp=8, tp=8)) is None
    batch = _batch()
    assert _micro_free(batch.select(np.array([0, 2, 4, 6, 8, 10]))) is None


def test_grad_accum_is_kept_for_batches_that_share_their_columns():
    """global_batch // (dp * micro_batch): 1024 // (16 * 2) = 32 for the second plan; the batch of another setting
    (the same columns) reads the same array, read-only; a batch of other columns its own."""
    batch = _batch()
    m = batch.grad_accum
    assert int(m[1]) == 1024 // (16 * 2) == 32
    assert not m.flags.writeable
    assert replace(batch, recompute="full").grad_accum is m
    assert batch.num_micro_batches is m
    other = batch.select(np.arange(4))
    assert other.grad_accum is not m and _same(other.grad_accum, m[:4])


def test_stage_layers_are_kept_for_a_batch_s_settings():
    """DeepSeek-V3's 61 layers on pp = 4 with a last stage of 5: ceil((61 - 5) / 3) = 19 on the others; the answers
    of the batch under another setting (the same columns) are the same arrays, and equal a fresh computation."""
    model, batch = load_model("deepseek-v3"), _batch()
    stage, uneven = layers_on_stage(model, batch), _uneven(batch)
    assert int(stage[2]) == -(-(61 - 5) // 3) == 19
    settled = replace(batch, recompute="full", zero=1)
    assert layers_on_stage(model, settled) is stage and _uneven(settled) is uneven
    fresh = batch.select(np.arange(len(batch)))  # new column arrays: computed again
    assert layers_on_stage(model, fresh) is not stage
    assert _same(layers_on_stage(model, fresh), stage) and _same(layers_on_last(model, fresh),
                                                                 layers_on_last(model, batch))


def test_real_counts_are_the_same_numbers_as_floats():
    """Integer counts cast once to float64 (step/stages.real): their products with seconds are the ones NumPy's
    mixed int64 x float64 arithmetic gives; one plan's counts stay as they are."""
    counts, seconds = np.array([1, 3, 61, 2**40], dtype=np.int64), np.array([0.1, 1e-7, 3.3, -0.0])
    assert _same(real(counts) * seconds, counts * seconds)
    assert _same(real(counts == 3) * seconds, (counts == 3) * seconds)
    assert real(4) == 4 and type(real(4)) is int
