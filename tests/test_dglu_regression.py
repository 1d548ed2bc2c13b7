"""A release's regressed kernel priced as its maintainers state it (Stack.dglu_slowdown, cost/mlp_moe.dglu_regressed,
OpCost.slowdown): cudnn-frontend#256 measured Transformer Engine's CuTeDSL grouped MLP backward GLU kernel
(grouped_gemm_dglu_wrapper_sm100: fc2's data gradient with the dGeGLU and the bias gradient in its epilogue) 10x slower
from cudnn-frontend 1.24.0, and Megatron-Bridge marks its 26.06.01 GPT-OSS-120B MXFP8 rows with that issue
(recipes_off.DGLU_SLOWDOWN). Measured, that row is 18,304 tokens/s a GPU where 26.06 and 26.08 measure 28,947 and 28,672
with the same recipe, while the SwiGLU MoE rows of 26.06.01 (Qwen3, DeepSeek-V3) did not slow."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.cost.layers import moe_layer
from meshplan.cost.mlp_moe import DGLU_RECORDS
from meshplan.estimate import estimate
from meshplan.roofline import op_time
from meshplan.specs.efficiency import DEFAULT as EFFICIENCY
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan_validation.case import map_run
from meshplan_validation.evaluate import evaluate_case
from meshplan_validation.records import read_runs

ROOT = Path(__file__).resolve().parents[1]
GPT_OSS = load_model("gpt-oss-120b")
GB200 = load_system("gb200")
PLAN = Plan(dp=8, ep=8, micro_batch=1, global_batch=16, precision="mxfp8")
GROUPED = load_stack("megatron-bridge").with_(expert_gemm="grouped")


def _times(stack):
    acc = GB200.cluster(8).accelerator
    return {(o.name, o.phase): op_time(o, acc, PLAN.precision, EFFICIENCY)
            for o in moe_layer(GPT_OSS, PLAN, stack) if o.kind != "collective"}


def test_only_the_grouped_backward_glu_kernel_takes_its_times():
    base, slow = _times(GROUPED), _times(GROUPED.with_(dglu_slowdown=10.0))
    for key, seconds in base.items():
        assert slow[key] == pytest.approx(10.0 * seconds if key in DGLU_RECORDS else seconds)
    assert set(DGLU_RECORDS) <= set(base)  # fc2's data gradient and the activation's gradient are both priced
    # the per-expert path (TE GroupedLinear's cuBLAS GEMMs, Megatron-Core's fused activation) runs other kernels
    per_expert = load_stack("megatron-bridge")
    assert _times(per_expert.with_(dglu_slowdown=10.0)) == _times(per_expert)


def test_the_step_grows_with_the_regression_and_is_untouched_without_one():
    cluster = GB200.cluster(8)
    steps = [estimate(GPT_OSS, cluster, PLAN, GROUPED.with_(dglu_slowdown=x)).step_time for x in (1.0, 2.0, 10.0)]
    assert steps == sorted(steps) and steps[0] < steps[-1]
    assert steps[0] == estimate(GPT_OSS, cluster, PLAN, GROUPED).step_time


def _gpt_oss_gb200(release: str):
    for record in read_runs(ROOT / "data" / "validation" / "published_runs.jsonl"):
        if record["id"] == f"mbridge_{release}_pretrain_DGX-GB200_GPT-OSS-120B_mxfp8_64gpu":
            return record
    raise LookupError(release)


def test_the_release_that_shipped_the_regression_pays_nine_more_kernel_times():
    """26.06.01 against 26.06 (one recipe): 36 layers x 5 micro-batches of 4 x 4,096 tokens on each GPU, each layer's
    regressed kernel 10x instead of 1x its time: the step grows by 9 x (fc2's data gradient + the activation's
    gradient) x 180 = 1.07 s, where the measured step grows from 2.830 to 4.476 s."""
    slow, base = map_run(_gpt_oss_gb200("26.06.01")), map_run(_gpt_oss_gb200("26.06"))
    assert slow.stack.dglu_slowdown == 10.0 and base.stack.dglu_slowdown == 1.0
    assert replace(slow.stack, dglu_slowdown=1.0) == base.stack and slow.plan == base.plan
    acc, eff = slow.cluster.accelerator, slow.efficiency(EFFICIENCY)  # the source's efficiencies, as evaluated
    kernel = sum(op_time(o, acc, slow.plan.precision, eff)
                 for o in moe_layer(slow.model, slow.plan, base.stack) if (o.name, o.phase) in DGLU_RECORDS)
    micro_batches = slow.plan.global_batch / (slow.plan.dp * slow.plan.micro_batch)
    assert (slow.model.num_layers, micro_batches) == (36, 5)
    extra, added = evaluate_case(slow).step_time - evaluate_case(base).step_time, 9 * kernel * 36 * micro_batches
    # the recipe overlaps the all-to-alls (moe_a2a_overlap: estimate.combined_1f1b), so the longer backward hides a
    # little more of them: at most the added kernel time, less 0.1 % of it (1.0730 of 1.0735 s)
    assert added * 0.999 <= extra <= added


def test_only_the_marked_release_and_model_are_mapped():
    assert map_run(_gpt_oss_gb200("26.08")).stack.dglu_slowdown == 1.0
    others = [r for r in read_runs(ROOT / "data" / "validation" / "published_runs.jsonl")
              if r["id"].startswith("mbridge_26.06.01_pretrain_DGX-GB200_") and r["model"]["arch"] == "moe"
              and "GPT-OSS" not in r["id"] and "Nemotron" not in r["id"]]  # Nemotron 3 is compared apart
    assert {r["model"]["name"] for r in others} == {"DeepSeek-V3", "Qwen3-235B-A22B", "Qwen3-30B-A3B"}
    assert all(map_run(r).stack.dglu_slowdown == 1.0 for r in others)
