"""The per-step table of benchmarks/measure/small_work_step.py on made-up entries: plans that differ only in their
micro-batch pooled by the median, in milliseconds, with the measured per-step part over the priced update."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "measure"))

import small_work_step as ss  # noqa: E402


def _entry(mb, measured, update, all_reduce=0.0, dp=1):
    return {"key": (2, 1, dp, mb, 12, 1024), "measured": measured, "priced": 8e-3, "optimizer/adam": update,
            "dp/grad_all_reduce": all_reduce}


def test_micro_batches_pooled_by_the_median():
    """Three micro-batch sizes of one (tp 2, dp 1, 12 layers, hidden 1024): medians 2.2 ms measured, 1.6 ms update,
    so 2.2 / 1.6 = 1.375 -> 1.38; no all-reduce at dp 1."""
    rows = ss.table([_entry(1, 2.1e-3, 1.6e-3), _entry(2, 2.2e-3, 1.6e-3), _entry(4, 2.3e-3, 1.6e-3)])
    assert len(rows) == 3
    assert rows[2] == "| 2 | 1 | 12 | 1024 | 2.20 | 8.00 | 1.60 | 0.00 | 1.38 |"


def test_one_row_per_data_parallel_size():
    """dp 1 and dp 2 stay apart, sorted; the dp-2 row carries its all-reduce: 3.6 / 1.6 = 2.25."""
    rows = ss.table([_entry(2, 3.6e-3, 1.6e-3, 0.9e-3, dp=2), _entry(2, 2.2e-3, 1.6e-3)])
    assert [r.split("|")[2].strip() for r in rows[2:]] == ["1", "2"]
    assert rows[3].endswith("| 3.60 | 8.00 | 1.60 | 0.90 | 2.25 |")
