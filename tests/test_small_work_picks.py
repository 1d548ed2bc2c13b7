"""The failing-sweep listing of benchmarks/measure/small_work_picks.py on made-up plans: a run's step split by its
plan's line (n micro-batches x slope + per step) and the swing of each part toward the wrong pick."""

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "measure"))

import small_work_parts as sp  # noqa: E402
import small_work_picks as pk  # noqa: E402


def _rec(gbs, tp, mb, rid, layers=12):
    return {"id": rid, "parallel": {"tp": tp, "pp": 1, "dp": 1, "micro_batch_size": mb, "global_batch_size": gbs},
            "model": {"num_layers": layers, "hidden_size": 1024, "num_heads": 16, "ffn_hidden_size": 4096,
                      "vocab_size": 50257, "seq_length": 1024},
            "hardware": {"gpu": "A100", "num_gpus": tp}, "framework": "mds", "precision": "fp16"}


def test_parts_of_a_run():
    """Measured 40 ms a micro-batch + 7 ms a step, priced 30 + 9: at global batch 8, micro-batch 2 (n = 4) the
    micro-batches take 160 / 120 ms and the step 7 / 9 ms."""
    records = [_rec(g, 1, 2, f"r{g}") for g in (4, 8, 16)]
    n = np.array([sp.microbatches(r) for r in records], dtype=float)
    times = {"measured": n * 0.040 + 0.007, "priced": n * 0.030 + 0.009, "gpu": n * 0.0, "host": n * 0.0}
    q = pk.parts(records[1], sp.lines(records, times))
    assert q["measured"] == pytest.approx({"per_microbatch": 0.160, "per_step": 0.007})
    assert q["priced"] == pytest.approx({"per_microbatch": 0.120, "per_step": 0.009})
    assert pk.parts(_rec(8, 8, 8, "x"), sp.lines(records, times)) == {}  # a plan run at one global batch only


def test_swing_adds_the_priced_lead_and_the_measured_deficit():
    """The pick is priced 10 ms cheaper a step on its micro-batches (120 against 130) and measured 20 ms slower
    (160 against 140): the micro-batches swing 10 + 20 = 30 ms toward it; the per-step part 1 + (-2) = -1 ms."""
    pick = {"measured": {"per_microbatch": 0.160, "per_step": 0.007},
            "priced": {"per_microbatch": 0.120, "per_step": 0.009}}
    best = {"measured": {"per_microbatch": 0.140, "per_step": 0.009},
            "priced": {"per_microbatch": 0.130, "per_step": 0.010}}
    assert pk.swing(pick, best) == pytest.approx({"per_microbatch": 0.030, "per_step": -0.001})
    assert pk.swing({}, best) == {}


def test_only_picks_beyond_ten_percent_fail():
    """Three plans of one sweep: the one priced fastest is measured 12 % over the best (fails); priced in the
    measured order, the sweep passes."""
    records = [_rec(8, 2, mb, f"m{mb}") for mb in (1, 2, 4)]
    measured = {"m1": 0.100, "m2": 0.112, "m4": 0.130}
    wrong = [SimpleNamespace(id=i, skipped=False, metric="iteration_time_s", predicted=p, measured=measured[i])
             for i, p in (("m1", 0.09), ("m2", 0.08), ("m4", 0.10))]
    found = pk.failing(records, wrong)
    assert len(found) == 1 and found[0]["regret"] == pytest.approx(0.12)
    assert found[0]["pick"][0]["id"] == "m2" and found[0]["best"][0]["id"] == "m1"
    right = [SimpleNamespace(id=r.id, skipped=False, metric=r.metric, predicted=r.measured, measured=r.measured)
             for r in wrong]
    assert pk.failing(records, right) == []
