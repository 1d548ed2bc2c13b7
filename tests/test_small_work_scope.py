"""benchmarks/measure/small_work_scope.py: vTrain's simulator arithmetic (predictor.py param_size_by_rank and
compute_comm_time) on made-up numbers, and the composition it finds in the released file (sources.VTRAIN's scope)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "measure"))

import small_work_scope as sc  # noqa: E402
from meshplan_validation.records import clean_record, read_runs  # noqa: E402

LUT = {2: {1: (1e-4, 20.0), 1024: (5e-3, 200.0)}, 4: {1: (2e-4, 30.0), 1024: (7e-3, 220.0)}}


def test_rank_bytes_counts_predictor_parameters():
    """h 1024, tp 2, one stage of 12 layers: per layer 6h + 12 h^2 / 2 + 7h / 2 (QKV, output, up and down
    projections and the QKV and up biases split over tp; LayerNorms and the other biases whole), plus 50257 // 2 x h
    twice (embedding and the untied logit layer) and 1024 x h positions, two bytes each."""
    h, tp = 1024, 2
    layer = 6 * h + 12 * h * h // tp + 7 * h // tp
    assert sc.rank_bytes(12, h, tp, 1) == 2 * (12 * layer + 2 * (50257 // tp) * h + 1024 * h)
    # a middle pipeline rank has only its layers; the last the logit layer, no positions
    assert sc.rank_bytes(12, h, tp, 4, rank=1) == 2 * 3 * layer
    assert sc.rank_bytes(12, h, tp, 4, rank=3) == 2 * (3 * layer + (50257 // tp) * h)


def test_all_reduce_reads_the_table_then_the_bus_bandwidth():
    """1 MiB at 2 GPUs: the row's 0.1 ms; 2048 MiB (past the table): 2048 / (200 x 1024) s = 10 ms."""
    assert sc.all_reduce(sc.MIB, 2, LUT) == pytest.approx(1e-4)
    assert sc.all_reduce(2048 * sc.MIB, 2, LUT) == pytest.approx(2048 / (200.0 * 1024))


def _run(dp, gb, seconds, mb=1):
    return {"parallel": {"tp": 8, "pp": 1, "dp": dp, "micro_batch_size": mb, "global_batch_size": gb},
            "model": {"num_layers": 12, "hidden_size": 1024}, "measured": {"iteration_time_s": seconds}}


def test_checks_split_a_composed_sweep():
    """A made-up plan composed as vTrain's graph would: 0.05 s a micro-batch, 1 ms once, and at dp 2 the table's
    2 ms all-reduce of the rank's bytes on top."""
    size = round(sc.rank_bytes(12, 1024, 8, 1) / sc.MIB)
    lut = {2: {size: (2e-3, 100.0), 1024: (5e-3, 200.0)}}
    runs = [_run(1, n, 1e-3 + 0.05 * n) for n in (2, 4, 8)] + [_run(2, 2 * n, 3e-3 + 0.05 * n) for n in (2, 4)]
    found = sc.checks(runs, lut)
    assert found["groups"] == 1 and found["linearity"] == pytest.approx(0.0, abs=1e-12)
    assert found["slope_spread"] == pytest.approx(0.0, abs=1e-12)
    assert found["rest_spread"] == pytest.approx(0.0, abs=1e-12)
    assert found["rest"][(12, 1024, 8, 1, 1)] == pytest.approx(1e-3)
    # timed dp-2 runs 0.4 ms slower than the composition show up as the spread
    runs[-2:] = [_run(2, 2 * n, 3.4e-3 + 0.05 * n) for n in (2, 4)]
    assert sc.checks(runs, lut)["rest_spread"] == pytest.approx(4e-4)


def test_the_released_half_is_composed_by_vtrains_graph():
    """The released file: every plan's times on one line in the micro-batch count, one slope at every dp, and each
    dp > 1 intercept its dp-1 twin's plus compute_comm_time of the first rank's fp16 bytes (to a microsecond; 72
    groups): the step's once-a-step part is that exposed all-reduce and a dp-independent rest (sources.VTRAIN)."""
    found = sc.checks([clean_record(r) for r in read_runs(sc.VTRAIN)], sc.read_lut())
    assert found["groups"] == 72
    assert found["linearity"] < 1e-9 and found["slope_spread"] < 1e-9 and found["rest_spread"] < 1e-6
