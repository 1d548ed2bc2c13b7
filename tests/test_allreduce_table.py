"""A node's all-reduce as measured (specs/allreduce_table.py): a cluster that carries nccl-tests rows prices its tier-0
all-reduces by them, by hand, and keeps NCCL's tuner model for the group sizes and the collectives they do not hold;
vTrain's records carry their node's rows (meshplan_validation/source_vtrain.py); a larger message never costs less."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshplan.collectives.price import collective_time
from meshplan.specs.allreduce_table import AllReduceTable, measured_all_reduce
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.units import MiB

# made-up rows of 8 ranks: 90 µs at 1 MiB, 100 at 4 MiB, a dip to 95 at 8 MiB (timing noise), 400 at 64 MiB
ROWS = ((8, 1 * MiB, 90e-6), (8, 4 * MiB, 100e-6), (8, 8 * MiB, 95e-6), (8, 64 * MiB, 400e-6))
TABLE = AllReduceTable(ROWS, source="made up")


def test_the_table_read_by_hand():
    """At a row its time; between rows linear (2.5 MiB: halfway from 90 to 100 µs); below the smallest the price it
    was given, at most the smallest row's (20 µs stays, 200 µs is capped at 90); the dip lifted to the running maximum
    (8 MiB: 100, not 95; 36 MiB halfway from 100 to 400); above the largest its algorithm bandwidth (128 MiB: 2 x 400
    µs)."""
    def t(n: float, priced: float = -1.0) -> float:
        return float(measured_all_reduce(TABLE, n, 8, priced))
    assert t(4 * MiB) == pytest.approx(100e-6) and t(2.5 * MiB) == pytest.approx(95e-6)
    assert t(0.25 * MiB, 20e-6) == pytest.approx(20e-6) and t(0.25 * MiB, 200e-6) == pytest.approx(90e-6)
    assert t(8 * MiB) == pytest.approx(100e-6) and t(36 * MiB) == pytest.approx(250e-6)
    assert t(128 * MiB) == pytest.approx(800e-6)
    assert measured_all_reduce(TABLE, 4 * MiB, 4, 7e-6) == 7e-6  # no rows of 4 ranks: the price it was given
    out = measured_all_reduce(TABLE, np.array([4 * MiB, 4 * MiB]), np.array([8, 4]), np.array([1e-6, 2e-6]))
    assert out == pytest.approx([100e-6, 2e-6])  # arrays of groups (the search's), each by its own rows
    with pytest.raises(ValueError, match="ranks >= 2"):
        AllReduceTable(((1, MiB, 1e-6),))


def test_a_cluster_with_a_table_prices_its_all_reduces_by_it():
    """An 8 x A100 node with the rows: its 8-rank all-reduce of 4 MiB is 100 µs where NCCL's tuner prices about half;
    its all-gather, and a 2-rank all-reduce (no rows), keep NCCL's model."""
    node = load_system("a100").cluster(8)
    measured = replace(node, allreduce_table=TABLE)
    assert collective_time("all_reduce", 4 * MiB, 8, 1, measured, DEFAULT) == pytest.approx(100e-6)
    assert collective_time("all_reduce", 4 * MiB, 8, 1, node, DEFAULT) < 80e-6
    for kind, group in (("all_gather", 8), ("all_reduce", 2)):
        assert collective_time(kind, 4 * MiB, group, 1, measured, DEFAULT) == collective_time(
            kind, 4 * MiB, group, 1, node, DEFAULT)


def test_a_larger_message_never_costs_less():
    """Monotone in the bytes whatever the rows' noise (the running maximum), below, between and past the rows: the
    made-up table and 50 random noisy ones (times of a latency-bandwidth line, each row off by up to ±30 %)."""
    sizes = np.geomspace(1e3, 1e10, 300)
    nccl = collective_time("all_reduce", sizes, 8, 1, load_system("a100").cluster(8), DEFAULT)  # below the rows
    assert np.all(np.diff(measured_all_reduce(TABLE, sizes, 8, nccl)) >= 0)
    rng = np.random.default_rng(79)
    for _ in range(50):
        rows_n = np.sort(rng.uniform(1e5, 2e9, rng.integers(1, 12)))
        noisy = (20e-6 + rows_n / 200e9) * rng.uniform(0.7, 1.3, rows_n.size)
        table = AllReduceTable(tuple((4, float(n), float(t)) for n, t in zip(rows_n, noisy, strict=True)))
        assert np.all(np.diff(measured_all_reduce(table, sizes, 4, sizes / 100e9)) >= 0)


def test_vtrains_records_carry_their_nodes_rows():
    """vTrain's graph times a layer's TP CommNode of b·s·h fp16 bytes at its node's nccl-tests row (trace/a100/
    AR_GPU8_1M_1024M_LUT, 2 MiB: 92.97 µs, the column predictor.get_allreduce_LUT keeps): micro-batch 1, sequence
    1024, hidden 1024 at tp 8."""
    from meshplan_validation.case import map_run
    from meshplan_validation.records import read_runs
    from meshplan_validation.source_vtrain import VTRAIN_ALLREDUCE, read_table
    assert read_table() == VTRAIN_ALLREDUCE and set(VTRAIN_ALLREDUCE.groups) == {2, 4, 8}
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "data" / "validation" / "vtrain_single_node_dev.jsonl"
    record = next(r for r in read_runs(path) if r["parallel"]["tp"] == 8)
    case = map_run(record, False)
    assert case.cluster.allreduce_table == VTRAIN_ALLREDUCE
    feature_map = 1 * 1024 * 1024 * 2
    assert collective_time("all_reduce", feature_map, 8, 1, case.cluster, DEFAULT) == pytest.approx(92.97e-6)
