"""benchmarks/measure/optimizer_loop_host.py replays Megatron's fp16 optimizer loops (the ordered count of
sources.MDS_FP16_TENSOR) on CPU: each loop leaves the state the step leaves, and the per-tensor times come out."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "measure"))
torch = pytest.importorskip("torch")

import optimizer_loop_host as replay  # noqa: E402


def test_the_loops_do_what_the_wrapper_does():
    pairs = replay.build(torch, 24, 4, "cpu")
    assert [tuple(p.model.shape) for p in pairs[:3]] == [(4,), (4,), (12, 4)]  # LayerNorm weight, bias, QKV
    pairs[2].model.main_grad.fill_(0.5)
    replay.queued(pairs)  # the fp16 main_grad, cast to fp32, is the master's gradient
    assert pairs[2].main.grad.dtype == torch.float32 and float(pairs[2].main.grad[0, 0]) == 0.5
    pairs[2].main.data.fill_(2.0)
    replay.after(pairs, torch)  # the master weight copied back into the fp16 weight, every gradient cleared
    assert pairs[2].model.dtype == torch.float16 and float(pairs[2].model.detach()[0, 0]) == 2.0
    assert all(p.model.grad is None and p.main.grad is None for p in pairs)


def test_per_tensor_times_are_differences_over_the_count():
    times = replay.per_tensor(torch, "cpu", 12, 4, 2)
    assert set(times) == {"queued", "after"} and all(abs(t) < 1e4 for t in times.values())
