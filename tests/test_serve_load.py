"""The request-level simulator (meshplan/serve/load/): its steady-state limit is serve's steady state, its prices
are serve's, and it behaves as a queue must (rate, KV capacity, Little's law)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from meshplan.errors import SpecError
from meshplan.serve.engine import load_engine
from meshplan.serve.estimate import serve_estimate
from meshplan.serve.load import arrivals, lengths
from meshplan.serve.load.arrivals import Requests
from meshplan.serve.load.prices import prices
from meshplan.serve.load.run import load_run
from meshplan.serve.load.scheduler import scheduler
from meshplan.serve.load.simulate import simulate_instance
from meshplan.serve.load.summary import summarise
from meshplan.serve.metrics import Setting
from meshplan.serve.plan import ServePlan, Workload
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

MODEL = load_model("llama3-8b")
H100 = load_system("h100").cluster(1)


def staggered(batch: int, inp: int, out: int, rounds: int = 12) -> Requests:
    """A closed loop of ``batch`` clients started in steady state: client i's first request stops after
    ⌈O·(i + 1)/B⌉ tokens, so one sequence in every O/B iterations finishes and is replaced, as in serve's steady
    state (metrics.py: B/O prompts enter per iteration)."""
    n = rounds * batch
    output = np.full(n, out)
    output[:batch] = np.ceil(out * (np.arange(batch) + 1) / batch)
    return Requests(np.zeros(n), np.full(n, inp), output, batch)


STEADY = [(engine, *case) for engine in ("vllm", "trtllm", "vllm-v0")
          for case in ((16, 1000, 200), (64, 1000, 200), (256, 200, 1000))]
STEADY += [("lmdeploy", 16, 1000, 200), ("lmdeploy", 128, 512, 512)]  # its max_seqs is 128


@pytest.mark.parametrize("engine,batch,inp,out", STEADY)
def test_steady_state_limit_is_serve(engine, batch, inp, out):
    """Fixed concurrency B = serve's batch, equal lengths: the simulated mean TPOT and output tokens/s after two
    rounds of warm-up equal serve's within 5 % and 8 %, for chunked prefill (vllm, trtllm with its full KV
    reservation) and prompts in iterations of their own (vllm-v0, lmdeploy). Serve prices an iteration that carries a
    prompt chunk at B decodes plus the chunk; the simulation at B − 1 (the newcomer decodes only once prefilled), and
    its throughput counts whole requests in the window, so it runs a few per cent faster (vllm, B = 64,
    I/O = 1000/200: TPOT 15.95 ms serve vs 15.42 ms simulated, −3.4 %; 4,013 vs 4,246 tokens/s, +5.8 %)."""
    e = load_engine(engine)
    plan = ServePlan(batch=batch)
    est = serve_estimate(MODEL, H100, plan, Workload(input_len=inp, output_len=out), e)
    assert est.fits
    reqs = staggered(batch, inp, out)
    run = simulate_instance(reqs, scheduler(MODEL, H100, plan, e), prices(MODEL, H100, plan, e, inp + out))
    later = slice(2 * batch, None)
    tpot = float(np.mean((run.done - run.first)[later] / (out - 1)))
    start = run.done[2 * batch - 1]
    tokens = float(np.sum((run.done > start) * reqs.output_len))
    throughput = tokens / (run.done.max() - start)
    assert run.preemptions == 0
    assert tpot == pytest.approx(est.metrics.tpot, rel=0.05)
    assert throughput == pytest.approx(est.metrics.tokens_per_s, rel=0.08)


def test_prices_are_serves_iteration_times():
    """On the grid's points the price is Setting.time itself; between them within 2 % (linear interpolation of a
    nearly piecewise-linear roofline: the plain one is linear in the context between the grid's contexts, the
    ridge's p-norm, roofline.work_time, bends it by under 1e-6 here): 100 decodes of 1,100-token contexts beside a
    700-token chunk."""
    e = load_engine("vllm")
    plan = ServePlan(batch=256)
    price = prices(MODEL, H100, plan, e, 4096)
    cols = {"tp": 1, "pp": 1, "dpa": 1, "ep": 1, "batch": 256, "replicas": 1, "prefill_replicas": 0}
    s = Setting(MODEL, H100, cols, plan.quant, e, Workload(input_len=1000, output_len=200))  # context 1,100
    assert price(256, 0, 1100) == pytest.approx(s.time(256), rel=1e-6)  # 256 is a grid point, 1100 between
    assert price(100, 700, 1100) == pytest.approx(s.time(100, 700, 1.0, 0.0), rel=0.02)
    assert price(37, 0, 1100) == pytest.approx(s.time(37), rel=0.02)


def _percentiles(rate: float, kv_tokens: int | None = None):
    e = load_engine("vllm")
    plan = ServePlan(batch=256)
    reqs = arrivals.poisson(rate, 1500, lengths.Lengths("sharegpt"), seed=3)
    sched = scheduler(MODEL, H100, plan, e)
    if kv_tokens:
        sched = dataclasses.replace(sched, kv_tokens=kv_tokens)
    run = simulate_instance(reqs, sched, prices(MODEL, H100, plan, e, 2048))
    return summarise([run]), run


def test_higher_rate_never_lowers_latency_percentiles():
    """The same requests (one seed: the gaps scale as 1/rate) at 5, 10, 20, 40 and 80 requests/s: every percentile
    of TTFT, TPOT and E2E is at least the lower rate's; the p99 TTFT at least 99 % of it. That p99 is the 15th longest
    of 1,500, set at light load by where a long prompt lands in the iteration running when it arrives, which moves
    with the gaps: one of 639 tokens waits 43.1 ms at 5 requests/s and 41.3 ms at 10 (a fraction of a step)."""
    results = [_percentiles(rate)[0] for rate in (5, 10, 20, 40, 80)]
    for low, high in zip(results, results[1:], strict=False):
        for name in ("ttft", "tpot", "e2e"):
            for p, value in getattr(low, name).items():
                slack = 0.01 if (name, p) == ("ttft", 99) else 1e-9
                assert getattr(high, name)[p] >= value * (1 - slack), (name, p)
    assert results[-1].tpot[99] > results[0].tpot[99]  # it can fail: a loaded engine decodes slower


def test_more_kv_capacity_never_raises_preemptions():
    """A KV cache of 20k to 160k tokens under 60 requests/s of ShareGPT lengths: preemptions fall (or stay) as it
    grows, and a small one does preempt (the property is not vacuous); every request still completes."""
    counts = []
    for kv in (20_000, 40_000, 80_000, 160_000):
        result, run = _percentiles(60, kv)
        counts.append(result.preemptions)
        assert result.completed == 1500 and np.all(run.done >= run.first) and np.all(run.first >= run.arrival)
    assert counts == sorted(counts, reverse=True)
    assert counts[0] > 0


def test_littles_law():
    """L = λW on the simulated queue: the time-average of the requests in the system (running + waiting, as the
    simulation holds them, per iteration) equals the completion rate times the mean time in the system, within
    3 % (the average samples the count at each iteration's start)."""
    result, _ = _percentiles(40)
    assert result.in_system == pytest.approx(result.little, rel=0.03)
    assert result.in_system > 10  # a loaded queue, not an idle one


def test_load_run_over_replicas_and_goodput():
    """Two replicas share 40 requests/s round-robin: all complete; goodput under a TTFT target no looser than any
    request's is the request rate, under one tighter than the p50 at most half of it."""
    reqs = arrivals.poisson(40, 2000, lengths.Lengths("sharegpt"), seed=1)
    plan = ServePlan(batch=256, replicas=2)
    loose = load_run(MODEL, load_system("h100").cluster(2), plan, reqs, slo=(3600.0, 0.0))
    assert loose.completed == 2000 and loose.goodput == pytest.approx(loose.requests_per_s)
    tight = load_run(MODEL, load_system("h100").cluster(2), plan, reqs, slo=(loose.ttft[50] * 0.999, 0.0))
    assert tight.goodput <= 0.5 * tight.requests_per_s


def test_lengths_and_trace_files(tmp_path):
    """The length kinds and a trace file; bad ones are refused with the field named."""
    rng = np.random.default_rng(0)
    inp, out = lengths.parse_lengths("uniform:0.5", 1000, 100).sample(10_000, rng)
    assert inp.min() >= 500 and inp.max() <= 1500 and out.min() >= 50 and out.max() <= 150
    inp, out = lengths.parse_lengths("sharegpt", 1, 1).sample(20_000, rng)
    assert inp.max() <= 1024 and (inp + out).max() <= 2048 and min(inp.min(), out.min()) >= 4
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 2.0, "input_len": 10, "output_len": 5}\n'
                     '{"arrival_s": 1.0, "input_len": 20, "output_len": 7}\n')
    reqs = arrivals.trace(str(trace))
    assert list(reqs.arrival) == [0.0, 1.0] and list(reqs.input_len) == [20, 10]
    pairs = tmp_path / "p.csv"
    pairs.write_text("input_len,output_len\n100,10\n300,30\n")
    assert lengths.parse_lengths(str(pairs), 1, 1).mean == (200.0, 20.0)
    pairs.write_text("input_len,output_len\n100,0\n")
    with pytest.raises(SpecError, match="output_len must be whole numbers >= 1"):
        lengths.parse_lengths(str(pairs), 1, 1)
    with pytest.raises(SpecError, match="lengths='zipf' must be"):
        lengths.parse_lengths("zipf", 1, 1)


def test_prefix_hits_shorten_the_first_token():
    """Half of every 2,000-token prompt in the prefix cache (whole 16-token blocks: 992 tokens; vLLM's
    block-aligned hits) at 4 requests/s: the mean TTFT falls, and by at most the prompt share saved (the decodes
    beside the chunk and the host's time are not saved)."""
    e = load_engine("vllm")
    reqs = arrivals.poisson(4, 300, lengths.Lengths("fixed", 2000, 100), seed=2)
    plan = ServePlan(batch=256)
    cold = load_run(MODEL, H100, plan, reqs, e)
    warm = load_run(MODEL, H100, plan, reqs, e, prefix_hit=0.5)
    assert scheduler(MODEL, H100, plan, e, 0.5).cached(2000) == 992
    assert warm.mean["ttft"] < cold.mean["ttft"]
    assert warm.mean["ttft"] > cold.mean["ttft"] * (1 - 992 / 2000) * 0.9


def test_a_plan_that_breaks_a_constraint_or_cannot_hold_a_request():
    """A plan serve refuses is refused here too, with its reason; a request longer than the whole KV cache is
    refused (counted, not simulated), and with none completed the latencies are None in the JSON, not NaN."""
    reqs = arrivals.poisson(1, 5, lengths.Lengths("fixed", 100, 10))
    with pytest.raises(SpecError, match="tp does not divide the attention heads"):
        load_run(MODEL, load_system("h100").cluster(8), ServePlan(tp=3, batch=16), reqs)
    plan = ServePlan(batch=16)
    sched = dataclasses.replace(scheduler(MODEL, H100, plan, load_engine("vllm")), kv_tokens=50)
    run = simulate_instance(reqs, sched, prices(MODEL, H100, plan, load_engine("vllm"), 128))
    result = summarise([run])
    assert run.refused == 5 and result.completed == 0
    assert result.to_dict()["ttft_p99_s"] is None and result.to_dict()["tpot_mean_s"] is None


def test_fewest_replicas_is_the_fewest():
    """Llama 3 8B on H100s at 60 ShareGPT requests/s under p99 targets of 300 ms TTFT and 20 ms TPOT: ``fewest``
    finds n replicas that meet them, and n − 1 do not (the bisection's answer is the least, not just one that
    passes)."""
    from meshplan.serve.load.under_load import Targets, fewest

    e = load_engine("vllm")
    cluster = load_system("h100").cluster(8)
    reqs = arrivals.poisson(60, 1500, lengths.Lengths("sharegpt"), seed=5)
    targets = Targets(ttft=0.3, tpot=0.02)
    one = ServePlan(batch=256)
    steady = serve_estimate(MODEL, cluster, one, Workload(input_len=161, output_len=338), e)
    found = fewest(MODEL, cluster, (one, float(steady.metrics.instance_tokens_per_s)), reqs, e, targets)
    assert found is not None and found.meets
    n = found.plan.replicas
    assert n > 1
    fewer = load_run(MODEL, cluster, one.with_(replicas=n - 1), reqs, e)
    assert not targets.met(fewer, len(reqs))


def test_speculative_decoding_trades_draft_work_for_tokens_per_step():
    """Llama 3 8B on an H200 at 2 requests/s of 1,000 / 200 tokens with MTP drafts (speculation.py): E = (1 − α^(k+1))
    / (1 − α) tokens a step (k = 3, α = 0.7: (1 − 0.2401) / 0.3 = 2.533); the median TPOT falls, by less than E
    (the draft's k steps and the verified rows cost time); at α = 0 nothing is accepted and it is slower than
    without; the draft's weights and KV cache leave room for fewer tokens."""
    from meshplan.serve.load.speculation import parse_speculation

    e, cluster = load_engine("vllm"), load_system("h200").cluster(1)
    reqs = arrivals.poisson(2, 200, lengths.Lengths("fixed", 1000, 200))
    plan = ServePlan(batch=256)
    plain = load_run(MODEL, cluster, plan, reqs, e)
    good, none = parse_speculation("3:0.7", MODEL), parse_speculation("3:0", MODEL)
    assert good.per_step == pytest.approx(2.533, abs=1e-3) and none.per_step == 1.0
    fast = load_run(MODEL, cluster, plan, reqs, e, spec=good)
    slow = load_run(MODEL, cluster, plan, reqs, e, spec=none)
    assert plain.tpot[50] / good.per_step < fast.tpot[50] < plain.tpot[50] < slow.tpot[50]
    assert fast.completed == slow.completed == 200
    assert scheduler(MODEL, cluster, plan, e, 0.0, good).kv_tokens < scheduler(MODEL, cluster, plan, e).kv_tokens


def test_deepseek_v3_mtp_speedup_near_the_published():
    """DeepSeek-V3's own MTP (one draft token, "acceptance rate ... between 85% and 90%", "1.8 times TPS":
    DeepSeek-V3 technical report §5.4.3): at α = 0.85, E = 1.85 tokens a step; on 8 H200s in fp8 at a light load the
    simulated median TPOT falls 1.3-1.85x (1.55x when written: the MTP layer and the verified rows cost ~19 % of a
    step)."""
    from meshplan.serve.load.speculation import parse_speculation
    from meshplan.serve.precision import Quant

    model = load_model("deepseek-v3")
    cluster, e = load_system("h200").cluster(8), load_engine("sglang")
    plan = ServePlan(tp=8, ep=8, batch=64, quant=Quant(weights="fp8", activations="fp8"))
    reqs = arrivals.poisson(1, 100, lengths.Lengths("fixed", 1000, 200))
    spec = parse_speculation("1:0.85", model)
    assert spec.per_step == pytest.approx(1.85) and spec.draft.block_counts == {"moe": 1}
    speedup = load_run(model, cluster, plan, reqs, e).tpot[50] / load_run(model, cluster, plan, reqs, e,
                                                                           spec=spec).tpot[50]
    assert 1.3 < speedup < 1.85


def test_disaggregated_pools_keep_prompts_out_of_the_decodes():
    """Two H100s serving Llama 3 8B at 8 requests/s of 4,000-token prompts and 200-token outputs: co-located (x2),
    each decode step shares iterations with prompt chunks; split 1 prefill + 1 decode instance (DistServe), the decode
    instance only decodes: its p99 TPOT is lower (8.6 vs 19.5 ms when written), while the one prefill instance
    queues the prompts, so TTFT is higher; every TTFT includes the prompt's KV-cache transfer."""
    from meshplan.serve.load.disagg import transfer_times

    cluster, e = load_system("h100").cluster(2), load_engine("vllm")
    reqs = arrivals.poisson(8, 600, lengths.Lengths("fixed", 4000, 200), seed=1)
    co = load_run(MODEL, cluster, ServePlan(batch=256, replicas=2), reqs, e)
    split_plan = ServePlan(batch=256, replicas=1, prefill_replicas=1)
    split = load_run(MODEL, cluster, split_plan, reqs, e)
    assert co.completed == split.completed == 600
    assert split.tpot[99] < co.tpot[99] and split.ttft[50] > co.ttft[50]
    moved = transfer_times(MODEL, cluster, split_plan, e, np.array([4000]))[0]
    assert 0 < moved < split.ttft[50]  # 4,000 tokens x 128 KiB each over NVLink: about a millisecond
    with pytest.raises(SpecError, match="more GPUs than the cluster has"):
        load_run(MODEL, load_system("h100").cluster(1), split_plan, reqs, e)


def test_the_benchmark_tools_samplers():
    """SGLang's random dataset draws I from [⌊r·I⌋, I] (r = 0.5, I = 1,000: 500 to 1,000, mean 750); GenAI-Perf's
    synthetic lengths are normals of the given spread rounded up (mean 1,000.5, spread 100, within 1 %); SGLang's
    ShareGPT filter keeps prompts beyond 1,024 tokens that vLLM's drops; bad forms are one line naming the field."""
    rng = np.random.default_rng(0)
    inp, out = lengths.parse_lengths("sglang-random:0.5", 1000, 200).sample(20_000, rng)
    assert inp.min() == 500 and inp.max() == 1000 and abs(inp.mean() - 750) < 5 and out.min() == 100
    inp, out = lengths.parse_lengths("synthetic:100:20", 1000, 200).sample(20_000, rng)
    assert inp.mean() == pytest.approx(1000.5, rel=0.01) and inp.std() == pytest.approx(100, rel=0.03)
    assert out.std() == pytest.approx(20, rel=0.05)
    inp, _ = lengths.parse_lengths("sharegpt-sglang", 1, 1).sample(20_000, rng)
    assert inp.max() > 1024 and inp.min() >= 2
    for bad in ("synthetic:-1", "synthetic:a", "sglang-random:2", "uniform:1"):
        with pytest.raises(SpecError, match="lengths="):
            lengths.parse_lengths(bad, 1000, 200)


def test_a_burst_sends_every_request_at_once():
    """--rate inf: benchmark_serving's ``--request-rate inf``, every arrival at 0."""
    reqs = arrivals.poisson(np.inf, 50, lengths.Lengths("fixed", 100, 10))
    assert len(reqs) == 50 and not reqs.arrival.any()
