"""The stage DP's thresholds (search/stage_dp.py): a uniform framework's settings ordered by their least largest step
(``_least_largest``, stacked), their steps sorted only for those partitioned (``threshold_values``), as
``least_threshold`` gives them one table at a time."""

from __future__ import annotations

import numpy as np

from meshplan.fields import usable_hbm
from meshplan.search.stage_dp import (  # noqa: PLC2701 (its own)
    _least_largest,
    least_threshold,
    threshold_values,
    uniform_settings,
    uniform_tables,
)
from meshplan.search.stage_lines import rank_lines
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

L70 = load_model("llama3-70b")  # 80 layers
H100_32 = load_system("h100").cluster(32)
UNIFORM = Plan(dp=1, tp=4, pp=8, global_batch=128, recompute="full")


def test_each_settings_least_largest_step_is_its_least_threshold_value_exactly():
    """``proposals`` orders a uniform framework's settings by their least largest step (``_least_largest``, the
    tables stacked) and sorts the steps of those it partitions alone (``threshold_values``): the least is one of its
    table's steps, bit for bit, the (values, index) ``least_threshold`` gives that table alone; ∞ where no split
    fits."""
    lines = rank_lines(L70, [H100_32] * 8, UNIFORM, load_stack("any"), DEFAULT)
    limits = [0.7 * usable_hbm(H100_32.accelerator.hbm_bytes, 0.12)] * 8  # some settings fit, some do not
    settings = uniform_settings(("none", "selective", "full"), 30, 1)
    tables = uniform_tables(lines, 80, limits, settings, 1)
    leasts = _least_largest(np.stack([t[0] for t in tables]), 80)
    assert 0 < np.isfinite(leasts).sum() < len(settings)
    for table, least in zip(tables, leasts, strict=True):
        values, lo = least_threshold(table, 80)
        assert (lo < len(values)) == bool(np.isfinite(least))
        if lo < len(values):
            assert values[lo].tobytes() == np.float64(least).tobytes()
        again, at = threshold_values(table[0], float(least))
        assert again.tobytes() == values.tobytes() and at == lo
