"""A finite run of N requests offered at a rate (TensorRT-LLM 0.14's online serving rows: 500 requests at QPS 2-32
and all at once, data/serving/published_serving.jsonl) is simulated request by request (serving_eval._transient,
serve/load/run.repeated): by Little's law its steady state's batch B fills over one request lifetime and drains over
another once the arrivals end, so only N − 2B of the N requests see it, a share that falls smoothly to none at
B = N/2, and the simulation holds every share without a rule. Its inter-token latency is no more than offering all N
at once: the page's 12 series agree (QPS 32 within its 1 ms rounding of INF, every other rate below). The steady
state and the simulation price one engine behaviour (in-flight batching with whole prompts beside the decodes,
Engine.prefill = "whole", presets/schedulers/trtllm.toml): at a low rate they agree."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from meshplan.serve.engine import Engine, load_engine
from meshplan.serve.load.arrivals import Requests, poisson
from meshplan.serve.load.lengths import Lengths
from meshplan.serve.load.policy import from_engine, policy_for
from meshplan.serve.load.run import load_run
from meshplan.serve.metrics import deployment, instance
from meshplan_validation.serving_eval import SERVE_DEFAULT, batch_of, largest_batch, predict, setting
from meshplan_validation.serving_map import case_of

DATA = Path(__file__).resolve().parents[1] / "data" / "serving" / "published_serving.jsonl"
RECORDS = {r["id"]: r for r in (json.loads(line) for line in DATA.read_text().splitlines() if line.strip())
           if r["group"] == "trtllm_serving_v0.14"}
SERIES = "trtllm014srv_llama3.1-70b_h100_tp4_467x256"


def _series() -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for rid, r in RECORDS.items():
        key, rate = rid.rsplit("_", 1)
        out[key][rate] = r
    return out


def test_a_finite_rate_reads_no_slower_than_every_request_at_once_as_measured():
    """Per series whose all-at-once run is priced (the 202/214 ones are not: serving_map.VARIED), the measured mean ITL
    at every finite rate is at most INF's (+1 ms: the page prints whole ms), and so is meshplan's (+5 %: INF is priced
    by the burst's closed form, a finite rate beyond N/2 in flight by the simulation)."""
    checked = 0
    for runs in _series().values():
        inf = case_of(runs["qpsinf"])
        if isinstance(inf, str):
            continue
        at_once, measured_at_once = predict(inf)[0]["itl_ms"], runs["qpsinf"]["measured"]["itl_ms"]
        for rate, r in runs.items():
            if rate == "qpsinf":
                continue
            assert r["measured"]["itl_ms"] <= measured_at_once + 1, r["id"]
            assert predict(case_of(r))[0]["itl_ms"] <= 1.05 * at_once, r["id"]
            checked += 1
    assert checked == 40  # 8 series of 5 rates


def test_the_steady_state_at_the_full_batch_is_what_a_finite_run_never_reaches():
    """Llama 3.1 70B, TP 4 on H100, 467/256 at QPS 32: beyond what the 500-request batch serves (15.7 req/s), the
    steady state there carries the prompts that replace the finished requests in every iteration, forever: 114 ms a
    token, where the page measured 86 (85 at INF). The run is priced by the simulation of its 500 requests: within 10 %
    of the measurement, and of INF's price."""
    r = RECORDS[f"{SERIES}_qps32"]
    case = case_of(r)
    assert batch_of(case, SERVE_DEFAULT) == largest_batch(case) == 500
    steady = deployment(instance(setting(case, 500.0, SERVE_DEFAULT)), 1, 0, 256)
    assert 1e3 * float(steady.tpot) == pytest.approx(114, rel=0.05)
    out = predict(case)[0]
    assert out["itl_ms"] == pytest.approx(r["measured"]["itl_ms"], rel=0.10)
    assert out["itl_ms"] == pytest.approx(predict(case_of(RECORDS[f"{SERIES}_qpsinf"]))[0]["itl_ms"], rel=0.10)


def test_at_a_low_rate_the_simulation_is_the_steady_state_of_the_same_engine():
    """QPS 2 of the same series holds ~9 of the 500 requests (B ≪ N: nearly every request lives in the steady state).
    The simulation's batch is the steady state's (Little's law: λ × the time in flight) and its ITL the steady state's
    TPOT at that batch, both pricing whole prompts beside the decodes: within 5 %."""
    case = case_of(RECORDS[f"{SERIES}_qps2"])
    assert case.engine.prefill == "whole"
    steady_batch = batch_of(case, SERVE_DEFAULT)
    out, held = predict(case)
    assert held == pytest.approx(steady_batch, rel=0.05)
    steady = deployment(instance(setting(case, held, SERVE_DEFAULT)), 1, 0, 256)
    assert out["itl_ms"] == pytest.approx(1e3 * float(steady.tpot), rel=0.05)


def test_the_price_has_no_jump_as_the_rate_crosses_half_the_requests_in_flight():
    """Llama 3.1 8B, TP 1 on H100, 467/256 (its QPS 32 holds about half of its 500 requests in the steady state, where
    a rule at N/2 jumped from +59 % to +7 %): over rates 20-44 req/s the priced ITL and TTFT rise with the rate, each
    step of 4 req/s by under 25 %, and the batch held stays under N/2 and rises too."""
    base = RECORDS["trtllm014srv_llama3.1-8b_h100_tp1_467x256_qps32"]
    rates = (20.0, 24.0, 28.0, 32.0, 36.0, 40.0, 44.0)
    priced = [predict(case_of({**base, "workload": {**base["workload"], "request_rate": q}})) for q in rates]
    for name in ("itl_ms", "ttft_ms"):
        values = [out[name] for out, _ in priced]
        assert all(b >= 0.98 * a and b <= 1.25 * a for a, b in zip(values, values[1:], strict=False)), (name, values)
    held = [batch for _, batch in priced]
    assert all(b >= a for a, b in zip(held, held[1:], strict=False)) and max(held) < 250, held


def test_a_request_under_load_waits_at_least_as_long_as_one_alone():
    """Every priced rate run's mean TTFT is at least a lone request's (an idle engine: its prompt's one iteration, the
    steady state at one sequence), and its mean ITL at least a lone request's decode step, less 2 % (the simulation
    prices each step at the batch's mean context)."""
    for r in RECORDS.values():
        case = case_of(r)
        if isinstance(case, str) or case.mode != "rate":
            continue
        alone = deployment(instance(setting(case, 1.0, SERVE_DEFAULT)), 1, 0, case.workload.output_len)
        out = predict(case)[0]
        assert out["ttft_ms"] >= 1e3 * float(alone.ttft), r["id"]
        assert out["itl_ms"] >= 0.98e3 * float(alone.tpot), r["id"]


def test_the_simulation_of_n_requests_reads_no_slower_at_a_finite_rate_than_all_at_once():
    """The same 500 requests through the same TensorRT-LLM instance (in-flight batching, GUARANTEED_NO_EVICT, whole
    prompts): at any Poisson rate, below and far beyond what it serves, the mean ITL is at most the burst's, and it
    rises with the rate."""
    case = case_of(RECORDS[f"{SERIES}_qps32"])
    plan = case.plan.with_(batch=int(largest_batch(case)))
    lengths = Lengths("fixed", 467, 256)

    def itl(reqs: Requests) -> float:
        return load_run(case.model, case.cluster, plan, reqs, case.engine).mean["itl"]

    burst = itl(Requests(np.zeros(500), np.full(500, 467), np.full(500, 256)))
    rates = [itl(poisson(rate, 500, lengths, 0)) for rate in (2.0, 8.0, 16.0, 32.0, 128.0)]
    assert all(a <= b * 1.02 for a, b in zip(rates, rates[1:], strict=False)), rates
    assert max(rates) <= burst * 1.02, (rates, burst)


def test_an_engine_from_its_fields_simulates_what_its_steady_state_prices():
    """policy.from_engine reads Engine.prefill's own flags, as metrics.instance does: whole prompts beside the decodes
    (TensorRT-LLM's in-flight batching, chunking off), chunks beside them, or prompts in iterations of their own."""
    got = {name: (p.mixed, p.chunked) for name in ("whole", "chunked", "separate")
           for p in [from_engine(Engine(name="mine", prefill=name))]}
    assert got == {"whole": (True, False), "chunked": (True, True), "separate": (False, False)}
    # TensorRT-LLM 0.14's Triton runs: the engine's own reading and the scheduler preset the simulation takes agree
    preset = policy_for(case_of(RECORDS[f"{SERIES}_qps2"]).engine)
    own = from_engine(load_engine("trtllm").with_(prefill="whole"))
    assert (preset.name, preset.mixed, preset.chunked) == ("trtllm", own.mixed, own.chunked)
