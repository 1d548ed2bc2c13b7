"""Grouped expert GEMMs, the EP all-to-all overlap and LoRA fine-tuning: relations, with the arithmetic shown."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import gpt, rates_only
from meshplan.cost.layers import dense_layer, moe_layer
from meshplan.cost.lora import LORA_PREFIXES
from meshplan.estimate import estimate
from meshplan.specs.check import check
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import LORA_TARGETS, Plan
from meshplan.specs.stack import Stack


def test_grouped_gemm_quantization_pads_each_group_and_shares_waves():
    # 16 groups of a 100×128 output on 132 SMs with 128×128 tiles: each group pads to one 128-row tile, and
    # 16 tiles leave most of a wave idle, so the kernel splits k ⌊132 / 16⌋ = 8 ways (4096 / 128 = 32 allows it):
    # 16·8 CTAs of 132 → 8 · 16·100·128 / (132·128·128) of the SMs' work (specs/gemm_shape.py)
    e = DEFAULT.with_(gemm=1.0, gemm_k0=0.0)
    grouped = e.gemm_efficiency(100.0, 128.0, 4096.0, 132, 16.0)
    assert abs(grouped - 8 * 16 * 100 * 128 / (132 * 128 * 128)) < 1e-12
    # one 1600-row GEMM: 13 tiles of 128 rows, the last one 64 rows full, split ⌊132 / 13⌋ = 10 ways
    assert abs(e.gemm_efficiency(1600.0, 128.0, 4096.0, 132) - 10 * 1600 * 128 / (132 * 128 * 128)) < 1e-12
    # at k = 256 a slice keeps at least 128 of it: 2 ways; then the 64-row tile wins: 1600 / 64 = 25 tiles, no row
    # wasted, 2 · 25 CTAs of 132 (the 128-row tile's 13 tiles would fill 26)
    assert abs(e.gemm_efficiency(1600.0, 128.0, 256.0, 132) - 2 * 25 / 132) < 1e-12
    # 16 groups of 1600 rows: 208 tiles, more than the SMs: two waves of 132, no split
    assert abs(e.gemm_efficiency(1600.0, 128.0, 4096.0, 132, 16.0)
               - 16 * 1600 * 128 / (2 * 132 * 128 * 128)) < 1e-12
    assert e.split_k_reductions(1600.0, 128.0, 4096.0, 132) == 1.0 == 1 - e.split_k_reductions(1600.0, 128.0,
                                                                                               4096.0, 132, 16.0)


def test_expert_gemms_are_grouped_per_local_expert():
    model = load_model("mixtral-8x7b").with_seq_length(4096)
    plan = Plan(dp=8, ep=4, micro_batch=1)
    fc1 = next(op for op in moe_layer(model, plan, Stack()) if op.name == "moe/experts/fc1" and op.phase == "fwd")
    # 8 experts / ep 4 = 2 local experts; 4096 tokens · top-2 = 8192 rows → 4096 rows each
    assert fc1.groups == 2 and fc1.m == 4096
    # weights read: 2 experts × h × 2F
    assert fc1.nbytes == 2 * (8192 * 4096 + 2 * 4096 * 2 * 14336 + 8192 * 2 * 14336)
    wgrad = next(op for op in moe_layer(model, plan, Stack()) if op.name == "moe/experts/fc1" and op.phase == "bwd_w")
    assert wgrad.k == 4096  # reduces over one expert's rows


def test_ep_overlap_is_never_slower_and_hides_the_all_to_all():
    model = load_model("mixtral-8x7b").with_seq_length(4096)
    cluster = load_system("h100").cluster(16)
    base = Plan(dp=16, ep=8, micro_batch=1, global_batch=64, zero=1)
    exposed = estimate(model, cluster, base)
    hidden = estimate(model, cluster, base, Stack(overlap_ep=True))
    assert hidden.step_time < exposed.step_time
    assert hidden.breakdown["ep"] < exposed.breakdown["ep"]
    assert hidden.breakdown["compute"] == exposed.breakdown["compute"]


def test_lora_drops_weight_gradients_and_trains_only_adapters(h100_64):
    model = gpt(layers=4, hidden=1024)
    plan = Plan(dp=64, micro_batch=1, zero=1)
    lora = plan.with_(finetune="lora", lora_rank=16)
    full_ops, lora_ops = dense_layer(model, plan, Stack()), dense_layer(model, lora, Stack())
    assert not [op for op in lora_ops if op.phase == "bwd_w" and "/lora_" not in op.name]
    assert len([op for op in full_ops if op.phase == "bwd_w"]) == 4  # qkv, out, fc1, fc2
    # adapters: 4 linears × (fwd, bwd_x, bwd_w) × (A, B)
    assert len([op for op in lora_ops if "/lora_" in op.name]) == 4 * 3 * 2
    full, tuned = estimate(model, h100_64, plan), estimate(model, h100_64, lora)
    assert tuned.breakdown["dp"] < full.breakdown["dp"]  # only the adapters' gradients are reduced
    # at h = 1024 the skinny, memory-bound adapter GEMMs cost about what the dropped weight gradients did; at
    # h = 4096 the weight-gradient GEMMs (a third of the GEMM FLOPs) dominate and LoRA is faster
    wide = gpt(layers=4, hidden=4096)
    assert estimate(wide, h100_64, lora).step_time < estimate(wide, h100_64, plan).step_time
    assert tuned.memory["weights"] > full.memory["weights"]  # base weights + adapters
    # adapters per layer: r·[(h + 3h) + (h + h) + (h + 4h) + (4h + h)] = 16·16·1024 = 262,144, 4 layers;
    # fp32 Adam state (12 B/param) sharded over 64 ranks
    assert abs(tuned.memory["optimizer"] - 12 * 4 * 16 * 16 * 1024 / 64) < 1e-6
    assert tuned.memory["grads"] < full.memory["grads"] / 100


def test_lora_adapters_on_mla_count_the_linears_the_ops_adapt():
    """DeepSeek-V3 MLA (h 7168, 128 heads, q_lora 1536, kv_lora 512, nope 128, rope 64, v 128): the adapted QKV
    linears are q_down 7168→1536, q_up 1536→128·192, kv_down 7168→576 and kv_up 512→128·256, so r·Σ(k + n) =
    r·(8704 + 26112 + 7744 + 33280) = r·75,840 per layer, the same as the adapter GEMMs' weights in the op list."""
    from meshplan.cost.params import adapter_params

    model = load_model("deepseek-v3")
    plan = Plan(finetune="lora", lora_rank=8, lora_targets="qkv")
    assert adapter_params(model, plan) == 8 * 75840
    ops = [o for o in moe_layer(model, plan, Stack()) if "/lora_" in o.name and o.phase == "fwd"]
    assert sum(o.k * o.n for o in ops) == 8 * 75840  # A: k×r and B: r×n of each adapted linear


def test_lora_model_flops_leave_out_the_frozen_weight_gradients(h100_64):
    """Forward 2·N, input gradients 2·N, no weight gradients: 4·N + 3 · attention per token instead of 6·N + 3 ·
    attention (NeMo's LoRA model TFLOP/s: Llama2-7B at 663 TFLOP/s for 24,824 tokens/s/GPU is 26.7 GFLOP/token)."""
    from meshplan.cost.flops import matmul_params, model_flops_per_token, plan_flops_per_token

    model = gpt(layers=4, hidden=1024)
    lora = Plan(dp=64, finetune="lora")
    assert plan_flops_per_token(model, Plan(dp=64)) == model_flops_per_token(model)
    assert plan_flops_per_token(model, lora) == model_flops_per_token(model) - 2 * matmul_params(model)
    est = estimate(model, h100_64, lora.with_(global_batch=64))
    assert est.model_flops == plan_flops_per_token(model, lora) * 64 * model.seq_length


def test_lora_on_qkv_only_adapts_one_linear(h100_64):
    """NeMo 1.x's default target: adapters on the QKV projection only. Per layer r·(h + 3h) = 16·4·1024 = 65,536
    parameters (a quarter of the all-linear 262,144 above); every base weight gradient is still dropped. Their
    optimizer state: 12 bytes per parameter (fp32 master weight and two Adam moments), 4 layers, ZeRO-1 over
    dp = 64: 12 · 4 · 65,536 / 64."""
    model = gpt(layers=4, hidden=1024)
    qkv = Plan(dp=64, micro_batch=1, zero=1, finetune="lora", lora_rank=16, lora_targets="qkv")
    ops = dense_layer(model, qkv, Stack())
    assert {op.name for op in ops if "/lora_" in op.name} == {"attn/qkv/lora_a", "attn/qkv/lora_b"}
    assert not [op for op in ops if op.phase == "bwd_w" and "/lora_" not in op.name]
    tuned = estimate(model, h100_64, qkv)
    assert abs(tuned.memory["optimizer"] - 12 * 4 * 16 * 4 * 1024 / 64) < 1e-6
    all_linears = estimate(model, h100_64, qkv.with_(lora_targets="all"))
    assert tuned.step_time < all_linears.step_time
    assert check(model, h100_64, qkv.with_(lora_targets="mlp")) == ["lora_targets='mlp' must be one of all, qkv"]
    assert set(LORA_PREFIXES) == set(LORA_TARGETS)  # every choice the check accepts has its GEMM prefixes


def test_megatron_model_flops_uses_the_multi_latent_attention_branch():
    from meshplan_validation.flops import megatron_model_flops

    model = load_model("deepseek-v3").with_seq_length(4096)
    h, a, s = 7168, 128, 4096
    # per token and layer: q 1536·(7168 + 128·192 + 1) + kv 512·(7168 + 128·256 + 1) + 7168·64 + 128·128·7168
    # + s·128·(192 + 128)/2; × 6 (3 passes × 2 FLOP per MAC)
    attn = 1536 * (h + a * 192 + 1) + 512 * (h + a * 256 + 1) + h * 64 + a * 128 * h + s * a * 320 / 2
    mlp = 2 * h * (8 * 2048 + 2048) * 1.5  # routed top-8 + shared expert, SwiGLU (g = 3/2), as 12·h²·(F/h)·g
    vocab = 6 * h * 129280 / 61
    expected = 61 * (6 * attn + 6 * mlp + vocab) * 4096
    assert megatron_model_flops(model, 1) == pytest.approx(expected, rel=1e-12)


DEFAULT_STACK = Stack()
HOSTED = Stack(host_dispatch=12e-6)  # Megatron-Core's cost per kernel (presets/stacks/megatron-core.toml); Stack()'s 0
# means a host that never limits, so no launch floor either


# ---- per-expert GEMMs launched by the host (mlp_moe.host_launched, roofline.op_time) -------------------------------
def _expert_ops(plan, stack=DEFAULT_STACK):
    model = load_model("qwen3-30b-a3b")
    return {(op.name, op.phase): op for op in moe_layer(model, plan, stack) if op.name.startswith("moe/experts/fc")}


def test_per_expert_gemms_count_their_host_launches():
    # 128 experts / ep 8 = 16 local experts: one GEMM each per pass, the activation one kernel forward and two
    # backward (mlp_moe.EXPERT_KERNELS: nine a expert); with fp8 also one quantization per expert before the forward
    # and the input-gradient GEMMs (the cast ops), none before the weight gradient
    model = load_model("qwen3-30b-a3b")
    act = {op.phase: op.launches for op in moe_layer(model, Plan(dp=8, ep=8), DEFAULT_STACK)
           if op.name == "moe/experts/act"}
    assert act == {"fwd": 16, "bwd_x": 32}
    bf16 = _expert_ops(Plan(dp=8, ep=8))
    assert {key: op.launches for key, op in bf16.items() if key[0] == "moe/experts/fc1"} == {
        ("moe/experts/fc1", "fwd"): 16, ("moe/experts/fc1", "bwd_x"): 16, ("moe/experts/fc1", "bwd_w"): 16}
    fp8 = _expert_ops(Plan(dp=8, ep=8, precision="fp8"))
    assert [fp8[("moe/experts/fc2", p)].launches for p in ("fwd", "bwd_x", "bwd_w")] == [16, 16, 16]
    assert [fp8[("moe/experts/fc2/cast", p)].launches for p in ("fwd", "bwd_x")] == [16, 16]
    grouped = _expert_ops(Plan(dp=8, ep=8, precision="fp8"), Stack(expert_gemm="grouped"))
    assert all(op.launches == 0 for op in grouped.values())


def test_a_host_launched_gemm_takes_at_least_the_host_time():
    from meshplan.roofline import op_time

    acc = rates_only("b200")  # without the per-kernel t0, which each of the 16 launches pays (roofline.overhead)
    op = _expert_ops(Plan(dp=8, ep=8, precision="fp8"), HOSTED)[("moe/experts/fc1", "fwd")]
    gpu = op_time(replace(op, launches=0.0), acc, "fp8", DEFAULT)
    # 16 experts × one GEMM launch each, through a Transformer Engine Linear: the stack's 12 µs per kernel × 100/37
    # (TE's module against a torch Linear, mlp_moe.TE_LINEAR) = 32.4 µs each, 0.52 ms of host time, against a few µs
    # of GPU time per expert GEMM
    per_gemm = HOSTED.host.per_kernel * 100 / 37
    assert op.launch_host == pytest.approx(per_gemm)
    assert op_time(op, acc, "fp8", DEFAULT) == pytest.approx(16 * per_gemm)
    assert gpu < 16 * per_gemm
    huge = replace(op, flops=op.flops * 1e4)  # a GEMM far longer than its launches: the GPU time stands
    assert op_time(huge, acc, "fp8", DEFAULT) == op_time(replace(huge, launches=0.0), acc, "fp8", DEFAULT)


def test_host_launches_matter_at_small_micro_batches_only():
    model = load_model("qwen3-30b-a3b")
    cluster = load_system("b200").cluster(8)

    def slowdown(mbs):
        plan = Plan(dp=8, ep=8, micro_batch=mbs, global_batch=64, precision="fp8", zero=1)
        return (estimate(model, cluster, plan, HOSTED).step_time
                / estimate(model, cluster, plan, HOSTED.with_(expert_gemm="grouped")).step_time)

    assert slowdown(1) > slowdown(8) >= 1.0
    assert slowdown(1) > 1.5  # 1024 rows per expert GEMM: the host, not the GPU, sets the pace


@pytest.mark.parametrize("expert_gemm", ["per_expert", "grouped"])
def test_search_finds_the_best_plan_for_the_stacks_expert_gemm(expert_gemm):
    """The search's top plan equals the best of estimate() over every candidate, whichever way the experts launch
    (the search computes its per-layer units with the plans' own settings, not the defaults)."""
    from meshplan.search import Space, search
    from test_search import every_plan

    model = load_model("qwen3-30b-a3b")
    cluster = load_system("b200").cluster(8)
    space = Space(global_batch=64, zero=(1,), recompute=("none",), offload_optimizer=(False,),
                  offload_activations=(False,), max_micro_batch=4, precision="fp8",
                  stack=Stack(expert_gemm=expert_gemm), all_placements=False, headroom=0.0, prefer_simple=False)
    result = search(model, cluster, space, top_k=1)
    fitting = [e for variants in every_plan(model, cluster, space)
               for e in (estimate(model, cluster, p, space.stack) for p in variants) if e.fits]
    assert all(e.stack.expert_gemm == expert_gemm for e in fitting) and result.plans[0].stack == space.stack
    assert result.plans[0].step_time == pytest.approx(min(e.step_time for e in fitting), rel=1e-9)


def test_the_op_table_names_launch_bound_expert_gemms():
    model = load_model("qwen3-30b-a3b")
    cluster = load_system("b200").cluster(8)
    plan = Plan(dp=8, ep=8, micro_batch=1, global_batch=8, precision="fp8", zero=1)
    bounds = {(r.name, r.phase): r.bound for r in estimate(model, cluster, plan).ops}
    assert bounds[("moe/experts/fc1", "fwd")] == "host"
    grouped = {(r.name, r.phase): r.bound
               for r in estimate(model, cluster, plan, Stack(expert_gemm="grouped")).ops}
    assert grouped[("moe/experts/fc1", "fwd")] in ("compute", "memory")
