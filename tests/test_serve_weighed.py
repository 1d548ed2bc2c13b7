"""What the serving search keeps for the report (``search(..., keep=True)``: serve/weighed.py) and the decode step's
op kinds (ServeEstimate.kinds): every configuration priced is a row, tallied by the same reasons, priced as
``serve_estimate`` prices it; and keeping them changes nothing the search returns."""

from __future__ import annotations

import random

import numpy as np
import pytest

from meshplan.serve import check
from meshplan.serve.estimate import serve_estimate
from meshplan.serve.plan import ServePlan, Workload
from meshplan.serve.search import search
from meshplan.serve.space import ServeSpace
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

CASES = [("llama3-8b", "h100", 8, 0.5, 0.02), ("mixtral-8x7b", "a100", 8, 1.0, 0.05)]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def kept(request):
    name, system, gpus, ttft, tpot = request.param
    model, cluster = load_model(name), load_system(system).cluster(gpus)
    space = ServeSpace(input_len=1024, output_len=256, ttft_slo=ttft, tpot_slo=tpot)
    return model, cluster, space, search(model, cluster, space, top_k=5, keep=True)


def test_every_configuration_is_a_row_tallied_as_the_search_tallies(kept):
    _, _, space, result = kept
    w = result.weighed
    assert len(w) == result.evaluated
    reasons = w.columns["reason"]
    assert int(np.sum(reasons < 0)) == result.feasible
    assert {w.reasons[i]: int(np.sum(reasons == i)) for i in set(reasons.tolist()) if i >= 0} == result.rejected
    # the search's targets: each failing row breaks the one its reason says, each fitting row meets both
    ok = reasons < 0
    assert np.all(w.columns["tpot"][ok] <= space.tpot_slo) and np.all(w.columns["ttft"][ok] <= space.ttft_slo)
    tpot = reasons == w.reasons.index(check.TPOT)
    assert tpot.any() and np.all(w.columns["tpot"][tpot] > space.tpot_slo)


def test_the_best_row_is_the_best_configuration(kept):
    """The row of the most tokens/s is the search's best by throughput (``fastest``: the configuration listed first
    may be a simpler one within the tie band)."""
    _, _, _, result = kept
    w = result.weighed
    ok = w.columns["reason"] < 0
    best = result.fastest
    assert np.max(w.columns["tokens_per_s"][ok]) == pytest.approx(best.metrics.tokens_per_s, rel=1e-9)
    # GPUs used: tp·pp·dpa per instance times (replicas + prefill replicas)
    i = int(np.argmax(np.where(ok, w.columns["tokens_per_s"], -1)))
    c = {k: int(w.columns[k][i]) for k in ("tp", "pp", "dpa", "replicas", "prefill_replicas", "gpus")}
    assert c["gpus"] == c["tp"] * c["pp"] * c["dpa"] * (c["replicas"] + c["prefill_replicas"]) == best.plan.num_gpus


def test_rows_are_priced_as_serve_estimate_prices_them(kept):
    model, cluster, space, result = kept
    w = result.weighed
    rows = [i for i in range(len(w)) if w.reasons[w.columns["reason"][i]] in (check.MEMORY, check.TTFT, check.TPOT)
            or w.columns["reason"][i] < 0]
    workload = Workload(input_len=space.input_len, output_len=space.output_len)
    for i in random.Random(7).sample(rows, 12):
        c = {k: int(w.columns[k][i]) for k in ("tp", "pp", "dpa", "ep", "batch", "replicas", "prefill_replicas")}
        e = serve_estimate(model, cluster, ServePlan(**c, quant=w.quants[w.columns["quant"][i]]), workload,
                           space.engine)
        for key, value in (("ttft", e.metrics.ttft), ("tpot", e.metrics.tpot), ("tokens_per_s", e.metrics.tokens_per_s),
                           ("memory", float(e.memory.total))):
            assert w.columns[key][i] == pytest.approx(value, rel=1e-6), (key, c)
        assert (w.columns["reason"][i] == w.reasons.index(check.MEMORY)) == any(
            r.startswith(check.MEMORY) for r in e.reasons)


def test_keeping_the_rows_changes_nothing_else(kept):
    model, cluster, space, result = kept
    plain = search(model, cluster, space, top_k=5)
    assert plain.weighed is None
    assert [e.plan for e in plain.plans] == [e.plan for e in result.plans]
    assert (plain.rejected, plain.evaluated) == (result.rejected, result.evaluated)


def test_the_table_alone_is_the_same_table(kept):
    """top_k=0 (the load search's shortlist reads the table alone): no plan re-estimated, the same rows bit for bit."""
    model, cluster, space, result = kept
    alone = search(model, cluster, space, top_k=0, keep=True)
    assert alone.plans == () and alone.weighed is not None and alone.weighed.reasons == result.weighed.reasons
    assert set(alone.weighed.columns) == set(result.weighed.columns)
    for key, column in result.weighed.columns.items():
        assert np.asarray(alone.weighed.columns[key]).tobytes() == np.asarray(column).tobytes(), key


def test_every_op_of_the_decode_step_has_a_kind(kept):
    _, _, _, result = kept
    for e in result.plans:
        assert set(e.breakdown) == set(e.kinds)
        assert set(e.kinds.values()) <= {"gemm", "attention", "memory", "collective", "host"}
        assert e.kinds["attn/decode"] == "attention" and e.kinds["attn/qkv"] == "gemm"
    host = [e for e in result.plans if e.engine.iteration_overhead]
    assert all(e.kinds["engine/host"] == "host" for e in host)
