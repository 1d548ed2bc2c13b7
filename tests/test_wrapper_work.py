"""What DeepSpeed's optimizer wrappers do to every micro-batch's gradients (cost/wrapper_work.py): BF16_Optimizer's
fp32 accumulation and the ZeRO optimizer's bucket copies at stages 2 and 3; which plans pay each, their bytes and
launches per layer and at the ends, what they do to a step, and that the search, which prices a key's units once for
every ZeRO stage of its grid, ranks each setting as estimate() prices it."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import gpt
from meshplan.cost.params import kind_params
from meshplan.cost.wrapper_work import ZERO3_HOOKS, by_work, possible_work, work_of, work_ops
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.specs.efficiency import DEFAULT as DEFAULT_EFF
from meshplan.specs.hardware import load_system
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.assemble import compose
from meshplan.step.grid import own_settings
from meshplan.step.units import timed_parts, units_for_recomputes

ROOT = Path(__file__).resolve().parents[1]
MDS = load_stack("megatron-deepspeed")
DEEPSPEED = load_stack("deepspeed")


@pytest.mark.parametrize("stack, zero, precision, grad_bytes, offload, work", [
    ("megatron-deepspeed", 0, "bf16", 2, False, "bf16-bf16"),  # pipeline engine, bf16: BF16_Optimizer (bf16 buffer)
    ("megatron-deepspeed", 0, "bf16", 4, False, "bf16"),  # (fp32 accumulation without ZeRO: refused, priced alike)
    ("megatron-deepspeed", 0, "fp16", 2, False, ""),  # FP16_Optimizer accumulates in autograd's fp16 grads
    ("deepspeed", 1, "bf16", 4, False, "bf16"),  # ZeRO-1 with fp32 gradients: BF16_Optimizer
    ("deepspeed", 1, "bf16", 4, True, ""),  # ... but with its optimizer offloaded the ZeRO optimizer, stage 1
    ("deepspeed", 1, "bf16", 2, False, ""),  # ZeRO-1 with bf16 gradients: autograd accumulates until the step
    ("deepspeed", 2, "bf16", 4, False, "zero2-fp32"),  # ZeRO-2: every micro-batch's gradients into its buckets
    ("deepspeed", 2, "bf16", 2, True, "zero2"),
    ("deepspeed", 3, "bf16", 2, False, "zero3"),  # ZeRO-3: every micro-batch's gradients into its bucket
    ("deepspeed", 3, "bf16", 4, True, "zero3-fp32"),
    ("megatron-core", 0, "bf16", 4, False, ""),  # a stated wrapper: Megatron's main_grad hooks, counted elsewhere
])
def test_who_does_what(stack, zero, precision, grad_bytes, offload, work):
    plan = Plan(zero=zero, precision=precision, grad_bytes=grad_bytes, dp=2, offload_optimizer=offload)
    assert work_of(plan, load_stack(stack)) == work
    # the records exist wherever some setting of the plan runs them: the search prices a twin each
    assert (work in work_ops(gpt(), plan, load_stack(stack), ("dense",))) == bool(work)


@pytest.mark.parametrize("stack", ["deepspeed", "megatron-deepspeed", "megatron-core"])
@pytest.mark.parametrize("precision, grad_bytes, finetune", [("bf16", 4, "full"), ("bf16", 2, "full"),
                                                             ("fp16", 2, "full"), ("fp8", 4, "full"),
                                                             ("bf16", 4, "lora")])
def test_the_possible_work_is_what_some_setting_runs(stack, precision, grad_bytes, finetune):
    plan = Plan(dp=2, precision=precision, grad_bytes=grad_bytes, finetune=finetune)
    every = {work_of(replace(plan, zero=z, offload_optimizer=o), load_stack(stack)) for z in range(4)
             for o in (False, True)}
    assert set(possible_work(plan, load_stack(stack))) == every - {""}


def test_a_gpt_layer_accumulates_20_bytes_a_parameter_in_two_launches_a_tensor():
    # the test GPT (h = 1024, QKV and linear biases, LayerNorm with bias): 12 tensors, 12·h² + 13·h parameters
    # (QKV 3h² + 3h, out h² + h, fc1 4h² + 4h, fc2 4h² + h, two norms 2·2h); at tp 2 this GPU's share
    # (cost/params.kind_params: the weights halve, the norms stay whole)
    h = 1024
    (op,) = work_ops(gpt(), Plan(), MDS, ("dense",))["bf16"]["dense"]
    assert (op.name, op.phase, op.kind) == ("layer/bf16_accumulate", "bwd_w", "memory")
    assert op.kernels == 2 * 12
    assert op.nbytes == 20 * (12 * h * h + 13 * h)
    (half,) = work_ops(gpt(), Plan(tp=2), MDS, ("dense",))["bf16"]["dense"]
    assert half.nbytes == 20 * kind_params(gpt(), Plan(tp=2), "dense").total
    assert 12 * h * h / 2 < half.nbytes / 20 < 12 * h * h / 2 + 13 * h


def test_the_ends_accumulate_their_tables():
    # the test GPT: vocabulary 51,200 and 2,048 learned positions of h = 1024 (2 tensors); a tied head's only own
    # tensors are the final LayerNorm's weight and bias
    ops = work_ops(gpt(), Plan(), MDS, ("dense",))["bf16"]
    (embed,), (head,) = ops["embed"], ops["head"]
    assert (embed.kernels, embed.nbytes) == (2 * 2, 20 * (51200 + 2048) * 1024)
    assert (head.kernels, head.nbytes) == (2 * 2, 20 * 2 * 1024)


def test_a_zero2_layer_copies_its_gradients_into_the_buckets_every_micro_batch():
    # ZeRO 2: 3 kernels a tensor and 22 bytes a parameter with fp32 gradient accumulation (a cast, two fp32 copies:
    # 2 + 4 + 2 x 8), 2 and 8 with bf16 gradients (two bf16 copies: 2 x 4); the test GPT's layer, 12 tensors
    h = 1024
    params = 12 * h * h + 13 * h
    (fp32,) = work_ops(gpt(), Plan(grad_bytes=4), DEEPSPEED, ("dense",))["zero2-fp32"]["dense"]
    assert (fp32.name, fp32.phase, fp32.kernels, fp32.nbytes) == ("layer/zero2_bucket", "bwd_w", 3 * 12, 22 * params)
    (bf16,) = work_ops(gpt(), Plan(grad_bytes=2), DEEPSPEED, ("dense",))["zero2"]["dense"]
    assert (bf16.kernels, bf16.nbytes) == (2 * 12, 8 * params)
    # ZeRO 3: one copy (4 bytes), with fp32 accumulation a cast and the copy (2 + 4 + 4 + 4 = 14 bytes)
    three, *_ = work_ops(gpt(), Plan(grad_bytes=4), DEEPSPEED, ("dense",))["zero3-fp32"]["dense"]
    assert (three.name, three.kernels, three.nbytes) == ("layer/zero3_bucket", 2 * 12, 14 * params)
    three, *_ = work_ops(gpt(), Plan(grad_bytes=2), DEEPSPEED, ("dense",))["zero3"]["dense"]
    assert (three.kernels, three.nbytes) == (12, 4 * params)


def test_zero3_hooks_every_module_and_tensor_on_the_host_alone():
    """ZeRO 3's fetch and release around each module (ZERO3_HOOKS, seconds on the DGX host): the test GPT's layer
    has 12 tensors and 6 parameter-holding modules (its two LayerNorms, the QKV and output projections, fc1 and fc2:
    the tensors less their 6 biases) and 3 containers (the layer, its attention, its MLP): 9 x 535 us + 12 x 151 us
    = 6.627 ms a micro-batch, half in the forward pass, half in the backward, no GPU time; on a host 1.55 times as
    slow 1.55 x that. The embedding (word and position tables, the model itself: 3 modules, 2 tensors) carries the
    micro-batch's own 0.791 ms; the tied head's final LayerNorm (1 module, 2 tensors)."""
    _, fwd, bwd = work_ops(gpt(), Plan(grad_bytes=2), DEEPSPEED, ("dense",))["zero3"]["dense"]
    layer = 9 * ZERO3_HOOKS["module"] + 12 * ZERO3_HOOKS["tensor"]
    assert layer == pytest.approx(6.627e-3)
    assert (fwd.name, fwd.phase, bwd.phase) == ("layer/zero3_hooks", "fwd", "bwd_x")
    assert (fwd.host, bwd.host) == (pytest.approx(layer / 2), pytest.approx(layer / 2))
    assert fwd.kernels == bwd.kernels == fwd.nbytes == fwd.flops == 0
    slow = work_ops(gpt(), Plan(grad_bytes=2), DEEPSPEED, ("dense",), python_host=1.55)["zero3"]["dense"]
    assert slow[1].host == pytest.approx(1.55 * layer / 2)
    ends = work_ops(gpt(), Plan(grad_bytes=2), DEEPSPEED, ("dense",))["zero3"]
    embed = 3 * ZERO3_HOOKS["module"] + 2 * ZERO3_HOOKS["tensor"] + ZERO3_HOOKS["microbatch"]
    assert sum(op.host for op in ends["embed"]) == pytest.approx(embed)
    assert sum(op.host for op in ends["head"]) == pytest.approx(ZERO3_HOOKS["module"] + 2 * ZERO3_HOOKS["tensor"])
    # stage 2 hooks nothing per module
    assert all(op.host == 0 for op in work_ops(gpt(), Plan(grad_bytes=2), DEEPSPEED, ("dense",))["zero2"]["dense"])


def test_zero3_hook_constants_are_the_committed_measurement():
    """ZERO3_HOOKS as benchmarks/measure/deepspeed_hooks_cpu.py measured them (data/measured/...-zero3-hooks-cpu.json):
    on this project's CPU, scaled by the plain layer's 1.15 ms on the DGX host over its CPU time, each the median of
    the measurement's repeats; in each repeat every kind's per-child slope lies on the line c_m + k·c_t of its k
    tensors within the measurement's scatter."""
    found = json.loads((ROOT / "data" / "measured" / "2026-11-27-deepspeed-zero3-hooks-cpu.json").read_text())
    plain_layer_on_gpu_host = load_stack("pytorch-fsdp").host_dispatch * 46  # 25 us x its 46 kernels: 1.15 ms
    assert found["to_dgx_host"] == pytest.approx(plain_layer_on_gpu_host / found["plain_layer_s"])
    for key, name in (("module", "module_s"), ("tensor", "tensor_s"), ("microbatch", "microbatch_s")):
        assert ZERO3_HOOKS[key] == pytest.approx(found["dgx_host"][name], rel=5e-3)
        assert found["dgx_host"][name] == pytest.approx(found[name] * found["to_dgx_host"])
    for key in ("module_s", "tensor_s", "microbatch_s"):  # each the median of the file's repeated measurements
        assert found[key] == statistics.median(r[key] for r in found["repeats"])
    for repeat in found["repeats"]:
        for kind, tensors in (("free", 0), ("weight", 1), ("weight_bias", 2)):
            slope = repeat["series"][kind]["per_child_s"]
            assert slope == pytest.approx(repeat["module_s"] + tensors * repeat["tensor_s"], rel=0.15)


def test_zero3_hooks_set_the_pace_of_a_small_step_and_hide_behind_a_large_one():
    """On one H200, 6 layers of the test GPT at ZeRO 3: at micro-batch 1 the host sets the pace and the hooks add
    at least their 6 x 6.6 ms (the ZeRO-2 twin has none); at micro-batch 64 the GPU does, and they hide."""
    cluster = load_system("h200").cluster(1)
    small = replace(gpt(layers=6), seq_length=1024, max_position_embeddings=1024)

    def step(micro, zero):
        plan = Plan(micro_batch=micro, global_batch=micro, zero=zero, grad_bytes=2)
        return estimate(small, cluster, plan, DEEPSPEED).step_time

    layer = 9 * ZERO3_HOOKS["module"] + 12 * ZERO3_HOOKS["tensor"]
    assert step(1, 3) - step(1, 2) >= 6 * layer
    assert step(64, 3) - step(64, 2) < 0.5 * 6 * layer


def test_the_op_table_lists_the_work_the_plan_runs():
    cluster = load_system("h100").cluster(8)
    names = {zero: {r.name for r in estimate(gpt(), cluster, Plan(dp=8, zero=zero, grad_bytes=4), DEEPSPEED).ops}
             for zero in (1, 2, 3)}
    named = {1: "bf16_accumulate", 2: "zero2_bucket", 3: "zero3_bucket"}
    for zero, name in named.items():
        assert {f"layer/{name}", f"embed/{name}", f"head/{name}"} <= names[zero]
        assert not any(n.endswith(name) for z, found in names.items() if z != zero for n in found)


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


def test_the_grids_settings_group_by_the_work_they_run():
    # DeepSpeed with fp32 gradients: ZeRO 1 without offload runs BF16_Optimizer, ZeRO 1 offloaded the ZeRO optimizer
    # with nothing per micro-batch, ZeRO 2 and 3 their optimizers with their buckets, offloaded or not
    groups = dict(by_work(Plan(dp=8, grad_bytes=4), DEEPSPEED, (1, 2, 3), (False, True)))
    assert groups == {"bf16": [(0, 1, 0, False)], "": [(0, 1, 1, True)],
                      "zero2-fp32": [(1, 2, 0, False), (1, 2, 1, True)],
                      "zero3-fp32": [(2, 3, 0, False), (2, 3, 1, True)]}


@pytest.mark.parametrize("stack", ["megatron-core", "generic", "torchtitan"])
@pytest.mark.parametrize("zeros, offloads", [((1, 2, 3), (False, True)), ((0,), (False,)), ((), (False,))])
def test_a_stated_wrapper_groups_every_setting_under_no_work(stack, zeros, offloads):
    # a stack whose wrapper is not the plan's (per_plan false) skips making each setting's plan: the same groups as
    # work_of over every setting gives (each "": one group, the settings in the grid's order; none for an empty grid)
    chosen = load_stack(stack)
    assert not chosen.wrapper.per_plan
    plan = Plan(dp=8, grad_bytes=4)
    every: dict[str, list] = {}
    for z, zero in enumerate(zeros):
        for o, offload in enumerate(offloads):
            work = work_of(replace(plan, zero=zero, offload_optimizer=offload), chosen)
            every.setdefault(work, []).append((z, zero, o, offload))
    assert by_work(plan, chosen, zeros, offloads) == list(every.items())
    assert set(every) <= {""}


def test_one_grid_prices_each_setting_as_estimate_does():
    """compose prices a plan under every (ZeRO, offload) setting from one set of units, each setting the twin its
    wrapper runs: every step equals estimate() of the plan with that setting."""
    model, cluster = gpt(layers=8), load_system("h100").cluster(8)
    plan = Plan(dp=8, micro_batch=2, global_batch=32, grad_bytes=4)
    grid = replace(own_settings(plan), zero=(1, 2, 3), offload_optimizer=(False, True))
    parts = timed_parts(model, cluster, plan, DEEPSPEED, DEFAULT_EFF)
    units = units_for_recomputes(model, plan, DEEPSPEED, parts, grid.recompute, DEFAULT_EFF)
    steps = {}
    for (_, z, o, _), step in compose(model, cluster, plan, units, grid, DEEPSPEED):
        zero, offload = grid.zero[z], grid.offload_optimizer[o]
        steps[zero, offload] = float(step.total())
        alone = estimate(model, cluster, replace(plan, zero=zero, offload_optimizer=offload), DEEPSPEED).step_time
        assert math.isclose(steps[zero, offload], alone, rel_tol=1e-12)
    # each setting that runs work pays for it: slower than the same plan with the work left out (a stated wrapper)
    stated = DEEPSPEED.with_(optimizer_wrapper="stated", tensor_host=0.0)
    for zero in (1, 2, 3):
        assert steps[zero, False] > estimate(model, cluster, replace(plan, zero=zero), stated).step_time


def test_a_search_over_zero_stages_ranks_them_as_estimate_prices_them():
    model, cluster = gpt(layers=8), load_system("h100").cluster(8)
    space = Space(global_batch=32, zero=(1, 2, 3), offload_optimizer=(False,), offload_activations=(False,),
                  recompute=("none",), grad_bytes=4, stack=DEEPSPEED, prefer_simple=False, headroom=0.0)
    result = search(model, cluster, space, top_k=12, workers=1)
    zeros = {e.plan.zero for e in result.plans}
    assert zeros == {1, 2, 3}
    times = [e.step_time for e in result.plans]
    assert times == sorted(times)
    for e in result.plans:
        assert estimate(model, cluster, e.plan, DEEPSPEED).step_time == e.step_time

