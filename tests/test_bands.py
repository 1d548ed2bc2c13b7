"""Error bands and ties: every estimate carries the band of comparable published runs (GPU architecture, dense or
MoE; specs/bands.py), plans inside the fastest one's band are equivalent, and among equivalents the command line
ranks the simpler and lighter plan first (search/run.py simple_first)."""

from __future__ import annotations

import json
from pathlib import Path

from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.search.run import simplicity
from meshplan.specs.bands import error_band
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan

BANDS = json.loads((Path(__file__).resolve().parents[1] / "src/meshplan/presets/error_bands.json").read_text())


def test_an_estimate_carries_the_band_of_its_gpu_generation_and_model_kind():
    dense = estimate(load_model("llama3-8b"), load_system("h100").cluster(8), Plan(dp=8, zero=3))
    moe = estimate(load_model("qwen3-30b-a3b"), load_system("h100").cluster(8), Plan(dp=8, ep=8, zero=3))
    assert dense.error_band == BANDS["bands"]["hopper/dense"]["band"] == dense.to_dict()["error_band"]
    assert moe.error_band == BANDS["bands"]["hopper/moe"]["band"]
    assert error_band("tpu-v9", False) == BANDS["overall"]["band"]  # an architecture with no runs: the overall band
    assert all(0 < b["band"] < 1 and b["runs"] >= 8 for b in BANDS["bands"].values())


def test_plans_within_the_band_are_equivalent_and_follow_the_fastest_simplest_first():
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(32)
    by_time = search(model, cluster, Space(global_batch=256), top_k=10)
    simple = search(model, cluster, Space(global_batch=256, prefer_simple=True), top_k=10)
    fastest = by_time.plans[0].step_time
    limit = fastest * (1 + by_time.plans[0].error_band)
    assert by_time.equivalent == tuple(e.step_time <= limit for e in by_time.plans)
    close = [e for e in simple.plans if e.step_time <= limit]
    assert close and simple.plans[: len(close)] == tuple(close)  # the equivalents first
    assert simple.plans[0].plan == by_time.plans[0].plan  # the fastest leads
    keys = [(simplicity(e.plan), e.peak_memory) for e in close[1:]]
    assert keys == sorted(keys)  # then simplest, then lightest
    assert json.loads(json.dumps(simple.to_dict()))["plans"][0]["equivalent"] is True


def test_simplicity_counts_what_a_plan_asks_of_its_user():
    assert simplicity(Plan(dp=8, recompute="none")) == 0
    # tp, pp, vpp (3) + optimizer offload (1) + selective recompute (1) = 5
    assert simplicity(Plan(dp=2, tp=2, pp=2, vpp=2, schedule="interleaved", offload_optimizer=True,
                           recompute="selective")) == 5
