"""Mixed clusters (issue 84 item 1): pools of different GPUs (specs/pools.py), a plan's pipeline stages or
data-parallel replicas laid on them (meshplan/derived/mixed.py) and the search over such plans (search/mixed.py). Pools
of one kind price exactly as the homogeneous cluster; a faster pool or link never slows a step; uneven layers and batch
shares balance the pools; the frameworks that run each layout are named; ``meshplan plan --system h100:32,a100:32``."""

from __future__ import annotations

import json
import random

import pytest

from meshplan.cli import main
from meshplan.derived.mixed import MixedPlan, linked, mixed_estimate, rank_pools, runners
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.search import Space
from meshplan.search.mixed import balanced_shares, mixed_search, pipelines
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.pools import GpuPool, Pools, is_pools, parse_pools
from meshplan.specs.stack import load_stack

L8 = load_model("llama3-8b")  # 32 layers
CORE, ANY = load_stack("megatron-core"), load_stack("any")
MIXED = parse_pools("h100:32,a100:32")
TWINS = parse_pools("h100:32,h100:32")
PIPE = Plan(dp=4, tp=8, pp=2, global_batch=256)
DATA = Plan(dp=8, tp=8, pp=1, global_batch=256)


def test_parse_pools_and_its_refusals(tmp_path):
    assert MIXED.num_gpus == 64 and MIXED.name == "h100:32,a100:32"
    # both pools on one fabric: a flow between them runs at the slower NICs (A100's ConnectX-6, 25 GB/s per GPU)
    assert MIXED.bandwidth == pytest.approx(25e9)
    assert is_pools("h100:32,a100:32") and not is_pools("h100")
    for bad, why in (("h100:32", "2 to 4 pools"), ("h100:x,a100:8", "preset:GPUs pairs"),
                     ("h100:12,a100:8", "multiple of its NVLink domain"), ("h999:8,a100:8", "h999")):
        with pytest.raises(SpecError, match=why):
            parse_pools(bad)
    path = tmp_path / "mixed.toml"
    path.write_text('[[pools]]\nsystem = "h200"\ngpus = 16\n[[pools]]\nsystem = "b200"\ngpus = 16\n'
                    '[link]\nbandwidth = "10 GB/s"\nlatency = "20 us"\n')
    pools = parse_pools(str(path))
    assert is_pools(str(path)) and pools.bandwidth == pytest.approx(10e9) and pools.latency == pytest.approx(20e-6)


def test_pools_of_one_kind_price_as_the_homogeneous_cluster():
    # two 32-GPU H100 pools: the pipeline's ranks each on an H100 pool, the same step as 64 H100s priced rank by rank
    cluster = load_system("h100").cluster(64)
    plan = PIPE.with_(stage_layers=(14, 18))
    one = estimate(L8, cluster, plan, CORE)
    two = mixed_estimate(L8, TWINS, MixedPlan(plan=plan, kind="pipeline", order=(0, 1), counts=(1, 1)), CORE)
    assert two.step_time == pytest.approx(one.step_time, rel=1e-9)
    assert two.stage_memory == pytest.approx(one.stage_memory, rel=1e-9)
    # replicas with equal shares: the homogeneous estimate
    data = mixed_estimate(L8, TWINS, MixedPlan(plan=DATA, kind="data", order=(0, 1), counts=(4, 4), shares=(32, 32)),
                          CORE)
    assert data.step_time == pytest.approx(estimate(L8, cluster, DATA, CORE).step_time, rel=1e-9)
    assert data.tokens_per_step == 256 * L8.seq_length


def test_an_a100_stage_paces_an_even_pipeline_and_uneven_layers_balance_it():
    even = mixed_estimate(L8, MIXED, MixedPlan(plan=PIPE, kind="pipeline", order=(0, 1), counts=(1, 1)), CORE)
    h100, a100 = even.pool_steps
    assert a100 > 2 * h100  # 16 layers on 312 TFLOP/s A100s against 16 on 989 TFLOP/s H100s
    split = mixed_estimate(L8, MIXED, MixedPlan(plan=PIPE.with_(stage_layers=(22, 10)), kind="pipeline",
                                                order=(0, 1), counts=(1, 1)), CORE)
    assert split.step_time < 0.8 * even.step_time
    assert rank_pools(split.mixed) == [0, 1]


def test_uneven_batch_shares_balance_the_replicas():
    equal = mixed_estimate(L8, MIXED, MixedPlan(plan=DATA, kind="data", order=(0, 1), counts=(4, 4),
                                                shares=(32, 32)), CORE)
    shared = mixed_estimate(L8, MIXED, MixedPlan(plan=DATA, kind="data", order=(0, 1), counts=(4, 4),
                                                 shares=(48, 16)), CORE)
    assert shared.tokens_per_step == equal.tokens_per_step  # 4·48 + 4·16 = 256 sequences either way
    assert shared.step_time < 0.75 * equal.step_time


def test_balanced_shares_solve_the_integer_split():
    # pools of 4 replicas each, a + b·m: 1 + 1·m and 1 + 3·m; 64 micro-batches: T = (64 + 4 + 4/3) / (4 + 4/3) = 13;
    # m = (12, 4): 4·12 + 4·4 = 64, both pools end at 13
    assert balanced_shares((4, 4), [(1.0, 1.0), (1.0, 3.0)], 64)[0] == (12, 4)


def test_frameworks_that_run_each_layout():
    uneven = MixedPlan(plan=DATA, kind="data", order=(0, 1), counts=(4, 4), shares=(48, 16))
    found, others = runners(uneven, CORE, L8)
    assert found == [] and "Sailor" in others and "Cephalo" in others
    equal = MixedPlan(plan=DATA, kind="data", order=(0, 1), counts=(4, 4), shares=(32, 32))
    assert "megatron-core" in runners(equal, CORE, L8)[0]
    layered = MixedPlan(plan=PIPE.with_(stage_layers=(22, 10)), kind="pipeline", order=(0, 1), counts=(1, 1))
    found, _ = runners(layered, CORE, L8)
    assert "megatron-core" in found and "torchtitan" not in found and "deepspeed" not in found


def test_refusals_name_the_problem():
    with pytest.raises(SpecError, match="do not fill the pools"):
        mixed_estimate(L8, MIXED, MixedPlan(plan=PIPE, kind="pipeline", order=(0, 1), counts=(2, 1)), CORE)
    fp8 = PIPE.with_(precision="fp8")  # the A100 has no fp8 tensor cores
    with pytest.raises(SpecError, match="fp8"):
        mixed_estimate(L8, MIXED, MixedPlan(plan=fp8, kind="pipeline", order=(0, 1), counts=(1, 1)), CORE)


@pytest.mark.parametrize("seed", range(6))
def test_property_a_faster_pool_or_link_never_slows_a_step(seed):
    rng = random.Random(8410 + seed)
    slow, fast = load_system("a100"), load_system("h100")
    n = rng.choice((16, 32))
    plan = rng.choice([Plan(dp=n // 8, tp=8, pp=2, global_batch=rng.choice((64, 128))),
                       Plan(dp=n // 4, tp=4, pp=2, global_batch=128, recompute="full")])
    layers = rng.choice(((), (18, 14), (12, 20)))
    mixed = MixedPlan(plan=plan.with_(stage_layers=layers), kind="pipeline", order=(0, 1), counts=(1, 1))
    base = Pools(pools=(GpuPool(system=fast, gpus=n), GpuPool(system=slow, gpus=n)))
    upgraded = Pools(pools=(GpuPool(system=fast, gpus=n), GpuPool(system=fast, gpus=n)))
    narrow = Pools(pools=base.pools, link_bandwidth=5e9)
    t = mixed_estimate(L8, base, mixed, CORE).step_time
    assert mixed_estimate(L8, upgraded, mixed, CORE).step_time <= t * (1 + 1e-12)
    assert mixed_estimate(L8, narrow, mixed, CORE).step_time >= t * (1 - 1e-12)
    # replicas of 8 GPUs, 128 sequences: 2 + 2 of them 48 + 16 micro-batches each, or 4 + 4 of them 24 + 8
    counts, shares = ((2, 2), (48, 16)) if n == 16 else ((4, 4), (24, 8))
    replica = MixedPlan(plan=Plan(dp=2 * n // 8, tp=8, global_batch=128), kind="data", order=(0, 1), counts=counts,
                        shares=shares)
    td = mixed_estimate(L8, base, replica, CORE).step_time
    assert mixed_estimate(L8, upgraded, replica, CORE).step_time <= td * (1 + 1e-12)
    assert mixed_estimate(L8, narrow, replica, CORE).step_time >= td * (1 - 1e-12)


def test_linked_caps_the_tiers_beyond_nvlink():
    cluster = load_system("h100").cluster(64)
    capped = linked(cluster, Pools(pools=MIXED.pools, link_bandwidth=5e9))
    assert capped.tiers[0] == cluster.tiers[0] and capped.tiers[1].bandwidth == pytest.approx(5e9)


def test_pipelines_try_every_pool_order():
    assert [m.order for m in pipelines(MIXED, PIPE)] == [(0, 1), (1, 0)]
    assert list(pipelines(MIXED, PIPE.with_(dp=2, tp=8, pp=4))) != []


@pytest.mark.parametrize("stack, kind", [(CORE, "pipeline"), (ANY, "data")])
def test_the_mixed_search_beats_the_fastest_pool_alone(stack, kind):
    # Llama 3 8B, 256 sequences, 32 H100 + 32 A100. Megatron-Core: the pipeline over the pools with layers balanced
    # (8 on the A100 stage, 24 on the H100's), faster than the 32 H100s alone; with every plan meshplan models, the
    # replicas with uneven batch shares (12 micro-batches a replica on the H100s, 4 on the A100s) lead
    result = mixed_search(L8, MIXED, Space(global_batch=256, stack=stack), top_k=5)
    best = result.plans[0]
    assert best.mixed.kind == kind and best.mixed.uneven and best.fits
    h100_alone = result.alone[0]
    assert h100_alone is not None and best.step_time < h100_alone.step_time
    assert [e.step_time for e in result.plans] == sorted(e.step_time for e in result.plans)
    again = mixed_estimate(L8, MIXED, best.mixed, stack)
    assert again.step_time == pytest.approx(best.step_time, rel=1e-12)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_on_a_mixed_cluster_from_the_command_line(capsys):
    code, out, _ = _cli(capsys, "plan", "--model", "llama3-8b", "--system", "h100:32,a100:32", "--global-batch",
                        "256", "--top", "3")
    assert code == 0 and "pipeline" in out and "h100 alone (32 GPUs)" in out and "megatron-core" in out
    code, out, _ = _cli(capsys, "plan", "--model", "llama3-8b", "--system", "h100:32,a100:32", "--gpus", "64",
                        "--global-batch", "256", "--framework", "any", "--json")
    data = json.loads(out)
    assert code == 0 and data["gpus"] == 64 and data["plans"][0]["layout"] == "data"
    assert data["plans"][0]["step_time_s"] < data["alone"][0]["step_time_s"]


@pytest.mark.parametrize("extra, why", [
    (("--gpus", "48"), "hold 64 GPUs"), (("--tokens", "1T"), "--tokens is not taken"),
    (("--emit", "megatron"), "--emit is not taken"),
])
def test_mixed_refusals_on_the_command_line(capsys, extra, why):
    code, _, err = _cli(capsys, "plan", "--model", "llama3-8b", "--system", "h100:32,a100:32", *extra)
    assert code == 2 and why in err and "Traceback" not in err
