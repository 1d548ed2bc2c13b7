"""step/parts.twin_ops and key_store.shape_ops: the expert-GEMM twin search (search/variants.py) takes the op records
of the groups that do not read the stack's expert GEMMs from its first twin, built once."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from meshplan.search.batch import PlanBatch
from meshplan.search.key_store import shape_compute_times, shape_ops, twin_times
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model, preset_names
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.parts import EXPERT_GROUPS, plan_ops, twin_ops

MOE = [n for n in preset_names() if load_model(n).is_moe]
# both choices, the grouped one also with its backward GLU kernel regressed (Stack.dglu_slowdown: read with it)
STACK = load_stack("megatron-core")
CHOICES = [STACK.with_(expert_gemm="per_expert"), STACK.with_(expert_gemm="grouped"),
           STACK.with_(expert_gemm="grouped", dglu_slowdown=10.0)]


def same(a, b) -> bool:
    """Field for field, numbers bit for bit (records.same_record's test), into the collectives' records too (which
    same_record does not compare: no compute op holds one)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and bool((a.view(f"u{a.itemsize}") == b.view(
            f"u{b.itemsize}")).all())
    if isinstance(a, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return bool(a == b)


def batches(model):
    """Two batches of plans (without and with sequence parallelism) over tp, the micro-batch and the expert sizes."""
    eps = [e for e in (1, 2, 8) if model.num_experts % e == 0]
    out = []
    for sp, tps in ((False, (1, 2)), (True, (2, 4))):
        plans = [Plan(tp=tp, ep=ep, etp=etp, micro_batch=mbs, sequence_parallel=sp, dp=ep * 2)
                 for tp in tps for ep in eps for etp in (1, tp) for mbs in (1, 2)]
        out.append(PlanBatch.of(plans))
    return out


@pytest.mark.parametrize("name", MOE)
def test_groups_outside_expert_groups_are_the_same_under_every_expert_gemm(name):
    """Every MoE preset: the op records of each group but ``EXPERT_GROUPS`` (the dense layer, a hybrid's other blocks,
    the ends, a send) are equal field for field, bit for bit (``same``), under each expert-GEMM choice, the "moe"
    layer's not; and ``twin_ops`` given one choice's records gives every group's as ``plan_ops`` builds them under
    another, those groups the same objects."""
    model = load_model(name)
    for batch in batches(model):
        ops = [plan_ops(model, batch, s) for s in CHOICES]
        assert all(o.keys() == ops[0].keys() for o in ops)
        shared = [k for k in ops[0] if k not in EXPERT_GROUPS]
        assert {"embed", "head", "p2p"} <= set(shared) and "moe" in ops[0]
        moe = [ops[0]["moe"], ops[1]["moe"]]  # the choice is read there
        assert len(moe[0]) != len(moe[1]) or not all(same(a, b) for a, b in zip(*moe, strict=True))
        for other in ops[1:]:
            for k in shared:
                assert len(other[k]) == len(ops[0][k])
                assert all(same(a, b) for a, b in zip(ops[0][k], other[k], strict=True)), (name, k)
        for i, j in ((0, 1), (1, 0), (0, 2)):
            twin = twin_ops(model, batch, CHOICES[j], ops[i])
            assert list(twin) == list(ops[j])
            for k, records in twin.items():
                assert len(records) == len(ops[j][k])
                assert all(same(a, b) for a, b in zip(records, ops[j][k], strict=True)), (name, k)
                if k in shared:
                    assert all(a is b for a, b in zip(records, ops[i][k], strict=True))


def test_shape_ops_takes_the_twins_records_only_for_the_same_rows_and_a_stack_differing_in_the_expert_gemms():
    """``shape_ops`` within ``twin_times`` after the first twin's ``shape_compute_times``: the same rows on the other
    choice share the non-expert groups' records (same objects); other rows, another stack difference, or outside
    ``twin_times``, every record is built anew."""
    model, cluster = load_model("deepseek-v3"), load_system("h100").cluster(64)
    batch, other_rows = batches(model)
    first, second = CHOICES[0], CHOICES[1]
    with twin_times():
        ops = shape_ops(model, batch, first)
        shape_compute_times(model, cluster, batch, first, DEFAULT, ops)
        twin = shape_ops(model, batch, second)
        assert twin["dense"][0] is ops["dense"][0] and twin["head"][0] is ops["head"][0]
        assert twin["moe"][0] is not ops["moe"][0]
        assert shape_ops(model, other_rows, second)["dense"][0] is not ops["dense"][0]
        assert shape_ops(model, batch, second.with_(dglu_slowdown=3.0, flash_attention=False))["dense"][0] \
            is not ops["dense"][0]
    assert shape_ops(model, batch, second)["dense"][0] is not ops["dense"][0]
