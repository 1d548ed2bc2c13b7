"""The cuBLAS / cuBLASLt workspaces a CUDA step holds (measure/blas_workspace.py): the sizes PyTorch's
CublasHandlePool.cpp chooses, one workspace per thread that runs a GEMM, and the committed H200 zoo run
(data/measured/gpu/) read with them: measured − predicted peak memory is that term to the KiB where nothing else is
missing, and within 3 % on every model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from meshplan.measure.blas_workspace import (
    calls_of_ops,
    calls_of_records,
    capability_of,
    cublas_workspace,
    cublaslt_workspace,
    resident_workspace,
)
from meshplan.measure.records import read_profiles
from meshplan.trace.capture import trace_module

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "data" / "measured" / "gpu" / "2026-11-26-nvidia-h200-zoo.jsonl.gz"
MiB = 2**20


def test_default_sizes_follow_the_handle_pool():
    assert cublas_workspace((9, 0)) == 32 * MiB  # 4096 KiB × 8 on Hopper
    assert cublas_workspace((8, 0)) == 8 * MiB + 128 * 1024  # :4096:2:16:8
    assert cublas_workspace((8, 0), {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}) == 32 * MiB
    assert cublas_workspace((9, 0), {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}) == 128 * 1024  # the deterministic setting
    assert cublas_workspace((9, 0), {"CUBLAS_WORKSPACE_CONFIG": "junk"}) == 32 * MiB  # unparsed: the default
    assert cublaslt_workspace() == MiB
    assert cublaslt_workspace({"CUBLASLT_WORKSPACE_SIZE": "4096"}) == 4 * MiB
    assert cublaslt_workspace({"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"}) == 0


LINEAR = ("aten.addmm.default", "fwd", ((256,), (512, 128), (128, 256)), "float32")
MM_BWD = ("aten.mm.default", "bwd_x", ((512, 256), (256, 128)), "float32")


def test_one_workspace_per_thread_that_runs_a_gemm():
    hopper = (9, 0)
    assert resident_workspace([], hopper) == 0
    assert resident_workspace([LINEAR], hopper) == 32 * MiB + MiB  # the caller's thread: cuBLAS + Lt (bias)
    assert resident_workspace([LINEAR, LINEAR], hopper) == 33 * MiB  # the same handle, once
    assert resident_workspace([LINEAR, MM_BWD], hopper) == 65 * MiB  # + the engine's device thread
    assert resident_workspace([MM_BWD], hopper) == 32 * MiB
    no_bias = ("aten.addmm.default", "fwd", ((512, 256), (512, 128), (128, 256)), "float32")  # 2-d self: cuBLAS
    assert resident_workspace([no_bias, MM_BWD], hopper) == 64 * MiB
    assert resident_workspace([LINEAR, MM_BWD], hopper, {"TORCH_CUBLAS_WORKSPACE_CACHE": "0"}) == 0
    assert resident_workspace([LINEAR, MM_BWD], (8, 0)) == 2 * (8 * MiB + 128 * 1024) + MiB


def test_calls_of_a_traced_linear_step():
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4, bias=False))
    trace = trace_module(model, [((4, 16), "float32")], gpu=True)
    calls = calls_of_ops(trace.ops)
    assert {(t, p) for t, p, _, _ in calls} >= {("aten.addmm.default", "fwd"), ("aten.mm.default", "fwd")}
    assert any(p.startswith("bwd") for _, p, _, _ in calls)
    assert resident_workspace(calls, (9, 0)) == 65 * MiB


@pytest.fixture(scope="module")
def gpu_records():
    return read_profiles(GPU)


def test_the_h200_zoo_reads_the_workspace(gpu_records):
    steps = [r for r in gpu_records if r["record"] == "step"]
    assert len(steps) == 10 and capability_of(steps[0]["machine"]["name"]) == (9, 0)
    errors = {}
    for s in steps:
        ops = [r for r in gpu_records if r["record"] == "op" and r["model"] == s["model"]]
        term = resident_workspace(calls_of_records(ops), (9, 0))
        gap = s["measured_peak_bytes"] - s["predicted_peak_bytes"]
        assert gap > 60 * MiB  # the stored prediction misses it: −36 % to −67 %
        errors[s["model"]] = (s["predicted_peak_bytes"] + term) / s["measured_peak_bytes"] - 1
        if s["model"] in ("bert", "vit", "mlp-mixer", "qwen-moe"):  # Linear with bias: 2 × 32 MiB + 1 MiB
            assert term == 65 * MiB and 0 <= gap - term < 8 * 1024
    assert max(abs(e) for e in errors.values()) < 0.03, errors
