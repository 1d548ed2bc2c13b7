"""The plans the report holds in full (report/detail.py), the comparison's pair and explanations (compare.py), the
trust panel's runs and assumptions (trust.py) and the plan space's columns (space.py), without a browser."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from conftest import gpt
from meshplan.errors import SpecError
from meshplan.estimate import COMPONENTS, estimate
from meshplan.search import Space, search
from meshplan.search.explore import Explore
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

pytest.importorskip("jinja2")

from meshplan.report import compare, detail, plots, space, trust  # noqa: E402

MODEL = gpt(layers=16, hidden=4096, heads=32, seq=4096)
CLUSTER = load_system("h100").cluster(16)


@pytest.fixture(scope="module")
def result():
    space_ = Space(global_batch=32, headroom=0.09, stack=load_stack("megatron-core"), prefer_simple=True)
    return search(MODEL, CLUSTER, space_, top_k=3, explore=Explore(sample=1500))


@pytest.fixture(scope="module")
def held(result):
    mine = estimate(MODEL, CLUSTER, Plan(dp=2, tp=4, pp=2, global_batch=32, zero=1))
    return detail.detailed_plans(result, 3, mine)


def test_held_plans_are_the_best_the_front_and_mine_once_each(result, held):
    origins = [d.origin for d in held]
    assert origins[:3] == [o for o in origins[:3] if o.startswith(("#1", "#2", "#3"))]
    assert origins[-1] == "your config"
    front = [d for d in held if "front" in d.origin]
    assert len(front) == len(result.explored.front)  # every front plan held, those among the best once
    assert len({d.est.plan for d in held}) == len(held)
    for d in front:  # re-estimated in float64 at the search's point
        t, m = next((t, m) for t, m, p in result.explored.front if p == d.est.plan)
        assert d.est.step_time == pytest.approx(t, rel=1e-5) and d.est.peak_memory == pytest.approx(m, rel=1e-5)


def test_the_front_of_time_memory_and_gpus(held):
    # alone, every plan of the 2D front is on the 3D front; a plan at fewer GPUs as fast and as light takes it off
    marked = detail.with_front(held, [])
    assert {d.id for d in marked if d.on_front} == {d.id for d in held if "front" in d.origin}
    first = next(d for d in marked if d.on_front)
    other = (first.est.step_time, first.est.peak_memory, 8)  # the same time and memory on 8 GPUs
    again = {d.id: d.on_front for d in detail.with_front(held, [other])}
    assert not again[first.id]
    # per point: beaten by one no worse anywhere and better somewhere; not by itself, a tie, or a trade
    assert detail.dominated([(2.0, 2.0, 16), (1.0, 2.0, 16), (1.0, 3.0, 8)], [(1.0, 2.0, 16)]) == [True, False, False]
    assert detail.dominated([(2.0, 2.0, 16)], []) == [False] and detail.dominated([], [(1.0, 2.0, 16)]) == []


def test_pair_of_names_best_front_and_mine(held):
    mine = held[-1].id
    assert compare.pair_of(held, None) == (mine, held[0].id)  # the config against #1
    assert compare.pair_of(held[:-1], None) == (held[0].id, held[1].id)
    front = [d.id for d in held if "front" in d.origin]
    assert compare.pair_of(held, "front2,mine") == (front[1], mine)
    for bad in ("#1", "#1,#9", "front99,#1", "#1,#2,#3"):
        with pytest.raises(SpecError, match="must name two of"):
            compare.pair_of(held, bad)


def test_page_data_keeps_every_block_within_the_budget(held, monkeypatch):
    data = detail.page_data(held, CLUSTER.accelerator.hbm_bytes, first=(held[-1].id,))
    assert [p["id"] for p in data][0] == held[-1].id  # the pair's plans first: they get their blocks
    for p in data:
        assert set(p["breakdown"]) == set(COMPONENTS) and p["time"] == pytest.approx(sum(p["breakdown"].values()))
    full = [p for p in data if not p["timeline"]["merged"]]
    # a full timeline: 2·m·v blocks per rank (forward and backward of every micro-batch and chunk), plus idle rows
    for p in full:
        t, f = p["timeline"], p["fields"]
        blocks = [r for r in t["rows"] if r[3] in (0, 1)]
        assert len(blocks) == 2 * f["micro-batches"] * f["vpp"] * f["pp"]
    monkeypatch.setattr(detail, "BLOCKS", 0)
    tight = detail.page_data(held, CLUSTER.accelerator.hbm_bytes)
    assert all(p["timeline"]["merged"] for p in tight)
    assert all(r[3] in (2, 3) for p in tight for r in p["timeline"].get("rows", []))  # busy and idle only
    # past the budget a tables.build table is the page's to simulate (templates/timeline.js): its shape and the
    # ranks' times per micro-batch and chunk, as plots.pipeline_run simulates them, and no rows
    by_id = {d.id: d.est for d in held}
    left = [p for p in tight if "replay" in p["timeline"]]
    assert left and all("rows" not in p["timeline"] for p in left)
    for p in left:
        schedule, vpp, t_f, t_b = plots.pipeline_times(by_id[p["id"]])
        t = p["timeline"]
        assert (t["schedule"], t["vpp"], t["replay"]["t_fwd"], t["replay"]["t_bwd"]) == (schedule, vpp, list(t_f),
                                                                                         list(t_b))
        assert t["replay"]["pixels"] == detail.MERGED_PIXELS and t["micro_batches"] == p["fields"]["micro-batches"]


def test_trust_nearest_runs_and_assumptions():
    est = estimate(load_model("llama3-70b"), load_system("h100").cluster(64),
                   Plan(dp=8, tp=4, pp=2, global_batch=64, zero=1, sequence_parallel=True))
    runs = trust.nearest(est)
    assert len(runs) == trust.NEAREST == 5
    assert all(r["same_generation"] and r["same_class"] for r in runs)  # hopper dense runs are many
    # issue 48: a bf16 plan's evidence is 16-bit runs (fp8 ones only once those run out)
    assert all(r["same_precision"] and r["precision"] in ("bf16", "fp16") for r in runs)
    fp8 = trust.nearest(estimate(est.model, est.cluster, replace(est.plan, precision="fp8")))
    assert all(r["precision"] in ("fp8", "mxfp8") for r in fp8)
    assert [r["distance"] for r in runs] == sorted(r["distance"] for r in runs)
    # the distance is 0 for the plan's own shape and grows with each |log2| ratio: tp 4 -> 8 adds 1, pp 2 -> 8 adds 2
    own = {"tp": 4, "tp2": 1, "pp": 2, "cp": 1, "ep": 1, "gpus": 64, "params_b": est.model.params() / 1e9}
    assert trust.distance(est, own) == pytest.approx(0.0, abs=1e-9)
    assert trust.distance(est, own | {"tp": 8, "pp": 8}) == pytest.approx(3.0)
    b = est.band  # its regime's runs, from specs/bands.py's table (presets/error_bands.json)
    assert trust.band_note(est) == (f"from the {b.runs} measured runs of {b.sources} sources like it ({b.basis}), "
                                    "each priced with the fitted constants refitted without its source, widened to "
                                    "hold 80% of the runs of a source not yet measured")
    assert b.basis.startswith("gpu=hopper") and "kind=dense" in b.basis and b.runs >= 20
    said = " ".join(a for a, _ in trust.assumptions(est, 0.09))
    assert "the megatron-core stack runs the plan" in said and "9% of HBM left free" in said  # estimate's default
    assert "routed evenly" not in said and "pipeline stages" in said  # dense, pp = 2
    moe = estimate(load_model("mixtral-8x7b"), load_system("h100").cluster(64),
                   Plan(dp=8, ep=8, tp=1, pp=8, global_batch=64, zero=1))
    assert "routed evenly" in " ".join(a for a, _ in trust.assumptions(moe, 0.0))
    # each assumption names where it lives, a path under src/meshplan that exists (a preset by its folder)
    offload = estimate(est.model, est.cluster, replace(est.plan, offload_optimizer=True))
    named = [w for e in (est, moe, offload) for _, w in trust.assumptions(e, 0.09)]
    assert any("channels.py" in w for w in named) and any("simulator.py" in w for w in named)
    for where in named:
        assert all((Path(trust.__file__).parents[1] / w.split(" (")[0]).exists() for w in where.split(", ")), where


def test_space_columns_decode_the_sample(result):
    cols = space.columns(result.explored)
    n = len(result.explored)
    assert all(len(cols[k]) == n for k in ("time", "memory", "tp", "zero", "framework", "status"))
    assert cols["vocab"]["status"][0] in ("fits", "memory exceeds HBM")
    # every sampled plan of a megatron-core search runs on megatron-core
    assert all("megatron-core" in cols["vocab"]["framework"][c] for c in cols["framework"])
    assert cols["vocab"]["zero"] == sorted(cols["vocab"]["zero"], key=int)
