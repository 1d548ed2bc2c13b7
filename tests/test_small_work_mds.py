"""benchmarks/measure/small_work_mds.py (Megatron-DeepSpeed's GPT on a lent GPU) and what benchmarks/docs/mds_gpu_doc.py
reads from its committed measurement: the parts that run without a GPU or a Megatron-DeepSpeed checkout."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "benchmarks" / folder) for folder in ("docs", "measure")]
import mds_gpu_doc  # noqa: E402
import small_work_mds  # noqa: E402


def test_apex_stand_in_is_torch_layer_norm_forward_and_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("apex", "apex.normalization", "apex.normalization.fused_layer_norm", "apex.multi_tensor_apply",
                 "apex.optimizers", "fused_layer_norm_cuda", "amp_C"):
        monkeypatch.delitem(sys.modules, name, raising=False)  # restored, whatever the stand-in puts there
    small_work_mds._apex_stand_in(torch)
    from apex.normalization.fused_layer_norm import FusedLayerNormAffineFunction

    torch.manual_seed(0)
    x, w, b = (torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in ((3, 2, 8), (8,), (8,)))
    y = FusedLayerNormAffineFunction.apply(x, w, b, torch.Size([8]), 1e-5, True)  # Megatron passes 6 arguments
    grad = torch.randn_like(y)
    y.backward(grad)
    x2, w2, b2 = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y2 = torch.nn.functional.layer_norm(x2, (8,), w2, b2, 1e-5)
    y2.backward(grad)
    for got, want in ((y, y2), (x.grad, x2.grad), (w.grad, w2.grad), (b.grad, b2.grad)):
        assert torch.allclose(got, want, atol=1e-12)
    # megatron/utils.py imports these on CUDA; apex.contrib (not built) must fail as an ImportError
    assert sys.modules["apex.multi_tensor_apply"].multi_tensor_applier is None
    with pytest.raises(ImportError):
        import apex.contrib.layer_norm.layer_norm  # noqa: F401


def test_bf16_accumulation_sums_each_micro_batch_in_fp32() -> None:
    # DeepSpeed 0.19.8: zero the bf16 gradients, backward, hp_grad += lp.grad.float() per tensor; two micro-batches of
    # x = 1 and x = 2 through y = sum(w * x) give w's gradients 1 and 2 (each alone: zeroed between), fp32 sum 3
    model = torch.nn.Linear(4, 1, bias=False).to(torch.bfloat16)
    backward = small_work_mds.ds_bf16_accumulate(torch, model)
    for x in (1.0, 2.0):
        backward(model(torch.full((1, 4), x, dtype=torch.bfloat16)).float().sum())
        assert torch.equal(model.weight.grad, torch.full((1, 4), x, dtype=torch.bfloat16))
    (hp,) = backward.hp_grads
    assert hp.dtype == torch.float32 and torch.equal(hp, torch.full((4,), 3.0))


def test_accumulation_per_layer_is_the_depths_difference() -> None:
    import json

    rows = json.loads(mds_gpu_doc.ROWS.read_text())["stacks"]["mds"]["rows"]
    plain, acc = mds_gpu_doc.accumulate_per_layer(rows)[(1024, 1)]
    # width 1024, micro-batch 1: eager (21.433 - 7.817) ms / 4 layers = 3.404 ms; with the accumulation
    # (27.829 - 10.034) / 4 = 4.449 ms: 1.05 ms a layer of 12 tensors on that machine's host
    assert plain == pytest.approx(3.404e-3, abs=1e-6) and acc == pytest.approx(4.449e-3, abs=3e-6)
    assert 0.9e-3 < acc - plain < 1.2e-3


def test_the_eager_softmax_bytes_explain_the_two_paths_measured_gpu_times() -> None:
    """Megatron-DeepSpeed's layer at micro-batch 8 on the H200, its kernels' busy time per layer: with the torch
    softmax path (run D) 5.951 ms at width 1024 and 9.321 at 2048; with its fused kernel built (run E) 2.785 and
    6.281: ratios 2.14 and 1.48. meshplan's GPU time (the CUDA-graphed twin: no host) of the two paths, eager fusion
    (cost/attention.unfused_score_traffic's 32 + 60 bytes a score) and jit (the kernel's 8 + 14): 4.680 / 2.326 =
    2.01 and 7.047 / 4.668 = 1.51, each path 17-26 % under its measurement."""
    import json
    from dataclasses import replace

    import small_work_gpu_doc as doc

    def per_layer(name: str, code: str, width: int) -> tuple[float, float]:
        rows = json.loads((doc.DATA / name).read_text())["stacks"][code]["rows"]
        lo, hi = ({(r["width"], r["batch"]): r for r in rows if r["layers"] == d}[(width, 8)] for d in (2, 6))
        graphed = replace(doc.stacks()[code][1], cuda_graphs=True)
        priced = (doc.predicted(hi, graphed, "NVIDIA H200") - doc.predicted(lo, graphed, "NVIDIA H200")) / 4
        return (hi["kernel_busy_s"] - lo["kernel_busy_s"]) / 4, priced

    for width, ratio in ((1024, 2.14), (2048, 1.48)):
        torch_path = per_layer("2026-11-27-nvidia-h200-small-work-mds.json", "mds", width)
        fused = per_layer("2026-11-27b-nvidia-h200-small-work-mds-fused.json", "mds-fused", width)
        assert torch_path[0] / fused[0] == pytest.approx(ratio, abs=0.01)
        assert torch_path[1] / fused[1] == pytest.approx(ratio, rel=0.07)
        for measured, priced in (torch_path, fused):
            assert 0.7 < priced / measured < 0.85
