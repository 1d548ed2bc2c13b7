"""search/batch.py: PlanBatch, many plans as columns, priced as each plan is; its fields are Plan's."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest

from meshplan.search.batch import CATEGORICAL, NUMERIC, PlanBatch
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import DENSE_AXES, Plan
from meshplan.specs.stack import Stack


def test_loss_workspace_of_a_batch_equals_each_plans():
    """The loss workspace depends on tp (DTensor loss_parallel): over a PlanBatch it must not branch on it."""
    from meshplan.memory import loss_workspace

    model = load_model("llama3-8b").with_seq_length(2048)
    plans = [Plan(dp=8, tp=1, global_batch=8), Plan(dp=4, tp=2, sequence_parallel=True, global_batch=8)]
    pytorch_loss = Stack(cross_entropy="pytorch")
    batch = PlanBatch.of([replace(p, sequence_parallel=True) for p in plans])
    one_by_one = [loss_workspace(model, replace(p, sequence_parallel=True), pytorch_loss) for p in plans]
    assert np.allclose(loss_workspace(model, batch, pytorch_loss), one_by_one)
    assert one_by_one == [2048 * 128256 * 8, 2048 * 128256 / 2 * 12]


def test_a_batch_has_each_plan_field_once_with_plans_defaults():
    """PlanBatch's fields are Plan's (one definition): a column for each numeric field, Plan's type and default for
    each shared one (where Plan computes one from the others, None: the plain Plan's); the placement as an index into
    the distinct placements, and the strides it gives."""
    plan_fields = {f.name: f for f in fields(Plan)}
    batch_fields = {f.name: f for f in fields(PlanBatch)}
    assert set(NUMERIC) | set(CATEGORICAL) == set(plan_fields) - {"placement", "tags"}
    assert set(batch_fields) == set(NUMERIC) | set(CATEGORICAL) | {"placement_id", "placements", "strides"}
    for name in CATEGORICAL:
        default = plan_fields[name].default
        assert (batch_fields[name].type, batch_fields[name].default) == (
            plan_fields[name].type, getattr(Plan(), name) if default is None else default)


def test_plans_come_back_from_a_batch_as_they_went_in():
    shared = {"zero": 1, "recompute": "full", "sequence_parallel": False}
    plans = [Plan(dp=2, tp=4, micro_batch=2, global_batch=16, **shared),
             Plan(dp=8, cp=2, global_batch=32, placement=("dp", "tp", "tp2", "cp", "pp"), **shared),
             Plan(dp=2, tp=2, pp=2, micro_batch=4, global_batch=64, placement=("pp", "tp", "tp2", "cp", "dp"),
                  **shared)]
    batch = PlanBatch.of(plans)
    assert len(batch) == 3 and [batch.plan(i) for i in range(3)] == plans
    assert len(batch.placements) == 3
    for i, plan in enumerate(plans):
        assert {a: int(batch.stride(a)[i]) for a in DENSE_AXES} == {a: plan.stride(a) for a in DENSE_AXES}
        assert (batch.grad_accum[i], batch.num_gpus[i]) == (plan.grad_accum, plan.num_gpus)
    # 2·4 = 8, 8·2 = 16 and 2·2·2 = 8 GPUs; 16 / (2·2) = 4 and 64 / (2·4) = 8 micro-batches
    assert batch.num_gpus.tolist() == [8, 16, 8] and batch.grad_accum.tolist() == [4, 4, 8]
    picked = batch.select(batch.tp > 1, zero=3)
    assert [picked.plan(i) for i in range(2)] == [replace(plans[0], zero=3), replace(plans[2], zero=3)]
    assert replace(batch, recompute="none").plan(1) == replace(plans[1], recompute="none")
    with pytest.raises(ValueError, match="plans differ in zero"):
        PlanBatch.of([plans[0], replace(plans[1], zero=2)])


def test_the_type_checkers_view_of_a_batch_declares_each_generated_column():
    """batch.py declares, for the type checker only, the fields make_dataclass generates that are not Plan's own
    (the NUMERIC columns, retyped as arrays, and the placement's): the declared names must be those fields."""
    import ast
    import inspect

    import meshplan.search.batch as batch

    tree = ast.parse(inspect.getsource(batch))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_Batch")
    block = next(n for n in cls.body if isinstance(n, ast.If))  # if TYPE_CHECKING:
    declared = [n.target.id for n in block.body if isinstance(n, ast.AnnAssign)]
    generated = [f.name for f in fields(PlanBatch) if f.name not in CATEGORICAL]
    assert declared == generated  # 12 columns + placement_id, placements, strides
    assert len(declared) == len(NUMERIC) + 3 == 15
