"""Energy per step and per token (energy.py), a power cap (specs/power.py) and stragglers (specs/stragglers.py), issue
84 item 3: the arithmetic shown, physics moving the right way on random draws, and the command line."""

from __future__ import annotations

import json
import math
import random

import pytest

from meshplan.cli import main
from meshplan.derived.energy import step_energy
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.power import IDLE_SHARE, PowerCap, capped, idle_watts, parse_power_cap
from meshplan.specs.stack import load_stack
from meshplan.specs.stragglers import Stragglers, parse_stragglers, slowed

L70 = load_model("llama3-70b")
H100 = load_system("h100")
PLAN = Plan(dp=2, tp=8, pp=4, global_batch=128)
CORE = load_stack("megatron-core")


def test_energy_is_the_duty_cycle_of_busy_and_idle_power():
    est = estimate(L70, H100.cluster(64), PLAN, CORE)
    e = step_energy(est)
    assert e is not None
    busy = (est.breakdown["compute"] + est.breakdown["recompute"] + est.breakdown["optimizer"]) / est.step_time
    # 69 W idle (the preset's measured reading), 700 W limit: P = 69 + 631·u
    assert e.idle_watts == 69 and e.busy_watts == 700 and e.busy_share == pytest.approx(busy)
    assert e.gpu_watts == pytest.approx(69 + 631 * busy)
    assert e.step_joules == pytest.approx(e.gpu_watts * 64 * est.step_time)
    assert e.token_joules == pytest.approx(e.step_joules / (128 * 8192))
    assert 0.2 < e.token_joules < 2  # Llama 3 70B on H100s: about 0.6 J a token


def test_idle_power_where_no_reading_is_stated_is_the_h100_share():
    h200 = load_system("h200").accelerator  # no idle reading in its preset
    assert idle_watts(h200) == pytest.approx(IDLE_SHARE * 700) and pytest.approx(69 / 700) == IDLE_SHARE


def test_power_cap_parses_and_lowers_the_limit_and_the_clock():
    assert parse_power_cap("500W") == PowerCap(500.0, 1)
    assert parse_power_cap("5.6kW/8").per_gpu == pytest.approx(700)
    for bad in ("fast", "5W", "1kW/0", "100kW/2"):
        with pytest.raises(SpecError, match="power-cap"):
            parse_power_cap(bad)
    cluster = H100.cluster(64)
    assert capped(cluster, PowerCap(900)) is cluster  # above the limit: nothing to cap
    low = capped(cluster, PowerCap(350))
    assert low.accelerator.tdp_watts == 350
    with pytest.raises(SpecError, match="idle draw"):
        capped(cluster, PowerCap(50))
    full, half = (estimate(L70, c, PLAN, CORE) for c in (cluster, low))
    # the GEMMs' clock (350/700)^(1/3) = 0.79: slower, and less energy a token
    assert half.step_time > full.step_time
    assert step_energy(half).token_joules < step_energy(full).token_joules


@pytest.mark.parametrize("seed", range(5))
def test_property_a_higher_cap_is_never_slower(seed):
    rng = random.Random(8420 + seed)
    system = load_system(rng.choice(("h100", "a100", "b200", "h200")))
    cluster = system.cluster(32)
    plan = rng.choice([Plan(dp=4, tp=8, global_batch=64), Plan(dp=2, tp=4, pp=4, global_batch=64, recompute="full")])
    model = load_model(rng.choice(("llama3-8b", "llama3-70b")))
    limit = system.accelerator.tdp_watts
    caps = sorted(rng.uniform(0.3, 1.0) * limit for _ in range(3))
    times = [estimate(model, capped(cluster, PowerCap(c)), plan, CORE).step_time for c in caps]
    assert times == sorted(times, reverse=True)


def test_stragglers_pace_is_the_slowest_of_n():
    share = Stragglers(form="share", share=0.01, slowdown=1.3)
    # 1 - 0.99^64 = 0.474 of the time some GPU is slow: 1 + 0.3 x 0.474 = 1.142
    assert share.pace(64) == pytest.approx(1 + 0.3 * (1 - 0.99 ** 64))
    assert share.pace(1) == pytest.approx(1.003) and share.pace(100_000) == pytest.approx(1.3)
    normal = Stragglers(form="lognormal", sigma=0.02)
    # the largest of 1,024 standard normals is about 3.2: e^{0.02·3.2} = 1.066
    assert 1.055 < normal.pace(1024) < 1.075 and normal.pace(1) == pytest.approx(
        1 + 0.02 * math.exp(0.0002) * 0.3989, rel=0.05)  # E[max(1, X)] ≈ 1 + σ·φ(0) for small σ
    assert parse_stragglers("1%:1.3") == share and parse_stragglers("lognormal:0.02") == normal
    with pytest.raises(SpecError, match="P%:S"):
        parse_stragglers("some")


@pytest.mark.parametrize("seed", range(5))
def test_property_more_gpus_or_slower_stragglers_never_speed_a_step(seed):
    rng = random.Random(8430 + seed)
    dist = rng.choice([Stragglers(form="share", share=rng.uniform(0.001, 0.05), slowdown=rng.uniform(1.05, 2)),
                       Stragglers(form="lognormal", sigma=rng.uniform(0.005, 0.1))])
    paces = [dist.pace(n) for n in (8, 64, 512, 4096)]
    assert paces == sorted(paces) and paces[0] >= 1
    cluster = H100.cluster(64)
    base = estimate(L70, cluster, PLAN, CORE)
    slow = estimate(L70, slowed(cluster, paces[1]), PLAN, CORE)
    assert base.step_time <= slow.step_time <= base.step_time * paces[1] * (1 + 1e-9)  # links are not slowed


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_prints_energy_per_token_and_takes_the_conditions(capsys):
    base = ["estimate", "--model", "llama3-70b", "--system", "h100", "--gpus", "64", "--tp", "8", "--pp", "4",
            "--global-batch", "128"]
    code, out, _ = _cli(capsys, *base)
    assert code == 0 and "energy" in out and "J a token" in out
    code, out, _ = _cli(capsys, *base, "--json")
    plain = json.loads(out)
    assert plain["energy"]["token_joules"] == pytest.approx(plain["energy"]["step_joules"] / (128 * 8192))
    code, out, _ = _cli(capsys, *base, "--stragglers", "1%:1.3", "--power-cap", "5.6kW/16", "--json")
    slow = json.loads(out)
    assert code == 0 and slow["step_time_s"] > plain["step_time_s"] and "power cap" in slow["conditions"]
    # MFU against the GPUs' own peak: the slower step reads as a lower MFU
    assert slow["mfu"] < plain["mfu"]
    code, _, err = _cli(capsys, *base, "--power-cap", "50W")
    assert code == 2 and "idle draw" in err


def test_plan_json_carries_energy_and_the_stragglers_change_the_step(capsys):
    base = ["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "64", "--global-batch", "256", "--top", "2"]
    code, out, _ = _cli(capsys, *base, "--json")
    plain = json.loads(out)
    assert code == 0 and all("energy" in p for p in plain["plans"])
    code, out, err = _cli(capsys, *base, "--stragglers", "1%:1.3", "--json")
    slowed_plans = json.loads(out)
    assert slowed_plans["plans"][0]["step_time_s"] > plain["plans"][0]["step_time_s"] and "1.142x" in err
