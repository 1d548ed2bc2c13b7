"""Physics where nature is monotone, for serving, over seeded random (model, system, plan, workload, engine) draws:
more HBM bandwidth never slows a decode step or TPOT, more FLOP/s never slows a prefill, more bandwidth on any mesh
tier never slows a step and more latency never speeds one up; every figure is finite and none negative. Over the
whole estimate, every rate (FLOP/s, HBM and L2 bandwidth, each tier's bandwidth, the measured all-reduce kernel's
bandwidth) scaled up never lowers the throughput nor raises TTFT or TPOT, and every latency (each tier's, the
kernel's, the engine's host time per iteration, per sequence and per eager layer, its time per iteration no host
speed sets, the GPU's idle time between kernels, the host's interpreter time) scaled up never helps, and a faster
untuned GEMM (vLLM's ROCm build of 2024) never slows; every preset given host time: more of it never raises the
throughput, and its overlapping twin (the host scheduling the next iteration during this one) is never slower than
the twin that waits; more sequences in a decode step never make it shorter, on every engine preset."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from functools import cache

import pytest

from meshplan.serve.check import FORMAT, PROMPT, servable
from meshplan.serve.engine import engine_names, load_engine
from meshplan.serve.estimate import plan_columns, serve_estimate
from meshplan.serve.metrics import Setting
from meshplan.serve.plan import ServePlan, Workload
from meshplan.serve.space import QUANTS
from meshplan.specs.hardware import Cluster, load_system, system_names
from meshplan.specs.model_load import load_model, preset_names

DRAWS = 120
FACTORS = (1.1, 2.0, 10.0)
RTOL = 1e-9


def servable_models() -> list[str]:
    out = []
    for name in sorted(preset_names()):
        try:
            servable(load_model(name))
        except Exception:  # noqa: BLE001  (hybrid and latent-MoE presets are refused for serving)
            continue
        out.append(name)
    return out


def draw(rng: random.Random):
    model = load_model(rng.choice(servable_models()))
    system = load_system(rng.choice(sorted(system_names())))
    tp = rng.choice([t for t in (1, 2, 4, 8) if model.num_heads % t == 0])
    pp = rng.choice((1, 1, 2))
    dpa = rng.choice((1, 2)) if model.is_moe else 1
    ep = tp * dpa if model.is_moe and (dpa > 1 or rng.random() < 0.5) else 1
    batch = rng.choice((1, 2, 8, 32, 128, 512)) * pp * dpa
    cluster = system.cluster(tp * pp * dpa * 2)
    plan = ServePlan(tp=tp, pp=pp, dpa=dpa, ep=ep, batch=batch, replicas=rng.choice((1, 2)),
                     quant=rng.choice(QUANTS))
    plan = plan.with_(prefill_replicas=2 - plan.replicas)
    workload = Workload(input_len=rng.choice((1, 128, 1000, 4096, 20000)), output_len=rng.choice((1, 16, 256, 2048)),
                        static=rng.random() < 0.2)
    return model, cluster, plan, workload, load_engine(rng.choice(engine_names()))


@cache
def drawn() -> tuple:
    """DRAWS draws, each with its serve estimate as drawn: every property below compares its variants with that one,
    so it is made once per process (serve_estimate is a pure function of its frozen arguments)."""
    rng = random.Random(39)
    out = []
    while len(out) < DRAWS:
        d = draw(rng)
        e = serve_estimate(*d)
        if FORMAT not in e.reasons and not any(PROMPT in r for r in e.reasons):  # a format the engine lacks, a prompt
            out.append((d, e))  # it refuses (serve/check.PROMPT)
    return tuple(out)


@cache
def draws() -> list:
    return [d for d, _ in drawn()]


def steps(model, cluster: Cluster, plan: ServePlan, workload: Workload, engine) -> tuple[float, float]:
    """A pure decode step at the batch and a prefill of the batch's prompts (one lane)."""
    s = Setting(model, cluster, plan_columns(plan), plan.quant, engine, workload)
    b = s.micro_batch
    return float(s.time(b)), float(s.time(0.0, b * workload.input_len, b, 0.0))


def scaled(cluster: Cluster, what: str, factor: float) -> Cluster:
    acc = cluster.accelerator
    fields = {"l2_cache": "l2_bandwidth", "kernel_bw": "allreduce_bandwidth", "kernel_lat": "allreduce_latency"}
    if what in fields:
        return replace(cluster, accelerator=replace(acc, **{fields[what]: getattr(acc, fields[what]) * factor}))
    if what == "hbm":
        return replace(cluster, accelerator=replace(acc, hbm_bandwidth=acc.hbm_bandwidth * factor))
    if what == "flops":
        return replace(cluster, accelerator=replace(acc, peak_flops={k: v * factor for k, v in acc.peak_flops.items()}))
    i, kind = int(what[-1]), what[:-1]
    tiers = list(cluster.tiers)
    change = {"bandwidth": tiers[i].bandwidth * factor} if kind == "tier" else {"latency": tiers[i].latency * factor}
    tiers[i] = replace(tiers[i], **change)
    return replace(cluster, tiers=tuple(tiers))


@cache
def drawn_steps(i: int) -> tuple[float, float]:
    """``steps`` of draw ``i`` as drawn: the rate and link properties compare each variant with it at every factor,
    so it is computed once per process (the serving model is a pure function of its frozen arguments)."""
    return steps(*draws()[i])


@pytest.mark.parametrize("factor", FACTORS)
def test_more_hbm_bandwidth_never_slows_decode(factor):
    for i, (model, cluster, plan, workload, engine) in enumerate(draws()):
        base = drawn_steps(i)[0]
        faster = steps(model, scaled(cluster, "hbm", factor), plan, workload, engine)[0]
        assert faster <= base * (1 + RTOL), (model.name, cluster.name, plan.describe())
        if i >= 40:  # the whole estimate (TPOT with its prefill share) on the first 40
            continue
        tpot = metrics(drawn()[i][1])[2]
        assert serve_estimate(model, scaled(cluster, "hbm", factor), plan, workload,
                              engine).metrics.tpot <= tpot * (1 + RTOL)


@pytest.mark.parametrize("factor", FACTORS)
def test_more_flops_never_slows_prefill(factor):
    for i, (model, cluster, plan, workload, engine) in enumerate(draws()):
        base = drawn_steps(i)[1]
        assert steps(model, scaled(cluster, "flops", factor), plan, workload, engine)[1] <= base * (1 + RTOL)


@pytest.mark.parametrize("what", ["tier0", "tier1"])
def test_more_link_bandwidth_never_slows_and_more_latency_never_speeds(what):
    for i, (model, cluster, plan, workload, engine) in enumerate(draws()[:60]):
        base = drawn_steps(i)
        wider = steps(model, scaled(cluster, what, 2.0), plan, workload, engine)
        slower = steps(model, scaled(cluster, what.replace("tier", "lat"), 10.0), plan, workload, engine)
        assert all(w <= b * (1 + RTOL) for w, b in zip(wider, base, strict=True))
        assert all(s >= b * (1 - RTOL) for s, b in zip(slower, base, strict=True))


def test_every_figure_is_finite_and_none_negative():
    for d, e in drawn():
        values = {k: v for k, v in e.to_dict().items() if isinstance(v, float)}
        values |= {f"memory.{k}": v for k, v in e.to_dict()["memory"].items()}
        values |= {f"step.{k}": v for k, v in e.breakdown.items()}
        assert all(math.isfinite(v) and v >= 0 for v in values.values()), (d[0].name, d[2].describe(), values)
        assert e.metrics.ttft <= e.metrics.e2e * (1 + RTOL)


RATES = ("flops", "hbm", "l2_cache", "kernel_bw", "tier0", "tier1", "tier2")  # a tier the cluster lacks is skipped
HOST = ("iteration_overhead", "sequence_overhead", "hidden_sequence_overhead", "eager_layer_overhead",
        "eager_layer_tp_overhead", "iteration_latency", "kernel_gap", "tp_broadcast_poll")
LATENCIES = ("lat0", "lat1", "lat2", "kernel_lat", "interpreter", *HOST)


def metrics(e) -> tuple[float, float, float]:
    m = e.metrics
    return float(m.tokens_per_s), float(m.ttft), float(m.tpot)


def estimate_metrics(model, cluster, plan, workload, engine) -> tuple[float, float, float]:
    return metrics(serve_estimate(model, cluster, plan, workload, engine))


def varied(d, what: str, factor: float):
    """The draw with one rate or latency scaled, or None where it has none of it (a tier it lacks, no L2 rate, no
    measured all-reduce kernel, an engine without host time)."""
    model, cluster, plan, workload, engine = d
    if what in HOST:
        if not getattr(engine, what):
            return None
        return model, cluster, plan, workload, replace(engine, **{what: getattr(engine, what) * factor})
    if what == "skinny_gemm_rate":  # a rate of the engine's, at most the modelled one
        if not engine.skinny_gemm_rows:
            return None
        return model, cluster, plan, workload, replace(engine, skinny_gemm_rate=min(engine.skinny_gemm_rate * factor,
                                                                                      1.0))
    if what == "interpreter":  # the host's time for interpreter-bound Python (Engine.host_interpreted)
        if not engine.host_interpreted:
            return None
        return model, replace(cluster, interpreter_host=cluster.interpreter_speed * factor), plan, workload, engine
    if what[-1].isdigit() and int(what[-1]) >= len(cluster.tiers):
        return None
    acc = cluster.accelerator
    if (what == "l2_cache" and not acc.l2_bandwidth) or (what.startswith("kernel") and not acc.allreduce_bandwidth):
        return None
    return model, scaled(cluster, what, factor), plan, workload, engine


@cache
def fitting(count: int = 30) -> list:
    """The first ``count`` draws that fit, and two that a rate of L2 prices (LMDeploy's kernel reads a KV head once
    per query head, from L2 on the GPUs that state its bandwidth: ops.decode_attention, iteration.cache_read_time),
    each with its estimate (the draws' as drawn, ``drawn``): the properties compare their variants with it."""
    lmdeploy = load_engine("lmdeploy")
    l2 = [(load_model("llama2-70b"), load_system("a100").cluster(4), ServePlan(tp=4, batch=64),
           Workload(input_len=3072, output_len=256), lmdeploy),
          (load_model("llama3-8b"), load_system("a800").cluster(1), ServePlan(batch=32),
           Workload(input_len=2048, output_len=512), lmdeploy)]
    # vLLM V0's ROCm builds of 2024 on MI300X (a KV head read once per query head, from HBM on its 8 dies; untuned
    # GEMMs; the GPU idle between kernels) and V0 on GH200's Grace (an interpreter-bound host loop)
    v0 = [(load_model("llama2-70b"), load_system("mi300x").cluster(2), ServePlan(tp=2, batch=64),
           Workload(input_len=1024, output_len=1024, static=True), load_engine("vllm-v0.6-rocm")),
          (load_model("llama3-8b"), load_system("mi300x").cluster(1), ServePlan(batch=200),
           Workload(input_len=300, output_len=700), load_engine("vllm-v0.5-rocm")),
          (load_model("llama2-7b"), load_system("gh200").cluster(1), ServePlan(batch=32),
           Workload(input_len=512, output_len=512, static=True), load_engine("vllm-v0.5"))]
    more = [(d, serve_estimate(*d)) for d in l2 + v0]
    return [(d, e) for d, e in drawn() if e.fits][:count] + [(d, e) for d, e in more if e.fits]


@pytest.mark.parametrize("what", (*RATES, "skinny_gemm_rate"))
@pytest.mark.parametrize("factor", FACTORS)
def test_more_of_any_rate_never_lowers_throughput_nor_raises_ttft_or_tpot(what, factor):
    for d, e in fitting():
        other = varied(d, what, factor)
        if other is None:
            continue
        (rate, ttft, tpot), (rate2, ttft2, tpot2) = metrics(e), estimate_metrics(*other)
        where = (what, factor, d[0].name, d[1].name, d[2].describe(), d[4].name)
        assert rate2 >= rate * (1 - RTOL), where
        assert ttft2 <= ttft * (1 + RTOL) and tpot2 <= tpot * (1 + RTOL), where


@pytest.mark.parametrize("what", LATENCIES)
@pytest.mark.parametrize("factor", FACTORS)
def test_more_of_any_latency_never_helps(what, factor):
    for d, e in fitting():
        other = varied(d, what, factor)
        if other is None:
            continue
        (rate, ttft, tpot), (rate2, ttft2, tpot2) = metrics(e), estimate_metrics(*other)
        where = (what, factor, d[0].name, d[1].name, d[2].describe(), d[4].name)
        assert rate2 <= rate * (1 + RTOL), where
        assert ttft2 >= ttft * (1 - RTOL) and tpot2 >= tpot * (1 - RTOL), where


def test_the_nvlink_that_slowed_megatron_3_6b_no_longer_does():
    """megatron-3.6b on H200, tp 4, pp 4, batch 1024, SGLang (issue 45): its TPOT rose with a 10 % faster NVLink
    (4.445 -> 4.482 ms) while the all-reduce's excess term grew with the bandwidth (meshplan/allreduce.py); under
    that term 16 -> 128 tokens went 4.456 -> 4.487 ms, 1 -> 256 4.653 -> 4.689 ms, 128 -> 512 6.359 -> 6.386 ms."""
    model, cluster = load_model("megatron-3.6b"), load_system("h200").cluster(16)
    plan, engine = ServePlan(tp=4, pp=4, batch=1024), load_engine("sglang")
    for input_len, output_len in ((16, 128), (1, 256), (128, 512), (1000, 2048)):
        workload = Workload(input_len=input_len, output_len=output_len)
        tpots = [serve_estimate(model, scaled(cluster, "tier0", f), plan, workload, engine).metrics.tpot
                 for f in (1.0, 1.1, 2.0, 10.0)]
        assert all(b <= a * (1 + RTOL) for a, b in zip(tpots, tpots[1:], strict=False)), (input_len, tpots)


def with_host(engine, scale: float, overlap: bool, graphs: int = 0):
    """The engine with host time of its own: 2 ms per iteration, 10 us per sequence exposed and 20 us beside the GPU,
    0.2 ms per eager layer, x scale (the order of vLLM V0's: presets/engines/vllm-v0*.toml), decode graphs up to
    ``graphs``."""
    return replace(engine, iteration_overhead=2e-3 * scale, sequence_overhead=10e-6 * scale,
                   hidden_sequence_overhead=20e-6 * scale, eager_layer_overhead=0.2e-3 * scale, host_overlap=overlap,
                   graph_max_batch=graphs)


@pytest.mark.parametrize("graphs", (0, 64))
def test_more_host_time_never_raises_throughput_and_overlap_never_slows(graphs):
    for (model, cluster, plan, workload, engine), _ in fitting():
        where = (model.name, cluster.name, plan.describe(), engine.name, graphs)
        at = {(overlap, f): estimate_metrics(model, cluster, plan, workload, with_host(engine, f, overlap, graphs))
              for overlap in (False, True) for f in (0.0, 1.0, 3.0, 10.0)}  # each priced once, read twice at 1.0
        for overlap in (False, True):
            rates = [at[overlap, f][0] for f in (0.0, 1.0, 3.0, 10.0)]
            assert all(b <= a * (1 + RTOL) for a, b in zip(rates, rates[1:], strict=False)), (where, overlap, rates)
        serial, overlapped = at[False, 1.0], at[True, 1.0]
        assert overlapped[0] >= serial[0] * (1 - RTOL), where
        assert overlapped[2] <= serial[2] * (1 + RTOL), where


@pytest.mark.parametrize("engine", sorted(engine_names()))
def test_more_sequences_never_shorten_a_decode_step(engine):
    """On every engine preset, a decode step of more sequences is never shorter: across the captured graphs' padded
    sizes, the eager batches beyond them and the rows up to which an untuned GEMM library runs its slow kernels
    (vllm-v0*-rocm: 256), for a dense and a MoE model on an NVIDIA and an AMD GPU."""
    for model, system, tp in (("llama2-70b", "mi300x", 2), ("llama3-8b", "h100", 1), ("mixtral-8x7b", "h100", 2)):
        m, c = load_model(model), load_system(system).cluster(tp)
        plan = ServePlan(tp=tp, batch=8)
        s = Setting(m, c, plan_columns(plan), plan.quant, load_engine(engine), Workload(input_len=512, output_len=512))
        times = [float(s.time(float(b))) for b in (1, 2, 3, 8, 9, 64, 200, 255, 256, 257, 300, 512, 513, 1024)]
        assert all(b >= a * (1 - RTOL) for a, b in zip(times, times[1:], strict=False)), (engine, model, times)
