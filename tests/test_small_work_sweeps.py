"""The sweep metrics of benchmarks/measure/small_work_sweeps.py on hand-worked examples (issue 46's planner bars)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "measure"))

import small_work_sweeps as sw  # noqa: E402
from meshplan_validation.result import RunResult  # noqa: E402


def test_spearman_of_a_swapped_pair():
    """Predicted ranks 1 2 3 4, measured 1 3 2 4: d² = 0 + 1 + 1 + 0 = 2, rho = 1 - 6·2 / (4·(16 - 1)) = 0.8."""
    assert sw.spearman([0.34, 0.36, 0.42, 0.55], [0.48, 0.59, 0.58, 0.66]) == pytest.approx(0.8)
    assert sw.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_regret_of_the_predicted_best():
    """meshplan predicts run 2 fastest (0.5 s); it measures 0.6 s against a best of 0.5 s: 0.6 / 0.5 - 1 = 20 %."""
    assert sw.regret([0.9, 0.5, 0.7], [0.5, 0.6, 0.55]) == pytest.approx(0.2)
    assert sw.regret([0.1, 0.5, 0.7], [0.5, 0.6, 0.55]) == 0.0


def _rec(id_, gbs, metric="iteration_time_s"):
    return {"id": id_, "framework": "x", "precision": "fp16", "model": {"num_layers": 2, "hidden_size": 8,
            "seq_length": 16}, "hardware": {"gpu": "V100", "num_gpus": 8}, "parallel": {"global_batch_size": gbs}}


def test_sweeps_group_equal_work_and_invert_throughput():
    """Three runs at global batch 16 that measured throughput form a sweep; the fourth (batch 32) is alone and
    dropped, and so are the two that measured step time (a time does not rank against 1 / throughput: a sweep has
    one metric). A throughput becomes 1 / throughput: 200 tokens/s -> 0.005."""
    recs = [_rec(i, 16) for i in "abcxy"] + [_rec("d", 32)]
    tps = "tokens_per_s_total"
    res = [RunResult("a", "g", tps, 250.0, 200.0, 0.25), RunResult("b", "g", tps, 400.0, 160.0, 1.5),
           RunResult("c", "g", tps, 200.0, 100.0, 1.0), RunResult("d", "g", tps, 1.0, 1.0, 0.0),
           RunResult("x", "g", "iteration_time_s", 0.4, 0.5, -0.2), RunResult("y", "g", "iteration_time_s", 0.3,
                                                                              0.6, -0.5)]
    (sweep,) = sw.sweeps(recs, res)
    assert [r[0] for r in sweep] == ["a", "b", "c"]
    assert sweep[2][1:] == (0.005, 0.01)
    m = sw.sweep_metrics(sweep)
    # times (1 / throughput): predicted a 0.004, b 0.0025, c 0.005 -> ranks (2, 1, 3); measured a 0.005, b 0.00625,
    # c 0.01 -> ranks (1, 2, 3): d² = 1 + 1 + 0, rho = 1 - 6·2 / (3·8) = 0.5; meshplan picks b, measured 0.00625
    # against a best of 0.005: regret 25 %
    assert m["spearman"] == pytest.approx(0.5) and m["regret"] == pytest.approx(0.25) and m["predicted_best"] == "b"


def test_pooled_figures():
    """Regrets 0 and 0.2: median 0.1, largest 0.2, one of two within 10 %; Spearman mean (1 + 0.5) / 2."""
    p = sw.pooled([{"runs": 4, "spearman": 1.0, "regret": 0.0}, {"runs": 3, "spearman": 0.5, "regret": 0.2}])
    assert (p["sweeps"], p["runs"], p["mean_spearman"], p["min_spearman"]) == (2, 7, 0.75, 0.5)
    assert p["median_regret"] == pytest.approx(0.1) and p["max_regret"] == 0.2 and p["within_10pct"] == 0.5
    assert sw.pooled([])["mean_spearman"] is None and sw.pooled([])["sweeps"] == 0
