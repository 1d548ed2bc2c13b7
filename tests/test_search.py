"""The search: exhaustive, exact (same best plan as estimate() on every candidate), reasons, determinism."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from meshplan.cli import main
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.search.batch import PlanBatch
from meshplan.search.candidates import candidates
from meshplan.search.keyed import panel_counts
from meshplan.search.placements import PLACEMENTS
from meshplan.specs.hardware import Network, load_system
from meshplan.specs.mesh import TierSpec
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import LAYOUTS, Plan
from meshplan.specs.stack import Stack
from meshplan.units import fmt_bytes
from spaces import EVERY_PLAN

SMALL = Space(**EVERY_PLAN, global_batch=16, zero=(0, 3), recompute=("none", "full"), offload_optimizer=(False,),
              offload_activations=(False, True), max_micro_batch=4)


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


@pytest.fixture(scope="module")
def small_estimates(small_case) -> dict[Plan, list]:
    """estimate() of every SMALL plan on small_case's cluster (SUMMA plans at each panel count), by its first plan."""
    model, cluster, _ = small_case
    return {options[0]: [estimate(model, cluster, p, SMALL.stack) for p in options]
            for options in every_plan(model, cluster, SMALL)}


def test_search_equals_estimate_on_every_candidate(small_case, small_estimates):
    """Every plan, and for SUMMA plans every panel count (which the search optimises per plan)."""
    _, _, result = small_case
    variants = list(small_estimates.values())
    assert len(variants) == result.evaluated
    # memory does not depend on the panels (the memory-example tests below price one panel count a plan)
    assert all(len({(e.peak_memory, e.host_memory, e.fits) for e in v}) == 1 for v in variants)
    ests = [min(v, key=lambda e: e.step_time) for v in variants]
    feasible = [e for e in ests if e.fits]
    assert len(feasible) == result.feasible
    best = min(e.step_time for e in feasible)
    assert result.plans[0].step_time == pytest.approx(best, rel=1e-12)
    # the whole top k, though the lower bound (bound.lower_bound) skipped the step time of some plans
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
    assert replace(space, zero=(1, 3)).zero == (3,)  # FSDP has no ZeRO-1: the space keeps the stages it has
    with pytest.raises(SpecError, match=r"zero=1: framework generic \(fsdp=fsdp1\) runs none of them \(it runs zero=0"):
        replace(space, zero=(1,))


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
    # one estimate per plan: its SUMMA panel variants share its memory (checked on every candidate above)
    firsts = [estimate(model, cluster, options[0], torch_rt) for options in every_plan(model, cluster, space)]
    fitting = [e for e in firsts if e.fits]
    assert result.feasible == len(fitting) < len(firsts)
    # each returned plan's own estimate(): the one above where the plan is a candidate as returned (estimate() is a
    # pure function of its frozen arguments), else afresh (a plan the search refined, or another panel count)
    by_plan = {e.plan: e for e in firsts}
    for e in result.plans:
        assert e.stack.pipeline_runtime == "torch"
        again = by_plan.get(e.plan) or estimate(model, cluster, e.plan, torch_rt)
        assert e.peak_memory == pytest.approx(again.peak_memory, rel=1e-9)
    pipelined = [e for e in result.plans if e.plan.pp > 1]
    assert pipelined
    plain = estimate(model, cluster, pipelined[0].plan, Stack())
    assert pipelined[0].peak_memory > plain.peak_memory


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
    # one estimate per plan: memory does not depend on the SUMMA panel count (checked on every candidate above)
    estimates = [estimate(model, cluster, group[0], SMALL.stack) for group in every_plan(model, cluster, SMALL)]
    least = min(e.peak_memory for e in estimates if not e.fits)
    capacity = cluster.accelerator.hbm_bytes
    assert result.examples["memory exceeds HBM"].endswith(f"{fmt_bytes(least)} > {fmt_bytes(capacity)}")


def test_the_host_memory_example_is_the_plan_nearest_to_fitting(small_case, small_estimates):
    """Of the plans that fit in HBM only by offloading more than the host holds, the example shown is the one
    that offloads least: as for HBM, what it would take (the same plan whichever block of the search met it)."""
    model, eight, _ = small_case
    cluster = replace(eight, host_memory=20e9)  # load_system("h100").cluster(8, host_memory=20e9)
    space = replace(SMALL, offload_optimizer=(False, True))
    result = search(model, cluster, space, top_k=1)
    # one estimate per plan (memory and offload do not depend on the panel count). Without optimizer offload the plans
    # are SMALL's: estimate() reads the host's size only to say whether the offload fits (estimate.py); 20 show it
    shared = [(group[0], small_estimates.get(group[0])) for group in every_plan(model, cluster, space)]
    assert sum(e is not None for _, e in shared) == len(small_estimates) == len(shared) // 2
    for e, again in ((e[0], estimate(model, cluster, p, space.stack)) for p, e in [x for x in shared if x[1]][:20]):
        assert (again.peak_memory, again.host_memory) == (e.peak_memory, e.host_memory)
    estimates = [e[0] if e else estimate(model, cluster, p, space.stack) for p, e in shared]
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
    result = search(model, load_system("h100").cluster(24), Space(**EVERY_PLAN, global_batch=24, zero=(1,),
                                                                   recompute=("full",), offload_optimizer=(False,),
                                                                   offload_activations=(False,)))
    assert result.rejected["tp does not divide num_heads"] > 0
    assert "tp=3 does not divide num_heads=64" in result.examples["tp does not divide num_heads"]


def test_placement_decides_what_shares_nvlink():
    """With tp inside the NVLink domain the best plan is faster than with tp forced across nodes."""
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(64)
    space = Space(**EVERY_PLAN, global_batch=64, zero=(1,), recompute=("selective",), offload_optimizer=(False,),
                  offload_activations=(False,))
    best = search(model, cluster, space, top_k=1).plans[0]
    assert best.plan.stride("tp") * best.plan.tp <= cluster.nvlink_domain or best.plan.tp == 1


def test_no_feasible_plan_is_a_result():
    result = search(load_model("llama3.1-405b"), load_system("h100").cluster(8),
                    Space(**EVERY_PLAN, global_batch=8, zero=(0,), recompute=("none",), offload_optimizer=(False,),
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


def search_ranks_as_estimate(model) -> list[list]:
    """Search ``model`` on 32 H100s (a small space) and check its top 5 against estimate() of every candidate,
    one by one; return those estimates (per candidate, its variants)."""
    cluster = load_system("h100").cluster(32)
    space = Space(**EVERY_PLAN, global_batch=32, zero=(1,), recompute=("full",), offload_optimizer=(False,),
                  offload_activations=(False,), max_micro_batch=1, layouts=("1d",), sequence_parallel=(True,))
    result = search(model, cluster, space, top_k=5)
    variants = [[estimate(model, cluster, p, space.stack) for p in options]
                for options in every_plan(model, cluster, space)]
    assert len(variants) == result.evaluated
    feasible = sorted(min(e.step_time for e in v) for v in variants if v[0].fits)
    # the first plan refined with each pipeline rank's own recompute (search/stage_settings.py) where that is faster:
    # never slower than the best uniform candidate, and estimate() reproduces it; the others are the candidates'
    first, *rest = result.plans
    assert first.step_time <= feasible[0] * (1 + 1e-9)
    assert estimate(model, cluster, first.plan, space.stack).step_time == pytest.approx(first.step_time, rel=1e-9)
    refined = first.step_time < feasible[0] * (1 - 1e-9)  # per-rank recompute, or one N layers on every rank
    assert [e.step_time for e in (rest if refined else result.plans)] == pytest.approx(
        feasible[1:5] if refined else feasible[:5], rel=1e-9)
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
    space = Space(**EVERY_PLAN, global_batch=16, zero=(1,), recompute=("selective", "full"),
                  recompute_modules=("moe", "layernorm"), offload_optimizer=(False,), offload_activations=(False,),
                  max_micro_batch=1, layouts=("1d",), sequence_parallel=(True,))
    result = search(model, cluster, space, top_k=5)
    variants = [[estimate(model, cluster, p, space.stack) for p in options]
                for options in every_plan(model, cluster, space)]
    assert len(variants) == result.evaluated
    fits = [v[0] for v in variants if v[0].fits]
    assert len(fits) == result.feasible
    times = sorted(e.step_time for e in fits)[:5]
    # the first refined per pipeline rank (search/stage_settings.py) where faster, estimate() reproducing it
    first, *rest = result.plans
    refined = first.step_time < times[0] * (1 - 1e-9)
    assert first.step_time <= times[0] * (1 + 1e-9)
    assert estimate(model, cluster, first.plan, space.stack).step_time == pytest.approx(first.step_time, rel=1e-9)
    assert [e.step_time for e in (rest if refined else result.plans)] == pytest.approx(
        times[1:] if refined else times, rel=1e-9)
    assert {e.plan.recompute_modules for e in fits} == {("moe", "layernorm")} == {first.plan.recompute_modules}


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
    result = search(model, cluster, Space(**EVERY_PLAN, global_batch=1024, layouts=("1d",), recompute=("none",),
                                          zero=(3,), offload_optimizer=(False,), offload_activations=(True,), cp_max=1,
                                          sequence_parallel=(False,)))
    assert result.rejected.get("offload exceeds host memory", 0) > 0


def test_gpipe_never_beats_1f1b(small_case):
    """GPipe plans are counted as dominated by default; evaluating them does not change the best plan."""
    model, cluster, result = small_case
    with_gpipe = search(model, cluster, replace(SMALL, gpipe=True), top_k=1)
    assert with_gpipe.plans[0].step_time == result.plans[0].step_time
    assert with_gpipe.evaluated - result.evaluated == result.rejected["dominated: GPipe (1F1B has its step time "
                                                                      "with less memory)"]


def test_search_equals_estimate_when_the_pipeline_crosses_servers():
    """Llama-3-70B on 32 H100s with tp = 2, pp = 4: a pipeline 4 ranks apart spans two servers, so one of its sends
    crosses InfiniBand and paces the stages (groups.send_stride). The batched search must price it so: ranking
    such a pipeline as if every send stayed on NVLink (one pair 4 ranks apart) put it ahead of faster plans."""
    variants = search_ranks_as_estimate(load_model("llama3-70b").with_seq_length(2048))
    spanning = [e for v in variants for e in v if e.plan.pp > 2 and e.plan.stride("pp") * e.plan.pp > 8]
    assert any(e.plan.stride("pp") < 8 for e in spanning)  # pairs of neighbours inside a server, chain across two


def test_search_equals_estimate_on_three_tiers_with_kernel_overheads():
    """Every candidate of a small space on a 2 x 2 x 4 mesh (NVLink pairs, leaves of two, a 4:1 tapered spine) whose
    accelerator pays 8 µs per GEMM and 4 µs per other kernel (calibrated overheads, roofline.overhead): the
    vectorised search ranks as estimate() does, with every placement of the axes on the three tiers."""
    h100 = load_system("h100")
    tiers = (TierSpec(name="nvlink", size=2, latency=3e-6), TierSpec(name="leaf", size=2, bandwidth=50e9, latency=5e-6),
             TierSpec(name="spine", bandwidth=50e9, oversubscription=4, latency=8e-6))
    acc = replace(h100.accelerator, gemm_overhead=8e-6, kernel_overhead=4e-6)
    cluster = replace(h100, accelerator=acc, network=Network(tiers=tiers)).cluster(16)
    assert cluster.mesh_shape == (2, 2, 4)
    model = load_model("llama3-8b").with_seq_length(1024)
    space = replace(SMALL, all_placements=True, zero=(1,), recompute=("none",), offload_activations=(False,),
                    max_micro_batch=1)
    result = search(model, cluster, space, top_k=3)
    ests = [min((estimate(model, cluster, p, space.stack) for p in v), key=lambda e: e.step_time)
            for v in every_plan(model, cluster, space)]
    assert len(ests) == result.evaluated and len({e.plan.placement for e in ests}) > 6
    top = sorted(e.step_time for e in ests if e.fits)[: len(result.plans)]
    assert [e.step_time for e in result.plans] == pytest.approx(top, rel=1e-9)
    assert estimate(model, cluster, result.plans[0].plan, Stack()).step_time == result.plans[0].step_time
