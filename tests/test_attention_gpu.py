"""meshplan's flash-attention pricing against the kernels measured on an H200 (benchmarks/measure/attention_gpu.py;
data/measured/gpu/2026-11-26-nvidia-h200-attention.json: PyTorch 2.11 SDPA's cuDNN and FlashAttention-2 backends,
forward and backward, head dimensions 64 and 128, 512-16,384 keys, with and without the causal mask, 16,384 tokens of
width 2,048). No GPU here: the tests read the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import rates_only
from meshplan.cost.records import OpCost
from meshplan.roofline import compute_time
from meshplan.specs.efficiency import DEFAULT

DATA = Path(__file__).parents[1] / "data" / "measured" / "gpu" / "2026-11-26-nvidia-h200-attention.json"


def _ratios(backend: str) -> list[float]:
    """meshplan's forward + backward time over the measured one, per row of ``backend`` (cudnn: the "fused" family,
    flash: "fa2"), each priced as cost/attention.py records it: m queries (B·h·T), n keys, k the head dimension."""
    acc, out = rates_only("h200"), []
    for row in json.loads(DATA.read_text())["rows"]:
        if row["backend"] != backend:
            continue
        shape = {"m": row["batch"] * row["heads"] * row["keys"], "n": row["keys"], "k": row["d"],
                 "variant": "flash_causal" if row["causal"] else "flash",
                 "kernel": "fused" if backend == "cudnn" else "fa2"}
        fwd = OpCost("attn/core", "fwd", "attention", row["fwd_flops"], 0.0, 0.0, **shape)
        bwd = OpCost("attn/core", "bwd_x", "attention", row["bwd_flops"], 0.0, **shape)
        predicted = compute_time(fwd, acc, "bf16", DEFAULT) + compute_time(bwd, acc, "bf16", DEFAULT)
        out.append(float(predicted) / (row["fwd_s"] + row["bwd_s"]))
    return out


def test_every_shape_measured_ran():
    rows = json.loads(DATA.read_text())["rows"]
    assert len(rows) == 2 * 2 * 6 * 2 and not [r for r in rows if "error" in r]


def test_the_cudnn_kernels_shape_dependence_is_meshplans_and_its_level_the_steps_lumped_rate():
    """cuDNN (the "fused" family): meshplan charges 1.62-1.89x the kernel's own time on every one of the 24 shapes,
    within 17 % of each other: the head-dimension falloff (d_0), the tile's fixed cost (L_0), the causal diagonal and
    the backward's rate follow the kernel across 32x in sequence length. The level is efficiency.py's ``attention``,
    fitted on whole training steps, which also pay the layout copies and softmax statistics around the kernel: it
    sits below the kernel alone, as its docstring says, and this measures by how much on Hopper."""
    ratios = _ratios("cudnn")
    assert len(ratios) == 24
    assert all(1.55 < r < 1.95 for r in ratios)
    assert max(ratios) / min(ratios) < 1.2


def test_flashattention2_on_hopper_runs_at_about_half_of_cudnn_at_long_sequences():
    """``fa2_on_async`` (PyTorch issue 142132's H100 figure, 0.52 at 4,608 keys): on the H200 the FA2 backend's forward
    at 16,384 keys, d = 128, no mask, ran at 352 TFLOP/s against cuDNN's 666 (0.53); meshplan's two families at that
    shape are within 10 % of that ratio. At short sequences FA2 is slower than its L_0 (fitted on a GB200) says:
    meshplan's ratio to the measured time spreads 1.48-1.93 over the FA2 rows (cuDNN's: 1.62-1.89)."""
    rows = {(r["backend"], r["d"], r["keys"], r["causal"]): r for r in json.loads(DATA.read_text())["rows"]}
    measured = rows[("flash", 128, 16384, False)]["fwd_s"] / rows[("cudnn", 128, 16384, False)]["fwd_s"]
    assert 1 / measured == pytest.approx(0.53, abs=0.01)
    acc = rates_only("h200")
    shape = {"m": 16384 * 16, "n": 16384, "k": 128, "variant": "flash"}
    fa2, cudnn = (compute_time(OpCost("a", "fwd", "attention", 1e12, 0.0, 0.0, kernel=k, **shape), acc, "bf16",
                               DEFAULT) for k in ("fa2", "fused"))
    assert float(fa2 / cudnn) == pytest.approx(measured, rel=0.10)
    flash = _ratios("flash")
    assert all(1.4 < r < 2.0 for r in flash)
