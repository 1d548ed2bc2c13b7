"""The load simulation's iteration grid (serve/load/prices.py) priced with its axes apart and broadcast, and memoised:
every point the value Setting.time gives at that point's (sequences, prompt tokens, context) priced alone, bit for
bit; the same specs give the same grid object back."""

from __future__ import annotations

import numpy as np

from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.engine import load_engine
from meshplan.serve.estimate import plan_columns
from meshplan.serve.load.prices import _AtContext, prices
from meshplan.serve.plan import ServePlan, Workload
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

MODEL = load_model("llama3-8b")
H100 = load_system("h100").cluster(1)
ENGINE = load_engine("vllm")
PLAN = ServePlan(tp=1, batch=24)


def test_every_grid_point_is_setting_time_at_that_point_bit_for_bit():
    grid = prices(MODEL, H100, PLAN, ENGINE, 3000)
    d, p, c = (np.array(axis) for axis in (grid.d, grid.p, grid.c))
    dd, pp, cc = (x.ravel() for x in np.meshgrid(d, p, c, indexing="ij"))  # every point its own row, as before
    setting = _AtContext(MODEL, H100, plan_columns(PLAN), PLAN.quant, ENGINE, Workload(input_len=1, output_len=1),
                         SERVE_DEFAULT, context=cc)
    with np.errstate(all="ignore"):
        flat = np.asarray(setting.time(dd, pp, np.minimum(pp, 1.0), 0.0), dtype=float)
    assert np.asarray(grid.table).shape == (len(d), len(p), len(c))
    assert np.asarray(grid.table).ravel().tobytes() == flat.tobytes()


def test_the_same_specs_give_the_same_grid_and_other_contexts_another():
    first = prices(MODEL, H100, PLAN, ENGINE, 2000)
    assert prices(MODEL, H100, PLAN, ENGINE, 2000) is first
    longer = prices(MODEL, H100, PLAN, ENGINE, 2001)
    assert longer is not first and longer.c[-1] == 2001.0 and first.c[-1] == 2000.0
