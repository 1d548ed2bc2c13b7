"""Per-op costs: relations and closed forms (Narayanan 2021 eq. 3, PaLM App. B, Korthikanti 2022 Table 2)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import gpt
from meshplan.cost.ops import ACT_BYTES, dense_layer, embedding_ops, head_ops, linear_2d, moe_layer
from meshplan.errors import SpecError
from meshplan.estimate import attention_flops_per_token, matmul_params, model_flops_per_token, saved_bytes
from meshplan.specs.hardware import load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan, check, fsdp_has_zero
from meshplan.specs.stack import Stack


def _flops(ops, phase=None, kind=None):
    return sum(o.flops for o in ops if (phase is None or o.phase == phase) and (kind is None or o.kind == kind))


def test_gemm_backward_is_twice_forward():
    ops = dense_layer(gpt(), Plan(), Stack())
    fwd = _flops(ops, "fwd", "gemm")
    bwd = _flops(ops, "bwd_x", "gemm") + _flops(ops, "bwd_w", "gemm")
    assert bwd == pytest.approx(2 * fwd)


def test_gemm_flops_of_one_layer_match_hand_count():
    # h=1024, s=2048, b=1: qkv 2·T·h·3h, out 2·T·h·h, fc1 2·T·h·4h, fc2 2·T·4h·h → 2·T·12h² = 24·T·h²
    ops = dense_layer(gpt(), Plan(), Stack())
    assert _flops(ops, "fwd", "gemm") == 24 * 2048 * 1024**2


def test_per_op_training_flops_match_6n_plus_attention():
    """Σ per-op FLOPs (unfused attention, no recompute) = 6·N·tokens + 3·attention (PaLM App. B).

    N counts the matmul weights; norms and biases are not matmul parameters, so allow 0.1 %."""
    model = gpt(layers=4, hidden=2048, heads=16)
    plan, unfused = Plan(), Stack(flash_attention=False)
    layer = dense_layer(model, plan, unfused)
    per_layer = _flops(layer, kind="gemm") + _flops(layer, kind="attention")
    head = _flops(head_ops(model, plan, unfused), kind="gemm")
    tokens = model.seq_length
    assert (model.num_layers * per_layer + head) / tokens == pytest.approx(model_flops_per_token(model), rel=1e-3)


def test_attention_term_is_palm_12_l_h_s():
    model = gpt(layers=3, hidden=1024, heads=16, seq=4096)
    # 3 · 2·s·A·2d·L = 12·L·h·s with A·d = h
    assert 3 * attention_flops_per_token(model) == 12 * 3 * 1024 * 4096


def test_flash_attention_skips_the_masked_half_and_recomputes_in_backward():
    model = gpt()
    unfused = [o for o in dense_layer(model, Plan(), Stack(flash_attention=False)) if o.kind == "attention"]
    fused = [o for o in dense_layer(model, Plan(), Stack()) if o.kind == "attention"]
    assert fused[0].flops == unfused[0].flops / 2  # causal blocks skipped
    assert fused[1].flops == 2.5 * fused[0].flops  # 5 GEMMs backward vs 2 forward


@pytest.mark.parametrize("dropout, fwd_bytes, bwd_bytes", [(False, 8, 14), (True, 13, 19)])
def test_unfused_attention_moves_the_scores_kernel_by_kernel(dropout, fwd_bytes, bwd_bytes):
    """bf16 scores, s = 2048, 16 heads, b = 1. Forward: Q·Kᵀ writes S (2), softmax reads S and writes P (4),
    P·V reads P (2) = 8 bytes per score; backward: dP written (2), softmax-backward reads P, dP and writes dS
    (6), dQ and dK read dS (4), dV reads P (2) = 14. Dropout: + read, write and a 1-byte mask = +5 each way."""
    model = replace(gpt(), dropout=dropout)
    fwd, bwd = [o for o in dense_layer(model, Plan(), Stack(flash_attention=False)) if o.kind == "attention"]
    s, heads, h = 2048, 16, 1024
    scores = heads * s * s
    qkv, out = 3 * s * h, s * h  # elements
    assert fwd.nbytes == ACT_BYTES * (qkv + out) + fwd_bytes * scores
    assert bwd.nbytes == ACT_BYTES * (2 * qkv + 2 * out) + bwd_bytes * scores


UNFUSED = Stack(flash_attention=False)


def _saved(model: ModelSpec, plan: Plan, stack: Stack = UNFUSED) -> float:
    """Bytes one layer keeps for its backward pass (selective recompute drops the recomputable ones); unfused
    attention unless ``stack`` says otherwise."""
    return saved_bytes(dense_layer(model, plan, stack), plan.recompute)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_activations_per_layer_korthikanti_table2(tp):
    s, b, h, a = 2048, 1, 1024, 16
    model = gpt(hidden=h, heads=a, seq=s)
    sbh = s * b * h
    scores = 5 * a * s * s * b
    # no parallelism row generalised to tp: 10·sbh + 24·sbh/t + 5·a·s²·b/t
    plan = Plan(tp=tp)
    assert _saved(model, plan) == pytest.approx(10 * sbh + 24 * sbh / tp + scores / tp)
    # sequence parallel: 34·sbh/t + 5·a·s²·b/t (needs tp > 1)
    if tp > 1:
        sp = Plan(tp=tp, sequence_parallel=True)
        assert _saved(model, sp) == pytest.approx(34 * sbh / tp + scores / tp)
        sel = Plan(tp=tp, sequence_parallel=True, recompute="selective")
        assert _saved(model, sel) == pytest.approx(34 * sbh / tp)


def test_activations_without_parallelism_are_34_plus_5as_over_h():
    s, b, h, a = 1024, 2, 512, 8
    model = gpt(hidden=h, heads=a, seq=s)
    plan = Plan(micro_batch=b)
    assert _saved(model, plan) == pytest.approx(s * b * h * (34 + 5 * a * s / h))


def test_flash_attention_saves_like_selective_recompute_plus_lse():
    model = gpt()
    flash = _saved(model, Plan(tp=4, sequence_parallel=True), Stack())
    selective = _saved(model, Plan(tp=4, sequence_parallel=True, recompute="selective"))
    lse = 2048 * (16 / 4) * 4  # T · A/t heads · fp32
    assert flash == pytest.approx(selective + lse)


def test_tp_1_has_no_tp_traffic_time():
    from meshplan.estimate import estimate
    from meshplan.specs.hardware import load_system

    est = estimate(gpt(), load_system("h100").cluster(8), Plan(dp=8, global_batch=64))
    assert est.breakdown["tp"] == 0.0


def test_sequence_parallel_replaces_all_reduce_with_gather_and_scatter():
    ops = dense_layer(gpt(), Plan(tp=4, sequence_parallel=True), Stack())
    kinds = {o.collective.kind for o in ops if o.kind == "collective" and o.collective.axis == "tp"}
    assert kinds == {"all_gather", "reduce_scatter"}
    ops = dense_layer(gpt(), Plan(tp=4), Stack())
    kinds = {o.collective.kind for o in ops if o.kind == "collective" and o.collective.axis == "tp"}
    assert kinds == {"all_reduce"}


def test_moe_expert_flops_scale_with_top_k_not_expert_count():
    base = dict(name="moe", num_layers=2, hidden_size=1024, num_heads=8, ffn_hidden_size=4096, vocab_size=32000,
                mlp="swiglu", norm="rmsnorm", moe_ffn_hidden_size=1024)
    few = ModelSpec(num_experts=8, moe_topk=2, **base)
    many = ModelSpec(num_experts=64, moe_topk=2, **base)
    expert = [o for o in moe_layer(few, Plan(), Stack()) if o.name.startswith("moe/experts") and o.kind == "gemm"]
    expert_many = [o for o in moe_layer(many, Plan(), Stack()) if o.name.startswith("moe/experts") and o.kind == "gemm"]
    assert _flops(expert) == _flops(expert_many)
    # top-2 SwiGLU experts: 3 GEMMs of 2·T·k·H·Fe, ×3 passes = 18·T·k·H·Fe
    assert _flops(expert) == 18 * 2048 * 2 * 1024 * 1024


def test_moe_dispatch_bytes():
    model = ModelSpec(name="moe", num_layers=2, hidden_size=1024, num_heads=8, ffn_hidden_size=4096,
                      vocab_size=32000, num_experts=8, moe_topk=2, moe_ffn_hidden_size=1024)
    ops = moe_layer(model, Plan(tp=2, dp=4, ep=4, sequence_parallel=True), Stack())
    dispatch = [o for o in ops if o.name == "moe/dispatch" and o.phase == "fwd"][0]
    # T/t tokens routed · k copies · h · 2 bytes = 1024 · 2 · 1024 · 2
    assert dispatch.nbytes == 1024 * 2 * 1024 * ACT_BYTES
    assert dispatch.collective.group == 4


def test_matmul_params_excludes_lookup_but_keeps_tied_head():
    model = gpt(layers=2, hidden=256, heads=4, vocab=1000)
    assert matmul_params(model) == model.params() - model.embedding_params() + 1000 * 256


def test_linear_2d_tp2_equal_one_is_1d_layout():
    # tp_out = 1: a row-parallel (1D) layer; FLOPs per GPU 2·(d_in/tp_in)·d_out·b per pass, 3 passes
    ops = linear_2d(1024, 4096, 512, tp_in=4, tp_out=1)
    assert _flops(ops) == 3 * 2 * (1024 / 4) * 4096 * 512
    tp_out = [o for o in ops if o.kind == "collective" and o.collective.axis == "tp_out"]
    assert tp_out[0].collective.group == 1


# ---- eager PyTorch element-wise kernels -------------------------------------------------------------------------
def _eager(model, stack):
    return {(o.name, o.phase): o.nbytes for o in dense_layer(model, Plan(), stack) if o.name.endswith("/eager")}


EAGER = Stack(fusion="eager")


def _llama(**extra):
    # Llama layout: RMSNorm, SwiGLU, RoPE, GQA (4 kv heads of 16), no biases, no dropout
    return ModelSpec(name="llama-test", num_layers=2, hidden_size=1024, num_heads=16, num_kv_heads=4,
                     ffn_hidden_size=2816, vocab_size=32000, seq_length=2048, mlp="swiglu", norm="rmsnorm", **extra)


def test_fused_plans_launch_no_eager_kernels():
    assert _eager(_llama(), Stack()) == {}
    assert not [o for o in head_ops(_llama(), Plan(), Stack()) if o.name.endswith("/eager")]


def test_eager_rmsnorm_streams_36_bytes_forward_and_92_backward_per_element():
    # T·H = 2048 · 1024 elements; the fused norm already counts r2 w2 forward and r4 w2 backward
    ops = _eager(_llama(), EAGER)
    elems = 2048 * 1024
    assert ops[("attn/norm/eager", "fwd")] == (36 - 4) * elems
    assert ops[("attn/norm/eager", "bwd_x")] == (92 - 6) * elems
    assert ops[("mlp/norm/eager", "fwd")] == ops[("attn/norm/eager", "fwd")]


def test_eager_rope_swiglu_and_repeat_kv_bytes():
    ops = _eager(_llama(), EAGER)
    T, d = 2048, 64
    # RoPE on q (16 heads) and k (4 heads): to fp32 (r2 w4), complex mul (r4 w4), type_as (r4 w2) = 20 bytes
    assert ops[("attn/rope/eager", "fwd")] == 20 * T * (16 + 4) * d
    # K and V copied to 16 heads each: 2 bytes written per element of the copies
    assert ops[("attn/repeat_kv/eager", "fwd")] == 2 * (2 * T * 16 * d)
    # SwiGLU as silu + mul (r2 w2 + r4 w2 = 10 bytes per FFN element) less the fused kernel's 6
    assert ops[("mlp/act/eager", "fwd")] == (10 - 6) * T * 2816


def test_eager_layernorm_gelu_model_adds_only_its_bias_gradients():
    # F.layer_norm and GELU are one kernel each way in eager mode too; each biased linear's gradient is reduced
    # by its own kernel, reading the output gradient once (2 bytes per element)
    model = gpt(layers=2, hidden=1024, heads=16, seq=2048)
    ops = _eager(model, EAGER)
    T, h = 2048, 1024
    assert set(ops) == {("attn/qkv_bias/eager", "bwd_w"), ("attn/out_bias/eager", "bwd_w"),
                        ("mlp/bias/eager", "bwd_w")}
    assert ops[("attn/qkv_bias/eager", "bwd_w")] == 2 * T * 3 * h
    assert ops[("mlp/bias/eager", "bwd_w")] == 2 * T * (4 * h + h)


def test_pytorch_cross_entropy_pays_the_upcast_and_three_pass_softmax():
    model = _llama()
    fused = {o.phase: o.nbytes for o in head_ops(model, Plan(), Stack()) if o.name == "head/loss"}
    extra = {o.phase: o.nbytes for o in head_ops(model, Plan(), Stack(cross_entropy="pytorch"))
             if o.name == "head/loss/eager"}
    logits = 2048 * 32000
    # fused: 10 bytes per logit forward, 6 backward; PyTorch: 6 + 16 forward, 4 + 16 + 6 backward
    assert fused["fwd"] + extra["fwd"] == 22 * logits
    assert fused["bwd_x"] + extra["bwd_x"] == 26 * logits


def test_eager_is_slower_and_compile_matters_only_where_kernels_differ():
    from meshplan.estimate import estimate

    cluster = load_system("h100").cluster(8)
    plan = Plan(dp=8, global_batch=8)
    llama = _llama()
    assert estimate(llama, cluster, plan, EAGER).step_time > estimate(llama, cluster, plan).step_time
    plain = replace(gpt(layers=2), qkv_bias=False, linear_bias=False)  # LayerNorm, GELU, no biases: nothing to fuse
    assert estimate(plain, cluster, plan, EAGER).step_time == pytest.approx(
        estimate(plain, cluster, plan).step_time)


def test_transformer_engine_keeps_the_fp8_copy_of_each_gemm_input():
    model = load_model("llama3-8b")
    saved = {}
    for name, plan, stack in (("bf16", Plan(), Stack()), ("te_fp8", Plan(precision="fp8"), Stack()),
                              ("torchao_fp8", Plan(precision="fp8"), Stack(cross_entropy="pytorch"))):
        saved[name] = {op.name: op.saved for op in dense_layer(model, plan, stack)
                       if op.kind == "gemm" and op.phase == "fwd"}
    # 8192 tokens × 4096 inputs: 2 bytes kept in bf16, 1 byte as TE's fp8 copy; torchao keeps the bf16 input
    assert saved["bf16"]["attn/qkv"] == 8192 * 4096 * 2
    assert saved["te_fp8"]["attn/qkv"] == 8192 * 4096 * 1
    assert saved["torchao_fp8"] == saved["bf16"]


def test_training_metrics_read_the_logits_outside_autograd():
    """Two metric cross-entropies (Composer + MPT) over T·V = 2048 · 51,200 logits: each casts bf16 to fp32
    (read 2, write 4 bytes) and runs log_softmax in fp32, three reads of a row too long for shared memory and a
    write (12 + 4): 2 · 22 · 2048 · 51,200 bytes, after the backward pass."""
    model = gpt()
    assert not [o for o in head_ops(model, Plan(), Stack()) if o.name == "head/metrics"]
    (metrics,) = [o for o in head_ops(model, Plan(), Stack(train_metrics=2)) if o.name == "head/metrics"]
    assert (metrics.phase, metrics.kind, metrics.saved) == ("bwd_x", "memory", 0.0)
    assert metrics.nbytes == 2 * 22 * 2048 * 51200
    with pytest.raises(SpecError, match="train_metrics=-1 is outside 1 … 100 \\(or 0: none\\)"):
        Stack(train_metrics=-1)


def test_flash_cross_entropy_reads_the_16_bit_logits():
    """flash-attn's CrossEntropyLoss: forward reads the bf16 logits twice (4 bytes), keeps them (2) and one fp32
    log-sum-exp per token; backward reads them and writes the bf16 gradient (4): 8 bytes per logit against the
    vocabulary-parallel loss's 10 + 6."""
    model = gpt()
    logits, tokens = 2048 * 51200, 2048

    def loss(stack):
        return [o for o in head_ops(model, Plan(), stack) if o.name == "head/loss"]

    fwd, bwd = loss(Stack(cross_entropy="flash"))
    assert (fwd.nbytes, bwd.nbytes, fwd.saved) == (4 * logits, 4 * logits, 2 * logits + 4 * tokens)
    fused_fwd, fused_bwd = loss(Stack())
    assert (fused_fwd.nbytes, fused_bwd.nbytes, fused_fwd.saved) == (10 * logits, 6 * logits, 4 * logits)


def test_fsdp_gradient_preparation_bytes_per_parameter():
    """FSDP1 (FlatParameter) per micro-batch: the flat gradient's cat (2 + 2), the cast to the fp32 reduce dtype
    (2 + 4) and the in-place pre-divide (4 + 4): 18 bytes per unsharded parameter; with bf16 reduction the cast
    goes: 4 + 4 = 8. FSDP2 copies into the fp32 reduce-scatter buffer only: 2 + 4 = 6. One layer of the test GPT
    holds 12h² + 13h = 12,596,224 parameters (h = 1024), split over tp."""
    model, layer = gpt(), 12 * 1024**2 + 13 * 1024

    def prep(fsdp="none", **kw):
        return [o for o in dense_layer(model, Plan(zero=3, **kw), Stack(fsdp=fsdp)) if o.name == "layer/fsdp_grad"]

    (fp32,) = prep(fsdp="fsdp1", grad_bytes=4)
    assert (fp32.phase, fp32.kind, fp32.nbytes) == ("bwd_w", "memory", 18 * layer)
    assert prep(fsdp="fsdp1", grad_bytes=2)[0].nbytes == 8 * layer
    assert prep(fsdp="fsdp2", grad_bytes=4)[0].nbytes == 6 * layer
    assert prep(fsdp="fsdp1", grad_bytes=4, tp=2)[0].nbytes == 18 * layer / 2
    assert prep() == [] and prep(fsdp="fsdp1", finetune="lora") == []  # LoRA: frozen weights have no gradient
    # the tied LM head holds only the final LayerNorm (2h); the embedding V·h + positions·h
    head = [o for o in head_ops(model, Plan(zero=3, grad_bytes=4), Stack(fsdp="fsdp1"))
            if o.name == "head/fsdp_grad"]
    assert head[0].nbytes == 18 * 2 * 1024
    embed = [o for o in embedding_ops(model, Plan(zero=3, grad_bytes=4), Stack(fsdp="fsdp1"))
             if o.name == "embed/fsdp_grad"]
    assert embed[0].nbytes == 18 * (51200 + model.max_position_embeddings) * 1024
    # per micro-batch whatever FSDP's sharding (NO_SHARD reduces the same gradient with an all-reduce)
    assert [o.nbytes for o in dense_layer(model, Plan(grad_bytes=4), Stack(fsdp="fsdp1"))
            if o.name == "layer/fsdp_grad"] == [18 * layer]
    with pytest.raises(SpecError, match="fsdp='ddp' must be one of none, fsdp1, fsdp2"):
        Stack(fsdp="ddp")
    assert check(model, None, Plan(zero=1), Stack(fsdp="fsdp2")) == [
        "fsdp=fsdp2 has no ZeRO-1 strategy (NO_SHARD is zero=0, SHARD_GRAD_OP 2, FULL_SHARD 3)"]
    # the one rule check, the search space and the CLI's zero grid share
    assert [z for z in range(4) if fsdp_has_zero("fsdp1", z)] == [0, 2, 3]
    assert [z for z in range(4) if fsdp_has_zero("none", z)] == [0, 1, 2, 3]
    # a SUMMA layer pays it too, split over its tp x tp2 grid
    summa_plan = Plan(zero=3, grad_bytes=4, tp=2, tp2=2, tensor_layout="summa")
    (summa,) = [o for o in dense_layer(model, summa_plan, Stack(fsdp="fsdp1")) if o.name == "layer/fsdp_grad"]
    assert summa.nbytes == 18 * layer / 4


def test_fsdp_gradient_preparation_of_a_moe_layer_counts_its_own_experts():
    """A MoE layer prepares its attention, norms, router and shared experts (split t-ways) and its local experts
    (E / (ep·etp) of them); a dense layer of the same model its dense MLP: each layer kind its own parameters."""
    model = load_model("deepseek-v3")
    plan, fsdp2 = Plan(zero=3, grad_bytes=4, ep=8), Stack(fsdp="fsdp2")
    experts = model.num_experts * model.mlp_params(model.moe_ffn_hidden_size)
    common = model.attention_params() + 2 * model.norm_params(model.hidden_size)
    (moe,) = [o for o in moe_layer(model, plan, fsdp2) if o.name == "layer/fsdp_grad"]
    assert moe.nbytes == pytest.approx(6 * (common + model.moe_params() - experts + experts / 8))
    (dense,) = [o for o in dense_layer(model, plan, fsdp2) if o.name == "layer/fsdp_grad"]
    assert dense.nbytes == pytest.approx(6 * (common + model.mlp_params(model.ffn_hidden_size)))


def test_varlen_attention_packs_and_unpacks_every_layer():
    """flash-attn's unpad_input / pad_input around the kernel, per q, k, v element (q + 2·kv = 3h for MHA) and
    output element (h): forward gathers (2 + 2) and zero-fills + index_puts the output (2 + 2 + 2); backward
    zero-fills + scatters the q, k, v gradients (2 + 2 + 2) and gathers the output's (2 + 2). The test GPT (h = 1024,
    T = 2048): forward 4·3·T·h + 6·T·h = 18·T·h bytes, backward 18·T·h + 4·T·h = 22·T·h; halved at tp = 2.
    The forward also takes at least 24 host launches (roofline: launches × Efficiency.host_launch)."""
    model, th = gpt(), 2048 * 1024

    def varlen(plan, on=True):
        return [o for o in dense_layer(model, plan, Stack(varlen_attention=on)) if o.name == "attn/varlen"]

    fwd, bwd = varlen(Plan())
    assert (fwd.phase, fwd.kind, fwd.nbytes) == ("fwd", "memory", 18 * th)
    assert (bwd.phase, bwd.nbytes) == ("bwd_x", 22 * th)
    # three unpad_input calls of 8 kernels each wait on the host after the synchronisations; the backward none
    assert (fwd.launches, bwd.launches) == (24, 0.0)
    # FlashAttention's packed output is kept beside the padded copy the output projection saves: 2 bytes per element
    assert (fwd.saved, bwd.saved) == (2 * th, 0.0)
    assert [o.nbytes for o in varlen(Plan(tp=2))] == [9 * th, 11 * th]
    assert varlen(Plan(), on=False) == []


def test_qkv_split_backward_concatenates_the_gradients():
    """torch.split's backward on the fused QKV output: a cat reading and writing 2 + 2 bytes per q, k, v element
    (3·T·h for the MHA test GPT), backward only."""
    model, th = gpt(), 2048 * 1024
    (cat,) = [o for o in dense_layer(model, Plan(), Stack(qkv_concat=True)) if o.name == "attn/qkv_concat"]
    assert (cat.phase, cat.kind, cat.nbytes) == ("bwd_x", "memory", 4 * 3 * th)
    assert not [o for o in dense_layer(model, Plan(), Stack()) if o.name == "attn/qkv_concat"]
    # MLA projects queries and keys/values through separate low-rank paths: nothing to concatenate
    assert not [o for o in moe_layer(load_model("deepseek-v3"), Plan(ep=8), Stack(qkv_concat=True))
                if o.name == "attn/qkv_concat"]


def test_varlen_forward_waits_on_the_host_for_its_launches():
    """A small micro-batch's unpad copies take less than 24 host launches of 35.4 µs: the op takes 0.85 ms."""
    from meshplan.roofline import op_time
    from meshplan.specs.efficiency import DEFAULT

    acc = load_system("h100").accelerator
    (fwd,) = [o for o in dense_layer(gpt(seq=128), Plan(), Stack(varlen_attention=True))
              if o.name == "attn/varlen" and o.phase == "fwd"]
    assert op_time(fwd, acc, "bf16", DEFAULT) == pytest.approx(24 * DEFAULT.host_launch)
