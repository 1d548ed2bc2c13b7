"""Multi-token prediction (ModelSpec.mtp_layers, embed_head.mtp_ops) and an uneven last pipeline stage
(Plan.last_stage_layers), with the recipe layouts that place them (layouts.PIPELINE_LAYOUTS)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost.embed_head import mtp_ops
from meshplan.cost.flops import model_flops_per_token, mtp_flops_per_token
from meshplan.cost.params import layers_on_last, layers_on_stage, stage_params
from meshplan.cost.records import ACT_BYTES
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.memory import loss_workspace, model_state_memory
from meshplan.specs.check import check
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack
from meshplan.step.passes import pass_times
from meshplan.step.stages import stage_times
from meshplan.step.units import unit_costs
from meshplan_validation.layouts import DSV3_LAYOUT_16, layout_last_stage

DSV3 = load_model("deepseek-v3")
SUPER = load_model("nemotron-3-super")


def test_deepseek_v3s_mtp_module_is_one_moe_layer_and_the_projection():
    """DeepSeek-V3 §2.2: an MTP module is a Transformer block (here a MoE layer, as its last layers are), the
    projection M (2h → h) and two RMSNorms, plus the shared embedding and head: 11.5B unique parameters
    (README_WEIGHTS.md), i.e. one MoE layer 11.507B + 2·7168² + 3·7168 norm weights = 11.61B (the README rounds)."""
    h = 7168
    assert DSV3.mtp_kinds == ("moe",)
    assert DSV3.mtp_params() == DSV3.block_params("moe") + 2 * h * h + 3 * h
    assert DSV3.mtp_params() / 1e9 == pytest.approx(11.6, abs=0.1)
    assert DSV3.params() == 671_026_419_200  # the model's own count leaves MTP out, as the report's 671B does


def test_nemotron_3_supers_mtp_is_the_checkpoints_shared_attention_and_latent_moe_layer():
    """The checkpoint's MTP layer has 2,942,324,736 BF16 weights (safetensors headers; tests/test_model.py), plus
    the router's 512 fp32 score-correction biases meshplan counts as parameters; Megatron-Bridge applies that one
    layer at two depths (mtp_use_repeated_layer), so its parameters count once."""
    assert (SUPER.mtp_layers, SUPER.mtp_pattern, SUPER.mtp_shared) == (2, "*E", True)
    assert SUPER.mtp_kinds == ("attention", "moe")
    assert SUPER.mtp_params() == 2_942_324_736 + 512


def test_each_depth_runs_the_projection_a_layer_and_the_shared_head():
    """Per depth: eh_proj 2·T·2h·h/t FLOPs forward (T = 4096 tokens, h = 7168, t = 1) and its norms and lookup
    (embed_head.mtp_ops), plus one MoE layer and the head and loss again: the last stage's head unit adds, per depth,
    those three parts' times, each as the step prices them alone."""
    model = replace(DSV3, mtp_layers=2)
    plan = Plan(ep=8, dp=8, etp=1, global_batch=8, recompute="none")
    ops = mtp_ops(model, plan, Stack())
    eh = [o for o in ops if o.name == "mtp/eh_proj" and o.phase == "fwd"]
    assert eh[0].flops == 2 * 4096 * 2 * 7168 * 7168
    assert not mtp_ops(replace(model, mtp_layers=0), plan, Stack())
    cluster = load_system("h100").cluster(8)
    with_mtp, without = unit_costs(model, cluster, plan), unit_costs(replace(model, mtp_layers=0), cluster, plan)
    parts = estimate(model, cluster, plan, Stack()).detail[1]  # the units' stack: each op timed as they time it
    def alone(kind):
        return pass_times(parts.ops[kind], parts.times[kind], plan, Stack(), "none", DEFAULT).total

    assert with_mtp.head.total - without.head.total == pytest.approx(2 * (alone("mtp") + alone("moe") + alone("head")))
    assert with_mtp.head_saved > without.head_saved


@pytest.mark.parametrize(("sp", "kinds"), [(False, [("fwd", "all_reduce")]),
                                           (True, [("fwd", "reduce_scatter"), ("bwd_x", "all_gather")])])
def test_the_mtp_lookup_is_reduced_across_tp_as_the_first_stages_is(sp, kinds):
    """The MTP layer looks the next tokens up in the same vocabulary-parallel table, so its T·h rows (4096 · 7168 ·
    2 bytes) are summed across the 8 TP ranks like the first stage's (embed/tp)."""
    plan = Plan(tp=8, ep=8, etp=1, global_batch=8, sequence_parallel=sp)
    ops = [o for o in mtp_ops(DSV3, plan, Stack()) if o.name == "mtp/embed_tp"]
    assert [(o.phase, o.collective.kind) for o in ops] == kinds
    assert {o.nbytes for o in ops} == {4096 * 7168 * ACT_BYTES}


def test_model_flops_count_every_depth():
    """6·(2h² + 3 norms of h + the layer's active parameters + V·h) + 3·2·s·A·(d_qk + d_v) per depth (MLA: d_qk
    192, d_v 128)."""
    h, v, s, heads = 7168, 129280, 4096, 128
    active = 2 * h * h + 3 * h + DSV3.block_params("moe", active=True)
    per_depth = 6 * (active + v * h) + 3 * 2 * s * heads * (192 + 128)
    assert mtp_flops_per_token(DSV3) == pytest.approx(per_depth)
    assert model_flops_per_token(DSV3) - model_flops_per_token(replace(DSV3, mtp_layers=0)) == pytest.approx(per_depth)


def test_mtp_runs_and_is_stored_on_the_last_stage():
    """The last stage computes the MTP depth and holds its weights (and, with p > 1, a copy of the embedding for
    its lookup); the first stage neither."""
    cluster = load_system("h100").cluster(128)
    plan = Plan(dp=8, pp=16, ep=8, etp=1, global_batch=128, zero=1)
    without = replace(DSV3, mtp_layers=0)
    first, last, _ = stage_times(DSV3, plan, Stack(), unit_costs(DSV3, cluster, plan))
    first0, last0, _ = stage_times(without, plan, Stack(), unit_costs(without, cluster, plan))
    assert first.total == pytest.approx(first0.total) and last.total > last0.total
    extra = stage_params(DSV3, plan, False).total - stage_params(without, plan, False).total
    experts = 256 * DSV3.expert_params()  # split over ep 8 · etp 1; the rest (attention, router, shared) t = 1
    assert extra == pytest.approx(DSV3.mtp_params() - experts + experts / 8 + 129280 * 7168)
    assert stage_params(DSV3, plan, True).total == stage_params(without, plan, True).total


def test_a_recipes_uneven_last_stage_balances_the_mtp_depth():
    """Megatron-Bridge's DeepSeek-V3 layout on 16 stages: [E + 4] + 14 × [4] + [1 + MTP + loss]. With the last
    stage at 1 layer the others hold ⌈60/15⌉ = 4, and the MTP depth no longer makes the last rank the slowest."""
    cluster = load_system("b200").cluster(256)
    plan = Plan(dp=16, pp=16, ep=8, etp=1, global_batch=4096, zero=1, precision="mxfp8")
    uneven = replace(plan, last_stage_layers=1)
    assert (layers_on_stage(DSV3, plan), layers_on_last(DSV3, plan)) == (4, 4)
    assert (layers_on_stage(DSV3, uneven), layers_on_last(DSV3, uneven)) == (4, 1)
    even, balanced = estimate(DSV3, cluster, plan), estimate(DSV3, cluster, uneven)
    assert balanced.step_time < even.step_time
    bridge = load_stack("megatron-bridge")  # the recipe's own stack: its hosts issue each expert GEMM's kernels
    first, last, _ = stage_times(DSV3, uneven, bridge, unit_costs(DSV3, cluster, uneven, bridge))
    assert first.total > last.total
    assert "last-stage-layers=1" in uneven.describe()


@pytest.mark.parametrize(("pp", "last"), [(16, 1), (8, 5), (4, 13)])
def test_layout_strings_give_the_last_ranks_layers(pp, last):
    """Chunk i runs on rank i mod p: pp 8 (vp 2) gets chunks 7 and 15 (4 + 1), pp 4 (vp 4) chunks 3, 7, 11, 15."""
    assert layout_last_stage(DSV3_LAYOUT_16, pp) == last
    assert DSV3_LAYOUT_16.count("t") == 61
    # DeepSeek-V3 on H100: "Et|(tt|)*30mL", 32 chunks on pp 8 (vp 4): chunks 7, 15, 23, 31 = 2 + 2 + 2 + 0
    assert layout_last_stage("Et|" + "tt|" * 30 + "mL", 8) == 6


def test_check_bounds_the_last_stage():
    plan = Plan(dp=8, pp=16, ep=8, etp=1, global_batch=128)
    assert "needs pp > 1" in check(DSV3, None, Plan(last_stage_layers=2))[0]
    reasons = check(DSV3, None, replace(plan, last_stage_layers=50))
    assert "leaves 11 of num_layers=61 for the other 15 pipeline ranks' 15 model chunks" in reasons[0]
    assert not check(DSV3, None, replace(plan, last_stage_layers=1))


@pytest.mark.parametrize(("fields", "message"), [
    ({"mtp_pattern": "*E"}, "mtp_pattern='*E' needs mtp_layers > 0"),
    ({"mtp_layers": 1}, "a hybrid's mtp_layers needs mtp_pattern"),
    ({"mtp_layers": 1, "mtp_pattern": "*X"}, "mtp_pattern has 'X', a block layer_pattern does not have"),
    ({"mtp_shared": True}, "mtp_shared=true needs mtp_layers > 0"),
])
def test_bad_mtp_fields_are_named(fields, message):
    nano = load_model("nemotron-3-nano")
    with pytest.raises(SpecError, match=message.replace("*", r"\*").replace("(", r"\(")):
        replace(nano, **fields)


def test_a_dense_models_mtp_layer_is_one_of_its_layers():
    model = ModelSpec(name="d", num_layers=4, hidden_size=1024, num_heads=8, ffn_hidden_size=4096,
                      vocab_size=32000, mtp_layers=1)
    assert model.mtp_kinds == ("dense",)
    assert model.mtp_params() == model.block_params("dense") + 2 * 1024 * 1024 + 3 * 2 * 1024  # LayerNorm w + b
    with pytest.raises(SpecError, match="applies to a hybrid layer_pattern only"):
        replace(model, mtp_pattern="*")
    # its own activations: the two norms' inputs and eh_proj's 2h-wide input, per micro-batch on the last stage
    saved = sum(o.saved for o in mtp_ops(model, Plan(), Stack()) if o.phase == "fwd")
    assert saved == (2048 * 1024 + 2048 * 1024 + 2048 * 2 * 1024) * ACT_BYTES


def test_an_uneven_last_stage_is_priced_and_stored_with_its_own_layers():
    """Llama-3-8B (32 layers) on pp 4 with 11 layers on the last rank: the others hold ⌈21/3⌉ = 7. The last rank is
    the busiest, so the per-op table counts its 11 layers per micro-batch and the head; with every layer's activations
    offloaded it keeps only the two it works on (double buffering), as the first rank does."""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(8)
    plan = Plan(dp=2, pp=4, global_batch=16, zero=1, last_stage_layers=11)
    assert (layers_on_stage(model, plan), layers_on_last(model, plan)) == (7, 11)
    est = estimate(model, cluster, plan)
    m = 8  # micro-batches: 16 sequences over dp 2
    counts = {(o.name, o.phase): o.count for o in est.ops}
    assert counts["attn/core", "fwd"] == m * 11 and counts["head/logits", "fwd"] == m
    assert ("embed/lookup", "fwd") not in counts
    offloaded = estimate(model, cluster, replace(plan, offload_activations=True))
    per_layer = offloaded.detail[2].layer_saved
    first, last = offloaded.rank_memory
    states_first, states_last = (sum(s) for s in model_state_memory(model, plan, Stack()))
    head = offloaded.detail[2].head_saved + loss_workspace(model, plan, Stack())  # its logits and the loss's transient
    assert last - states_last == pytest.approx(2 * per_layer + head)
    assert first - states_first < last - states_last + per_layer
