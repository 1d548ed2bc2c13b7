"""InternEvo's layers and loop as its code runs them (issue 79; InternLM/InternEvo @c628a8c87411, read in
meshplan_validation/source_internevo.py): the element-wise work of its eager module code ("eager-apex",
specs/fusion.py: apex's RMSNorm on an fp32 upcast of the residual, flash-attn's rotary kernel), flash-attn's
cross-entropy, FlashAttention-2 and AccPerplex over every micro-batch's logits. The arithmetic of the two eager rows
it adds, the records as mapped, and properties on seeded random draws."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from functools import cache

import pytest

from draws import draw_triple
from meshplan.cost.eager import EAGER, eager_bytes, eager_kernels
from meshplan.estimate import estimate
from meshplan.specs.check import check
from meshplan.specs.fusion import fusion_of
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

MODEL, CLUSTER = load_model("llama2-7b"), load_system("a100").cluster(8)
PLAN = Plan(dp=8, global_batch=8)  # one micro-batch of one 4,096-token sequence a GPU


def _extras(est, name: str) -> list:
    return [o for o in est.ops if o.name == name]


def test_rows_bytes_per_element():
    """flash-attn's rotary kernel reads and writes each element of q and k in place, 2 + 2 bytes each way (one
    kernel); the upcast norm adds, forward, the cast (read 2, write 4) and the norm's fp32 read (2 more than the
    16-bit read counted in norm()): 8 bytes; backward the norm's fp32 read (2), its fp32 input gradient (2 more
    written) and the cast of that gradient back (read 4, write 2): 10 bytes."""
    assert (eager_bytes("rope_flash", "fwd"), eager_bytes("rope_flash", "bwd_x")) == (4, 4)
    assert (eager_kernels("rope_flash", "fwd"), eager_kernels("rope_flash", "bwd_x")) == (1, 1)
    assert (eager_bytes("norm_upcast", "fwd"), eager_bytes("norm_upcast", "bwd_x")) == (8, 10)
    assert (eager_bytes("rope", "fwd"), eager_bytes("rope", "bwd_x")) == (20, 20)  # torchtitan's complex multiply
    assert len(EAGER["norm_upcast"]["bwd_x"]) == 3
    mode = fusion_of("eager-apex")
    assert (mode.library_norm, mode.norm_upcast, mode.rope, mode.per_op) == (True, True, "rope_flash", True)


def test_eager_apex_against_eager_te_closed_form():
    """Both stacks run the norms as one library kernel and every other element-wise op eagerly; eager-apex adds the
    two upcasts a layer (each over T·h = 4,096 x 4,096 elements: 8 bytes forward, 10 backward) and runs RoPE as
    flash-attn's kernel over q and k (T x (32 + 32) heads x 128 = 4,096 x 8,192 elements: 4 bytes each way where
    torchtitan's complex multiply moves 6 + 8 + 6 = 20). The SwiGLU's two kernels, the residuals and the GEMMs are
    the same."""
    te = estimate(MODEL, CLUSTER, PLAN, Stack(fusion="eager-te"))
    apex = estimate(MODEL, CLUSTER, PLAN, Stack(fusion="eager-apex"))
    th, qk = 4096 * 4096, 4096 * 8192
    for name in ("attn/norm/upcast/eager", "mlp/norm/upcast/eager"):
        ops = {o.phase: o.nbytes for o in _extras(apex, name)}
        assert ops == pytest.approx({"fwd": 8 * th, "bwd_x": 10 * th})
        assert not _extras(te, name)
    rope = {o.phase: o.nbytes for o in _extras(apex, "attn/rope/eager")}
    assert rope == pytest.approx({"fwd": 4 * qk, "bwd_x": 4 * qk})
    assert {o.phase: o.nbytes for o in _extras(te, "attn/rope/eager")} == pytest.approx(
        {"fwd": 20 * qk, "bwd_x": 20 * qk})
    same = ("mlp/act/eager", "mlp/fc1", "attn/qkv", "attn/residual", "mlp/residual")
    for name in same:
        assert sorted((o.phase, o.nbytes, o.flops) for o in _extras(te, name)) == sorted(
            (o.phase, o.nbytes, o.flops) for o in _extras(apex, name))


def _record(rid: str) -> dict:
    with open("benchmarks/data/independent_runs.jsonl", encoding="utf-8") as f:
        return next(r for r in map(json.loads, f) if r["id"] == rid)


def test_internevo_records_map_onto_its_code():
    """The InternEvo records get its profile: eager-apex, flash-attn's loss, FlashAttention-2, one metric pass (its
    AccPerplex: 24 bytes a logit against the 22 priced per metric cross-entropy), no sequence parallelism; the
    records' ZeRO-1 settings (source_internevo.internevo_plan / internevo_sync) stand."""
    from meshplan_validation.case import map_run  # noqa: PLC0415

    for rid in ("internevo-7b-nockpt-8gpu-mn4", "internevo-7b-tgs-tp2-z4-8gpu", "internevo-7b-ckpt-8gpu-mb8"):
        case = map_run(_record(rid))
        s = case.stack
        assert (s.name, s.fusion, s.cross_entropy, s.attention_kernel, s.train_metrics) == (
            "internevo", "eager-apex", "flash", "fa2", 1)
        assert (s.grad_sync, s.param_sync, case.plan.grad_bytes, case.plan.sequence_parallel) == (
            "all_reduce", "shard_broadcasts", 2, False)
        assert "defaults: InternEvo" in case.assumptions
        assert any("apex's fused RMSNorm on fp32 upcasts" in a for a in case.assumptions)


def test_internevo_single_node_step_longer_than_generic():
    """On one node (no network) the code's element-wise work, loss and metric make the step longer than the generic
    fused profile's: the 8-GPU run without checkpointing by at least the upcasts, RoPE, SwiGLU kernels and metric."""
    from meshplan_validation.case import map_run  # noqa: PLC0415

    case = map_run(_record("internevo-7b-nockpt-8gpu-mn4"))
    ours = estimate(case.model, case.cluster, case.plan, case.stack)
    generic = estimate(case.model, case.cluster, case.plan, case.stack.with_(
        fusion="fused", cross_entropy="fused", attention_kernel="fused", train_metrics=0))
    assert ours.step_time > generic.step_time
    def total(est, pick) -> float:
        return sum(o.count * o.seconds for o in est.ops if pick(o.name))

    added = total(ours, lambda n: n.endswith("/eager") or n == "head/metrics")
    loss = total(ours, lambda n: n == "head/loss") - total(generic, lambda n: n == "head/loss")  # flash's: cheaper
    assert added > 0 > loss
    assert ours.step_time - generic.step_time == pytest.approx(added + loss, rel=0.02)


@cache
def _draws() -> list:
    """Dense models of the seeded draws that eager-apex takes (check: no hybrid layers). MoE layers are left out:
    their fused stack prices Megatron-Core's own expert pieces, which an eager stack does not run."""
    rng, out = random.Random(2379), []
    while len(out) < 40:
        model, cluster, plan = draw_triple(rng)[:3]
        if not model.is_moe and not check(model, cluster, plan, Stack(fusion="eager-apex")):
            out.append((model, cluster, plan))
    return out


@pytest.mark.parametrize("i", range(40))
def test_eager_apex_never_faster_than_fused_nor_with_fewer_tokens(i):
    """Property (40 seeded dense draws, the generic profile's host and overlap): eager-apex only adds traffic to a fused
    stack (its extra rows are all positive), so its step is never shorter; and a batch twice as large never takes
    less time under it."""
    model, cluster, plan = _draws()[i]
    fused = estimate(model, cluster, plan, Stack())
    apex = estimate(model, cluster, plan, Stack(fusion="eager-apex"))
    assert apex.step_time >= fused.step_time * (1 - 1e-9)
    double = replace(plan, global_batch=2 * plan.global_batch)
    assert estimate(model, cluster, double, Stack(fusion="eager-apex")).step_time >= apex.step_time * (1 - 1e-9)


def test_flash_rope_launches_one_kernel_a_tensor_each_way():
    """Under eager-apex the RoPE row counts flash-attn's kernel on q and on k, one each way (2 forward, 2 backward
    launches a layer), not the 6 and 8 PyTorch launched for torchtitan's complex multiply (cost/eager.py
    EAGER_KERNELS "llama"), which eager-te keeps."""
    from meshplan.cost.eager import eager_rows  # noqa: PLC0415

    assert eager_rows(MODEL, Stack(fusion="eager-apex"))["attn/rope"] == (2, 2, 0)
    assert eager_rows(MODEL, Stack(fusion="eager-te"))["attn/rope"] == (6, 8, 0)
    apex = estimate(MODEL, CLUSTER, PLAN, Stack(fusion="eager-apex"))
    te = estimate(MODEL, CLUSTER, PLAN, Stack(fusion="eager-te"))
    assert all(a.seconds <= t.seconds for a, t in zip(_extras(apex, "attn/rope/eager"), _extras(te, "attn/rope/eager"),
                                                       strict=True))
