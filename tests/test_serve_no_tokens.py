"""A grouped expert GEMM that no token reaches (cost/decode.gemm with 0 touched experts) has 0 rows per group:
serve_estimate once raised ZeroDivisionError (0 rows / 0 groups) for MLA MoE models whose pipeline-parallel static
prefill leaves a stage's decode lane empty."""

from __future__ import annotations

import math

import pytest

from meshplan.cost.decode import gemm
from meshplan.serve.engine import load_engine
from meshplan.serve.estimate import serve_estimate
from meshplan.serve.plan import ServePlan, Workload
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model


def test_a_grouped_gemm_without_rows_or_groups():
    op = gemm("moe/experts/fc1", 0.0, 7168, 1024, 2.0, 2.0, groups=0.0)
    assert (op.m, op.flops, op.groups) == (0.0, 0.0, 0.0)
    # with groups, m / groups rows each: 64 rows over 8 experts
    assert gemm("moe/experts/fc1", 64.0, 7168, 1024, 2.0, 2.0, groups=8.0).m == 8.0


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2"])
def test_static_prefill_with_an_empty_decode_lane(name):
    plan = ServePlan(tp=4, pp=2, batch=4, replicas=1, prefill_replicas=1)
    est = serve_estimate(load_model(name), load_system("h200").cluster(16), plan,
                         Workload(input_len=20000, output_len=256, static=True), load_engine("vllm-v0"))
    # priced, not raised: the decode step is finite; the weights (> 126 GiB per GPU) leave no room for the cache
    assert math.isfinite(est.metrics.tpot) and not est.fits and "does not fit" in est.reasons[0]
