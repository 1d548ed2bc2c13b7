"""The load simulation's iteration grid (serve/load/prices.py) priced with its axes apart and broadcast, and memoised:
every point the value Setting.time gives at that point's (sequences, prompt tokens, context) priced alone, bit for
bit; the same specs give the same grid object back. The prompt-only axis, priced a block at a time as it is read, and
the prefix grid priced with it, are what pricing them whole gives; the decode knots and the written-out interpolation
are the interpolation of ``_where`` and ``_bilinear``; the percentiles of a load are np.percentile's, bit for bit."""

from __future__ import annotations

import random

import numpy as np
import pytest

from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.engine import load_engine
from meshplan.serve.estimate import plan_columns
from meshplan.serve.load.prices import LONE_BLOCK, _AtContext, _bilinear, _prices, _where, prices
from meshplan.serve.load.summary import percentile
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


def _alone(engine=ENGINE):
    return _AtContext(MODEL, H100, plan_columns(PLAN), PLAN.quant, engine, Workload(input_len=1, output_len=1),
                      SERVE_DEFAULT, context=0.0)


@pytest.mark.parametrize("sampled", [False, True])
def test_the_prompt_only_axis_read_block_by_block_is_the_axis_priced_whole(sampled):
    grid = _prices(MODEL, H100, PLAN, ENGINE, 3000, SERVE_DEFAULT, sampled)
    lone = grid.alone
    axis = np.array(lone.axis)
    assert axis[0] == 0.0 and axis[-1] == ENGINE.max_batched_tokens and len(axis) == ENGINE.max_batched_tokens + 1
    x = 1000.25  # between two points: read before anything is priced, it prices its block and the prefix grid
    assert lone(x) == lone.values[1000] + 0.25 * (lone.values[1001] - lone.values[1000])
    assert lone.blocks == {1000 // LONE_BLOCK} and lone.grid is not None
    lone(3.0)  # a second block: every other one priced
    assert len(lone.blocks) == -(-len(axis) // LONE_BLOCK)
    with np.errstate(all="ignore"):
        whole = _alone().time(0.0, axis, axis if sampled else np.minimum(axis, 1.0), 0.0)
        p2, q2 = np.array(grid.p).reshape(-1, 1), np.array(grid.c).reshape(1, -1)
        after = (_alone().time(0.0, p2, np.minimum(p2, 1.0), q2) - _alone().time(0.0, p2, np.minimum(p2, 1.0), 0.0))
    assert np.array(lone.values).tobytes() == np.broadcast_to(whole, axis.shape).astype(float).tobytes()
    assert np.array(lone.grid).tobytes() == np.nan_to_num(np.broadcast_to(after, (len(grid.p), len(grid.c)))).tobytes()


def test_the_prefix_grid_read_first_is_priced_alone_and_the_same():
    one, other = (_prices(MODEL, H100, PLAN, ENGINE, 3000, SERVE_DEFAULT, False) for _ in range(2))
    first = one.alone.prefixed()
    assert one.alone.blocks == set()
    other.alone(100.0)
    assert np.array(first).tobytes() == np.array(other.alone.grid).tobytes()


def test_knots_and_the_written_out_interpolation_are_where_and_bilinear():
    grid = _prices(MODEL, H100, PLAN, ENGINE, 3000, SERVE_DEFAULT, False)
    rng = random.Random(3)

    def reference(decode, prefill, context):  # the interpolation as _where and _bilinear write it
        i, a = _where(grid.d, decode / grid.lanes)
        j, b = _where(grid.p, prefill / grid.lanes)
        k, g = _where(grid.c, context)
        lo, hi = _bilinear(grid.table[i], j, k, b, g), _bilinear(grid.table[i + 1], j, k, b, g)
        return lo + a * (hi - lo) + 0.0

    for decode in (1.0, 2.0, 7.0, 23.0, 24.0, 40.0):
        axis, values = grid.knots(decode)
        assert values == [reference(decode, 0.0, c) for c in axis] == [grid(decode, 0.0, c) for c in axis]
    for _ in range(300):
        point = (float(rng.randint(1, 30)), rng.uniform(0, 9000), rng.uniform(-5, 4000))
        assert grid(*point) == reference(*point)


def test_a_loads_percentiles_are_numpys_bit_for_bit():
    rng = np.random.default_rng(5)
    for n in (1, 2, 3, 10, 99, 100, 101, 1000):
        for x in (rng.random(n), np.round(rng.random(n) * 10), rng.integers(0, 3, n).astype(float)):
            for p in (50, 90, 95, 99, 0, 100):
                assert percentile(x, p) == float(np.percentile(x, p)), (n, p)
    with np.errstate(all="ignore"):
        assert np.isnan(percentile(np.array([1.0, np.nan, 2.0]), 50))
        for x in ([1.0, np.inf], [np.inf, np.inf, 2.0], [-np.inf, 0.0, 1.0]):
            ours, numpys = percentile(np.array(x), 99), float(np.percentile(x, 99))  # inf - inf: NaN (of either sign)
            assert ours == numpys or (np.isnan(ours) and np.isnan(numpys))


@pytest.mark.parametrize("name, system, shapes", [
    ("llama3-70b", "h100", [(2, 2, 1, 1, 384, "bf16"), (1, 4, 1, 1, 384, "bf16"), (4, 1, 1, 1, 1024, "fp8"),
                            (2, 8, 1, 1, 1024, "bf16"), (4, 2, 1, 1, 512, "fp8")]),
    ("mixtral-8x7b", "h100", [(2, 1, 1, 2, 128, "bf16"), (1, 1, 2, 2, 256, "bf16"), (4, 2, 1, 4, 64, "bf16")])])
def test_grids_priced_together_are_each_priced_alone_bit_for_bit(name, system, shapes):
    from meshplan.serve.load import prices as module
    from meshplan.serve.precision import parse_quant

    model, cluster = load_model(name), load_system(system).cluster(16)
    plans = [ServePlan(tp=tp, pp=pp, dpa=dpa, ep=ep, batch=b, quant=parse_quant(q)) for tp, pp, dpa, ep, b, q in shapes]
    module._MEMO.clear()
    module.prime(model, cluster, plans, ENGINE, 1500, 1000.0)  # and each one's block of a 1,000-token prefill
    for plan in plans:
        together = prices(model, cluster, plan.with_(replicas=3), ENGINE, 1500)  # replicas apart: the same grid
        alone = module._prices(model, cluster, plan, ENGINE, 1500, SERVE_DEFAULT, False)
        assert (together.d, together.p, together.c, together.lanes) == (alone.d, alone.p, alone.c, alone.lanes)
        assert np.asarray(together.table).tobytes() == np.asarray(alone.table).tobytes(), plan.describe()
        primed = sorted(together.alone.blocks)
        assert primed == together.alone.blocks_at(1000.0 / plan.pp / plan.dpa) and together.alone.calls == 0
        alone.alone._fill(set(primed))
        span = together.alone.span(primed)
        assert np.array(together.alone.values)[span].tobytes() == np.array(alone.alone.values)[span].tobytes()
        assert np.array(together.alone.grid).tobytes() == np.array(alone.alone.grid).tobytes()
        assert together(0.0, 777.0, 0.0) == alone(0.0, 777.0, 0.0)
