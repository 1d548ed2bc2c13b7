"""Hybrid Mamba-2 / attention / MoE models (Nemotron-H, Nemotron 3): the Mamba block's ops, the latent MoE, the
average layer over block kinds, the plan rules, search == estimate, and validation's treatment of the runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cli import main
from meshplan.cost.flops import ssd_flops_per_token
from meshplan.cost.layers import hybrid_block, layer_kinds
from meshplan.cost.mamba import mamba_block
from meshplan.cost.params import kind_fractions, layer_params
from meshplan.cost.records import ACT_BYTES, dims
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.specs.check import check
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.units import saved_bytes
from spaces import EVERY_PLAN

NANO = load_model("nemotron-3-nano")
SUPER = load_model("nemotron-3-super")


def _op(ops, name, phase="fwd"):
    return next(o for o in ops if o.name == name and o.phase == phase)


def test_mamba_projections_split_over_tp():
    """Nano, b = 1, s = 8192, t = 2 (SP): in_proj 2688 → (4096 + 6144 + 64)/2 = 5152 columns, out_proj 2048 → 2688."""
    plan = Plan(tp=2, sequence_parallel=True)
    ops = mamba_block(NANO, plan, dims(NANO, plan, Stack()))
    in_proj, out_proj = _op(ops, "mamba/in_proj"), _op(ops, "mamba/out_proj")
    assert (in_proj.m, in_proj.k, in_proj.n) == (8192, 2688, 5152)
    assert in_proj.flops == 2 * 8192 * 2688 * 5152
    assert (out_proj.k, out_proj.n) == (2048, 2688)
    assert {o.collective.kind for o in ops if o.kind == "collective"} == {"all_gather", "reduce_scatter"}


def test_ssd_products_per_chunk():
    """T = 8192 tokens, Q = 128: 64 chunks; 64 heads, 8 groups, N = 128, P = 64 (t = 1).
    chunk states (128×128)·(128×64) per chunk-head, C·Bᵀ (128×128)·(128×128) per chunk-group, scan
    (128×256)·(256×64) per chunk-head; the forward FLOPs per token equal ssd_flops_per_token / 23 blocks."""
    ops = mamba_block(NANO, Plan(), dims(NANO, Plan(), Stack()))
    state, cb, scan = (_op(ops, f"mamba/ssd_{k}") for k in ("state", "cb", "scan"))
    assert (state.m, state.k, state.n, state.groups) == (128, 128, 64, 64 * 64)
    assert (cb.m, cb.k, cb.n, cb.groups) == (128, 128, 128, 64 * 8)
    assert (scan.m, scan.k, scan.n, scan.groups) == (128, 256, 64, 64 * 64)
    forward = sum(o.flops for o in ops if o.name.startswith("mamba/ssd") and o.phase == "fwd")
    assert forward == 8192 * (64 * (2 * 128 * 64 + 2 * 256 * 64) + 8 * 2 * 128 * 128)
    assert forward == pytest.approx(8192 * ssd_flops_per_token(NANO) / 23)
    # the chunk states cross HBM as fp32 and 16-bit copies: 12 bytes per element forward, 24 backward
    states = 64 * 64 * 128 * 64
    assert _op(ops, "mamba/ssd_states").nbytes == 12 * states
    assert _op(ops, "mamba/ssd_states", "bwd_x").nbytes == 24 * states
    # SSD products stay in 16 bits under an fp8 plan (no quantization casts for them)
    fp8 = hybrid_block(NANO, Plan(precision="fp8"), Stack(), "mamba")
    assert not [o for o in fp8 if o.name.startswith("mamba/ssd") and o.name.endswith("/cast")]
    assert [o for o in fp8 if o.name == "mamba/in_proj/cast"]


def test_mamba_block_keeps_its_inputs_and_the_scan_output():
    """Saved per block (t = 1, T = 8192): norm input 2688, in_proj input 2688, in_proj output 10304 (z, x, B, C, dt),
    scan output 4096 and out_proj input 4096 values per token, 2 bytes each."""
    ops = mamba_block(NANO, Plan(), dims(NANO, Plan(), Stack()))
    assert saved_bytes(ops) == 8192 * (2688 + 2688 + 10304 + 4096 + 4096) * ACT_BYTES


def test_latent_moe_dispatches_latent_rows():
    """Super, ep 8, T = 8192, top-22: the dispatch carries 8192 × 22 rows of 1024 (not 4096) 16-bit values; the
    experts' fc1 is (rows × 1024)·(1024 × 2688); H → 1024 and 1024 → H projections around them."""
    plan = Plan(ep=8, dp=8)
    ops = layer_kinds(SUPER, plan, Stack())["moe"]
    assert _op(ops, "moe/dispatch").nbytes == 8192 * 22 * 1024 * ACT_BYTES
    fc1 = _op(ops, "moe/experts/fc1")
    assert (fc1.k, fc1.n) == (1024, 2688)
    assert (_op(ops, "moe/latent_in").k, _op(ops, "moe/latent_in").n) == (4096, 1024)
    assert (_op(ops, "moe/latent_out").k, _op(ops, "moe/latent_out").n) == (1024, 4096)


def test_average_layer_weights_the_block_kinds():
    """Nano: 23/52 Mamba, 6/52 attention, 23/52 MoE; the layer's saved bytes and parameters are those shares."""
    assert kind_fractions(NANO) == {"mamba": 23 / 52, "attention": 6 / 52, "moe": 23 / 52}
    plan = Plan(ep=8, dp=8)
    per_kind = layer_kinds(NANO, plan, Stack())
    est = estimate(NANO, load_system("h100").cluster(8), replace(plan, recompute="none"))
    units = est.detail[2]
    assert units.layer_saved == pytest.approx(sum(saved_bytes(per_kind[k]) * f
                                                  for k, f in kind_fractions(NANO).items()))
    params = layer_params(NANO, plan)
    experts = 128 * NANO.expert_params() / 8
    assert params.expert == pytest.approx(23 / 52 * experts)
    assert params.dense * 52 == pytest.approx(NANO.params() - 23 * 128 * NANO.expert_params()
                                              - NANO.embedding_params() - NANO.head_params())


def test_per_op_counts_follow_the_blocks():
    """The per-op table runs each block kind's ops (its count of blocks) × micro-batches times."""
    est = estimate(NANO, load_system("h100").cluster(8), Plan(ep=8, dp=8, global_batch=64, recompute="none"))
    rows = {(r.name, r.phase): r.count for r in est.ops}
    assert rows[("mamba/in_proj", "fwd")] == 23 * 8
    assert rows[("attn/core", "fwd")] == 6 * 8
    assert rows[("moe/router", "fwd")] == 23 * 8


@pytest.mark.parametrize(("plan", "stack", "reason"), [
    (Plan(tp=16, dp=1), Stack(), "tp=16 does not divide mamba_groups=8"),
    (Plan(cp=2, dp=4), Stack(), "cp=2: context parallelism of Mamba layers is not modelled"),
    (Plan(), Stack(fusion="eager"),
     "fusion='eager': hybrid models (layer_pattern) are costed with fusion='fused' only"),
    (Plan(finetune="lora"), Stack(), "finetune='lora': hybrid models"),
])
def test_plans_a_hybrid_cannot_run_name_the_reason(plan, stack, reason):
    assert any(reason in r for r in check(NANO, None, plan, stack))


def test_search_agrees_with_estimate_and_rejects_cp():
    cluster = load_system("h100").cluster(16)
    space = Space(**EVERY_PLAN, global_batch=64, zero=(1,), recompute=("none", "full"), offload_optimizer=(False,),
                  offload_activations=(False,), max_micro_batch=2)
    result = search(NANO, cluster, space, top_k=3, workers=1)
    assert result.plans and "cp of Mamba layers not modelled" in result.rejected
    for best in result.plans:
        again = estimate(NANO, cluster, best.plan, best.stack)
        assert again.step_time == pytest.approx(best.step_time, rel=1e-6)
        assert again.peak_memory == pytest.approx(best.peak_memory, rel=1e-6)


def test_cli_estimates_a_hybrid_config_json(capsys):
    from pathlib import Path

    config = Path(__file__).parent / "data" / "hf" / "nemotron-3-nano" / "config.json"
    code = main(["estimate", "--model", str(config), "--seq", "8192", "--system", "h100", "--gpus", "16",
                 "--ep", "8", "--global-batch", "1024", "--recompute", "none", "--precision", "fp8"])
    out = capsys.readouterr().out
    assert code == 0 and "31.6 B params" in out and "step time" in out


def test_validation_compares_nano_and_keeps_super_apart_unless_asked():
    """A Nemotron 3 Nano record (sizes unstated: the preset of its name) is compared on its tokens/s, with the
    release's module recompute (Megatron-Bridge's H100 FP8 recipe: moe, layernorm, core_attn, moe_act) and its
    HybridEP dispatch (recipes_dispatch.FLEX_DISPATCH; priced 15 % fast, where the all-to-all dispatcher read
    -0.1 %: HybridEP's single permute and one copy a rank, at NVLink's rate, not its kernel's); a
    Nemotron 3 Super record (a latent MoE) is skipped with the reason by default and compared with ``hybrid=True``
    (``meshplan validate --hybrid``), with its recipe's two multi-token-prediction depths."""
    from meshplan_validation.case import map_run
    from meshplan_validation.evaluate import evaluate_case
    from meshplan_validation.skip import Skip

    rec = {"id": "n", "group": "megatron_bridge_26.04", "framework": "Megatron-Bridge / Megatron-Core",
           "task": "pretrain", "precision": "fp8",
           "model": {"name": "Nemotron-3-Nano", "arch": None, "num_layers": None, "hidden_size": None,
                     "num_heads": None, "seq_length": 8192},
           "hardware": {"gpu": "H100", "num_gpus": 16, "gpus_per_node": 8},
           "parallel": {"tp": 1, "pp": 1, "dp": 16, "cp": 1, "ep": 8, "micro_batch_size": 1,
                        "global_batch_size": 1024},
           "measured": {"tokens_per_s_per_gpu": 14507}}
    case = map_run(rec)
    assert case.model.layer_pattern == NANO.layer_pattern and case.plan.ep == 8 and case.measured == 14507
    assert case.plan.recompute == "selective"
    assert case.plan.recompute_modules == ("moe", "layernorm", "core_attn", "moe_act")
    assert (case.stack.moe_dispatcher, case.stack.flex_backend) == ("flex", "hybridep-32sm")
    result = evaluate_case(case)
    assert result.error is not None and result.error == pytest.approx(0.150, abs=0.01)
    super_rec = {**rec, "model": {**rec["model"], "name": "Nemotron-3-Super"}, "precision": "mxfp8",
                 "hardware": {"gpu": "GB200", "num_gpus": 64, "gpus_per_node": 4},
                 "parallel": {**rec["parallel"], "tp": 2, "dp": 32, "ep": 64, "global_batch_size": 512}}
    with pytest.raises(Skip, match="hybrid Mamba-2 model with a latent MoE, compared apart"):
        map_run(super_rec)
    apart = map_run(super_rec, hybrid=True)
    assert (apart.model.mtp_layers, apart.model.mtp_pattern) == (2, "*E")


def test_supers_recipes_dispatch_with_hybridep_once_per_server_and_rank():
    """Nemotron 3 Super's Megatron-Bridge recipes (26.04 to 26.08: recipes_dispatch.FLEX_DISPATCH) run HybridEP. Its
    top-22 of 512 experts over ep 64 on 8 DGX B200 servers (64 experts a server) hit a given other server with
    probability 1 − C(448, 22)/C(512, 22) = 0.950: a token crosses the network 7 × 0.950 = 6.65 times, not
    22 × 56/64 = 19.25; inside a server or a GB200 rack NVLink carries one copy to each of the
    64 × (1 − C(504, 22)/C(512, 22)) = 19.07 ranks a token hits, not 22."""
    from math import comb

    from meshplan.collectives.dispatch import node_hit, rank_copies
    from meshplan_validation.case import map_run

    rec = {"id": "s", "group": "megatron_bridge_26.04", "framework": "Megatron-Bridge / Megatron-Core",
           "task": "pretrain", "precision": "mxfp8",
           "model": {"name": "Nemotron-3-Super", "arch": None, "num_layers": None, "hidden_size": None,
                     "num_heads": None, "seq_length": 8192},
           "hardware": {"gpu": "B200", "num_gpus": 64, "gpus_per_node": 8},
           "parallel": {"tp": 1, "pp": 1, "dp": 64, "cp": 1, "ep": 64, "micro_batch_size": 1,
                        "global_batch_size": 512},
           "measured": {"tokens_per_s_per_gpu": 6302}}
    case = map_run(rec, hybrid=True)
    assert (case.stack.moe_dispatcher, case.stack.flex_backend, case.plan.ep) == ("flex", "hybridep-32sm", 64)
    E, k = SUPER.num_experts, SUPER.moe_topk
    assert (E, k) == (512, 22)
    assert node_hit(E, k, 64) == pytest.approx(1 - comb(448, 22) / comb(512, 22))
    assert 7 * node_hit(E, k, 64) == pytest.approx(6.65, abs=5e-3)
    assert rank_copies(E, k, 8) == pytest.approx(64 * (1 - comb(504, 22) / comb(512, 22)))
    assert rank_copies(E, k, 8) == pytest.approx(19.07, abs=5e-3)
