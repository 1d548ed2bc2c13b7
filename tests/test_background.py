"""A shared fabric (specs/background.py, issue 84 item 6): other jobs' traffic priced by the fluid fair-share link model
(a tier's bandwidth what the background leaves, at least half), given as shares or as another job's estimate; the
NVLink domain untouched, more background never faster, and the search's pick moving away from a busy network."""

from __future__ import annotations

import json
import random

import pytest

from meshplan.cli import main
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.specs.background import EVERY, Background, job_shares, parse_background, under_background
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

H100 = load_system("h100")
CORE = load_stack("megatron-core")


def test_parse_the_three_forms(tmp_path):
    assert parse_background("0.3") == Background(((EVERY, 0.3),))
    assert parse_background("network=0.8").shares == (("network", 0.8),)
    for bad, why in (("1.5", "from 0 to 1"), ("network=x", "from 0 to 1"), ("=0.3", "TIER=SHARE")):
        with pytest.raises(SpecError, match=why):
            parse_background(bad)
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"tiers": {"tp": "nvlink", "dp": "network", "pp": "network"}, "step_time_s": 10.0,
                                "breakdown_s": {"tp": 4.0, "dp": 1.5, "pp": 0.5}}))
    # without a per-op table: the exposed seconds of the axes on each tier beyond NVLink, over the step: 2 of 10
    assert parse_background(str(path)).shares == (("network", pytest.approx(0.2)),)


def test_job_shares_count_every_collective_of_its_op_table():
    data = {"tiers": {"tp": "nvlink", "dp": "network"}, "step_time_s": 4.0,
            "ops": [{"name": "attn/tp_in", "kind": "collective", "count": 100, "seconds": 0.01},
                    {"name": "dp/grad_all_reduce", "kind": "collective", "count": 2, "seconds": 0.5},
                    {"name": "mlp/fc1", "kind": "compute", "count": 100, "seconds": 0.02}]}
    assert job_shares(data, "x") == {"network": pytest.approx(1.0 / 4.0)}  # 2 x 0.5 s of 4 s; tp on NVLink
    with pytest.raises(SpecError, match="not a meshplan estimate"):
        job_shares({"plans": []}, "x")


def test_a_tier_keeps_what_the_background_leaves_at_least_half():
    cluster = H100.cluster(64)
    assert under_background(cluster, Background((("network", 0.3),))).tiers[1].bandwidth == pytest.approx(
        0.7 * cluster.tiers[1].bandwidth)
    busy = under_background(cluster, Background(((EVERY, 0.9),)))
    assert busy.tiers[1].bandwidth == pytest.approx(0.5 * cluster.tiers[1].bandwidth)  # a fair half
    assert busy.tiers[0] == cluster.tiers[0]  # the job's own NVLink domain
    with pytest.raises(SpecError, match="'spine' is not a tier"):
        under_background(cluster, Background((("spine", 0.3),)))


def test_a_plan_inside_nvlink_is_untouched():
    model, cluster = load_model("llama3-8b"), H100.cluster(8)
    plan = Plan(dp=8, global_batch=64)
    busy = under_background(cluster, Background(((EVERY, 0.9),)))
    assert estimate(model, busy, plan, CORE).step_time == pytest.approx(estimate(model, cluster, plan, CORE).step_time,
                                                                        rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_property_more_background_is_never_faster(seed):
    rng = random.Random(8460 + seed)
    model = load_model(rng.choice(("llama3-8b", "llama3-70b", "mixtral-8x7b")))
    system = load_system(rng.choice(("h100", "a100", "b200", "gb200")))
    cluster = system.cluster(64)
    plan = rng.choice([Plan(dp=8, tp=8, global_batch=64), Plan(dp=4, tp=4, pp=4, global_batch=64, recompute="full"),
                       Plan(dp=64, global_batch=128, zero=3)])
    shares = sorted(rng.uniform(0, 1) for _ in range(3))
    times = [estimate(model, under_background(cluster, Background(((EVERY, b),))), plan, CORE).step_time
             for b in shares]
    assert times == sorted(times)


def test_the_search_moves_away_from_a_busy_network(capsys):
    base = ["plan", "--model", "llama3-70b", "--system", "h100", "--gpus", "128", "--global-batch", "256", "--top", "1",
            "--json"]
    assert main(base) == 0
    free = json.loads(capsys.readouterr().out)["plans"][0]
    assert main([*base, "--background-traffic", "network=0.9"]) == 0
    out = capsys.readouterr()
    busy = json.loads(out.out)["plans"][0]
    assert busy["plan"] != free["plan"] and busy["plan"]["dp"] < free["plan"]["dp"]
    assert busy["step_time_s"] > free["step_time_s"] and "network 90%" in out.err


def test_estimate_takes_another_jobs_estimate(tmp_path, capsys):
    other = tmp_path / "other.json"
    assert main(["estimate", "--model", "llama3-70b", "--system", "h100", "--gpus", "64", "--tp", "8", "--pp", "4",
                 "--global-batch", "128", "--json", "--ops"]) == 0
    other.write_text(capsys.readouterr().out)
    base = ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "64", "--global-batch", "256", "--json"]
    assert main(base) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main([*base, "--background-traffic", str(other)]) == 0
    shared = json.loads(capsys.readouterr().out)
    assert shared["step_time_s"] >= alone["step_time_s"] and "the job of" in shared["conditions"]
    assert main([*base, "--background-traffic", "2"]) == 2
    assert "from 0 to 1" in capsys.readouterr().err
