"""benchmarks/measure/small_work_graph.py: a layer's time per micro-batch split out of vTrain's released lines (made-up
lines composed as vTrain's graph composes them), the checks on the released file, and what sources.VTRAIN prices of
that scope (no recompute, the vocabulary vTrain's model holds, the TP all-reduces after the layer, no CPU mask)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "measure"))

import small_work_graph as gr  # noqa: E402
from meshplan_validation.case import map_run  # noqa: E402
from meshplan_validation.records import clean_record, read_runs  # noqa: E402
from meshplan_validation.sources import MDS_CPU_MASK_1024, VTRAIN  # noqa: E402

LAYER, REST, WU = 3e-3, 6e-3, 0.4e-3  # made up: a layer a micro-batch, the last rank's rest, the update per layer


def _line(layers, pp, mb=1, layer=LAYER):
    """The last rank's time per micro-batch (its layers and the rest) as the slope; the fill holds the earlier ranks'
    layers at the same time, plus the update per layer once a step (vTrain's graph without recompute)."""
    slope = layers / pp * layer + REST
    intercept = (pp - 1) * layers / pp * layer + layers * WU / pp
    return {(layers, 2048, 4, pp, mb, 1): (slope, intercept, 0.0)}


def _fits(layer_by_mb=None):
    fits = {}
    for mb, layer in (layer_by_mb or {1: LAYER}).items():
        for layers in gr.DEPTHS:
            for pp in (1, 2, 4):
                fits.update(_line(layers, pp, mb, layer))
    return fits


def test_split_recovers_the_layer_and_the_rest():
    """(slope(20) - slope(12)) / (8 / pp) = 3 ms at every depth; the rest 12 / pp x 3 ms less: 6 ms; the fill's excess
    (20 - 12) / 2 x 3 ms / 4 + (8 x 0.4 / 2 ms) / 4 - (8 x 0.4 ms) / 8 - 3 ms = 3 + 0.4 - 0.4 - 3 = 0."""
    row = gr.split(_fits())[(2048, 4, 1)]
    assert row["layer"] == pytest.approx(LAYER)
    assert all(v == pytest.approx(LAYER) for v in row["layers"].values())
    assert row["rest"][2] == pytest.approx(REST) and row["rest"][4] == pytest.approx(REST)
    assert row["fill_excess"][2] == pytest.approx(0.0, abs=1e-12)


def test_an_earlier_ranks_recompute_on_the_critical_path_shows_in_the_fill():
    """1 ms of recompute per layer on each earlier rank, in the fill only: (20 - 12) / 2 x 1 ms / 4 = 1 ms a layer."""
    fits = _fits()
    for layers in gr.DEPTHS:
        slope, intercept, _ = fits[(layers, 2048, 4, 2, 1, 1)]
        fits[(layers, 2048, 4, 2, 1, 1)] = (slope, intercept + layers / 2 * 1e-3, 0.0)
    assert gr.split(fits)[(2048, 4, 1)]["fill_excess"][2] == pytest.approx(1e-3)


def test_falls_lists_a_layer_cheaper_at_a_larger_micro_batch():
    rows = gr.split(_fits({1: 3e-3, 2: 2.5e-3, 4: 4e-3}))
    assert gr.falls(rows) == [(2048, 4, 2, pytest.approx(2.5e-3), pytest.approx(3e-3))]


def test_the_released_half_shows_one_layer_time_at_every_depth():
    """The released file: a layer's time per micro-batch the same at pp 1, 2 and 4 and the rest at pp 2 and 4 (to
    1e-9 s), the fill holding each earlier layer once at that time (12 groups at one dp), and six traced layers
    cheaper at a larger micro-batch (the profiling run's own timing, which no pricing follows)."""
    found = gr.checks([clean_record(r) for r in read_runs(gr.VTRAIN)])
    assert found["groups"] == 24 and found["fill_groups"] == 12
    assert found["layer_spread"] < 1e-9 and found["rest_spread"] < 1e-9 and found["fill_excess"] < 1e-9
    assert [(h, tp, mb) for h, tp, mb, _, _ in found["falls"]] == [
        (1024, 2, 4), (1024, 4, 2), (1024, 8, 2), (1024, 8, 4), (2048, 4, 2), (2048, 8, 2)]


def test_vtrain_prices_its_graphs_scope():
    """A released run (tp 2, stated full recompute) maps to vTrain's graph: no recompute, 50257 // 2 x 2 = 50256
    vocabulary rows unpadded, the TP all-reduces after the layer's kernels with no host call, no CPU mask."""
    record = next(clean_record(r) for r in read_runs(gr.VTRAIN) if r["parallel"]["tp"] == 2)
    case = map_run(record, False)
    assert case.plan.recompute == "none" and case.model.vocab_size == 50256
    assert (case.stack.vocab_multiple, case.stack.collective_host, case.stack.microbatch_host) == (1, 0.0, 0.0)
    assert case.stack.blocking_collectives and VTRAIN.stack.microbatch_host != MDS_CPU_MASK_1024
    tp1 = next(clean_record(r) for r in read_runs(gr.VTRAIN) if r["parallel"]["tp"] == 1)
    assert map_run(tp1, False).model.vocab_size == 50257  # one rank holds the odd vocabulary whole
