"""The RL plans move the way physics does, on seeded random draws (tests/draws.py's spirit): more GPUs never make the
best plan of a set-up slower; longer responses never make an iteration faster; a faster interconnect never slows
the weight transfer, whichever method moves it."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from meshplan import Plan, load_model, load_system
from meshplan.rl import RLJob, RLPlan, RLSpace, rl_estimate, rl_search
from meshplan.rl.sync import SYNC_METHODS, sync_time
from meshplan.serve.plan import ServePlan
from meshplan.specs.stack import load_stack

MODELS = ("llama3-8b", "mistral-7b", "qwen3-30b-a3b")
SYSTEMS = ("h100", "a100", "h200")
MEGATRON = load_stack("megatron-core")
TOLERANCE = 1e-9


def draw_job(rng: random.Random, output_len: int | None = None) -> RLJob:
    out = output_len or rng.choice((256, 512, 1024))
    kind = rng.choice(("fixed", "lognormal"))
    return RLJob(prompts=rng.choice((16, 32)), samples_per_prompt=rng.choice((2, 4)), input_len=rng.choice((128, 256)),
                 output_len=out, lengths=kind, mean_output=out * 0.4 if kind == "lognormal" else 0.0,
                 mini_batches=rng.choice((1, 2)), seed=rng.randrange(1000))


@pytest.mark.parametrize("seed", range(8))
def test_more_gpus_never_slower_at_the_same_setup(seed):
    """The best plan of each set-up on 2G GPUs is at least as fast as on G (searched both times)."""
    rng = random.Random(seed)
    model, system = load_model(rng.choice(MODELS[:2])), load_system(rng.choice(SYSTEMS))
    job = draw_job(rng)
    space = RLSpace(setups=("colocated", "split"), offloads=("all",), train_plans=1, engine_plans=2)
    small, large = (rl_search(model, system, g, job, space, top_k=4) for g in (8, 16))
    for setup, est in small.best.items():
        assert setup in large.best, f"{setup} found on 8 GPUs but not on 16"
        assert large.best[setup].iteration_time <= est.iteration_time * (1 + TOLERANCE), (
            setup, est.plan.describe(), large.best[setup].plan.describe())


def _plan(setup: str) -> RLPlan:
    if setup == "colocated":
        return RLPlan(setup="colocated", trainer=Plan(dp=4, tp=2, micro_batch=2, global_batch=32),
                      engine=ServePlan(tp=1, batch=256, replicas=8), train_gpus=8, rollout_gpus=8, offload="all")
    return RLPlan(setup=setup, trainer=Plan(dp=2, tp=2, micro_batch=2, global_batch=32),
                  engine=ServePlan(tp=1, batch=256, replicas=4), train_gpus=4, rollout_gpus=4)


@pytest.mark.parametrize("seed", range(6))
def test_longer_outputs_never_faster(seed):
    """The same placement, responses twice as long (every length doubled, the mean too): no phase is faster, nor the
    iteration."""
    rng = random.Random(100 + seed)
    model, system = load_model(rng.choice(MODELS[:2])), load_system(rng.choice(SYSTEMS))
    setup = rng.choice(("colocated", "split", "async"))
    short = draw_job(rng, rng.choice((256, 512)))
    long = replace(short, output_len=2 * short.output_len, mean_output=2 * short.mean_output)
    a, b = (rl_estimate(model, system, j, replace(_plan(setup), trainer=replace(_plan(setup).trainer,
                                                                                 global_batch=j.mini_batch)),
                        MEGATRON) for j in (short, long))
    assert b.iteration_time >= a.iteration_time * (1 - TOLERANCE), (setup, a.phases, b.phases)
    for phase in ("rollout", "old_log_prob", "actor_update"):
        assert b.phases.get(phase, 0.0) >= a.phases.get(phase, 0.0) * (1 - TOLERANCE), phase


def _faster(system, factor: float):
    """The system with every tier's bandwidth (NVLink, the NICs) ``factor`` times higher."""
    net = system.network
    if net.tiers:
        net = replace(net, tiers=tuple(replace(t, bandwidth=t.bandwidth * factor) for t in net.tiers))
    else:
        net = replace(net, nic_bandwidth=net.nic_bandwidth * factor)
    acc = replace(system.accelerator, nvlink_bandwidth=system.accelerator.nvlink_bandwidth * factor)
    return replace(system, network=net, accelerator=acc)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("method", list(SYNC_METHODS))
def test_a_faster_interconnect_never_slows_the_weight_transfer(method, seed):
    rng = random.Random(200 + seed)
    model, system = load_model(rng.choice(MODELS)), load_system(rng.choice(SYSTEMS))
    gpus = rng.choice((16, 32))
    tp, pp = rng.choice(((1, 1), (2, 1), (2, 2), (4, 2)))
    ep = rng.choice((1, 8)) if model.is_moe else 1
    trainer = Plan(dp=gpus // 2 // (tp * pp), tp=tp, pp=pp, ep=ep, zero=rng.choice((1, 3)) if pp == 1 else 1)
    engine = ServePlan(tp=rng.choice((1, 2, 4)), replicas=2)
    times = []
    for factor in (1.0, 2.0, 10.0):
        fast = _faster(system, factor)
        whole, pool = fast.cluster(gpus), fast.cluster(gpus // 2)
        times.append(sync_time(model, whole, (pool, trainer, MEGATRON), engine, method).seconds)
    assert times[0] >= times[1] * (1 - TOLERANCE) >= times[2] * (1 - TOLERANCE) ** 2, times
