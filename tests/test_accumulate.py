"""DeepSpeed's BF16_Optimizer accumulating each micro-batch's gradients in fp32 (cost/accumulate.py): which plans pay
it, its bytes and launches per layer and at the ends, what it does to a step, and that the search, which prices a
key's units once for every ZeRO stage of its grid, ranks each setting as estimate() prices it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from conftest import gpt
from meshplan.cost.accumulate import accumulates_fp32, accumulation_ops, by_accumulation
from meshplan.cost.params import kind_params
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.specs.efficiency import DEFAULT as DEFAULT_EFF
from meshplan.specs.hardware import load_system
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.assemble import compose, own_settings
from meshplan.step.units import timed_parts, units_for_recomputes

MDS = load_stack("megatron-deepspeed")
DEEPSPEED = load_stack("deepspeed")


@pytest.mark.parametrize("stack, zero, precision, grad_bytes, offload, pays", [
    ("megatron-deepspeed", 0, "bf16", 2, False, True),  # its pipeline engine in bf16: BF16_Optimizer
    ("megatron-deepspeed", 0, "fp16", 2, False, False),  # FP16_Optimizer accumulates in autograd's fp16 grads
    ("deepspeed", 1, "bf16", 4, False, True),  # ZeRO-1 with fp32 gradients: BF16_Optimizer
    ("deepspeed", 1, "bf16", 4, True, False),  # ... but with its optimizer offloaded the ZeRO optimizer
    ("deepspeed", 1, "bf16", 2, False, False),  # ZeRO-1 with bf16 gradients: the ZeRO optimizer
    ("deepspeed", 2, "bf16", 4, False, False),
    ("megatron-core", 0, "bf16", 4, False, False),  # a stated wrapper: Megatron's main_grad hooks, counted elsewhere
])
def test_who_accumulates(stack, zero, precision, grad_bytes, offload, pays):
    plan = Plan(zero=zero, precision=precision, grad_bytes=grad_bytes, dp=2, offload_optimizer=offload)
    assert accumulates_fp32(plan, load_stack(stack)) == pays
    # the records exist wherever some setting of the plan pays them: the search prices both twins then
    assert bool(accumulation_ops(gpt(), plan, load_stack(stack), ("dense",))) == (pays or stack == "deepspeed"
                                                                                   and grad_bytes == 4)


def test_a_gpt_layer_accumulates_20_bytes_a_parameter_in_two_launches_a_tensor():
    # the test GPT (h = 1024, QKV and linear biases, LayerNorm with bias): 12 tensors, 12·h² + 13·h parameters
    # (QKV 3h² + 3h, out h² + h, fc1 4h² + 4h, fc2 4h² + h, two norms 2·2h); at tp 2 this GPU's share
    # (cost/params.kind_params: the weights halve, the norms stay whole)
    h = 1024
    (op,) = accumulation_ops(gpt(), Plan(), MDS, ("dense",))["dense"]
    assert (op.name, op.phase, op.kind) == ("layer/bf16_accumulate", "bwd_w", "memory")
    assert op.kernels == 2 * 12
    assert op.nbytes == 20 * (12 * h * h + 13 * h)
    (half,) = accumulation_ops(gpt(), Plan(tp=2), MDS, ("dense",))["dense"]
    assert half.nbytes == 20 * kind_params(gpt(), Plan(tp=2), "dense").total
    assert 12 * h * h / 2 < half.nbytes / 20 < 12 * h * h / 2 + 13 * h


def test_the_ends_accumulate_their_tables():
    # the test GPT: vocabulary 51,200 and 2,048 learned positions of h = 1024 (2 tensors); a tied head's only own
    # tensors are the final LayerNorm's weight and bias
    ops = accumulation_ops(gpt(), Plan(), MDS, ("dense",))
    (embed,), (head,) = ops["embed"], ops["head"]
    assert (embed.kernels, embed.nbytes) == (2 * 2, 20 * (51200 + 2048) * 1024)
    assert (head.kernels, head.nbytes) == (2 * 2, 20 * 2 * 1024)


def test_the_op_table_lists_it_where_the_plan_pays_it():
    cluster = load_system("h100").cluster(8)
    pays = estimate(gpt(), cluster, Plan(dp=8, zero=1, grad_bytes=4), DEEPSPEED)
    free = estimate(gpt(), cluster, Plan(dp=8, zero=2, grad_bytes=4), DEEPSPEED)
    assert {"layer/bf16_accumulate", "embed/bf16_accumulate", "head/bf16_accumulate"} <= {r.name for r in pays.ops}
    assert not any(r.name.endswith("bf16_accumulate") for r in free.ops)


def test_it_makes_a_host_bound_step_slower_and_hides_behind_a_gpu_bound_one():
    cluster = load_system("h200").cluster(1)
    small = replace(gpt(layers=6), seq_length=1024, max_position_embeddings=1024)
    stated = replace(MDS, optimizer_wrapper="stated")

    def step(model, micro, stack):
        return estimate(model, cluster, Plan(micro_batch=micro, global_batch=micro), stack).step_time

    # micro-batch 1: the host sets the pace, and 6 layers pay 24 launches each at 50 us: 6 x 1.2 ms and more
    assert step(small, 1, MDS) - step(small, 1, stated) >= 6 * 24 * MDS.host_dispatch
    # micro-batch 16: the GPU sets the pace, and the layers' accumulation costs its bytes, well under its launches
    added = step(small, 16, MDS) - step(small, 16, stated)
    assert 0 < added < 6 * 24 * MDS.host_dispatch


def test_the_grids_settings_group_by_the_wrapper_they_run():
    # DeepSpeed with fp32 gradients: ZeRO 1 without offload runs BF16_Optimizer, ZeRO 1 offloaded and ZeRO 2 the
    # ZeRO optimizer
    groups = dict(by_accumulation(Plan(dp=8, grad_bytes=4), DEEPSPEED, (1, 2), (False, True)))
    assert groups == {True: [(0, 1, 0, False)], False: [(0, 1, 1, True), (1, 2, 0, False), (1, 2, 1, True)]}


def test_one_grid_prices_each_setting_as_estimate_does():
    """compose prices a plan under every (ZeRO, offload) setting from one set of units, each setting the twin its
    wrapper runs: every step equals estimate() of the plan with that setting."""
    model, cluster = gpt(layers=8), load_system("h100").cluster(8)
    plan = Plan(dp=8, micro_batch=2, global_batch=32, grad_bytes=4)
    grid = replace(own_settings(plan), zero=(1, 2), offload_optimizer=(False, True))
    parts = timed_parts(model, cluster, plan, DEEPSPEED, DEFAULT_EFF)
    units = units_for_recomputes(model, plan, DEEPSPEED, parts, grid.recompute, DEFAULT_EFF)
    steps = {}
    for (_, z, o, _), step in compose(model, cluster, plan, units, grid, DEEPSPEED):
        zero, offload = grid.zero[z], grid.offload_optimizer[o]
        steps[zero, offload] = float(step.total())
        alone = estimate(model, cluster, replace(plan, zero=zero, offload_optimizer=offload), DEEPSPEED).step_time
        assert math.isclose(steps[zero, offload], alone, rel_tol=1e-12)
    # the accumulating setting pays for it: ZeRO-1 with its optimizer on the GPU beside ZeRO-1 offloaded is not
    # comparable (offload), but it is slower than the same plan with its accumulation left out
    bare = replace(plan, zero=1)
    stated = DEEPSPEED.with_(optimizer_wrapper="stated", tensor_host=0.0)
    assert steps[1, False] > estimate(model, cluster, bare, stated).step_time


def test_a_search_over_zero_stages_ranks_them_as_estimate_prices_them():
    model, cluster = gpt(layers=8), load_system("h100").cluster(8)
    space = Space(global_batch=32, zero=(1, 2), offload_optimizer=(False,), offload_activations=(False,),
                  recompute=("none",), grad_bytes=4, stack=DEEPSPEED, prefer_simple=False, headroom=0.0)
    result = search(model, cluster, space, top_k=12, workers=1)
    zeros = {e.plan.zero for e in result.plans}
    assert zeros == {1, 2}
    times = [e.step_time for e in result.plans]
    assert times == sorted(times)
    for e in result.plans:
        assert estimate(model, cluster, e.plan, DEEPSPEED).step_time == e.step_time

