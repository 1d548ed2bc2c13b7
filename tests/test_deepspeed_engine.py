"""DeepSpeed's own engine measured on a lent H200 (benchmarks/measure/deepspeed_engine_gpu.py; the committed
data/measured/gpu/2026-11-27c-nvidia-h200-deepspeed-engine.json) and how benchmarks/docs/deepspeed_engine_doc.py reads
it: the wrapper DeepSpeed's engine picked in each setting is the one cost/wrappers.py says it picks, the per-step and
per-micro-batch split is exact arithmetic, and the plain loop beside it is priced within the regime's targets."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from meshplan.cost.wrappers import deepspeed_wrapper
from meshplan.specs.plan import Plan

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "benchmarks" / folder) for folder in ("docs", "measure")]
import deepspeed_engine_doc as doc  # noqa: E402

CALLS = json.loads(doc.FILE.read_text())["calls"]
# DeepSpeed 0.19.8's class for each of cost/wrappers.py's names (and ZeRO stage: stage 3 has a class of its own)
CLASSES = {("bf16", 1): "BF16_Optimizer", ("zero", 1): "DeepSpeedZeroOptimizer", ("zero", 2): "DeepSpeedZeroOptimizer",
           ("zero", 3): "DeepSpeedZeroOptimizer_Stage3"}


def test_the_engine_picked_the_wrapper_cost_wrappers_says_it_picks():
    seen = set()
    for call in CALLS:
        for row in call["rows"]:
            if row["setting"] == "torch":
                assert row["wrapper"] == "AdamW"
                continue
            zero, grad_bytes = doc.SETTINGS[row["setting"]]
            picked = deepspeed_wrapper(Plan(zero=zero, grad_bytes=grad_bytes, precision="bf16"), pipeline=False)
            assert row["wrapper"] == CLASSES[picked, zero], row
            seen.add(picked)
    assert seen == {"bf16", "zero"}


def test_the_split_solves_the_four_terms_exactly():
    # t(L, m) = S0 + S1·L + m·(M0 + M1·L) with S0 = 3, S1 = 2, M0 = 1.5, M1 = 0.5 (ms), at L = 2, 6 and m = 1, 8
    s0, s1, m0, m1 = 3e-3, 2e-3, 1.5e-3, 0.5e-3
    rows = [{"setting": "x", "layers": layers, "accum": m, "t": s0 + s1 * layers + m * (m0 + m1 * layers)}
            for layers in (2, 6) for m in (1, 8)]
    assert doc.split(rows, "t")["x"] == pytest.approx((s1, m1, s0, m0), rel=1e-9)


def test_per_layer_divides_the_depths_difference_by_layers_and_micro_batches():
    # 2 and 6 layers, 4 micro-batches: (60 - 20) ms / 4 layers / 4 = 2.5 ms
    rows = [{"setting": "x", "width": 1024, "micro_batch": 1, "accum": 4, "layers": d, "t": t}
            for d, t in ((2, 0.020), (6, 0.060))]
    assert doc.per_layer(rows, "t") == {("x", 1024, 1, 4): pytest.approx(2.5e-3)}


def test_the_plain_loop_is_priced_within_the_small_work_regime():
    rows = [r for c in CALLS for r in c["rows"] if r["setting"] == "torch"]
    errors = [abs(doc.priced(r, "NVIDIA H200") / r["step_s"] - 1) for r in rows]
    assert len(rows) == 8 + 4 + 1 + 8  # the second call's rows, the third's, the fourth's and the fifth's
    # the targets for the small-work regime: median at most 12 %, p90 at most 30 %
    assert statistics.median(errors) <= 0.12 and sorted(errors)[int(0.9 * len(errors)) - 1] <= 0.30
