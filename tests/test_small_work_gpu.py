"""The host constants of the eager stacks stand on the committed GPU measurements (data/measured/gpu/, issue 46,
item 3): each is read again from the files here, without a GPU, and the presets must lie in what was measured.

Per CUDA kernel of a training layer, host-bound (micro-batch 1-2 at width 1024, where the GPU is busy a fraction of
the pass): the fixed cost a of a layer (benchmarks/small_work_gpu_doc.py's fit over the micro-batch of the depths'
difference) over the kernels PyTorch's profiler counted in it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from meshplan.specs.stack import load_stack

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "measured" / "gpu"


def _doc():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("small_work_gpu_doc", ROOT / "benchmarks" / "small_work_gpu_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _per_kernel(rows: list[dict], width: int, batches: tuple[int, ...]) -> list[float]:
    """Seconds per kernel at each batch: (t(6 layers) − t(2 layers)) / 4 over (kernels(6) − kernels(2)) / 4."""
    by = {(r["layers"], r["batch"]): r for r in rows if r["width"] == width}
    return [(by[(6, b)]["eager_s"] - by[(2, b)]["eager_s"]) / (by[(6, b)]["kernels"] - by[(2, b)]["kernels"])
            for b in batches if (6, b) in by and (2, b) in by]  # run C measured micro-batches 1 and 8 only


def _rows(code: str) -> list[list[dict]]:
    out = []
    for path in sorted(DATA.glob("*-small-work*.json")):
        data = json.loads(path.read_text())
        parts = data.get("stacks", {"pytorch": data})
        if code in parts:
            out.append(parts[code]["rows"])
    return out


def test_plain_pytorch_layer_host_per_kernel_brackets_the_eager_presets() -> None:
    # run B (small-work.json): (8.490 - 3.567) ms / (305 - 121) kernels = 26.8 us at b = 1; run A: 29.6 us; run C
    # (small-work-compiled.json's eager baseline): (7.036 - 2.838) ms / (305 - 121) = 22.8 us at b = 1
    found = [t for rows in _rows("pytorch") for t in _per_kernel(rows, 1024, (1, 2))]
    assert len(found) == 5
    assert min(found) == pytest.approx(22.8e-6, abs=0.1e-6) and max(found) == pytest.approx(29.6e-6, abs=0.1e-6)
    for name in ("pytorch-fsdp", "deepspeed", "torchtitan", "llm-foundry"):
        assert min(found) * 0.9 <= load_stack(name).host_dispatch <= max(found)


def test_megatron_module_code_host_per_kernel_brackets_the_megatron_lm_stack() -> None:
    from meshplan_validation.sources import MEGATRON_LM_HOST

    (rows,) = _rows("megatron")
    found = _per_kernel(rows, 1024, (1, 2, 4)) + _per_kernel(rows, 2048, (1, 2))
    # (27.718 - 9.413) ms / (424 - 172) kernels = 72.6 us at width 1024, b = 1
    assert found[0] == pytest.approx(72.6e-6, abs=0.1e-6)
    assert min(found) <= MEGATRON_LM_HOST <= max(found)
    assert 1.5 * load_stack("pytorch-fsdp").host_dispatch < MEGATRON_LM_HOST  # more Python per kernel, same host


def _phases(code: str) -> list[list[dict]]:
    """The ``phases`` (forward and backward timed and profiled apart) of every measurement of ``code``."""
    out = []
    for path in sorted(DATA.glob("*-small-work*.json")):
        data = json.loads(path.read_text())
        parts = data.get("stacks", {"pytorch": data})
        if code in parts and parts[code].get("phases"):
            out.append(parts[code]["phases"])
    return out


@pytest.mark.parametrize("code", ["pytorch", "megatron"])
def test_counted_kernels_of_the_measured_layer(code: str) -> None:
    """meshplan's kernels per layer (step/host.py's count under the code's stack, small_work_gpu_doc.py) are the ones
    PyTorch's profiler counted on the H200, forward and backward, in every committed measurement of the code: per
    layer (kernels at 6 layers − at 2) / 4. Plain PyTorch: forward (69 − 29) / 4 = 10, backward (236 − 92) / 4 = 36
    (2 norms × 4, 4 linears × 5, SDPA's 3 + the q, k, v stack and its layout copy, 2 residual fork sums, GeLU 1: 8 +
    20 + 5 + 2 + 1); Megatron-Core's local spec: forward (142 − 62) / 4 = 20, backward (282 − 110) / 4 = 43
    (cost/eager.py's "gpt-no-dropout" rows: 4 + 5 + 12 + 3 + 3 + 4 + 3 + 3 + 3 + 3)."""
    doc = _doc()
    stack = doc.stacks()[code][1]
    expected = {"pytorch": (10, 36), "megatron": (20, 43)}[code]
    found = _phases(code)
    assert found
    for phases in found:
        by = {(p["width"], p["layers"], p["batch"]): p for p in phases}
        for (width, layers, batch), hi in by.items():
            lo = by.get((width, 2, batch))
            if layers != 6 or lo is None:
                continue
            measured = tuple((hi[ph]["kernels"] - lo[ph]["kernels"]) / 4 for ph in ("forward", "backward"))
            assert measured == expected
            row = {"width": width, "layers": 6, "batch": batch, "seq": hi["seq"]}
            assert doc.launches_per_layer(row, stack, "NVIDIA H200") == expected
