"""ZeRO groups smaller than the data-parallel ranks (Plan.distributed_optimizer_instances, cost/zero_group.py): the
optimizer state sharded within the group, the gradients reduce-scattered there and all-reduced across the instances
(Megatron-Core) or all-reduced over every replica (InternEvo), the weights gathered or broadcast within the group;
the plan's rules, Megatron-LM's argument, and InternEvo's records read with their zero1 size."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.collectives.groups import zero_layouts
from meshplan.collectives.price import collective_time
from meshplan.configs import emit, read
from meshplan.cost.params import StageParams, stage_params
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.memory import model_states
from meshplan.specs.check import check
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import build_cluster, load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack
from meshplan.step.channels import dp_collectives
from meshplan_validation.case import map_run

PSI = 1_000_000_000
MODEL = load_model("llama3-8b")
H100 = load_system("h100")
CLUSTER = build_cluster(H100.name, H100.accelerator, H100.network, 16)  # two nodes of 8


def test_the_optimizer_state_shards_over_the_zero_group_only():
    # dp = 16 in 4 instances: groups of 16 / 4 = 4 ranks. ZeRO-1, Adam (K = 12), fp32 gradients:
    # weights 2Ψ and gradients 4Ψ as without groups, the optimizer 12Ψ / 4 = 3Ψ (not 12Ψ / 16 = 0.75Ψ)
    params = StageParams(dense=PSI, expert=0.0)
    weights, grads, opt = model_states(params, Plan(dp=16, zero=1, distributed_optimizer_instances=4), Stack())
    assert (weights, grads, opt) == pytest.approx((2 * PSI, 4 * PSI, 12 * PSI / 4))
    # ZeRO-2 shards the gradients over the same group: 4Ψ / 4 = Ψ
    _, grads, opt = model_states(params, Plan(dp=16, zero=2, distributed_optimizer_instances=4), Stack())
    assert (grads, opt) == pytest.approx((4 * PSI / 4, 12 * PSI / 4))
    # expert weights: edp = tp·cp·dp / (ep·etp) = 16 / 4 = 4 ranks, in 2 instances of 2: 12Ψ / 2
    experts = StageParams(dense=0.0, expert=PSI)
    _, _, opt = model_states(experts, Plan(dp=16, ep=4, etp=1, zero=1, distributed_optimizer_instances=2), Stack())
    assert opt == pytest.approx(12 * PSI / 2)


def test_megatron_reduce_scatters_within_the_group_and_all_reduces_the_shard_across_instances():
    # dp = 16 on two nodes of 8, 2 instances: each ZeRO group is one node (8 ranks at stride 1, NVLink), the 2
    # instances stride 8 apart (across the network). n = Ψ_rank · 4 gradient bytes:
    #   scatter = RS(n, 8 in the node) + AR(n / 8, 2 across nodes);  gather = AG(Ψ_rank · 2, 8 in the node)
    plan = Plan(dp=16, global_batch=64, zero=1, distributed_optimizer_instances=2)
    params = stage_params(MODEL, plan, True)
    zero, across, _, _ = zero_layouts(plan)
    assert zero == ((1, 1), (8, 1)) and across == 8
    n = params.total * plan.grad_bytes
    c = dp_collectives(MODEL, CLUSTER, plan, params, DEFAULT, Stack())
    rs = collective_time("reduce_scatter", n, 8, zero, CLUSTER, DEFAULT)
    ar = collective_time("all_reduce", n / 8, 2, across, CLUSTER, DEFAULT)
    assert c.scatter == pytest.approx(rs + ar)
    assert c.gather == pytest.approx(collective_time("all_gather", params.total * 2, 8, zero, CLUSTER, DEFAULT))
    # one instance: the plain ZeRO-1 over all 16 ranks, nothing across
    one = dp_collectives(MODEL, CLUSTER, plan.with_(distributed_optimizer_instances=1), params, DEFAULT, Stack())
    layout = ((1, 1), (16, 1))
    assert one.scatter == pytest.approx(collective_time("reduce_scatter", n, 16, layout, CLUSTER, DEFAULT))
    assert one.all_reduce == c.all_reduce  # ZeRO-0's all-reduce is over every replica whatever the groups


def test_internevo_all_reduces_over_every_replica_and_broadcasts_within_the_group():
    # grad_sync all_reduce: AR(n, 16) whatever the groups; shard_broadcasts within the group of 8: 8 · BC(w / 8, 8)
    plan = Plan(dp=16, global_batch=64, zero=1, grad_bytes=2, distributed_optimizer_instances=2)
    params = stage_params(MODEL, plan, True)
    stack = Stack(grad_sync="all_reduce", param_sync="shard_broadcasts")
    c = dp_collectives(MODEL, CLUSTER, plan, params, DEFAULT, stack)
    n, w = params.total * 2, params.total * 2
    assert c.scatter == pytest.approx(collective_time("all_reduce", n, 16, ((1, 1), (16, 1)), CLUSTER, DEFAULT))
    zero = zero_layouts(plan)[0]
    assert c.gather == pytest.approx(8 * collective_time("broadcast", w / 8, 8, zero, CLUSTER, DEFAULT))


@pytest.mark.parametrize(("changes", "says"), [
    ({"distributed_optimizer_instances": 3}, "does not divide dp=16"),
    ({"distributed_optimizer_instances": 0}, "must be a positive integer"),
    ({"distributed_optimizer_instances": True}, "must be a positive integer"),
    ({"distributed_optimizer_instances": 2, "zero": 0}, "needs ZeRO 1 or 2"),
    ({"distributed_optimizer_instances": 2, "zero": 3}, "needs ZeRO 1 or 2"),
    ({"distributed_optimizer_instances": 2, "dp_mode": "ps"}, "dp_mode=ps"),
])
def test_the_instances_must_divide_dp_under_zero_1_or_2(changes, says):
    plan = Plan(dp=16, global_batch=64, zero=1).with_(**changes)
    assert any(says in r for r in check(MODEL, CLUSTER, plan, Stack()))
    assert not check(MODEL, CLUSTER, Plan(dp=16, global_batch=64, zero=1, distributed_optimizer_instances=4), Stack())
    fsdp = Plan(dp=16, global_batch=64, zero=2, distributed_optimizer_instances=2)
    assert any("fsdp=fsdp2" in r for r in check(MODEL, CLUSTER, fsdp, Stack(fsdp="fsdp2")))


def test_a_larger_zero_group_never_raises_the_optimizer_memory():
    """Over seeded random models, dp and ZeRO 1 / 2: fewer instances (a larger group) never hold more optimizer state
    or gradients a GPU, and the weights do not move."""
    rng = random.Random(79)
    names = ["llama3-8b", "llama3-70b", "gpt-oss-20b", "llama4-scout"]
    for _ in range(60):
        model = load_model(rng.choice(names))
        dp = rng.choice((2, 4, 8, 16, 32, 64))
        ep = rng.choice([e for e in (1, 2, 4) if dp % e == 0]) if model.is_moe else 1
        base = Plan(dp=dp, ep=ep, etp=1, zero=rng.choice((1, 2)), global_batch=dp)
        params = stage_params(model, base, True)
        states = [model_states(params, base.with_(distributed_optimizer_instances=i), Stack())
                  for i in (1, 2, 4, 8, 16, 32, 64) if dp % i == 0 and (dp // ep) % i == 0]
        for larger, smaller in zip(states[:-1], states[1:], strict=True):  # instances 1, 2, 4 ...: the group shrinks
            assert larger[0] == pytest.approx(smaller[0])
            assert larger[1] <= smaller[1] * (1 + 1e-12) and larger[2] <= smaller[2] * (1 + 1e-12)


def test_an_estimate_with_instances_fits_less_and_syncs_more():
    """Llama 3 8B on 16 H100s, dp = 16: 2 instances hold twice the optimizer state of one and add the all-reduce
    across them to the gradient sync."""
    plan = Plan(dp=16, global_batch=64, zero=1)
    one, two = estimate(MODEL, CLUSTER, plan), estimate(MODEL, CLUSTER, plan.with_(distributed_optimizer_instances=2))
    assert two.memory["optimizer"] == pytest.approx(2 * one.memory["optimizer"])
    assert two.step_time >= one.step_time


def test_megatron_lm_writes_and_reads_its_instances():
    plan = Plan(dp=16, tp=2, micro_batch=1, global_batch=64, zero=1, sequence_parallel=True,
                distributed_optimizer_instances=4)
    text = emit("megatron", MODEL, plan, load_stack("megatron-core"))
    assert "  --num-distributed-optimizer-instances 4" in text.splitlines()
    assert read("megatron", MODEL, 32, text)[0] == plan
    single = emit("megatron", MODEL, plan.with_(distributed_optimizer_instances=1), load_stack("megatron-core"))
    assert "--num-distributed-optimizer-instances" not in single  # Megatron's default, 1, is not written
    with pytest.raises(SpecError, match="distributed_optimizer_instances=4"):
        emit("torchtitan", MODEL, plan.with_(zero=3, sequence_parallel=False), load_stack("torchtitan"))


RUNS = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "independent_runs.jsonl"


@pytest.mark.parametrize(("run", "instances"), [
    ("internevo-7b-nockpt-1024gpu-mn1", 128),  # zero1=8, dp = 1024: 1024 / 8
    ("internevo-7b-tgs-tp2-z4-1024gpu", 128),  # zero1=4, tp = 2, dp = 512: 512 / 4
    ("internevo-7b-nockpt-8gpu-mn4", 1),  # zero1=8 = dp
    ("internevo-7b-tgs-tp1-zall-1024gpu", 1),  # zero1=-1: the whole data-parallel group
])
def test_internevo_records_are_read_with_their_zero1_size(run, instances):
    record = next(r for r in map(json.loads, RUNS.read_text().splitlines()) if r["id"] == run)
    case = map_run(record)
    assert case.plan.distributed_optimizer_instances == instances
    assert (case.stack.grad_sync, case.stack.param_sync, case.plan.grad_bytes) == ("all_reduce", "shard_broadcasts", 2)


@pytest.mark.parametrize("sync", ["reduce_scatter", "all_reduce"])
def test_more_bandwidth_or_less_latency_never_slows_the_grouped_sync(sync):
    """Over seeded random dp, instances and ZeRO 1 / 2 on 2 to 16 H100 nodes: every tier twice as fast never lengthens
    the gradient or the weight sync, twice the latency never shortens it."""
    rng = random.Random(23)
    for _ in range(30):
        nodes = rng.choice((2, 4, 8, 16))
        cluster = build_cluster(H100.name, H100.accelerator, H100.network, 8 * nodes)
        tp = rng.choice((1, 2, 4))
        dp = 8 * nodes // tp
        plan = Plan(dp=dp, tp=tp, global_batch=dp, zero=rng.choice((1, 2)),
                    distributed_optimizer_instances=rng.choice([i for i in (1, 2, 4, 8, 16) if dp % i == 0]))
        params = stage_params(MODEL, plan, True)
        stack = Stack(grad_sync=sync, param_sync=rng.choice(("all_gather", "shard_broadcasts")))
        fast = replace(cluster, tiers=tuple(replace(t, bandwidth=2 * t.bandwidth) for t in cluster.tiers))
        slow = replace(cluster, tiers=tuple(replace(t, latency=2 * t.latency) for t in cluster.tiers))
        base, quick, late = (dp_collectives(MODEL, c, plan, params, DEFAULT, stack) for c in (cluster, fast, slow))
        for name in ("scatter", "gather"):
            assert getattr(quick, name) <= getattr(base, name) <= getattr(late, name), (plan.describe(), name)
