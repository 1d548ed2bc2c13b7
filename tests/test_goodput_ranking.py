"""Goodput that changes the pick (issue 84 item 3; goodput.plan_goodput, search/by_goodput.py): what a plan changes
in its failure accounting (its checkpoint writers, its replicas), the search ranked by expected time exactly over the
space, and ``plan --mtbf --recovery replica`` leading with a plan of small replicas."""

from __future__ import annotations

import json
import random

import pytest

from meshplan.cli import main
from meshplan.derived.goodput import Reliability, checkpoint_bytes, goodput, plan_goodput, replica_goodput, writer_share
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.search.by_goodput import expected_time, least_factor, search_by_goodput
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

L8 = load_model("llama3-8b")
ANY = load_stack("any")


def test_writer_share_sharded_or_the_first_replica():
    plan = Plan(dp=16, tp=8, pp=2, global_batch=256)
    size = checkpoint_bytes(L8, plan)  # 16 B a parameter: 2 weights + 12 Adam
    assert writer_share(L8, plan, 256, sharded=True) == pytest.approx(size / 256)
    # DeepSpeed: the first replica writes the weights over tp·pp = 16 ranks, every rank 1/256 of the optimizer
    assert writer_share(L8, plan, 256, sharded=False) == pytest.approx(size * 2 / 14 / 16 + size * 12 / 14 / 256)


def test_a_rank_link_bounds_the_write_of_a_small_job():
    # 8 GPUs writing 128 GB at 2 TB/s would take 64 ms; each rank's 16 GB through its 55 GB/s host link takes 291 ms
    plan, rel = Plan(dp=8, global_batch=64), Reliability(mtbf_gpu_hours=1000)
    share = writer_share(L8, plan, 8, sharded=True)
    g = goodput(L8, plan, 8, rel, share, 55e9)
    assert g.checkpoint_s == pytest.approx(share / 55e9)
    assert g.checkpoint_s > goodput(L8, plan, 8, rel).checkpoint_s


def test_replica_recovery_arithmetic():
    plan, rel = Plan(dp=32, tp=8, global_batch=512, zero=0), Reliability(mtbf_gpu_hours=500, recovery="replica")
    g = replica_goodput(L8, plan, 256, rel, step_time=2.0, link_bandwidth=50e9)
    mtbf = 500 * 3600 / 256  # 7,031 s between failures of the job
    heal = checkpoint_bytes(L8, plan) / 8 / 50e9  # a replica's 128 GB over its 8 GPUs' links
    assert g.heal_s == pytest.approx(heal) and g.job_mtbf_s == pytest.approx(mtbf)
    assert g.factor == pytest.approx(1 / (1 - (600 + heal + 1.0) / mtbf / 32))


def test_plan_goodput_recovers_by_replicas_only_with_whole_copies():
    cluster, rel = load_system("h100").cluster(256), Reliability(mtbf_gpu_hours=500, recovery="replica")
    copies = estimate(L8, cluster, Plan(dp=32, tp=8, global_batch=512, zero=0), ANY)
    sharded = estimate(L8, cluster, Plan(dp=32, tp=8, global_batch=512, zero=1), ANY)
    assert plan_goodput(copies, rel).recovery == "replica" and plan_goodput(sharded, rel).recovery == "restart"
    assert plan_goodput(copies, rel).goodput > plan_goodput(sharded, rel).goodput
    # a framework without replica recovery restarts whatever the plan
    core = estimate(L8, cluster, Plan(dp=32, tp=8, global_batch=512, zero=0), load_stack("megatron-core"))
    assert plan_goodput(core, rel).recovery == "restart"


@pytest.mark.parametrize("seed", range(6))
def test_property_more_replicas_or_rarer_failures_never_lower_goodput(seed):
    rng = random.Random(8440 + seed)
    gpus, step = rng.choice((64, 256, 1024)), rng.uniform(0.5, 20)
    mtbf = rng.uniform(100, 1e5)
    rel = Reliability(mtbf_gpu_hours=mtbf, recovery="replica")
    ladder = [replica_goodput(L8, Plan(dp=d, tp=gpus // d, global_batch=d * 8, zero=0), gpus, rel, step, 50e9).goodput
              for d in (2, 4, 8) if gpus % d == 0]
    assert ladder == sorted(ladder)
    rarer = Reliability(mtbf_gpu_hours=2 * mtbf, recovery="replica")
    plan = Plan(dp=4, tp=gpus // 4, global_batch=32, zero=0)
    assert replica_goodput(L8, plan, gpus, rarer, step, 50e9).goodput >= replica_goodput(
        L8, plan, gpus, rel, step, 50e9).goodput
    # the ranking's floor is below every plan's factor
    assert least_factor(L8, plan, gpus, rel) <= replica_goodput(L8, plan, gpus, rel, step, 50e9).factor


def test_the_search_ranked_by_expected_time_changes_its_pick():
    # Llama 3 8B on 256 H100, one interruption per 500 GPU-hours: by step time a ZeRO-2 plan of 256 replicas leads
    # (1.69 s); every failure then restarts the job (goodput 91.5 %). Recovering by replicas, a ZeRO-0 plan of 32
    # replicas of 8 GPUs loses a replica for its restart and heal only (99.7 %) and leads in expected time
    model, cluster = L8, load_system("h100").cluster(256)
    space = Space(global_batch=512, stack=ANY)
    rel = Reliability(mtbf_gpu_hours=500, recovery="replica")
    by_time = search(model, cluster, space, top_k=3, workers=1).plans[0]
    ranked, exact = search_by_goodput(model, cluster, space, rel, top_k=5)
    lead = ranked.plans[0]
    assert exact and lead.plan != by_time.plan and lead.plan.zero == 0 and lead.plan.dp >= 2
    assert expected_time(lead, rel) < expected_time(by_time, rel)
    assert lead.step_time >= by_time.step_time  # slower a step, faster to train
    times = [expected_time(e, rel) for e in ranked.plans]
    assert times == sorted(times)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_mtbf_changes_the_plan_from_the_command_line(capsys):
    base = ["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "256", "--global-batch", "512", "--top",
            "3", "--framework", "any", "--json"]
    plain = json.loads(_cli(capsys, *base)[1])["plans"][0]
    code, out, _ = _cli(capsys, *base, "--mtbf", "500", "--recovery", "replica")
    failing = json.loads(out)["plans"][0]
    assert code == 0 and failing["plan"] != plain["plan"] and failing["plan"]["zero"] == 0
    assert failing["failures"]["recovery"] == "replica" and failing["goodput"] > 0.99
    assert failing["expected_step_time_s"] < plain["step_time_s"] / 0.915  # the time-ranked #1 loses 8.5 % to failures


@pytest.mark.parametrize("extra, why", [
    (("--recovery", "replica"), "give --mtbf too"),
    (("--mtbf", "500", "--recovery", "replica", "--framework", "megatron-core"), "no replica recovery"),
    (("--mtbf", "500", "--all", "-o", "plans.csv"), "leave out --mtbf"),
])
def test_recovery_refusals(capsys, tmp_path, monkeypatch, extra, why):
    monkeypatch.chdir(tmp_path)
    code, _, err = _cli(capsys, "plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "64", *extra)
    assert code == 2 and why in err and "Traceback" not in err


@pytest.mark.parametrize(("gpus", "framework", "rel"), [
    (64, "megatron-core", Reliability()),  # every plan's factor the same: the ranking by time's first ten
    (64, "deepspeed", Reliability(mtbf_gpu_hours=300, checkpoint_bandwidth=5e9)),  # factors apart: writers differ
    # the first replica's writers bind (storage at 100 TB/s): factors 14.69 to 15.21, the 6th by time ranks 5th
    (64, "megatron-deepspeed", Reliability(mtbf_gpu_hours=4, checkpoint_bandwidth=1e14)),
])
def test_the_lazy_ranking_by_expected_time_is_the_full_one(monkeypatch, gpus, framework, rel):
    # by_goodput._Lazy estimates the kept plans only as far as the ten first in expectation need: the same plans,
    # times, order, fastest and exactness as the ranking of every kept plan estimated (_Lazy.ranking None)
    from meshplan.search import by_goodput

    space = Space(global_batch=256, stack=load_stack(framework), stage_layers=True)
    cluster = load_system("h100").cluster(gpus)
    answers, ranking = [], by_goodput._Lazy.ranking
    monkeypatch.setattr(by_goodput._Lazy, "ranking", lambda *a: answers.append(ranking(*a)) or answers[-1])
    lazy, lazy_exact = search_by_goodput(L8, cluster, space, rel, top_k=10)
    assert answers and None not in answers  # drawn lazily, not the ranking in full
    monkeypatch.setattr(by_goodput._Lazy, "ranking", lambda *_: None)
    full, full_exact = search_by_goodput(L8, cluster, space, rel, top_k=10)
    assert lazy_exact == full_exact and len(lazy.plans) == len(full.plans) > 0
    assert [(e.plan, e.step_time, e.peak_memory) for e in lazy.plans] == [
        (e.plan, e.step_time, e.peak_memory) for e in full.plans]
    assert lazy.fastest is not None and full.fastest is not None and lazy.fastest.plan == full.fastest.plan
    assert (lazy.evaluated, lazy.bounded, lazy.rejected) == (full.evaluated, full.bounded, full.rejected)


@pytest.mark.parametrize(("stage_layers", "priced"), [(False, 1), (True, 10)])
def test_the_lazy_ranking_waits_for_the_dp_pool_only_where_the_dp_runs(monkeypatch, stage_layers, priced):
    # --mtbf --top 1 on Megatron-Core (a stack whose Supports.stage_layers is on): with the stage DP on, the lazy
    # ranking estimates the POOL (10) first rows before it refines (the DP's pool is drawn from them: run._refined);
    # with it off the first row, which alone leads (before: 10 either way). The answer is the ranking in full's.
    from meshplan.search import by_goodput
    from meshplan.search.stage_pool import POOL

    space = Space(global_batch=256, stack=load_stack("megatron-core"), stage_layers=stage_layers)
    cluster, rel = load_system("h100").cluster(64), Reliability(mtbf_gpu_hours=300, checkpoint_bandwidth=5e9)
    calls: list = []
    ranking = by_goodput._Lazy.ranking

    def counted(self, rows, keep, price, refine):
        return ranking(self, rows, keep, lambda plan: calls.append(plan) or price(plan), refine)

    monkeypatch.setattr(by_goodput._Lazy, "ranking", counted)
    lazy, lazy_exact = search_by_goodput(L8, cluster, space, rel, top_k=1)
    assert len(calls) == priced == (POOL if stage_layers else 1)
    monkeypatch.setattr(by_goodput._Lazy, "ranking", lambda *_: None)
    full, full_exact = search_by_goodput(L8, cluster, space, rel, top_k=1)
    assert lazy_exact == full_exact and [(e.plan, e.step_time) for e in lazy.plans] == [
        (e.plan, e.step_time) for e in full.plans]
