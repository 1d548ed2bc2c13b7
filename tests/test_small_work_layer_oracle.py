"""The arithmetic of benchmarks/measure/small_work_layer_oracle.py on made-up numbers: the closest non-decreasing
layer times, a layer's move of a 1F1B step, a re-priced sweep's pick, and the four queue disciplines of one pass."""

import random
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from meshplan.cost.records import OpCost
from meshplan.specs.host_cost import HostCost

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "measure"))

import small_work_layer_oracle as lo  # noqa: E402


def test_monotone_pools_adjacent_violators():
    """3, 1, 2 pools into one block of mean 2; 1, 3, 2, 4 pools the middle pair; a sorted list stays."""
    assert lo.monotone([3.0, 1.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])
    assert lo.monotone([1.0, 3.0, 2.0, 4.0]) == pytest.approx([1.0, 2.5, 2.5, 4.0])
    assert lo.monotone([1.0, 2.0, 5.0]) == pytest.approx([1.0, 2.0, 5.0])


def test_monotone_is_non_decreasing_and_keeps_the_sum():
    rng = random.Random(79)
    for _ in range(200):
        values = [rng.uniform(2.0, 9.0) for _ in range(rng.randint(1, 6))]
        fit = lo.monotone(values)
        assert all(a <= b + 1e-12 for a, b in zip(fit, fit[1:], strict=False))
        assert sum(fit) == pytest.approx(sum(values))


def test_monotone_cells_run_over_the_micro_batches_of_each_width_and_tp():
    measured = {(2, 1, 1024): 3.3, (2, 2, 1024): 3.6, (2, 4, 1024): 3.2, (2, 1, 2048): 3.0}
    fit = lo.monotone_cells(measured)
    assert fit[(2, 1, 1024)] == pytest.approx(3.3)
    assert fit[(2, 2, 1024)] == pytest.approx(3.4) and fit[(2, 4, 1024)] == pytest.approx(3.4)
    assert fit[(2, 1, 2048)] == pytest.approx(3.0)


def _rec(rid, tp, pp, mb, gb=8, layers=20):
    return {"id": rid, "parallel": {"tp": tp, "pp": pp, "dp": 1, "micro_batch_size": mb, "global_batch_size": gb},
            "model": {"num_layers": layers, "hidden_size": 1024, "num_heads": 16, "ffn_hidden_size": 4096,
                      "vocab_size": 50257, "seq_length": 1024},
            "hardware": {"gpu": "A100", "num_gpus": 4}, "framework": "mds", "precision": "fp16"}


def test_a_layer_moves_a_1f1b_step_by_its_stage_layers_times_the_micro_batches_and_the_fill():
    """20 layers over 2 stages, 2 micro-batches (global batch 8 at micro-batch 4): 1 ms more a layer is 10 layers x
    (2 + 1) runs of a stage = 30 ms; at pp 1 with 8 micro-batches of 1, 20 x 8 = 160 ms."""
    assert lo.moved(_rec("a", 1, 2, 4), 1e-3) == pytest.approx(0.030)
    assert lo.moved(_rec("b", 2, 1, 1), 1e-3) == pytest.approx(0.160)


@dataclass(frozen=True)
class _Run:  # a validation result's fields the sweeps read (meshplan_validation.result.RunResult)
    id: str
    predicted: float
    measured: float
    skipped: str = ""
    metric: str = "iteration_time_s"


def test_pricing_the_layer_as_measured_moves_the_pick():
    """tp 1 pp 2 is priced fastest (its layer at 3.5 ms) but measured 30 % over tp 2 pp 1: the sweep fails. Priced at
    its measured 5.0 ms a layer it is 10 x 3 x 1.5 = 45 ms slower, and the pick moves to the best."""
    records = [_rec("t1", 1, 2, 4), _rec("t2", 2, 1, 4), _rec("t4", 4, 1, 4)]
    runs = [_Run("t1", 0.150, 0.195), _Run("t2", 0.160, 0.150), _Run("t4", 0.170, 0.170)]
    assert lo.picks(records, runs)[:2] == (0, 1)
    moved = lo.repriced(records, runs, {(1, 4, 1024): 3.5e-3}, lambda c: 5.0e-3)
    assert moved[0].predicted == pytest.approx(0.195) and moved[1:] == runs[1:]
    assert lo.picks(records, moved)[:2] == (1, 1)


def _op(name, n, gpu_us):
    return OpCost(name, "fwd", "memory", nbytes=1e6, kernels=n), gpu_us * 1e-6


def test_the_four_disciplines_of_one_pass():
    """Kernels issued at 10 us each with GPU times 2, 30, 5 us: max(H, G) = 37 us; from an empty queue the GPU runs
    10-12, 20-50, 50-55 (55 us); one at a time Σ max(10, g) = 50 plus the largest min(10, g) = 10 (60 us); every
    launch blocking 30 + 37 = 67 us."""
    host = HostCost(per_kernel=10e-6)
    h, g, c, queue, one = lo._pass([_op("a", 1, 2), _op("b", 1, 30), _op("c", 1, 5)], host)
    assert (h, g, c) == pytest.approx((30e-6, 37e-6, 0.0))
    assert queue == pytest.approx(55e-6) and one == pytest.approx(60e-6)
    assert max(h, g) <= queue <= one <= h + g
