"""Physics where nature is monotone, for serving, over seeded random (model, system, plan, workload, engine) draws:
more HBM bandwidth never slows a decode step or TPOT, more FLOP/s never slows a prefill, more bandwidth on any mesh
tier never slows a step and more latency never speeds one up; every figure is finite and none negative."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from functools import cache

import pytest

from meshplan.serve.check import FORMAT, servable
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
def draws() -> list:
    rng = random.Random(39)
    out = []
    while len(out) < DRAWS:
        d = draw(rng)
        if FORMAT not in serve_estimate(*d).reasons:
            out.append(d)
    return out


def steps(model, cluster: Cluster, plan: ServePlan, workload: Workload, engine) -> tuple[float, float]:
    """A pure decode step at the batch and a prefill of the batch's prompts (one lane)."""
    s = Setting(model, cluster, plan_columns(plan), plan.quant, engine, workload)
    b = s.micro_batch
    return float(s.time(b)), float(s.time(0.0, b * workload.input_len, b, 0.0))


def scaled(cluster: Cluster, what: str, factor: float) -> Cluster:
    acc = cluster.accelerator
    if what == "hbm":
        return replace(cluster, accelerator=replace(acc, hbm_bandwidth=acc.hbm_bandwidth * factor))
    if what == "flops":
        return replace(cluster, accelerator=replace(acc, peak_flops={k: v * factor for k, v in acc.peak_flops.items()}))
    i, kind = int(what[-1]), what[:-1]
    tiers = list(cluster.tiers)
    change = {"bandwidth": tiers[i].bandwidth * factor} if kind == "tier" else {"latency": tiers[i].latency * factor}
    tiers[i] = replace(tiers[i], **change)
    return replace(cluster, tiers=tuple(tiers))


@pytest.mark.parametrize("factor", FACTORS)
def test_more_hbm_bandwidth_never_slows_decode(factor):
    for i, (model, cluster, plan, workload, engine) in enumerate(draws()):
        base = steps(model, cluster, plan, workload, engine)[0]
        faster = steps(model, scaled(cluster, "hbm", factor), plan, workload, engine)[0]
        assert faster <= base * (1 + RTOL), (model.name, cluster.name, plan.describe())
        if i >= 40:  # the whole estimate (TPOT with its prefill share) on the first 40
            continue
        tpot = serve_estimate(model, cluster, plan, workload, engine).metrics.tpot
        assert serve_estimate(model, scaled(cluster, "hbm", factor), plan, workload,
                              engine).metrics.tpot <= tpot * (1 + RTOL)


@pytest.mark.parametrize("factor", FACTORS)
def test_more_flops_never_slows_prefill(factor):
    for model, cluster, plan, workload, engine in draws():
        base = steps(model, cluster, plan, workload, engine)[1]
        assert steps(model, scaled(cluster, "flops", factor), plan, workload, engine)[1] <= base * (1 + RTOL)


@pytest.mark.parametrize("what", ["tier0", "tier1"])
def test_more_link_bandwidth_never_slows_and_more_latency_never_speeds(what):
    for model, cluster, plan, workload, engine in draws()[:60]:
        base = steps(model, cluster, plan, workload, engine)
        wider = steps(model, scaled(cluster, what, 2.0), plan, workload, engine)
        slower = steps(model, scaled(cluster, what.replace("tier", "lat"), 10.0), plan, workload, engine)
        assert all(w <= b * (1 + RTOL) for w, b in zip(wider, base, strict=True))
        assert all(s >= b * (1 - RTOL) for s, b in zip(slower, base, strict=True))


def test_every_figure_is_finite_and_none_negative():
    for d in draws():
        e = serve_estimate(*d)
        values = {k: v for k, v in e.to_dict().items() if isinstance(v, float)}
        values |= {f"memory.{k}": v for k, v in e.to_dict()["memory"].items()}
        values |= {f"step.{k}": v for k, v in e.breakdown.items()}
        assert all(math.isfinite(v) and v >= 0 for v in values.values()), (d[0].name, d[2].describe(), values)
        assert e.metrics.ttft <= e.metrics.e2e * (1 + RTOL)
