"""An eager stack whose norms are Transformer Engine's RMSNorm module (``Stack.fusion`` "eager-te", specs/fusion.py:
NeMo AutoModel's own models with backend.rms_norm te): the norm is one fused kernel each way, as a fused stack prices
it, and every other element-wise op stays eager. The arithmetic, and the AutoModel records as mapped."""

from __future__ import annotations

import pytest

from meshplan.cost.eager import EAGER, eager_bytes
from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

MODEL, CLUSTER = load_model("llama3-8b"), load_system("h100").cluster(8)
PLAN = Plan(dp=8, global_batch=8)  # one micro-batch of 8,192 tokens a GPU
NORMS = ("attn/norm/eager", "mlp/norm/eager", "head/norm/eager")


def test_te_norms_drop_the_decomposed_rmsnorm_and_nothing_else():
    """Eager PyTorch's RMSNorm (x.float(), pow, mean, rsqrt, type_as, the weight: cost/eager.py EAGER["rmsnorm"])
    moves 32 bytes an element forward and 86 backward beyond the one fused norm kernel cost/ counts: 6 + 8 + 4 + 8 +
    6 + 4 − 4 and 4 + 6 + 2 + 6 + 8 + 12 + 4 + 4 + 8 + 8 + 12 + 12 + 6 − 6. Under eager-te those records are gone
    (two a layer and the final norm's, each over 8,192 x 4,096 elements) and the fused norm's records launch one
    kernel each way; every other record is unchanged, so the step is shorter by exactly the norms' time."""
    assert (eager_bytes("rmsnorm", "fwd"), eager_bytes("rmsnorm", "bwd_x")) == (32, 86)
    assert len(EAGER["rmsnorm"]["fwd"]) == 7
    eager = estimate(MODEL, CLUSTER, PLAN, Stack(fusion="eager"))
    te = estimate(MODEL, CLUSTER, PLAN, Stack(fusion="eager-te"))
    elems = 8192 * 4096
    norms = [o for o in eager.ops if o.name in NORMS]
    assert {(o.name, o.phase) for o in norms} == {(n, p) for n in NORMS for p in ("fwd", "bwd_x")}
    for o in norms:
        assert o.nbytes == pytest.approx((32 if o.phase == "fwd" else 86) * elems)
    assert not [o for o in te.ops if o.name in NORMS]
    fused = ("attn/norm", "mlp/norm", "head/norm")  # the fused norm records: their kernels as cost/ counts them (one
    # a record and pass) under eager-te, eager PyTorch's 8 forward and 15 backward launches (EAGER_KERNELS) under eager

    def rest(ops: tuple) -> list:
        return sorted((o.name, o.phase, o.count, o.nbytes, o.seconds) for o in ops if o.name not in NORMS + fused)

    assert rest(eager.ops) == rest(te.ops)
    for o in (o for o in te.ops if o.name in fused):
        twin = next(e for e in eager.ops if (e.name, e.phase) == (o.name, o.phase))
        assert (o.count, o.nbytes) == (twin.count, twin.nbytes) and o.seconds <= twin.seconds
    saved = sum(o.count * o.seconds for o in eager.ops if o.name in NORMS + fused) - sum(
        o.count * o.seconds for o in te.ops if o.name in fused)
    assert saved > sum(o.count * o.seconds for o in norms) > 0
    assert eager.step_time - te.step_time == pytest.approx(saved, rel=1e-6)


def test_automodels_moe_models_build_te_norms():
    """Every AutoModel MoE benchmark config @01926a5c sets backend.rms_norm te (components/moe/utils.py
    initialize_rms_norm_module: Transformer Engine's RMSNorm): the profile's fusion is eager-te, and Qwen3-30B's
    layers carry no decomposed norm."""
    from meshplan.specs.efficiency import DEFAULT  # noqa: PLC0415
    from meshplan_validation.case import map_run  # noqa: PLC0415
    from meshplan_validation.records import read_runs  # noqa: PLC0415

    run = next(r for r in read_runs("benchmarks/data/independent_runs.jsonl") if r["id"] == "automodel-qwen3-moe-30b-8")
    case = map_run(run)
    assert case.stack.fusion == "eager-te"
    est = estimate(case.model, case.cluster, case.plan, case.stack, case.efficiency(DEFAULT))
    assert not [o for o in est.ops if o.name in NORMS]
    assert [o for o in est.ops if o.name == "attn/rope/eager"]  # its RoPE stays eager (rope_utils.apply_rotary_emb)
