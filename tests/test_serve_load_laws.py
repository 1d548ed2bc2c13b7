"""The request-level simulator's own laws on seeded random draws (engines x their schedulers x models x GPUs x
batch limits x length distributions x rates), not on chosen cases: each test says how many draws it makes.

- The low-rate limit: a request alone on an idle instance has serve's static TTFT and TPOT at batch 1, exactly.
- A higher rate (the same requests, their arrivals compressed) never lowers a TTFT percentile by more than one
  iteration where no request is preempted: a request that arrives just after an iteration starts waits it out, one
  that arrives before does not, so its TTFT can move by up to one iteration's length either way whatever the load
  (the granularity of iteration-level scheduling, Orca §4.2). TPOT and E2E percentiles are not held to it: a batch's
  step grows less than its size, so compressing a finite set of requests lets a long one finish alone, sooner
  (docs/SERVING_LOAD.md, "Laws").
- The means too, under a mixed scheduler (decodes ride in every iteration beside the prompts: TensorRT-LLM's in-flight
  batching, vLLM V1) and requests of one length (TensorRT-LLM 0.14's online serving runs, trtllm014srv_*): a higher
  rate never lowers the mean TTFT by more than one iteration, nor the mean ITL by more than one iteration per
  request's decode span (the same granularity: with fixed lengths the mean ITL is the mean decode span over O − 1).
  A prefill-first scheduler (vLLM V0, SGLang, TurboMind) is not held to it: at a higher rate one prompt-only
  iteration carries several prompts, so the decodes stall fewer times a token (vLLM V0, Llama 3 8B on an A100,
  64 sequences, 2,291 / 290 tokens: mean ITL 51.2 ms at 0.56 of its capacity, 43.6 ms at 0.85).
- Throughput never beyond saturation: no run makes more output tokens/s than max_d d·E / price(d) (bound.py).
- KV capacity: a scheduler that reserves a request's whole footprint (TensorRT-LLM's GUARANTEED_NO_EVICT, TurboMind)
  never preempts; one whose cache holds every request at once never preempts either. Between those, preempting the
  newest on demand is Bélády's anomaly's kind of policy (more room can mean more preemptions), so no monotone law
  is claimed there.
- Little's law: the time-average of the requests in the system (the simulator's own counts, per iteration, and the
  part of an iteration a request arrived during) equals the completion rate times their mean time in it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from meshplan.serve.engine import load_engine
from meshplan.serve.estimate import serve_estimate
from meshplan.serve.load import arrivals
from meshplan.serve.load.bound import saturation
from meshplan.serve.load.lengths import Lengths
from meshplan.serve.load.run import Choices, load_instance
from meshplan.serve.load.simulate import simulate_instance
from meshplan.serve.load.summary import summarise
from meshplan.serve.plan import ServePlan, Workload
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

SYSTEMS = (("llama3-8b", "a100", 1), ("llama3-8b", "h100", 1), ("llama3-70b", "h100", 4), ("mixtral-8x7b", "h100", 2),
           ("llama2-7b", "l40s", 1), ("llama3-70b", "h200", 2))
ENGINES = ("vllm", "vllm-v0", "sglang", "trtllm", "lmdeploy", "trtllm-pytorch")
SCHEDULERS = (None, None, None, "trtllm-max-utilization", "vllm-v0-chunked", "sglang-mixed", "trtllm-chunked")
LONGEST = 6000  # contexts the price grids cover (prompt + output of any draw)
REQUESTS = 100  # per simulated run


class Draws:
    """Seeded random configurations, their instances built once (a price grid each) and shared by the draws."""

    def __init__(self) -> None:
        self.built: dict[tuple, tuple] = {}

    def instance(self, rng: np.random.Generator):
        system = SYSTEMS[int(rng.integers(len(SYSTEMS)))]
        engine = ENGINES[int(rng.integers(len(ENGINES)))]
        policy = SCHEDULERS[int(rng.integers(len(SCHEDULERS)))]
        batch = int(rng.choice([16, 64, 256]))
        key = (system, engine, policy, batch)
        if key not in self.built:
            model, cluster = load_model(system[0]), load_system(system[1]).cluster(system[2])
            e = load_engine(engine)
            plan = ServePlan(tp=system[2], batch=min(batch, e.max_seqs))
            self.built[key] = load_instance(model, cluster, plan, e, LONGEST, Choices(scheduler=policy))
        return key, self.built[key]

    @staticmethod
    def requests(rng: np.random.Generator, count: int = REQUESTS):
        kind = str(rng.choice(["fixed", "uniform", "sharegpt"]))
        inp, out = int(rng.integers(50, 3000)), int(rng.integers(10, 1000))
        lengths = Lengths("sharegpt") if kind == "sharegpt" else Lengths(kind, inp, out, 0.5)
        return arrivals.poisson(1.0, count, lengths, int(rng.integers(1 << 30)))

    @staticmethod
    def capacity(sched, price, reqs) -> float:
        """Requests/s the instance roughly serves at its batch limit (to spread the draws' rates around it)."""
        out = max(float(np.mean(reqs.output_len)), 1.0)
        return sched.max_seqs / (price(sched.max_seqs, 0, float(np.mean(reqs.input_len))) * out)


@pytest.fixture(scope="module")
def draws() -> Draws:
    return Draws()


def at_rate(reqs, rate: float):
    return dataclasses.replace(reqs, arrival=reqs.arrival / rate)


def test_low_rate_limit_is_serves_static_ttft_and_tpot(draws):
    """60 draws: one request on an idle instance (its own arrival, nobody else) has serve's static TTFT and TPOT at
    batch 1 (metrics.py: a lone sequence finds the engine idle; its TPOT meets no other prompt): the TTFT to 1e-6."""
    rng = np.random.default_rng(81)
    for _ in range(60):
        (system, engine, policy, _), (sched, price) = draws.instance(rng)
        if policy is not None:
            continue
        inp, out = int(rng.integers(16, 4000)), int(rng.integers(2, 1500))
        model, cluster = load_model(system[0]), load_system(system[1]).cluster(system[2])
        e = load_engine(engine)
        static = serve_estimate(model, cluster, ServePlan(tp=system[2], batch=1), Workload(input_len=inp,
                                                                                           output_len=out), e)
        one = simulate_instance(arrivals.Requests(np.zeros(1), np.array([inp]), np.array([out])), sched, price)
        ttft, tpot = one.first[0], (one.done[0] - one.first[0]) / (out - 1)
        # TurboMind's first token comes from a decode step: serve prices it at the mean context I + O/2, the
        # simulation at the context it runs at, I (a few microseconds apart)
        assert ttft == pytest.approx(static.metrics.ttft, rel=1e-3 if sched.last_token_decoded else 1e-6), \
            (system, engine, inp, out)
        # the static TPOT is the step at the mean context; the simulation's mean of the steps at each context is the
        # same where the price is linear in the context between the grid's points (it is, prices.py)
        assert tpot == pytest.approx(static.metrics.tpot, rel=2e-3), (system, engine, inp, out)


def test_a_higher_rate_never_lowers_a_ttft_percentile(draws):
    """300 draws, each the same requests at a rate r (0.1 to 4 times the instance's capacity) and at r·f (f from 1.1
    to 2.5): where neither run preempts, every TTFT percentile (p50, p90, p95, p99) at r·f is at least r's less one
    iteration (the longest of the two runs: module docstring). Where the cache runs out the law is not the engines':
    vLLM puts a preempted request back at the head of the queue, ahead of new arrivals, and its recompute does not
    count in its TTFT (its first token was streamed), so a faster arrival, admitted before the cache filled, can
    get its first token sooner (vLLM V0, Llama 2 7B on an L40S, 120 requests thrashing a 54k-token cache: TTFT p90
    36.4 s at 4.35 requests/s, 0.09 s at 10.1)."""
    rng = np.random.default_rng(810)
    broken, compared = [], 0
    for _ in range(300):
        key, (sched, price) = draws.instance(rng)
        reqs = draws.requests(rng)
        rate = draws.capacity(sched, price, reqs) * float(np.exp(rng.uniform(np.log(0.1), np.log(4))))
        factor = float(rng.uniform(1.1, 2.5))
        low, high = (simulate_instance(at_rate(reqs, r), sched, price) for r in (rate, rate * factor))
        if low.preemptions or high.preemptions:
            continue
        compared += 1
        slack = max(low.longest, high.longest)
        a, b = summarise([low]).ttft, summarise([high]).ttft
        broken += [(key, p, a[p], b[p], slack) for p in a if b[p] < a[p] - slack - 1e-12]
    assert not broken, broken[:3]
    assert compared > 180  # most draws compared (not the chosen few)


def test_throughput_never_beyond_saturation(draws):
    """200 draws at 0.3 to 8 times the capacity and all at once: output tokens/s at most the instance's saturation
    (bound.saturation at the shortest context a request decodes at)."""
    rng = np.random.default_rng(811)
    for _ in range(200):
        key, (sched, price) = draws.instance(rng)
        reqs = draws.requests(rng)
        rate = draws.capacity(sched, price, reqs) * float(np.exp(rng.uniform(np.log(0.3), np.log(8))))
        top = saturation(sched, price, float(reqs.input_len.min()))
        for load in (at_rate(reqs, rate), dataclasses.replace(reqs, arrival=np.zeros(len(reqs)))):
            result = summarise([simulate_instance(load, sched, price)])
            assert result.output_tokens_per_s <= top * (1 + 1e-9), (key, result.output_tokens_per_s, top)


def test_reserving_schedulers_and_a_cache_that_holds_everyone_never_preempt(draws):
    """300 draws: a scheduler that reserves each request's whole footprint never preempts; nor does any scheduler
    whose cache holds every request's prompt and output at once (with a page of rounding each)."""
    rng = np.random.default_rng(812)
    for _ in range(300):
        key, (sched, price) = draws.instance(rng)
        reqs = draws.requests(rng)
        rate = draws.capacity(sched, price, reqs) * float(np.exp(rng.uniform(np.log(0.3), np.log(4))))
        load = at_rate(reqs, rate)
        if sched.policy.admission == "reserve":
            assert simulate_instance(load, sched, price).preemptions == 0, key
        everyone = int(np.sum(reqs.input_len + reqs.output_len) + len(reqs) * 2 * sched.block_size)
        roomy = dataclasses.replace(sched, kv_tokens=max(everyone, sched.kv_tokens))
        assert simulate_instance(load, roomy, price).preemptions == 0, key


def test_littles_law(draws):
    """300 draws from idle to overloaded: L = λW to 1e-6 (the time-average of the requests in the system, as the
    simulation holds them per iteration plus the part of an iteration each arrived during, against the completion
    rate times the mean time in the system: two bookkeepings of the same queue)."""
    rng = np.random.default_rng(813)
    for _ in range(300):
        key, (sched, price) = draws.instance(rng)
        reqs = draws.requests(rng)
        rate = draws.capacity(sched, price, reqs) * float(np.exp(rng.uniform(np.log(0.05), np.log(4))))
        result = summarise([simulate_instance(at_rate(reqs, rate), sched, price)])
        assert result.refused == 0
        assert result.in_system == pytest.approx(result.little, rel=1e-6), key


def test_a_higher_rate_never_shortens_the_mean_ttft_or_itl_of_a_mixed_scheduler(draws):
    """400 draws of 100 requests of one length, each at a rate r (0.02 to 4 times the instance's capacity over f) and
    at r·f (f from 1.1 to 2.5), the mixed schedulers' only (module docstring): where neither run preempts, the mean
    TTFT at r·f is at least r's less one iteration and the mean ITL at least r's less one iteration over O − 1 (the
    longest of the two runs' iterations)."""
    rng = np.random.default_rng(814)
    broken, compared = [], 0
    for _ in range(400):
        key, (sched, price) = draws.instance(rng)
        inp, out = int(rng.integers(50, 3000)), int(rng.integers(10, 1000))
        reqs = arrivals.poisson(1.0, REQUESTS, Lengths("fixed", inp, out), int(rng.integers(1 << 30)))
        rate = draws.capacity(sched, price, reqs) * float(np.exp(rng.uniform(np.log(0.02), np.log(4))))
        factor = float(rng.uniform(1.1, 2.5))
        if not sched.policy.mixed:
            continue
        low, high = (simulate_instance(at_rate(reqs, r), sched, price) for r in (rate / factor, rate))
        if low.preemptions or high.preemptions:
            continue
        compared += 1
        slack = max(low.longest, high.longest)
        a, b = summarise([low]).mean, summarise([high]).mean
        if b["ttft"] < a["ttft"] - slack - 1e-12 or b["itl"] < a["itl"] - slack / (out - 1) - 1e-12:
            broken.append((key, inp, out, rate, a, b, slack))
    assert not broken, broken[:3]
    assert compared > 250  # the mixed draws: about 4 in 5 (3 of the 6 engines' own schedulers are prefill-first)
