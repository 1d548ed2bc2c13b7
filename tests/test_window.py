"""Sliding-window attention (ModelSpec.sliding_window / window_layers) and the eager kernels of Megatron-Core's
per-expert MLP around a clamped GLU and biased experts (mlp_moe.grouped_mlp_eager)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost.flops import attention_layer_flops, model_flops_per_token
from meshplan.cost.layers import dense_layer, moe_layer
from meshplan.cost.records import ACT_BYTES
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.hf.config import translate
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


def llama(**extra: object) -> ModelSpec:
    fields = {"mlp": "swiglu", "norm": "rmsnorm"} | extra
    return ModelSpec(name="w", num_layers=4, hidden_size=1024, num_heads=8, ffn_hidden_size=4096, vocab_size=32000,
                     seq_length=4096, **fields)


def _attention(ops: list, phase: str) -> list:
    """The attention core's records: "attn/core" (full layers) and "attn/core/window" (the windowed share)."""
    return [o for o in ops if o.name.startswith("attn/core") and o.phase == phase]


# ---- the spec ----------------------------------------------------------------------------------------------------
def test_a_window_without_a_layer_count_windows_every_attention_layer():
    assert llama(sliding_window=128).window_share == 1.0
    assert llama(sliding_window=128, window_layers=2).window_share == 0.5
    assert llama().window_share == 0.0
    assert llama(sliding_window=4096).window_share == 0.0  # as long as the sequence: no window at all
    # 0 stays "every layer", so a model with fewer layers is still a valid spec
    assert replace(llama(sliding_window=128), num_layers=2).window_share == 1.0


@pytest.mark.parametrize(("extra", "message"), [
    ({"window_layers": 2}, "window_layers=2 needs sliding_window > 0"),
    ({"sliding_window": 128, "window_layers": 5}, "window_layers=5 is more than the model's 4 attention layers"),
    ({"sliding_window": 128, "causal": False}, "sliding_window=128 needs causal attention"),
    ({"sliding_window": -1}, "sliding_window=-1 must be a non-negative integer"),
    ({"glu_clamp": -7.0}, "glu_clamp=-7.0 must be positive"),
    ({"glu_clamp": 7.0, "mlp": "gelu"}, "glu_clamp=7.0 needs a gated MLP"),
    ({"glu_clamp": "7"}, "glu_clamp='7' must be a number"),
    ({"sliding_window": 128, "layer_pattern": "MM-E", "num_experts": 4, "moe_topk": 2, "mamba_heads": 8,
      "mamba_head_dim": 64, "mamba_state": 16}, "sliding_window=128 needs attention layers"),
])
def test_bad_window_and_clamp_settings_name_the_field(extra: dict, message: str):
    with pytest.raises(SpecError, match=message):
        llama(**extra)


def test_window_keys_average_min_of_position_and_window():
    # s = 8, w = 3: positions see 1, 2, 3, 3, 3, 3, 3, 3 keys = 21 → 21/8 = 2.625 = 3 − 3·2/16
    model = replace(llama(sliding_window=3), seq_length=8)
    assert model.window_keys() == 21 / 8 == 3 - 3 * 2 / 16


# ---- Hugging Face import ---------------------------------------------------------------------------------------
BASE = {"num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "intermediate_size": 4096,
        "vocab_size": 32000, "max_position_embeddings": 4096}


@pytest.mark.parametrize(("config", "window", "layers"), [
    ({"model_type": "mistral", "sliding_window": 4096}, 4096, 0),  # MistralAttention: every layer (0: all)
    ({"model_type": "mistral", "sliding_window": None}, 0, 0),  # Mistral 7B v0.2+
    ({"model_type": "qwen2", "sliding_window": 1024, "use_sliding_window": False}, 0, 0),
    ({"model_type": "qwen2", "sliding_window": 1024, "use_sliding_window": True, "max_window_layers": 1}, 1024, 3),
    ({"model_type": "llama", "sliding_window": 512,
      "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]}, 512, 3),
])
def test_the_window_and_its_layers_are_read_per_family(config: dict, window: int, layers: int):
    spec = translate(BASE | config, "x")
    assert (spec.get("sliding_window", 0), spec.get("window_layers", 0)) == (window, layers)


def test_gpt_oss_alternates_from_the_first_layer_and_clamps_at_swiglu_limit():
    oss = BASE | {"model_type": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 128}
    spec = translate(oss | {"num_hidden_layers": 5}, "oss")  # GptOssConfig: layers 0, 2, 4 windowed
    assert (spec["sliding_window"], spec["window_layers"], spec["glu_clamp"]) == (128, 3, 7.0)
    assert translate(oss | {"swiglu_limit": 10.0}, "oss")["glu_clamp"] == 10.0


def test_layer_types_must_name_every_layer():
    with pytest.raises(SpecError, match="layer_types has 2 entries but num_hidden_layers=4"):
        translate(BASE | {"model_type": "llama", "sliding_window": 8, "layer_types": ["full_attention"] * 2}, "x")


def test_the_gpt_oss_presets_window_half_their_layers():
    for name, layers in (("gpt-oss-120b", 36), ("gpt-oss-20b", 24)):
        model = load_model(name)
        assert (model.sliding_window, model.window_layers, model.glu_clamp) == (128, layers // 2, 7.0)


# ---- attention cost --------------------------------------------------------------------------------------------
def test_windowed_layers_do_the_windows_flops_full_layers_the_causal_half():
    """s = 4096, 8 heads of 128, one micro-batch: a full causal layer 2·T·s·A·2d / 2 = 2·4096·4096·8·256 / 2
    = 34.36 GFLOP forward; w = 128 sees 128 − 128·127/8192 = 126.02 keys per query: 2·4096·126.02·8·256 = 2.11 GFLOP.
    Half the layers windowed: the average layer carries half of each; its saved q, k, v are counted once."""
    full = 2 * 4096 * 4096 * 8 * 256 / 2
    band = 2 * 4096 * (128 - 128 * 127 / 8192) * 8 * 256
    plain = _attention(dense_layer(llama(), Plan(), Stack()), "fwd")
    mixed = _attention(dense_layer(llama(sliding_window=128, window_layers=2), Plan(), Stack()), "fwd")
    assert [o.flops for o in plain] == [pytest.approx(full)]
    assert [o.flops for o in mixed] == [pytest.approx(full / 2), pytest.approx(band / 2)]
    assert [(o.name, o.window) for o in mixed] == [("attn/core", 0.0), ("attn/core/window", 128)]
    assert sum(o.saved for o in mixed) == pytest.approx(plain[0].saved)
    assert sum(o.nbytes for o in mixed) == pytest.approx(plain[0].nbytes)
    bwd = _attention(dense_layer(llama(sliding_window=128, window_layers=2), Plan(), Stack()), "bwd_x")
    assert [o.flops for o in bwd] == [pytest.approx(2.5 * full / 2), pytest.approx(2.5 * band / 2)]


def test_a_window_as_long_as_the_sequence_is_plain_causal_attention():
    plain = dense_layer(llama(), Plan(), Stack())
    assert dense_layer(llama(sliding_window=4096), Plan(), Stack()) == plain
    assert dense_layer(llama(sliding_window=8192), Plan(), Stack()) == plain


def test_unfused_attention_computes_the_whole_square_whatever_the_window():
    unfused = Stack(flash_attention=False)
    assert dense_layer(llama(sliding_window=128), Plan(), unfused) == dense_layer(llama(), Plan(), unfused)


def test_a_band_wastes_a_block_per_query_tile_and_pays_the_tiles_fixed_cost_once():
    """w = 128 over s = 4096: a = 128 − 128·127/8192 = 126.02 keys per query; the band's two edges waste a block
    (128 keys) and the tile's fixed cost is L0 = 543 keys: a/(a + 128 + 543) of the rate, against the causal square's
    2048/(2048 + 64 + 543)."""
    a = 128 - 128 * 127 / 8192
    assert DEFAULT.attention_efficiency(128, 4096, window=128) == pytest.approx(DEFAULT.attention * a / (a + 128 + 543))
    assert DEFAULT.attention_efficiency(128, 4096) == pytest.approx(DEFAULT.attention * 2048 / 2655)
    # the band is slower per FLOP than the causal square, but does far fewer FLOPs: the layer is faster
    assert DEFAULT.attention_efficiency(128, 4096, window=128) < DEFAULT.attention_efficiency(128, 4096)


def test_ring_context_parallelism_cannot_run_a_window():
    """Transformer Engine's attention_with_cp takes a sliding window only with the all-gather (or a2a) exchange."""
    from meshplan.search import Space, search
    from meshplan.specs.check import check

    model, cluster = llama(sliding_window=128), load_system("h100").cluster(8)
    reasons = check(model, cluster, Plan(cp=2, dp=4))
    assert any("cp=2 with cp_comm='ring' cannot run sliding-window attention" in r for r in reasons)
    assert not check(model, cluster, Plan(cp=2, dp=4), Stack(cp_comm="allgather"))
    result = search(model, cluster, Space(global_batch=8, cp_max=2))
    assert result.rejected["ring context parallelism with a sliding window"] > 0
    assert all(e.plan.cp == 1 for e in result.plans)
    gathered = search(model, cluster, Space(global_batch=8, cp_max=2, stack=Stack(cp_comm="allgather")))
    assert "ring context parallelism with a sliding window" not in gathered.rejected
    assert gathered.evaluated > result.evaluated  # the cp = 2 plans are searched


def test_a_windowed_model_trains_faster_and_counts_fewer_model_flops():
    cluster = load_system("h100").cluster(8)
    plain, windowed = llama(), llama(sliding_window=128, window_layers=2)
    assert estimate(windowed, cluster, Plan(dp=8)).step_time < estimate(plain, cluster, Plan(dp=8)).step_time
    # 2·((1 − f)·s + f·w)·A·2d = 2·(2048 + 64)·8·256 per layer and token, against 2·4096·8·256: training (3 ×)
    # over 4 layers counts 3·4·2·(4096 − 2112)·8·256 fewer
    assert attention_layer_flops(windowed) == 2 * (2048 + 64) * 8 * 256
    assert model_flops_per_token(plain) - model_flops_per_token(windowed) == 3 * 4 * 2 * 1984 * 8 * 256


# ---- Megatron-Core's per-expert MLP: clamp and bias kernels ----------------------------------------------------
def moe(**extra: object) -> ModelSpec:
    return llama(num_experts=8, moe_topk=2, moe_ffn_hidden_size=2048, **extra)


def _bytes(ops: list, name: str) -> dict[str, float]:
    return {o.phase: o.nbytes for o in ops if o.name == name}


def test_a_clamped_glu_and_biased_experts_add_their_eager_kernels():
    """T = 4096 tokens, top-2: 8192 routed rows; F = 2048, H = 1024, 2 bytes. Clamp: 8F forward, 10F backward
    per row = 8·2048·8192·2 = 268 MB and 336 MB. Bias: 6H forward, 5H activation gradient, 3H bias gradient."""
    rows = 4096 * 2
    ops = moe_layer(moe(glu_clamp=7.0, linear_bias=True), Plan(), Stack())
    assert _bytes(ops, "moe/experts/act/clamp") == {"fwd": 8 * 2048 * rows * ACT_BYTES,
                                                     "bwd_x": 10 * 2048 * rows * ACT_BYTES}
    assert _bytes(ops, "moe/experts/fc2/bias") == {"fwd": 6 * 1024 * rows * ACT_BYTES,
                                                    "bwd_x": 5 * 1024 * rows * ACT_BYTES,
                                                    "bwd_w": 3 * 1024 * rows * ACT_BYTES}


def test_the_biases_per_expert_loop_is_launched_by_the_host_two_kernels_an_expert_each_way():
    """TEGroupedMLP._apply_bias runs ``t + b * p`` per local expert, then one cat: forward 2 kernels an expert + 1;
    backward the probabilities' gradient (product, row sum) an expert + the split's cat, and the bias gradient
    (product, column sum) an expert. 8 experts on one GPU (ep 1): 17, 17 and 16 launches at the stack's cost per
    kernel, a floor on each record's time (roofline.op_time): 17 x 12 us = 204 us where its traffic takes less."""
    from meshplan.roofline import op_time

    stack = Stack(host_dispatch=12e-6)
    ops = {o.phase: o for o in moe_layer(moe(linear_bias=True), Plan(), stack) if o.name == "moe/experts/fc2/bias"}
    assert {ph: o.launches for ph, o in ops.items()} == {"fwd": 2 * 8 + 1, "bwd_x": 2 * 8 + 1, "bwd_w": 2 * 8}
    assert {o.launch_host for o in ops.values()} == {stack.host.per_kernel} == {12e-6}
    cluster = load_system("h100").cluster(8)
    small = replace(ops["fwd"], nbytes=1e3)
    assert op_time(small, cluster.accelerator, "bf16", DEFAULT) == pytest.approx(17 * 12e-6)
    # with more experts per GPU the floor grows; a bare Stack() (no host cost) has none
    more = {o.phase: o for o in moe_layer(replace(moe(linear_bias=True), num_experts=16), Plan(), stack)
            if o.name == "moe/experts/fc2/bias"}
    assert more["fwd"].launches == 2 * 16 + 1 > ops["fwd"].launches
    assert {o.launch_host for o in moe_layer(moe(linear_bias=True), Plan(), Stack())
            if o.name == "moe/experts/fc2/bias"} == {0.0}


@pytest.mark.parametrize("stack", [Stack(expert_gemm="grouped"), Stack(fusion="eager")])
def test_a_fused_grouped_mlp_or_a_stack_without_megatrons_experts_runs_none_of_them(stack: Stack):
    names = {o.name for o in moe_layer(moe(glu_clamp=7.0, linear_bias=True), Plan(), stack)}
    assert not names & {"moe/experts/act/clamp", "moe/experts/fc2/bias"}


def test_no_clamp_or_bias_no_eager_kernels():
    names = {o.name for o in moe_layer(moe(), Plan(), Stack())}
    assert not names & {"moe/experts/act/clamp", "moe/experts/fc2/bias"}


def test_the_clamp_keeps_fc1s_output_and_the_moe_act_recompute_runs_it_again():
    """The clamps keep fc1's 2F-wide output besides the clamped copy the fused kernel keeps: 2·2048·8192 rows·2
    bytes = 67 MB a layer. The moe_act recompute frees it and runs the clamp's forward again (8F a row: its
    streaming time, 8·2048·8192·2 bytes at 0.85 of the H100's 3.35 TB/s, plus its kernel's fixed 2.4 µs, per layer
    and micro-batch)."""
    from meshplan.step.units import saved_bytes

    rows, clamp_bytes = 4096 * 2, 8 * 2048 * 4096 * 2 * ACT_BYTES
    ops, plain = moe_layer(moe(glu_clamp=7.0), Plan(), Stack()), moe_layer(moe(), Plan(), Stack())
    assert saved_bytes(ops) - saved_bytes(plain) == 2 * 2048 * rows * ACT_BYTES
    assert saved_bytes(ops, "selective", ("moe_act",)) == saved_bytes(plain, "selective", ("moe_act",))
    cluster = load_system("h100").cluster(8)
    plan = Plan(dp=8, ep=8, global_batch=8, recompute="selective", recompute_modules=("moe_act",))
    with_clamp = estimate(moe(glu_clamp=7.0), cluster, plan)
    without = estimate(moe(), cluster, plan)
    rerun = clamp_bytes / (3.35e12 * 0.85) + cluster.accelerator.kernel_overhead
    assert cluster.accelerator.kernel_overhead == 2.4e-6
    per_step = 4 * 1  # 4 layers, one micro-batch (global batch 8 over dp 8)
    assert with_clamp.breakdown["recompute"] - without.breakdown["recompute"] == pytest.approx(per_step * rerun,
                                                                                              rel=1e-3)


def test_palms_mfu_formula_counts_every_layers_keys_whatever_the_window():
    """validate.palm_flops converts a source's PaLM-style MFU with the published formula, 6·N + 12·l·h·s per
    token: a sliding window changes meshplan's model FLOPs, not the source's."""
    from meshplan_validation.flops import palm_flops

    assert palm_flops(llama(sliding_window=128), 2) == palm_flops(llama(), 2) == 2 * 4096 * model_flops_per_token(
        llama())
