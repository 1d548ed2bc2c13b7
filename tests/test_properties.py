"""Physics where nature is monotone, over seeded random (model, system, plan) triples (draws.py).

Each property is checked on at least 500 valid triples (the same 500 for every estimate property, drawn once):
- more of any rate (dense FLOP/s of every precision or of the one that runs, HBM, each mesh tier's bandwidth, the
  host link) never lengthens the step; more latency on any tier, or more fixed time per kernel (the GEMM and the
  other kernels' overheads, roofline.overhead), never shortens it; a fifth of the systems are on three tiers;
- more host time per launched kernel (``Stack.host_dispatch``) or per compiled region (``Stack.region_host``) never
  shortens the step, host time per parameter tensor per step (``Stack.tensor_host``) and the training loop's per
  micro-batch and per step (``Stack.microbatch_host``, ``Stack.iteration_host``) lengthen it, and a
  CUDA-graphed stack is never slower than its eager twin;
- the estimate is deterministic; MFU and HFU are at most 1; every number of the Estimate and of its JSON is finite;
  no memory or time component is negative;
- the top plan of a search re-estimates to the same step time, fits, and is no slower than any fitting candidate
  drawn from the same space (``test_search.py`` compares a search with every candidate on a few fixed spaces).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from draws import draw_count, draw_model, draw_stack, draw_system, draw_triple
from meshplan.cost.wrappers import wrapped
from meshplan.estimate import Estimate, estimate
from meshplan.search import Space, search
from meshplan.search.batch import PlanBatch
from meshplan.search.candidates import candidates
from meshplan.search.keyed import panel_counts
from meshplan.search.placements import PLACEMENTS
from meshplan.specs.hardware import Cluster
from meshplan.specs.plan import LAYOUTS
from meshplan.specs.stack import PIPELINE_RUNTIMES
from meshplan.specs.supports import Supports

TRIPLES = 500
SEARCHES = 500
RATE_FACTORS = (1.1, 2.0, 10.0)
LATENCY_FACTORS = (2.0, 100.0)
RTOL = 1e-9  # float64 sums in another order


@cache
def triples() -> list:
    rng = random.Random(34)
    return [draw_triple(rng) for _ in range(TRIPLES)]


@cache
def drawn(i: int) -> Estimate:
    """Triple ``i``'s estimate as drawn: the rate and latency properties compare each variant with it at every factor,
    so it is estimated once per process: estimate() is a pure function of its frozen arguments
    (test_estimates_are_deterministic_finite_non_negative_and_below_peak estimates each afresh and compares it with
    this one, made earlier in the process: 500 of them, about 24 MB)."""
    return estimate(*triples()[i])


def as_drawn(i: int) -> tuple[float, bool]:
    """Triple ``i``'s step time and whether it fits, as drawn."""
    est = drawn(i)
    return est.step_time, est.fits


def with_rate(cluster: Cluster, rate: str, factor: float, precision: str) -> Cluster:
    """``cluster`` with one rate multiplied by ``factor`` (``tier<i>``: that tier's bandwidth)."""
    acc = cluster.accelerator
    if rate == "flops":
        return replace(cluster, accelerator=replace(acc, peak_flops={k: v * factor for k, v in acc.peak_flops.items()}))
    if rate == "flops_run":  # only the precision the plan's GEMMs run in (fp16 priced as bf16 where it has none)
        key = precision if precision in acc.peak_flops else "bf16"
        peaks = acc.peak_flops | {key: acc.peak_flops[key] * factor}
        return replace(cluster, accelerator=replace(acc, peak_flops=peaks))
    if rate == "hbm":
        return replace(cluster, accelerator=replace(acc, hbm_bandwidth=acc.hbm_bandwidth * factor))
    if rate == "host":
        return replace(cluster, host_bandwidth=cluster.host_bandwidth * factor)
    i = int(rate.removeprefix("tier"))
    tiers = list(cluster.tiers)
    tiers[i] = replace(tiers[i], bandwidth=tiers[i].bandwidth * factor)
    return replace(cluster, tiers=tuple(tiers))


def with_latency(cluster: Cluster, latency: str, factor: float) -> Cluster:
    """``cluster`` with one latency multiplied by ``factor`` (5 µs where it was 0): ``tier<i>``'s α, or a per-kernel
    overhead of the accelerator (``gemm_overhead``, ``kernel_overhead``)."""
    if not latency.startswith("tier"):
        acc, old = cluster.accelerator, getattr(cluster.accelerator, latency)
        return replace(cluster, accelerator=replace(acc, **{latency: old * factor if old else 5e-6}))
    i = int(latency.removeprefix("tier"))
    tiers = list(cluster.tiers)
    tiers[i] = replace(tiers[i], latency=tiers[i].latency * factor if tiers[i].latency else 5e-6)
    return replace(cluster, tiers=tuple(tiers))


def rates(cluster: Cluster) -> list[str]:
    return ["flops", "flops_run", "hbm", "host", *(f"tier{i}" for i in range(len(cluster.tiers)))]


def latencies(cluster: Cluster) -> list[str]:
    return [*(f"tier{i}" for i in range(len(cluster.tiers))), "gemm_overhead", "kernel_overhead"]


def comparisons() -> int:
    """The estimates the rate and latency properties compare with their base: every rate and latency of every triple
    (a three-tier mesh has one of each more) at every factor."""
    return sum(len(rates(c)) * len(RATE_FACTORS) + len(latencies(c)) * len(LATENCY_FACTORS) for _, c, _, _ in triples())


def numbers(value, path: str = ""):
    """Every number in a nest of dicts, lists and tuples, with where it is."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from numbers(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from numbers(v, f"{path}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, value


def test_the_draws_cover_every_axis_and_option():
    """The 500 triples hold every parallel axis, layout, schedule, recompute, ZeRO stage and precision."""
    plans = [p for _, _, p, _ in triples()]
    assert len(plans) >= 500
    for axis in ("tp", "pp", "cp", "ep", "tp2", "vpp"):
        assert sum(getattr(p, axis) > 1 for p in plans) >= 10, axis
    for name, values in (("zero", (0, 1, 2, 3)), ("recompute", ("none", "selective", "full")),
                         ("schedule", ("gpipe", "1f1b", "interleaved")), ("tensor_layout", ("1d", "summa")),
                         ("precision", ("bf16", "fp16", "fp8"))):
        assert {getattr(p, name) for p in plans} >= set(values), name
    assert sum(len(c.tiers) > 1 and c.tiers[1].size > 1 for _, c, _, _ in triples()) >= 100  # beyond one domain
    assert sum(len(c.tiers) > 2 and c.tiers[2].size > 1 for _, c, _, _ in triples()) >= 30  # across three tiers
    assert sum(c.accelerator.gemm_overhead > 0 for _, c, _, _ in triples()) >= 30  # with per-kernel overheads
    stacks = [s for _, _, _, s in triples()]
    for name in ("fusion", "fsdp", "pipeline_runtime", "cross_entropy", "attention_kernel", "cp_comm", "projections",
                 "moe_permute", "moe_dispatcher"):
        assert len({getattr(s, name) for s in stacks}) > 1, name
    assert {s.pipeline_runtime for s in stacks} == set(PIPELINE_RUNTIMES)
    assert sum(s.pipeline_runtime_mode.sends_whole and p.pp > 1 and p.tp > 1 and not p.sequence_parallel and
               p.tensor_layout == "1d" for _, _, p, s in triples()) >= 3  # whole sends of a replicated tensor
    for name in ("overlap_tp", "overlap_pp", "overlap_ep", "flash_attention", "varlen_attention", "qkv_concat",
                 "blocking_launches"):
        assert {getattr(s, name) for s in stacks} == {False, True}, name
    assert sum(not as_drawn(i)[1] for i in range(100)) >= 5  # plans that do not fit


@pytest.mark.parametrize("factor", RATE_FACTORS)
def test_more_of_any_rate_never_lengthens_a_step(factor):
    """Issue 34's repro (Llama-3-8B, ZeRO-3 + activation offload, 2x the FLOP/s: 12.05 -> 13.30 s) is one of these."""
    worse = []
    for i, (model, cluster, plan, stack) in enumerate(triples()):
        step = as_drawn(i)[0]
        for rate in rates(cluster):
            faster = estimate(model, with_rate(cluster, rate, factor, plan.precision), plan, stack).step_time
            if faster > step * (1 + RTOL):
                worse.append(f"{model.name} {cluster.name}x{cluster.num_gpus} {plan.describe()}: {rate} x{factor} "
                             f"{step:.6g} -> {faster:.6g} s")
    assert not worse, f"{len(worse)} slower: " + "; ".join(worse[:5])


@pytest.mark.parametrize("factor", LATENCY_FACTORS)
def test_more_latency_never_shortens_a_step(factor):
    shorter = []
    for i, (model, cluster, plan, stack) in enumerate(triples()):
        step = as_drawn(i)[0]
        for latency in latencies(cluster):
            slower = estimate(model, with_latency(cluster, latency, factor), plan, stack).step_time
            if slower < step * (1 - RTOL):
                shorter.append(f"{model.name} {cluster.name}x{cluster.num_gpus} {plan.describe()}: {latency} "
                               f"x{factor} {step:.6g} -> {slower:.6g} s")
    assert not shorter, f"{len(shorter)} faster: " + "; ".join(shorter[:5])


HOST_FACTORS = (2.0, 100.0)


def host_stacks(stack, plan) -> tuple:
    """The host property's stacks for a triple: eager at 15 µs per launched kernel (or its own, if more); that with a
    torch.compile region per layer and pass; that with the wrapper the plan runs (cost/wrappers.py) stated, to state
    more per tensor against (a stated wrapper drops its per-micro-batch work, cost/wrapper_work.py); that wrapper."""
    eager = stack.with_(host_dispatch=max(stack.host_dispatch, 15e-6), cuda_graphs=False)
    compiled = eager.with_(compiled=True, region_host=0.29e-3)
    own = wrapped(eager, plan)
    stated = eager.with_(optimizer_wrapper="stated", tensor_host=own.tensor_host, tensor_sharded=own.tensor_sharded)
    return eager, compiled, stated, own


@cache
def host_bases(i: int) -> tuple[float, float, float, float]:
    """Triple ``i``'s step time eager, CUDA-graphed, compiled and with its wrapper stated: what the host property
    compares with at every factor, estimated once per process (as ``as_drawn``)."""
    model, cluster, plan, stack = triples()[i]
    eager, compiled, stated, _ = host_stacks(stack, plan)
    graphed = eager.with_(cuda_graphs=True)
    return tuple(estimate(model, cluster, plan, s).step_time for s in (eager, graphed, compiled, stated))


@pytest.mark.parametrize("factor", HOST_FACTORS)
def test_more_host_cost_never_shortens_a_step_and_cuda_graphs_never_slow_one(factor):
    """The host as a resource (step/passes.py): each triple's stack at 15 µs per launched kernel (or its own,
    if more) and at ``factor`` × that; and each against its CUDA-graphed twin. At ×100 (1.5 ms a kernel) most
    steps are host-bound, so the comparisons bite."""
    shorter, slower, bound, longer = [], [], 0, 0
    for i, (model, cluster, plan, stack) in enumerate(triples()[:TRIPLES // 2]):
        eager, compiled, stated, own = host_stacks(stack, plan)
        base, graphed, region, stated_base = host_bases(i)
        more = estimate(model, cluster, plan, eager.with_(host_dispatch=eager.host_dispatch * factor)).step_time
        more_region = estimate(model, cluster, plan, compiled.with_(region_host=0.29e-3 * factor)).step_time
        extra = stated.with_(tensor_host=own.tensor_host + 5e-6 * factor)
        tensors = estimate(model, cluster, plan, extra).step_time
        # the training loop's host work: per micro-batch and rank at x2, per step at x100 (each on 250 triples)
        loop = (eager.with_(microbatch_host=eager.microbatch_host + 50e-6) if factor < 10
                else eager.with_(iteration_host=eager.iteration_host + 50e-6))
        looped = estimate(model, cluster, plan, loop).step_time
        where = f"{model.name} {cluster.name}x{cluster.num_gpus} {plan.describe()} {stack.describe()}"
        if more < base * (1 - RTOL):
            shorter.append(f"{where}: host x{factor} {base:.6g} -> {more:.6g} s")
        if graphed > base * (1 + RTOL):
            slower.append(f"{where}: graphed {base:.6g} -> {graphed:.6g} s")
        if more_region < region * (1 - RTOL):
            shorter.append(f"{where}: region host x{factor} {region:.6g} -> {more_region:.6g} s")
        if not tensors > stated_base:  # the per-parameter loops add host time to every step (step/host.step_host)
            shorter.append(f"{where}: tensor host +{5e-6 * factor:.3g} s {stated_base:.6g} -> {tensors:.6g} s")
        longer += looped > base  # behind a synchronisation: no queued GPU work hides it (step/stages.loop_times)
        if looped < base * (1 - RTOL):
            shorter.append(f"{where}: loop host {loop.microbatch_host:.3g} / {loop.iteration_host:.3g} s "
                           f"{base:.6g} -> {looped:.6g} s")
        bound += more > base * (1 + 1e-6)
    assert not shorter, f"{len(shorter)} faster: " + "; ".join(shorter[:5])
    assert not slower, f"{len(slower)} slower with CUDA graphs: " + "; ".join(slower[:5])
    assert bound >= (100 if factor > 10 else 1), bound  # the host term binds: the test can fail
    # the loop's host work lengthens nearly every step (not one whose data-parallel traffic outlasts its passes)
    assert longer >= 0.9 * len(triples()[:TRIPLES // 2]), longer


def test_estimates_are_deterministic_finite_non_negative_and_below_peak():
    for i, (model, cluster, plan, stack) in enumerate(triples()):
        est = drawn(i)  # the first estimate, as the properties above used it (or made here, where they did not run)
        where = f"{model.name} {cluster.name}x{cluster.num_gpus} {plan.describe()} {stack.describe()}"
        data = est.to_dict()
        again = estimate(model, cluster, plan, stack).to_dict()
        assert json.dumps(again, sort_keys=True) == json.dumps(data, sort_keys=True)
        json.dumps(data, allow_nan=False)  # raises on NaN or infinity
        for path, value in numbers(data):
            assert math.isfinite(value), (where, path, value)
        assert est.step_time > 0, where
        assert 0 < est.mfu <= est.hfu <= 1 + 1e-12, (where, est.mfu, est.hfu)
        for name, value in (*est.breakdown.items(), *est.memory.items()):
            assert value >= 0, (where, name, value)
        assert est.peak_memory > 0 and est.host_memory >= 0 and min(est.rank_memory) >= 0, where
        for row in est.ops:
            assert row.seconds >= 0 and row.flops >= 0 and row.nbytes >= 0, (where, row.name)


# ---- the search --------------------------------------------------------------------------------------------------
def draw_space(rng: random.Random, model, cluster: Cluster) -> Space:
    """A random narrowing of the search space (each option a random non-empty subset), small enough to be quick."""
    def some(values):
        return tuple(rng.sample(values, rng.randint(1, min(2, len(values)))))
    peaks = cluster.accelerator.peak_flops
    precision = rng.choice([p for p in ("bf16", "fp16", "fp8") if p in peaks or (p == "fp16" and "bf16" in peaks)])
    stack = draw_stack(rng, model, precision)
    zeros = (0, 1, 2, 3) if stack.fsdp == "none" else (0, 2, 3)  # FSDP has no ZeRO-1
    recomputes = ("none", "selective") if stack.overlap_ep else ("none", "selective", "full")  # combined 1F1B
    if model.mtp_layers > 1:
        stack = stack.with_(overlap_ep=False)
    if model.is_hybrid:  # costed with fused kernels only
        stack = stack.with_(fusion="fused")
    stack = stack.with_(supports=Supports())  # the whole space; what each framework runs: tests/test_supports.py
    return Space(global_batch=rng.choice((8, 16, 32, 64)) * max(1, cluster.num_gpus // 8), zero=some(zeros),
                 recompute=some(recomputes), sequence_parallel=some((False, True)),
                 layouts=some(("1d", "summa")), offload_optimizer=(rng.random() < 0.2,),
                 offload_activations=(rng.random() < 0.2,), all_placements=rng.random() < 0.3,
                 max_micro_batch=rng.choice((1, 2, 4)), gpipe=rng.random() < 0.2, precision=precision,
                 stack=stack, headroom=0.0, prefer_simple=False)  # every plan that fits, ranked by time alone


def searches() -> list:
    rng = random.Random(3434)
    out = []
    while len(out) < SEARCHES:
        model, system = draw_model(rng), draw_system(rng)
        if model.num_layers * model.hidden_size > 200 * 8192:  # keep each search quick
            continue
        n = draw_count(rng, system.network.nvlink_domain)
        n = min(n, 64) if n <= system.network.nvlink_domain else n
        if n > 256:
            continue
        cluster = system.cluster(n)
        out.append((model, cluster, draw_space(rng, model, cluster), rng.randrange(2**31)))
    return out


def test_the_top_plan_of_a_search_re_estimates_the_same_and_fits():
    found = 0
    for model, cluster, space, seed in searches():
        result = search(model, cluster, space, top_k=3, workers=1)
        times = [e.step_time for e in result.plans]
        assert times == sorted(times)
        if not result.plans:
            assert result.feasible == 0 and result.rejected_total >= result.evaluated
            continue
        found += 1
        top = result.plans[0]
        again = estimate(model, cluster, top.plan, space.stack)
        assert again.step_time == top.step_time and again.fits and top.fits
        # no fitting candidate drawn from the space is faster (the search ranks in float32, then re-estimates)
        pick = random.Random(seed)
        for plan in sample_candidates(model, cluster, space, pick, 3):
            est = estimate(model, cluster, plan, space.stack)
            if est.fits:
                assert est.step_time >= top.step_time * (1 - 1e-6), (model.name, plan.describe(), top.plan.describe())
    assert found >= SEARCHES // 2


def sample_candidates(model, cluster, space: Space, rng: random.Random, k: int) -> list:
    """``k`` candidates of ``space`` drawn at random, each with a random choice of the space's settings (what
    test_search.every_plan enumerates in full)."""
    columns, _ = candidates(model, cluster, space)
    if not columns:
        return []
    layouts = columns.pop("layout")
    base = PlanBatch(**columns, placements=PLACEMENTS, **space.settings)
    out = []
    for i in rng.sample(range(len(base)), min(k, len(base))):
        plan = replace(base.plan(i), tensor_layout=LAYOUTS[layouts[i]])
        summa = plan.tensor_layout == "summa"
        schedules = ["1f1b"] if plan.vpp == 1 else ["interleaved"]
        schedules += ["gpipe"] if space.gpipe and plan.vpp == 1 and plan.pp > 1 else []
        sps = [sp for sp in space.sequence_parallel if (plan.tp > 1 and not summa) or not sp]
        panels = panel_counts(model.hidden_size, plan.tp, plan.tp2) if summa else [plan.summa_panels]
        if not sps:  # sequence parallelism asked for, and this candidate has no tensor parallelism: not a plan
            continue
        out.append(replace(plan, schedule=rng.choice(schedules), sequence_parallel=rng.choice(sps),
                           recompute=rng.choice(space.recompute), zero=rng.choice(space.zero),
                           offload_optimizer=rng.choice(space.offload_optimizer),
                           offload_activations=rng.choice(space.offload_activations), summa_panels=rng.choice(panels)))
    return out


def test_the_readme_states_these_counts():
    """The README's Reliability section quotes these counts; line breaks in it do not matter."""
    from test_fuzz import CASES, FUZZED_LAYERS

    text = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    count = comparisons()
    rate_text = ", ".join(f"×{f:g}" for f in RATE_FACTORS)
    latency_text = ", ".join(f"×{f:g}" for f in LATENCY_FACTORS)
    fuzz = (f"({CASES['estimate']} `estimate`, {CASES['plan']} `plan` and {CASES['serve']} `serve` command lines, "
            f"{CASES['model']} mutated model, {CASES['system']} system and {CASES['engine']} engine TOML files, "
            f"{CASES['hf']} Hugging Face configs at {FUZZED_LAYERS} layers, {CASES['record']} validation records)")
    for figure in (f"draws {TRIPLES} seeded", f"{count:,} comparisons", f"{SEARCHES} random narrowed",
                   f"runs {sum(CASES.values()):,} seeded", f"link; {rate_text})", f"per kernel ({latency_text})", fuzz):
        assert figure in text, figure
