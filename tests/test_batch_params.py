"""step/grid.rank_params of a search batch: computed once per distinct row of the fields the parameters read
(``PARAMS_READ``) and spread back, the same numbers bit for bit as computing every row, for every preset model."""

from __future__ import annotations

import numpy as np
import pytest

import meshplan.step.grid as grid
from meshplan.cost.params import StageParams
from meshplan.search.batch import PlanBatch
from meshplan.specs.model_load import load_model, preset_names
from meshplan.specs.plan import Plan

FIELDS = StageParams.__dataclass_fields__


def same(a, b) -> bool:
    """One StageParams field: an array of the same shape, type and bits (-0.0 is not 0.0), or the same number."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and bool(
            (a.view(f"u{a.itemsize}") == b.view(f"u{b.itemsize}")).all())
    return type(a) is type(b) and np.float64(a).tobytes() == np.float64(b).tobytes()


def batch(model, last: int = 0, vpp: int = 1) -> PlanBatch:
    """Plans over pp, tp, ep and etp (interleaved: ``vpp`` > 1), each under two micro-batches and two dp sizes (which
    the parameters do not read: each distinct row stands for four), ``last`` layers on the last stage where
    pipelined."""
    eps = [e for e in (1, 2, 8) if model.num_experts % e == 0] if model.is_moe else [1]
    plans = [Plan(pp=pp, vpp=vpp, tp=tp, ep=ep, etp=etp, micro_batch=mbs, dp=dp * ep, sequence_parallel=False,
                  last_stage_layers=last if pp > 1 else 0)
             for pp in ((1, 2, 4) if vpp == 1 else (2, 4)) for tp in (1, 2, 8) for ep in eps
             for etp in sorted({1, tp}) for mbs in (1, 4) for dp in (1, 2)]
    return PlanBatch.of(plans)


@pytest.mark.parametrize("name", preset_names())
def test_a_batchs_parameters_on_its_distinct_rows_are_every_rows(name, monkeypatch):
    """Every preset (dense, MoE with dense first layers and MTP, hybrids), even and uneven last stages: ``rank_params``
    of the batch on its distinct rows equals ``_params`` of every row, field by field, bit for bit; each distinct row
    of these batches stands for 4 plans (2 micro-batches x 2 dp sizes), so the distinct path is the one taken."""
    monkeypatch.setattr(grid, "DISTINCT_FROM", 0)
    model = load_model(name)
    for last, vpp in ((0, 1), (max(1, model.num_layers // 8), 1), (0, 2)):
        plans = batch(model, last, vpp)
        read = [getattr(plans, f) for f in grid.PARAMS_READ]  # every field rank_params reads, as the batch holds it
        rows = grid._distinct_rows([c for c in read if isinstance(c, np.ndarray) and c.ndim])
        assert rows is not None and 4 * len(rows[0]) == len(plans.dp)  # 1 in 4 rows distinct
        whole, distinct = grid._params(model, plans), grid.rank_params(model, plans)
        for a, b in zip(whole, distinct, strict=True):
            assert all(same(getattr(a, f), getattr(b, f)) for f in FIELDS), (name, last, vpp)


def test_a_small_batch_and_one_plan_are_computed_whole(monkeypatch):
    """Below ``DISTINCT_FROM`` plans (the Python, not the arrays, sets the time) and for one plan (kept: ``_kept``)
    no unique is taken."""
    model = load_model("deepseek-v3")
    plans = batch(model)
    assert len(plans.dp) < grid.DISTINCT_FROM
    called = []
    monkeypatch.setattr(grid, "_distinct_rows", lambda columns: called.append(1))
    grid.rank_params(model, plans)
    grid.rank_params(model, Plan(pp=4, tp=2, ep=8))
    assert not called


def test_distinct_rows_are_none_where_packing_cannot_tell_them_apart_or_gains_nothing():
    """Integer columns packed (mixed radix): 6 rows, 3 distinct, each with its first row and its index; a float or
    negative column, or rows mostly distinct, give None (computed whole)."""
    a, b = np.array([1, 2, 1, 1, 2, 3]), np.array([0, 5, 0, 0, 5, 0])
    first, inverse = grid._distinct_rows([a, b])
    assert list(first) == [0, 1, 5] and list(inverse) == [0, 1, 0, 0, 1, 2]
    assert grid._distinct_rows([a.astype(float)]) is None
    assert grid._distinct_rows([a - 2]) is None
    assert grid._distinct_rows([np.arange(6)]) is None  # 6 distinct of 6


@pytest.mark.parametrize("name", ["llama3-70b", "deepseek-v3", "mixtral-8x7b"])
def test_a_batchs_kind_params_are_kept_read_only_and_each_rows_own(name):
    """cost/params.kind_params of a batch is kept for the same model, batch and kind (the ranks' parameters ask for
    each kind 7-8 times): the same object again, its arrays read-only, each row's numbers those of its own plan."""
    from meshplan.cost.params import kind_params  # noqa: PLC0415

    model = load_model(name)
    plans = batch(model)
    for kind in ("dense", "moe"):
        once = kind_params(model, plans, kind)
        assert kind_params(model, plans, kind) is once
        for f in FIELDS:
            value = getattr(once, f)
            if isinstance(value, np.ndarray):
                assert not value.flags.writeable
                for i in (0, len(plans) // 2, len(plans) - 1):
                    assert same(value[i], np.float64(getattr(kind_params(model, plans.plan(i), kind), f)))
    assert kind_params(model, batch(model), "moe") is not kind_params(model, plans, "moe")  # another batch: its own


def test_a_kept_answer_that_views_a_batch_column_freezes_a_copy_not_the_column():
    """cost/params._frozen: a field that is a view of another array (a plan's column returned as it is) is kept as a
    read-only copy, so the column's owner stays writeable for its other readers; an array of its own is frozen as it
    is (the same object)."""
    from meshplan.cost.params import _frozen  # noqa: PLC0415

    column, own = np.arange(4.0), np.ones(4)
    kept = _frozen(StageParams(dense=column[:], expert=own, adapters=0.0))
    assert column.flags.writeable and kept.dense is not column and not kept.dense.flags.writeable
    assert list(kept.dense) == [0.0, 1.0, 2.0, 3.0]
    assert kept.expert is own and not own.flags.writeable and kept.adapters == 0.0
