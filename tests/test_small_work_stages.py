"""The depth check of benchmarks/measure/small_work_stages.py on made-up lines: each depth's measured / priced seconds
per micro-batch, their spread, and the intercept beyond the pipeline's fill."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "measure"))

import small_work_stages as ss  # noqa: E402


def _fit(measured, priced):
    return {"measured": measured, "priced": priced}


def test_ratios_and_spread():
    """40 ms measured against 50 priced at pp 1 and 22 against 25 at pp 2: ratios 0.8 and 0.88, spread 1.1; the same
    ratio at every depth spreads 1."""
    r = ss.ratios({1: _fit((0.040, 0.002), (0.050, 0.008)), 2: _fit((0.022, 0.020), (0.025, 0.030))})
    assert r == pytest.approx({1: 0.8, 2: 0.88})
    assert ss.spread(r) == pytest.approx(1.1)
    assert ss.spread({1: 0.9, 2: 0.9, 4: 0.9}) == pytest.approx(1.0)


def test_beyond_fill():
    """A 4-deep line of 20 ms a micro-batch and 50 ms a step: the fill of 3 stages is 60 ms, 10 ms beyond it the
    other way (the slowest stage's extra work outweighs the step's own); at pp 1 the intercept itself."""
    assert ss.beyond_fill(4, (0.020, 0.050)) == pytest.approx(-0.010)
    assert ss.beyond_fill(1, (0.020, 0.007)) == pytest.approx(0.007)


def test_by_depth_takes_dp_one_or_the_smallest():
    """Keys (tp, pp, dp, micro-batch, layers, hidden): tp 1's pp 1 only at dp 2 and 4 keeps dp 2; its pp 2 at dp 1
    and 2 keeps dp 1; a group at one depth has no row in the table, and the largest spreads split tp 1 from tp >= 2."""
    fits = {(1, 1, 4, 2, 12, 1024): _fit((0.030, 0.0), (0.030, 0.0)),
            (1, 1, 2, 2, 12, 1024): _fit((0.040, 0.0), (0.050, 0.0)),
            (1, 2, 1, 2, 12, 1024): _fit((0.022, 0.0), (0.025, 0.0)),
            (1, 2, 2, 2, 12, 1024): _fit((0.010, 0.0), (0.025, 0.0)),
            (2, 1, 1, 1, 12, 1024): _fit((0.040, 0.0), (0.040, 0.0)),
            (2, 2, 1, 1, 12, 1024): _fit((0.021, 0.0), (0.020, 0.0)),
            (4, 1, 1, 1, 12, 1024): _fit((0.040, 0.0), (0.040, 0.0))}
    groups = ss.by_depth(fits)
    assert ss.ratios(groups[(1, 2, 1024, 12)]) == pytest.approx({1: 0.8, 2: 0.88})
    assert ss.largest(groups, True) == pytest.approx(1.1)
    assert ss.largest(groups, False) == pytest.approx(1.05)
    rows = ss.table(groups)
    assert len(rows) == 2 + 2  # the header, its rule, and the two groups at two depths (tp 4 ran at pp 1 only)
    assert "| 1 | 2 | 1024 | 12 | 1: 0.800, 2: 0.880 | 1.100 |" in rows[2]
