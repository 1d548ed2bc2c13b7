"""The search: exhaustive, exact (same best plan as estimate() on every candidate), reasons, determinism."""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import replace

import numpy as np
import pytest

import meshplan.search.run as search_module
from meshplan.cli import main
from meshplan.comm import split_group
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.groups import expert_factors, send_stride
from meshplan.search.batch import PlanBatch
from meshplan.search.keyed import KeyUnits, distinct, panel_counts, split_codes
from meshplan.search.run import PLACEMENTS, Space, candidates, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import LAYOUTS, Plan
from meshplan.specs.stack import Stack
from meshplan.units import fmt_bytes

SMALL = Space(global_batch=16, zero=(0, 3), recompute=("none", "full"), offload_optimizer=(False,),
              offload_activations=(False, True), max_micro_batch=4)


def unit_keys(model, cluster, batch):
    """The reference unit key (what keyed.KeyUnits.price packs into one code): the unit columns and the tier splits
    of the groups their collectives use; the first plan of each distinct key and each plan's key index."""
    columns = ("tp", "tp2", "cp", "micro_batch", "ep", "etp", "summa_panels")
    return distinct(np.stack([getattr(batch, k) for k in columns] + split_codes(model, cluster, batch)))


def every_plan(model, cluster, space):
    """All candidates as Plans, one by one (the slow way)."""
    columns, _ = candidates(model, cluster, space)
    layouts = columns.pop("layout")
    base = PlanBatch(**columns, placements=PLACEMENTS, **space.settings)
    for i in range(len(base)):
        plan = replace(base.plan(i), tensor_layout=LAYOUTS[layouts[i]])
        schedules = ["1f1b"] if plan.vpp == 1 else ["interleaved"]
        if space.gpipe and plan.vpp == 1 and plan.pp > 1:
            schedules.append("gpipe")
        sps = [sp for sp in space.sequence_parallel if (plan.tp > 1 and plan.tensor_layout == "1d") or not sp]
        summa = plan.tensor_layout == "summa"
        panels = panel_counts(model.hidden_size, plan.tp, plan.tp2) if summa else [plan.summa_panels]
        for sched, sp, rc, z, oo, oa in itertools.product(schedules, sps, space.recompute, space.zero,
                                                          space.offload_optimizer, space.offload_activations):
            yield [replace(plan, schedule=sched, sequence_parallel=sp, recompute=rc, zero=z, offload_optimizer=oo,
                           offload_activations=oa, summa_panels=nb) for nb in panels]


@pytest.fixture(scope="module")
def small_case():
    model = load_model("llama3-8b").with_seq_length(2048)
    cluster = load_system("h100").cluster(8)
    return model, cluster, search(model, cluster, SMALL, top_k=5)


def test_search_equals_estimate_on_every_candidate(small_case):
    model, cluster, result = small_case
    """Every plan, and for SUMMA plans every panel count (which the search optimises per plan)."""
    variants = [[estimate(model, cluster, p) for p in panel_options]
                for panel_options in every_plan(model, cluster, SMALL)]
    assert len(variants) == result.evaluated
    ests = [min(v, key=lambda e: e.step_time) for v in variants]  # memory does not depend on the panels
    feasible = [e for e in ests if e.fits]
    assert len(feasible) == result.feasible
    best = min(e.step_time for e in feasible)
    assert result.plans[0].step_time == pytest.approx(best, rel=1e-12)
    # the whole top k, though the lower bound (search._lower_bound) skipped the step time of some plans
    top = sorted(e.step_time for e in feasible)[: len(result.plans)]
    assert [e.step_time for e in result.plans] == pytest.approx(top, rel=1e-9)
    over = result.rejected.get("memory exceeds HBM", 0) + result.rejected.get("offload exceeds host memory", 0)
    assert sum(1 for e in ests if not e.fits) == over


@pytest.mark.parametrize(("system", "precision", "scaling"), [("h100", "fp8", "current"), ("b200", "mxfp8", "delayed")])
def test_search_equals_estimate_with_low_precision_casts_and_quantized_gathers(system, precision, scaling):
    """Low precision changes the per-key units (casts, quantized sequence-parallel gathers and SUMMA panels,
    block-scaled casts priced slower): the batched search must still price every plan as estimate() does."""
    model = load_model("llama3-8b").with_seq_length(2048)
    cluster = load_system(system).cluster(8)
    space = replace(SMALL, precision=precision, stack=Stack(fp8_scaling=scaling), zero=(1,), recompute=("none",),
                    offload_activations=(False,))
    result = search(model, cluster, space, top_k=10)
    variants = [[estimate(model, cluster, p, space.stack) for p in options]
                for options in every_plan(model, cluster, space)]
    feasible = sorted(min(e.step_time for e in v) for v in variants if v[0].fits)
    assert any(p.plan.tp > 1 and p.plan.sequence_parallel for p in result.plans)
    assert [e.step_time for e in result.plans] == pytest.approx(feasible[: len(result.plans)], rel=1e-9)


def test_search_equals_estimate_with_fsdp_gradient_preparation():
    """Stack.fsdp adds a per-micro-batch memory op to every layer and to the embedding and head: the batched
    search must price it as estimate() does, on every zero stage of the grid."""
    model = load_model("llama3-8b").with_seq_length(2048)
    cluster = load_system("h100").cluster(8)
    space = replace(SMALL, stack=Stack(fsdp="fsdp1"), zero=(0, 2, 3), recompute=("none",),
                    offload_activations=(False,))
    result = search(model, cluster, space, top_k=10)
    variants = [[estimate(model, cluster, p, space.stack) for p in options]
                for options in every_plan(model, cluster, space)]
    feasible = sorted(min(e.step_time for e in v) for v in variants if v[0].fits)
    assert all(p.stack.fsdp == "fsdp1" for p in result.plans)
    assert [e.step_time for e in result.plans] == pytest.approx(feasible[: len(result.plans)], rel=1e-9)
    plain = search(model, cluster, replace(space, stack=Stack()), top_k=1)
    assert result.plans[0].step_time > plain.plans[0].step_time
    assert any(p.plan.tensor_layout == "summa" for e in variants for p in [e[0]])  # summa plans were compared
    with pytest.raises(ValueError, match="no ZeRO-1"):
        replace(space, zero=(1, 3))


def test_search_equals_estimate_with_overlapped_pipeline_sends():
    """Stack.overlap_pp hides an interleaved schedule's sends behind compute: the batched search must price it as
    estimate() does, and an interleaved plan that sends anything gets faster than with its sends exposed."""
    model = load_model("llama3-8b").with_seq_length(2048)
    cluster = load_system("h100").cluster(8)
    space = replace(SMALL, stack=Stack(overlap_pp=True), zero=(0,), recompute=("none",), offload_activations=(False,))
    result = search(model, cluster, space, top_k=10)
    variants = [[estimate(model, cluster, p, space.stack) for p in options]
                for options in every_plan(model, cluster, space)]
    feasible = sorted(min(e.step_time for e in v) for v in variants if v[0].fits)
    assert all(p.stack.overlap_pp for p in result.plans)
    assert [e.step_time for e in result.plans] == pytest.approx(feasible[: len(result.plans)], rel=1e-9)
    interleaved = [e[0] for e in variants if e[0].plan.vpp > 1 and e[0].breakdown["pp"] > 0]
    assert interleaved
    for e in interleaved[:5]:
        exposed = estimate(model, cluster, e.plan, Stack())
        assert e.breakdown["pp"] < exposed.breakdown["pp"]


def test_search_equals_estimate_under_the_torch_pipeline_runtime():
    """Stack.pipeline_runtime = "torch" keeps every micro-batch's boundary tensors and the last stage's logits all
    step: the batched search must count them as estimate() does, in what fits and in each plan's peak."""
    model = load_model("llama3-8b").with_seq_length(4096)
    cluster = load_system("h100").cluster(8)
    torch_rt = Stack(pipeline_runtime="torch")
    space = replace(SMALL, stack=torch_rt, global_batch=64, zero=(1,), recompute=("none", "full"),
                    offload_activations=(False,), max_micro_batch=2)
    result = search(model, cluster, space, top_k=200)
    variants = [[estimate(model, cluster, p, torch_rt) for p in options]
                for options in every_plan(model, cluster, space)]
    fitting = [v[0] for v in variants if v[0].fits]  # the SUMMA panel variants of a plan share its memory
    assert result.feasible == len(fitting) < len(variants)
    for e in result.plans:
        assert e.stack.pipeline_runtime == "torch"
        assert e.peak_memory == pytest.approx(estimate(model, cluster, e.plan, torch_rt).peak_memory, rel=1e-9)
    pipelined = [e for e in result.plans if e.plan.pp > 1]
    assert pipelined
    plain = estimate(model, cluster, pipelined[0].plan, Stack())
    assert pipelined[0].peak_memory > plain.peak_memory


def test_the_lower_bound_loses_none_of_the_top_k(small_case, monkeypatch):
    """In small chunks the k-th best time is known early, and later plans whose lower bound exceeds it are
    not timed: the same top k and counts as in one chunk per schedule group, where only the groups scored after
    the first can be skipped."""
    model, cluster, whole = small_case
    monkeypatch.setattr(search_module, "CHUNK", 32)
    chunked = search(model, cluster, SMALL, top_k=5)
    assert whole.bounded < chunked.bounded < chunked.evaluated
    assert [e.plan for e in chunked.plans] == [e.plan for e in whole.plans]
    assert (chunked.evaluated, chunked.feasible, chunked.rejected) == (whole.evaluated, whole.feasible, whole.rejected)


def test_the_lower_bound_holds_for_every_plan_and_setting():
    """search._lower_bound: m·(L_stage·c + max(e, h)) + ((p − 1)·L_stage·c + min(e, h)) / v from the kernel
    times of a plan's shape, never above its step time under any setting; on pipelined plans it counts the bubble,
    so it exceeds the busiest rank's layer kernels alone."""
    model, cluster = load_model("llama3-8b").with_seq_length(2048), load_system("h100").cluster(8)
    space = replace(SMALL, layouts=("1d",), sequence_parallel=(False,))
    columns, _ = candidates(model, cluster, space)
    columns.pop("layout")
    pool = PlanBatch(**columns, placements=PLACEMENTS, **space.settings)
    units = KeyUnits(model, cluster, pool, space.stack, space.recompute, search_module.DEFAULT)
    bound = search_module._lower_bound(model, pool, units.shapes, units.shape_of)
    kernels = units.shapes["none"].layer
    for i in range(len(pool)):
        plan = replace(pool.plan(i), schedule="interleaved" if pool.vpp[i] > 1 else "1f1b")
        for rc, z, oa in itertools.product(space.recompute, space.zero, space.offload_activations):
            step = estimate(model, cluster, replace(plan, recompute=rc, zero=z, offload_activations=oa)).step_time
            assert bound[i] <= step * (1 + 1e-12)
        layers = -(-model.num_layers // plan.pp)
        c = (kernels.fwd + kernels.bwd)[units.shape_of[i]]
        if plan.pp > 1:
            assert bound[i] > plan.grad_accum * layers * c * (1 + 1 / plan.grad_accum / plan.vpp)


@pytest.mark.parametrize(("name", "layout"), [("mixtral-8x7b", "1d"), ("llama3-8b", "summa")])
def test_one_key_per_shape_gives_every_keys_kernel_times_and_saved_activations(name, layout):
    """keyed.KeyUnits: the forward and backward kernel times and the saved bytes of a unit depend on its op shapes
    alone, not on the placement or SUMMA panels: the key computed for its shape stands for every key of it (what
    memory and the lower bound use), on a two-tier mesh where placements split the groups differently."""
    model, cluster = load_model(name).with_seq_length(2048), load_system("h100").cluster(32)
    space = Space(global_batch=64, layouts=(layout,), sequence_parallel=(True,))
    columns, _ = candidates(model, cluster, space)
    columns.pop("layout")
    pool = PlanBatch(**columns, placements=PLACEMENTS, **space.settings).select(
        columns["tp"] > 1, sequence_parallel=True, tensor_layout=layout)
    units = KeyUnits(model, cluster, pool, space.stack, space.recompute, search_module.DEFAULT)
    full, by_shape = units.price(pool, units.shape_of)[0], units.saved(units.shape_of)
    # the key table knows a key by (shape, panels, tier splits): as many as the distinct unit keys of the plans
    assert units.n_shapes < units.priced == len(unit_keys(model, cluster, pool)[0])
    for rc in space.recompute:
        for f in ("layer_saved", "embed_saved", "head_saved"):
            assert np.allclose(getattr(full[rc], f), getattr(by_shape[rc], f), rtol=1e-12)
        for part, f in itertools.product(("layer", "layer_plain", "embed", "head"), ("fwd", "bwd")):
            assert np.allclose(getattr(getattr(full[rc], part), f), getattr(getattr(by_shape[rc], part), f),
                               rtol=1e-12)


def test_a_key_is_priced_once_whatever_the_batches():
    """keyed.KeyUnits.price: plans priced in two batches get the units they get in one, and pricing them again adds
    no key (the memo table finds every code it has met)."""
    model, cluster = load_model("mixtral-8x7b").with_seq_length(2048), load_system("h100").cluster(32)
    space = Space(global_batch=64, layouts=("1d",), sequence_parallel=(True,))
    columns, _ = candidates(model, cluster, space)
    columns.pop("layout")
    pool = PlanBatch(**columns, placements=PLACEMENTS, **space.settings).select(
        columns["tp"] > 1, sequence_parallel=True)
    whole = KeyUnits(model, cluster, pool, space.stack, space.recompute, search_module.DEFAULT)
    at_once, panels = whole.price(pool, whole.shape_of)
    halves = KeyUnits(model, cluster, pool, space.stack, space.recompute, search_module.DEFAULT)
    cut = np.arange(len(pool)) % 3 == 0
    parts = [halves.price(pool.select(rows), halves.shape_of[rows])[0] for rows in (cut, ~cut)]
    assert halves.priced == whole.priced
    again, again_panels = whole.price(pool, whole.shape_of)
    assert whole.priced == halves.priced
    for rc in space.recompute:
        assert np.array_equal(again[rc].layer.total, at_once[rc].layer.total)
        assert np.array_equal(again_panels[rc], panels[rc])
        for rows, part in zip((cut, ~cut), parts, strict=True):
            for name in ("layer", "embed", "head", "p2p"):
                assert np.array_equal(getattr(part[rc], name).total, getattr(at_once[rc], name).total[rows])


def test_units_are_priced_only_for_keys_that_can_reach_the_top_k(monkeypatch):
    """The collectives of a unit key are priced only when one of its plans' lower bound can still reach the
    k-th best time: on this MoE space four in ten keys never are, and the search still equals estimate() on its best."""
    made = []

    class Recorded(KeyUnits):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(search_module, "KeyUnits", Recorded)
    model, cluster = load_model("mixtral-8x7b").with_seq_length(2048), load_system("h100").cluster(32)
    space = Space(global_batch=64, zero=(1,), recompute=("none", "full"), offload_optimizer=(False,),
                  offload_activations=(False,), layouts=("1d",), sequence_parallel=(True,))
    result = search(model, cluster, space, top_k=3)
    columns, _ = candidates(model, cluster, space)
    columns.pop("layout")
    plans = PlanBatch(**columns, placements=PLACEMENTS, **space.settings).select(
        columns["tp"] > 1, sequence_parallel=True)
    every = len(unit_keys(model, cluster, plans)[0])
    priced = sum(u.priced for u in made)
    assert made and 0 < priced < 0.7 * every  # 3,255 of 5,324
    assert result.plans[0].step_time == pytest.approx(estimate(model, cluster, result.plans[0].plan).step_time)
    assert result.bounded > 0


def test_equally_fast_plans_are_kept_by_the_smaller_memory():
    """search._Best.offer with k = 1: of two plans with the best time, the one with the smaller peak stays (the
    ranking's tie-break), whichever comes first in the chunk."""
    best = search_module._Best(1)
    plans = [Plan(dp=1, tp=t, pp=1, micro_batch=1, global_batch=8) for t in (1, 2, 4)]
    best.offer(np.array([1.0, 1.0, 2.0]), np.array([50.0, 30.0, 10.0]), lambda i: plans[i])
    assert [(r[0], r[1]) for r in best.rows] == [(1.0, 30.0)] and best.rows[0][2][1] == plans[1]
    assert best.threshold == 1.0
    # in a search: Llama-3-70B on 288 GB200s has equally fast plans with and without offloaded activations (hidden);
    # the best of one is the best of five, the lighter one (31.0 GB, not 52.4 GB)
    model, cluster = load_model("llama3-70b").with_seq_length(8192), load_system("gb200").cluster(288)
    one, five = (search(model, cluster, Space(global_batch=256), top_k=k, workers=1) for k in (1, 5))
    tied = [e for e in five.plans if e.step_time == five.plans[0].step_time]
    assert len(tied) > 1 and one.plans[0].peak_memory == min(e.peak_memory for e in tied)


def test_returned_plans_are_feasible_and_sorted(small_case):
    _, _, result = small_case
    assert all(e.fits for e in result.plans)
    times = [e.step_time for e in result.plans]
    assert times == sorted(times)


def test_every_rejection_has_a_reason_and_an_example(small_case):
    _, _, result = small_case
    assert result.rejected and all(result.examples.get(reason) for reason in result.rejected)


def test_the_memory_example_is_the_plan_nearest_to_fitting():
    """Of the plans that do not fit, the example shown is the one with the smallest peak: what it would take."""
    model, cluster = load_model("llama3-70b").with_seq_length(2048), load_system("h100").cluster(4)
    result = search(model, cluster, SMALL, top_k=1)
    estimates = [estimate(model, cluster, plan) for group in every_plan(model, cluster, SMALL) for plan in group]
    least = min(e.peak_memory for e in estimates if not e.fits)
    capacity = cluster.accelerator.hbm_bytes
    assert result.examples["memory exceeds HBM"].endswith(f"{fmt_bytes(least)} > {fmt_bytes(capacity)}")


def test_the_host_memory_example_is_the_plan_nearest_to_fitting():
    """Of the plans that fit in HBM only by offloading more than the host holds, the example shown is the one
    that offloads least: as for HBM, what it would take (the same plan whichever block of the search met it)."""
    model = load_model("llama3-8b").with_seq_length(2048)
    cluster = load_system("h100").cluster(8, host_memory=20e9)
    space = replace(SMALL, offload_optimizer=(False, True))
    result = search(model, cluster, space, top_k=1)
    # one estimate per plan: memory and offload do not depend on the SUMMA panel count
    estimates = [estimate(model, cluster, group[0]) for group in every_plan(model, cluster, space)]
    over = [e for e in estimates if e.peak_memory <= cluster.accelerator.hbm_bytes
            and e.host_memory > cluster.host_memory]
    assert over and result.rejected["offload exceeds host memory"] == len(over)
    least = min(e.host_memory for e in over)
    expected = f"{fmt_bytes(least)} > {fmt_bytes(cluster.host_memory)}"
    assert result.examples["offload exceeds host memory"].endswith(expected)


def test_ranking_is_deterministic(small_case):
    model, cluster, result = small_case
    again = search(model, cluster, SMALL, top_k=5)
    assert [e.plan for e in again.plans] == [e.plan for e in result.plans]


def test_structural_rejections_are_counted():
    model = load_model("llama3-70b")  # 64 heads: tp=3 is impossible
    result = search(model, load_system("h100").cluster(24), Space(global_batch=24, zero=(1,), recompute=("full",),
                                                                   offload_optimizer=(False,),
                                                                   offload_activations=(False,)))
    assert result.rejected["tp does not divide num_heads"] > 0
    assert "tp=3 does not divide num_heads=64" in result.examples["tp does not divide num_heads"]


def test_placement_decides_what_shares_nvlink():
    """With tp inside the NVLink domain the best plan is faster than with tp forced across nodes."""
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(64)
    space = Space(global_batch=64, zero=(1,), recompute=("selective",), offload_optimizer=(False,),
                  offload_activations=(False,))
    best = search(model, cluster, space, top_k=1).plans[0]
    assert best.plan.stride("tp") * best.plan.tp <= cluster.nvlink_domain or best.plan.tp == 1


def test_no_feasible_plan_is_a_result():
    result = search(load_model("llama3.1-405b"), load_system("h100").cluster(8),
                    Space(global_batch=8, zero=(0,), recompute=("none",), offload_optimizer=(False,),
                          offload_activations=(False,)))
    assert result.plans == () and result.rejected["memory exceeds HBM"] == result.evaluated


def test_cli_plan_json(capsys):
    code = main(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "16", "--global-batch", "64",
                 "--top", "3", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert len(data["plans"]) == 3 and data["evaluated"] > 1000 and data["seconds"] > 0
    assert data["rejected"]["count"] >= 0 and isinstance(data["rejected"]["reasons"], dict)
    for key in ("step_time_s", "tokens_per_s", "mfu", "peak_memory_bytes"):
        assert data["plans"][0][key] > 0
    assert data["plans"][0]["plan"]["dp"] * data["plans"][0]["plan"]["tp"] * data["plans"][0]["plan"]["pp"] * \
        data["plans"][0]["plan"]["cp"] == 16


def test_cli_strong_scaling_with_cost(capsys):
    code = main(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8,16", "--global-batch", "64",
                 "--tokens", "1T", "--price", "2", "--json", "--no-offload", "--recompute", "selective"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and [r["gpus"] for r in data["scaling"]] == [8, 16]
    best = data["scaling"][1]["plans"][0]
    # days = 1e12 tokens / tokens_per_s / 86400; cost = days · 24 · 16 GPUs · $2
    assert best["days"] == pytest.approx(1e12 / best["tokens_per_s"] / 86400)
    assert best["cost"] == pytest.approx(best["days"] * 24 * 16 * 2)


@pytest.mark.parametrize(("args", "message"), [
    (["--gpus", "0"], "must be positive"),
    (["--gpus", "8", "--zero", "4"], "zero='4' must be one of"),
    (["--gpus", "8", "--recompute", "half"], "recompute='half' must be one of"),
    (["--gpus", "8", "--tokens", "lots"], "tokens="),
])
def test_cli_plan_bad_input(capsys, args, message):
    code = main(["plan", "--model", "llama3-8b", "--system", "h100", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


@functools.lru_cache
def _mesh(tiers: tuple[int, int]):
    return load_system("h100").cluster(tiers[0] * tiers[1], nvlink_domain=tiers[0])


def _members(tiers: tuple[int, int], group: int, layout) -> tuple[int, ...]:
    """comm.split_group on a two-tier mesh, as integers."""
    return tuple(round(g) for g in split_group(_mesh(tiers), group, layout))


def placement_key(order: tuple[str, ...], sizes: dict[str, int], tiers: tuple[int, ...],
                  experts: tuple[tuple[int, int], ...] = ()) -> tuple:
    """The scalar reference for search._placements_many: everything a placement changes in the cost model, the
    tier split of each collective's group (tp, tp2, cp, the pipeline neighbours, the dp·cp gradient group and,
    for an MoE model's ``experts`` (ep, etp) pairs, the expert-parallel and expert-data-parallel groups;
    estimate.axis_layout)."""
    stride, strides = 1, {}
    for axis in order:
        strides[axis] = stride
        stride *= sizes[axis]
    # no sends when pp = 1
    neighbours = _members(tiers, 2, send_stride(strides["pp"], sizes["pp"])) if sizes["pp"] > 1 else ()
    dp_layout = ((sizes["cp"], strides["cp"]), (sizes["dp"], strides["dp"]))
    key = (tuple(_members(tiers, sizes[a], strides[a]) for a in ("tp", "tp2", "cp"))
           + (neighbours, _members(tiers, sizes["dp"] * sizes["cp"], dp_layout)))
    bounds = (strides["pp"], strides["pp"] * sizes["pp"])
    domain = sizes["tp"] * sizes["cp"] * sizes["dp"]
    for ep, etp in experts:
        key += (_members(tiers, ep, expert_factors(ep, etp, *bounds)),
                _members(tiers, domain // (ep * etp), expert_factors(domain // (ep * etp), ep * etp, *bounds)))
    return key


def test_deduplicated_placements_cover_every_distinct_cost():
    """The placements kept are one per distinct tier split of the groups, and no distinct split is lost."""
    import random

    from meshplan.search.run import _placements_many
    from meshplan.specs.plan import DENSE_AXES

    def _placements(sizes, tiers):
        return _placements_many(np.array([[sizes[a] for a in DENSE_AXES]], dtype=np.int64), tiers)[0]

    rng = random.Random(1)
    for tiers in ((8, 512), (4, 64), (72, 16)):
        for _ in range(150):
            sizes = {a: rng.choice([1, 1, 2, 3, 4, 8, 16]) for a in DENSE_AXES}
            kept = _placements(sizes, tiers)
            keys = [placement_key(PLACEMENTS[i], sizes, tiers) for i in kept]
            assert len(set(keys)) == len(keys)
            assert set(keys) == {placement_key(order, sizes, tiers) for order in PLACEMENTS}


def test_the_expert_groups_split_as_the_dense_key_says():
    """The placement dedupe keys on the dense groups only. That is exact for MoE models too when orders with
    equal dense keys also split every expert-parallel and expert-data-parallel group alike (their layout
    depends on where pp sits: estimate.expert_layout): checked here over random sizes, meshes and (ep, etp)."""
    import random

    from meshplan.specs.plan import DENSE_AXES

    rng = random.Random(5)
    for tiers in ((8, 512), (72, 16), (4, 64)):
        for _ in range(150):
            sizes = {a: rng.choice([1, 2, 4, 8, 16]) for a in DENSE_AXES} | {"tp2": 1}
            domain = sizes["tp"] * sizes["cp"] * sizes["dp"]
            experts = tuple((ep, etp) for ep in (1, 2, 4, 8, 16, 32) for etp in (1, sizes["tp"])
                            if domain % (ep * etp) == 0)
            full: dict[tuple, set] = {}
            for order in PLACEMENTS:
                full.setdefault(placement_key(order, sizes, tiers), set()).add(
                    placement_key(order, sizes, tiers, experts))
            assert all(len(keys) == 1 for keys in full.values()), (tiers, sizes)


def search_ranks_as_estimate(model) -> list[list]:
    """Search ``model`` on 32 H100s (a small space) and check its top 5 against estimate() of every candidate,
    one by one; return those estimates (per candidate, its variants)."""
    cluster = load_system("h100").cluster(32)
    space = Space(global_batch=32, zero=(1,), recompute=("full",), offload_optimizer=(False,),
                  offload_activations=(False,), max_micro_batch=1, layouts=("1d",), sequence_parallel=(True,))
    result = search(model, cluster, space, top_k=5)
    variants = [[estimate(model, cluster, p) for p in options] for options in every_plan(model, cluster, space)]
    assert len(variants) == result.evaluated
    feasible = sorted(min(e.step_time for e in v) for v in variants if v[0].fits)
    assert [e.step_time for e in result.plans] == pytest.approx(feasible[:5], rel=1e-9)
    return variants


def test_search_equals_estimate_for_experts_under_the_pipeline():
    """Mixtral on 32 H100s: among the candidates are expert groups that step over a pipeline placed inside
    them. The batched search (its placement dedupe and its keyed units) must price each as estimate() does."""
    variants = search_ranks_as_estimate(load_model("mixtral-8x7b").with_seq_length(2048))
    assert any(e.plan.ep > 1 and e.plan.pp > 1 and e.plan.stride("pp") < e.plan.tp * e.plan.cp * e.plan.dp
               for v in variants for e in v)


def test_search_equals_estimate_for_windowed_attention_and_megatrons_expert_kernels():
    """GPT-OSS-20B: half its layers in a 128-key sliding window (two attention records per layer), its experts
    biased and its GLU clamped (Megatron-Core's eager kernels around the per-expert GEMMs)."""
    model = load_model("gpt-oss-20b").with_seq_length(2048)
    assert model.window_share == 0.5 and model.glu_clamp
    search_ranks_as_estimate(model)


def test_search_equals_estimate_with_recompute_modules_and_mtp():
    """Plan.recompute_modules and a multi-token-prediction depth change the per-key units (the recomputed modules'
    kernels and frees, the last stage's head with its MTP layer): the batched search must price every candidate as
    estimate() does, in what fits and in the top plans' step times, under full recompute too (which checkpoints the
    MTP layer)."""
    model = replace(load_model("mixtral-8x7b"), mtp_layers=1).with_seq_length(2048)
    cluster = load_system("h100").cluster(16)
    space = Space(global_batch=16, zero=(1,), recompute=("selective", "full"), recompute_modules=("moe", "layernorm"),
                  offload_optimizer=(False,), offload_activations=(False,), max_micro_batch=1, layouts=("1d",),
                  sequence_parallel=(True,))
    result = search(model, cluster, space, top_k=5)
    variants = [[estimate(model, cluster, p) for p in options] for options in every_plan(model, cluster, space)]
    assert len(variants) == result.evaluated
    fits = [v[0] for v in variants if v[0].fits]
    assert len(fits) == result.feasible
    assert [e.step_time for e in result.plans] == pytest.approx(sorted(e.step_time for e in fits)[:5], rel=1e-9)
    assert {e.plan.recompute_modules for e in fits} == {("moe", "layernorm")}


def test_placement_of_a_size_one_axis_changes_nothing():
    """dp = 1: where dp sits in the order does not change the gradient-reduction group over cp."""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(16)
    a = estimate(model, cluster, Plan(tp=4, cp=4, dp=1, global_batch=4, placement=("tp", "tp2", "cp", "dp", "pp")))
    b = estimate(model, cluster, Plan(tp=4, cp=4, dp=1, global_batch=4, placement=("dp", "tp", "tp2", "cp", "pp")))
    assert a.step_time == b.step_time


def test_offload_is_limited_by_host_memory():
    """Offloading 64,800-token activations of vit_era5 would need terabytes of host memory per GPU."""
    model, cluster = load_model("vit-era5"), load_system("a100").cluster(1024)
    plan = Plan(dp=1024, global_batch=1024, zero=3, offload_activations=True)
    est = estimate(model, cluster, plan)
    assert not est.fits and any("host memory" in r for r in est.reasons)
    result = search(model, cluster, Space(global_batch=1024, layouts=("1d",), recompute=("none",), zero=(3,),
                                          offload_optimizer=(False,), offload_activations=(True,), cp_max=1,
                                          sequence_parallel=(False,)))
    assert result.rejected.get("offload exceeds host memory", 0) > 0


def test_gpipe_never_beats_1f1b(small_case):
    """GPipe plans are counted as dominated by default; evaluating them does not change the best plan."""
    model, cluster, result = small_case
    with_gpipe = search(model, cluster, replace(SMALL, gpipe=True), top_k=1)
    assert with_gpipe.plans[0].step_time == result.plans[0].step_time
    assert with_gpipe.evaluated - result.evaluated == result.rejected["dominated: GPipe (1F1B has its step time "
                                                                      "with less memory)"]


INTERLEAVE_REJECTED = "interleaved: pp does not divide the micro-batches"


@pytest.mark.parametrize("name, gpus", [("llama3-8b", 64), ("mixtral-8x7b", 32)])
def test_plan_count_is_what_the_search_evaluates_or_rejects_for_interleaving(name, gpus):
    """The space's size, counted before any plan is built, is the plans the search evaluates plus the
    interleaved ones it rejects because pp does not divide their micro-batches (both count every placement)."""
    model, cluster = load_model(name), load_system("h100").cluster(gpus)
    space = Space(global_batch=64, offload_optimizer=(False,))
    result = search(model, cluster, space, top_k=1, workers=1)
    combos, _ = search_module._combos(model, cluster, space)
    count = search_module.plan_count(combos, cluster, space)
    assert count == result.evaluated + result.rejected.get(INTERLEAVE_REJECTED, 0)
    every_order = sum(c.mult * search_module._weight(c) for c in combos) * len(PLACEMENTS)
    assert count < every_order  # distinct placements are counted, not every axis order


def test_a_space_beyond_max_plans_is_refused_with_its_size(capsys):
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(64)
    combos, _ = search_module._combos(model, cluster, SMALL)
    count = search_module.plan_count(combos, cluster, SMALL)
    search(model, cluster, replace(SMALL, max_plans=count), top_k=1)  # exactly at the limit: searched
    with pytest.raises(SpecError, match=f"holds {count:,} plans, more than max-plans={count - 1:,}: narrow it"):
        search(model, cluster, replace(SMALL, max_plans=count - 1), top_k=1)
    code = main(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "64", "--max-plans", "1000"])
    err = capsys.readouterr().err
    assert code == 2 and "more than max-plans=1,000" in err and err.count("\n") == 1


def test_two_workers_find_what_one_finds():
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(64)
    space = Space(global_batch=64, offload_optimizer=(False,), offload_activations=(False,))
    one = search(model, cluster, space, top_k=5, workers=1)
    two = search(model, cluster, space, top_k=5, workers=2)
    assert [e.plan for e in one.plans] == [e.plan for e in two.plans]
    assert (one.evaluated, one.feasible, one.rejected) == (two.evaluated, two.feasible, two.rejected)


def test_distinct_keys_survive_int64_overflow():
    """Five columns of values up to 2^20 pack into 2^100 > int64: the code is renumbered instead."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**20, size=(5, 40))
    keys = np.concatenate([base, base[:, :10]], axis=1)  # rows 40..49 repeat rows 0..9
    first, inverse = distinct(keys)
    assert len(first) == len({tuple(c) for c in base.T}) == 40
    assert (keys[:, first][:, inverse] == keys).all()  # every row maps back to its own key
    assert (inverse[40:] == inverse[:10]).all()


def test_loss_workspace_of_a_batch_equals_each_plans():
    """The loss workspace depends on tp (DTensor loss_parallel): over a PlanBatch it must not branch on it."""
    from meshplan.memory import loss_workspace

    model = load_model("llama3-8b").with_seq_length(2048)
    plans = [Plan(dp=8, tp=1, global_batch=8), Plan(dp=4, tp=2, sequence_parallel=True, global_batch=8)]
    pytorch_loss = Stack(cross_entropy="pytorch")
    batch = PlanBatch.of([replace(p, sequence_parallel=True) for p in plans])
    one_by_one = [loss_workspace(model, replace(p, sequence_parallel=True), pytorch_loss) for p in plans]
    assert np.allclose(loss_workspace(model, batch, pytorch_loss), one_by_one)
    assert one_by_one == [2048 * 128256 * 8, 2048 * 128256 / 2 * 12]


def test_search_equals_estimate_when_the_pipeline_crosses_servers():
    """Llama-3-70B on 32 H100s with tp = 2, pp = 4: a pipeline 4 ranks apart spans two servers, so one of its sends
    crosses InfiniBand and paces the stages (estimate.send_stride). The batched search must price it so: ranking
    such a pipeline as if every send stayed on NVLink (one pair 4 ranks apart) put it ahead of faster plans."""
    variants = search_ranks_as_estimate(load_model("llama3-70b").with_seq_length(2048))
    spanning = [e for v in variants for e in v if e.plan.pp > 2 and e.plan.stride("pp") * e.plan.pp > 8]
    assert any(e.plan.stride("pp") < 8 for e in spanning)  # pairs of neighbours inside a server, chain across two
