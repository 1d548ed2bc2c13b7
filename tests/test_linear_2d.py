"""A single linear layer on a tp_in × tp_out grid (cost/linear_2d.py, seed 001)."""

from __future__ import annotations

from meshplan.cost.linear_2d import linear_2d


def _flops(ops, phase=None, kind=None):
    return sum(o.flops for o in ops if (phase is None or o.phase == phase) and (kind is None or o.kind == kind))


def test_linear_2d_tp2_equal_one_is_1d_layout():
    # tp_out = 1: a row-parallel (1D) layer; FLOPs per GPU 2·(d_in/tp_in)·d_out·b per pass, 3 passes
    ops = linear_2d(1024, 4096, 512, tp_in=4, tp_out=1)
    assert _flops(ops) == 3 * 2 * (1024 / 4) * 4096 * 512
    tp_out = [o for o in ops if o.kind == "collective" and o.collective.axis == "tp_out"]
    assert tp_out[0].collective.group == 1
