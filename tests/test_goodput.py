"""Goodput under failures (goodput.py; issue 50 item 5): Daly's checkpoint interval and expected wall time, checked on
Llama 3's published figures, its limits and properties, and ``plan --mtbf``."""

from __future__ import annotations

import json
import math
import random

import pytest

from meshplan.cli import main
from meshplan.derived.goodput import (
    LLAMA3_MTBF_GPU_HOURS,
    Reliability,
    checkpoint_bytes,
    goodput,
    optimum_interval,
    wall_factor,
)
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan

MODEL = load_model("llama3.1-405b")
PLAN = Plan(dp=128, tp=8, pp=16, global_batch=2048)


def test_llama3_405b_on_16k_gpus_keeps_over_90_percent_as_the_paper_says():
    """Dubey et al. 2024 §3.3.4: 419 unexpected interruptions in 54 days on 16,384 H100s, "higher than 90 %" effective
    training time; Tectonic sustains 2 TB/s (§3.3.1)."""
    assert pytest.approx(16_384 * 54 * 24 / 419) == LLAMA3_MTBF_GPU_HOURS  # 50,679 GPU-hours
    g = goodput(MODEL, PLAN, 16_384, Reliability())
    assert g.job_mtbf_s == pytest.approx(54 * 24 * 3600 / 419)  # 3.09 h: one interruption every 11,135 s
    assert g.checkpoint_bytes == MODEL.params() * (2 + 12)  # bf16 weights + Adam's fp32 master, m and v
    assert g.checkpoint_s == pytest.approx(g.checkpoint_bytes / 2e12)  # 5.68 TB at 2 TB/s: 2.84 s
    young = math.sqrt(2 * g.checkpoint_s * g.job_mtbf_s)  # Young 1974: 251.5 s
    assert g.interval_s == pytest.approx(young * (1 + math.sqrt(g.checkpoint_s / (2 * g.job_mtbf_s)) / 3
                                                  + g.checkpoint_s / (2 * g.job_mtbf_s) / 9) - g.checkpoint_s)
    assert 240 < g.interval_s < 260 and 0.90 < g.goodput < 0.95  # 249.6 s; 92.6 %


def test_the_interval_is_the_optimum_and_tends_to_young():
    delta, mtbf, restart = 30.0, 20_000.0, 600.0
    tau = optimum_interval(delta, mtbf)
    best = wall_factor(tau, delta, restart, mtbf)
    assert all(wall_factor(tau * f, delta, restart, mtbf) > best for f in (0.8, 0.95, 1.05, 1.25))
    assert optimum_interval(1e-3, 1e6) == pytest.approx(math.sqrt(2 * 1e-3 * 1e6), rel=1e-4)  # δ << M: Young
    assert optimum_interval(5e4, 2e4) == 2e4  # δ ≥ 2M: τ = M (Daly 2006)


def test_more_gpus_slower_storage_or_longer_restarts_never_raise_goodput():
    base = goodput(MODEL, PLAN, 4096, Reliability())
    assert base.factor > 1
    assert goodput(MODEL, PLAN, 16_384, Reliability()).goodput < base.goodput
    assert goodput(MODEL, PLAN, 4096, Reliability(checkpoint_bandwidth=2e11)).goodput < base.goodput
    assert goodput(MODEL, PLAN, 4096, Reliability(restart_s=3600)).goodput < base.goodput
    assert goodput(MODEL, PLAN, 4096, Reliability(mtbf_gpu_hours=1e7)).goodput > base.goodput


def test_lora_checkpoints_hold_the_adapters_only():
    lora = Plan(dp=8, tp=8, global_batch=64, finetune="lora", lora_rank=16)
    assert 0 < checkpoint_bytes(MODEL, lora) < 0.01 * checkpoint_bytes(MODEL, PLAN)


def test_plan_mtbf_prices_days_and_ranks_gpu_counts_by_expected_time(capsys):
    args = ["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "64,512", "--tokens", "1T", "--mtbf",
            "llama3", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    for run in data["scaling"]:
        best = run["plans"][0]
        g = best["failures"]
        assert best["goodput"] == pytest.approx(1 / g["factor"])
        assert best["expected_step_time_s"] == pytest.approx(best["step_time_s"] * g["factor"])
        assert best["days"] == pytest.approx(1e12 / best["tokens_per_s"] / 86400 * g["factor"])
    keys = [p["expected_step_time_s"] * p["gpus"] for p in data["plans"]]
    assert keys == sorted(keys)


@pytest.mark.parametrize("extra, words", [
    (["--mtbf", "often"], "mtbf='often' must be GPU-hours per interruption"),
    (["--mtbf", "0.5"], "mtbf_gpu_hours=0.5 must be a number from 1"),
    (["--restart-time", "60"], "--restart-time prices failures: give --mtbf too"),
    (["--mtbf", "llama3", "--checkpoint-bandwidth", "0"], "checkpoint-bandwidth=0.0 must be GB/s from 0.001"),
    (["--mtbf", "llama3", "--checkpoint-bandwidth", "inf"], "checkpoint-bandwidth=inf must be GB/s from 0.001"),
])
def test_bad_failure_options_are_one_line(capsys, extra, words):
    assert main(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


def test_goodput_is_overflow_safe_for_any_mtbf():
    """Issue 80 (fuzz class): 557 of 13,604 draws raised OverflowError in wall_factor (e^{R/M} with M ≪ R) and 20
    returned inf unsaid. Over seeded draws across every allowed MTBF (1 to 10^9 GPU-hours), GPU count, checkpoint
    bandwidth and restart time: no exception, the factor is ≥ 1 or inf (then ``stalls``, goodput 0, JSON null), it
    agrees with Daly's closed form wherever that is finite, and a longer MTBF never lowers goodput."""
    rng = random.Random(80)
    stalled = 0
    for _ in range(3000):
        gpus = int(10 ** rng.uniform(0, 6))
        hours = [10 ** rng.uniform(0, 9) for _ in range(2)]
        bandwidth, restart = 10 ** rng.uniform(6, 15), 10 ** rng.uniform(-3, 6)
        lo, hi = (goodput(MODEL, PLAN, gpus, Reliability(mtbf_gpu_hours=h, checkpoint_bandwidth=bandwidth,
                                                        restart_s=restart)) for h in sorted(hours))
        for g in (lo, hi):
            assert g.factor >= 1 and g.stalls == math.isinf(g.factor) and 0 <= g.goodput <= 1
            assert (g.as_dict()["factor"] is None) == g.stalls
            try:
                closed = g.job_mtbf_s * math.exp(g.restart_s / g.job_mtbf_s) * math.expm1(
                    (g.interval_s + g.checkpoint_s) / g.job_mtbf_s) / g.interval_s
            except OverflowError:
                closed = math.inf
            if math.isfinite(closed):
                assert g.factor == pytest.approx(closed, rel=1e-9)
        assert hi.goodput >= lo.goodput
        stalled += lo.stalls
    assert 0 < stalled < 3000  # both kinds were drawn


def test_a_job_that_cannot_progress_says_so(capsys):
    """The fuzz repro: 16,384 GPUs at one interruption per GPU-hour (one every 220 ms) against a 600 s restart."""
    code = main(["plan", "--model", "llama3-70b", "--system", "h100", "--gpus", "16384", "--mtbf", "1", "--top",
                     "1", "--tokens", "1T", "--price", "2"])
    out = capsys.readouterr().out
    assert code == 0 and "goodput 0: the job makes no progress (interrupted every 220 ms" in " ".join(out.split())
    code = main(["plan", "--model", "llama3-70b", "--system", "h100", "--gpus", "16384", "--mtbf", "1", "--top",
                     "1", "--tokens", "1T", "--json"])
    data = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert code == 0 and data
