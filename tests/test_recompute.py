"""Selective recompute of Megatron-Core's modules (Plan.recompute_modules, ops.RECOMPUTE_MODULES): what each module
runs again in the backward pass and what its checkpoint frees, against the ops it acts on."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import gpt
from meshplan.cli import main
from meshplan.cost.flops import attention_flops_per_token, module_flops_per_token, recompute_flops_per_token
from meshplan.cost.layers import dense_layer, moe_layer
from meshplan.cost.recompute import rerun_by, rerun_part, runs_again
from meshplan.cost.records import ACT_BYTES
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.search import Space
from meshplan.specs.check import check
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.passes import pass_times, time_ops
from meshplan.step.units import saved_bytes

MOE = ModelSpec(name="moe", num_layers=4, hidden_size=1024, num_heads=8, ffn_hidden_size=4096, vocab_size=32000,
                seq_length=2048, mlp="swiglu", norm="rmsnorm", num_experts=8, moe_topk=2, moe_ffn_hidden_size=1024,
                shared_expert_ffn_size=2048)
H100 = load_system("h100")


STACK = Stack()  # the generic stack: fused kernels, flash attention


def _layer(model, plan, cluster=None, stack=STACK):
    cluster = cluster or H100.cluster(plan.num_gpus)
    ops = moe_layer(model, plan, stack) if model.is_moe else dense_layer(model, plan, stack)
    return ops, time_ops(ops, cluster, plan, DEFAULT)


def _fwd_time(ops, times, prefix):
    return sum(t for o, t in zip(ops, times, strict=True) if o.phase == "fwd" and o.kind != "collective"
               and o.name.startswith(prefix))


def test_core_attn_alone_is_the_old_selective_recompute():
    """Megatron-Core's default recompute_modules is ["core_attn"]: the attention kernel's forward again (meshplan's
    selective recompute before modules: every forward record of kind "attention"), and an unfused kernel's scores
    freed (Korthikanti et al. 2022 Table 2: 5·a·s²·b/t bytes)."""
    model, plan = gpt(), Plan(recompute="selective")
    ops, times = _layer(model, plan, stack=Stack(flash_attention=False))
    redo = pass_times(ops, times, plan, STACK, "selective").recompute
    assert redo == sum(t for o, t in zip(ops, times, strict=True) if o.phase == "fwd" and o.kind == "attention")
    s, a = 2048, 16
    assert saved_bytes(ops) - saved_bytes(ops, "selective") == 5 * a * s * s  # softmax 2 + mask 1 + dropout 2


def test_moe_act_recomputes_the_activation_and_frees_fc2s_input():
    """T = 2048 tokens, top-2 → 4096 expert rows; SwiGLU's output is Fe = 1024 wide, 2 bytes: fc2's saved input
    4096 · 1024 · 2 bytes is freed, the activation kernel runs again."""
    plan = Plan(recompute="selective", recompute_modules=("moe_act",))
    ops, times = _layer(MOE, plan)
    assert saved_bytes(ops) - saved_bytes(ops, "selective", ("moe_act",)) == 4096 * 1024 * ACT_BYTES
    assert pass_times(ops, times, plan, STACK, "selective").recompute == pytest.approx(
        _fwd_time(ops, times, "moe/experts/act"))


def test_layernorm_recomputes_the_moe_norm_and_frees_the_routers_input():
    """The pre-MLP norm of a MoE layer is a module of its own: its output (T · H · 2 bytes, which the router keeps)
    is freed; the attention's norm is fused into linear_qkv in Megatron-Core's specs and is not recomputed."""
    plan = Plan(recompute="selective", recompute_modules=("layernorm",))
    ops, times = _layer(MOE, plan)
    assert saved_bytes(ops) - saved_bytes(ops, "selective", ("layernorm",)) == 2048 * 1024 * ACT_BYTES
    recompute = pass_times(ops, times, plan, STACK, "selective").recompute
    assert recompute == pytest.approx(_fwd_time(ops, times, "moe/norm"))
    dense_ops, dense_times = _layer(gpt(), plan)
    assert pass_times(dense_ops, dense_times, plan, STACK, "selective").recompute == 0.0


def test_moe_recomputes_the_whole_moe_layer_with_its_all_to_alls():
    """checkpoint(moe_layer, norm output): every MoE kernel's forward again plus the forward's exposed dispatch and
    combine; only the router's input (the norm output) stays saved of the MoE's activations."""
    plan = Plan(dp=8, ep=8, recompute="selective", recompute_modules=("moe",))
    ops, times = _layer(MOE, plan)
    times_none = pass_times(ops, times, plan, STACK, "none")
    redo = pass_times(ops, times, plan, STACK, "selective").recompute
    kernels = sum(_fwd_time(ops, times, p) for p in ("moe/router", "moe/permute", "moe/unpermute", "moe/experts/",
                                                      "moe/shared/"))
    exposed_forward_a2a = sum(t for o, t in zip(ops, times, strict=True)
                              if o.phase == "fwd" and o.name in ("moe/dispatch", "moe/combine"))
    assert redo == pytest.approx(kernels + exposed_forward_a2a)
    assert 0 < exposed_forward_a2a <= times_none.ep
    freed = sum(o.saved for o in ops if o.phase == "fwd" and o.name.startswith(("moe/experts/", "moe/shared/")))
    assert saved_bytes(ops) - saved_bytes(ops, "selective", ("moe",)) == freed > 0
    router = next(o for o in ops if o.name == "moe/router" and o.phase == "fwd")
    assert router.saved == 2048 * 1024 * ACT_BYTES  # kept


def test_mlp_recomputes_dense_mlps_only():
    """Megatron-Core recomputes "mlp" on layers whose MLP is not a MoELayer: a MoE layer is untouched. On a dense
    layer the checkpoint holds the pre-MLP norm (fused into linear_fc1) and keeps only its input: norm, fc1, the
    activation and fc2 run again, and fc1's input (T·H), the activation's input and fc2's input (T·4H each, GeLU)
    are freed: T = 2048, H = 1024, 2 bytes."""
    plan = Plan(recompute="selective", recompute_modules=("mlp",))
    moe_ops, moe_times = _layer(MOE, plan)
    assert pass_times(moe_ops, moe_times, plan, STACK, "selective").recompute == 0.0
    assert saved_bytes(moe_ops, "selective", ("mlp",)) == saved_bytes(moe_ops)
    ops, times = _layer(gpt(), plan)
    redo = pass_times(ops, times, plan, STACK, "selective").recompute
    assert redo == pytest.approx(sum(_fwd_time(ops, times, p) for p in ("mlp/norm", "mlp/fc1", "mlp/act", "mlp/fc2")))
    assert saved_bytes(ops) - saved_bytes(ops, "selective", ("mlp",)) == (2048 * 1024 + 2 * 2048 * 4096) * ACT_BYTES


def test_a_recomputed_mlp_runs_its_tensor_parallel_collectives_again():
    """tp = 4 with sequence parallelism: the MLP's all-gather and reduce-scatter are inside its checkpoint, so their
    share of the forward's TP time (all of it exposed here, no overlap) runs again: the MLP's two of the layer's
    four forward TP collectives of equal size, half the forward TP time."""
    plan = Plan(tp=4, sequence_parallel=True, recompute="selective", recompute_modules=("mlp",))
    ops, times = _layer(gpt(), plan)
    passes = pass_times(ops, times, plan, STACK, "selective")
    kernels = sum(_fwd_time(ops, times, p) for p in ("mlp/norm", "mlp/fc1", "mlp/act", "mlp/fc2"))
    forward_tp = sum(t for o, t in zip(ops, times, strict=True) if o.phase == "fwd" and o.kind == "collective"
                     and o.collective.axis == "tp")
    assert passes.recompute == pytest.approx(kernels + forward_tp / 2)


def test_mla_up_proj_reruns_the_query_projection_without_a_query_latent():
    """DeepSeek-V3's up-projections (q_up, kv_up) run again; a model without a query latent (q_lora_rank 0) projects
    its queries in one GEMM, attn/q, which qkv_up_proj_and_rope_apply runs too; q_down never."""
    plan = Plan(recompute="selective", recompute_modules=("mla_up_proj",))
    v3 = load_model("deepseek-v3")
    for model, names in ((v3, {"attn/q_up", "attn/kv_up"}), (replace(v3, q_lora_rank=0), {"attn/q", "attn/kv_up"})):
        ops = dense_layer(model, plan, Stack())
        again = {o.name for o, redo in zip(ops, rerun_by(ops, ("mla_up_proj",)), strict=True) if redo}
        assert {n for n in again if not n.endswith("/cast")} == names


def test_recomputed_flops_per_token_count_each_module_once_per_layer():
    """HFU: moe recomputes the MoE layer's forward, per token and MoE layer: router 2·H·E, SwiGLU experts
    k · 3 · 2·H·Fe, shared expert 3 · 2·H·Fs, and the element-wise kernels' FLOPs: the activations 8 per input
    element (k · 2·Fe and 2·Fs of them), the unpermute's weighted sum 2 per routed element (k · H)."""
    plan = Plan(recompute="selective", recompute_modules=("moe",))
    gemm = 2 * 1024 * 8 + 2 * 3 * 2 * 1024 * 1024 + 3 * 2 * 1024 * 2048
    elementwise = 8 * 2 * 2 * 1024 + 8 * 2 * 2048 + 2 * 2 * 1024
    assert module_flops_per_token(MOE, plan, STACK, ("moe",)) == 4 * (gemm + elementwise)
    both = replace(plan, recompute_modules=("core_attn", "moe"))
    assert recompute_flops_per_token(MOE, both, Stack()) == pytest.approx(
        attention_flops_per_token(MOE) + module_flops_per_token(MOE, plan, STACK, ("moe",)))


def test_recompute_modules_slow_the_step_and_shrink_the_activations():
    model, cluster = load_model("mixtral-8x7b").with_seq_length(4096), H100.cluster(16)
    base = Plan(dp=16, ep=8, etp=1, global_batch=64, zero=1, recompute="selective")
    plain = estimate(model, cluster, base)
    moe = estimate(model, cluster, replace(base, recompute_modules=("core_attn", "moe")))
    assert moe.breakdown["recompute"] > plain.breakdown["recompute"]
    assert moe.memory["activations"] < plain.memory["activations"]
    assert moe.hfu > plain.hfu and moe.mfu < plain.mfu
    assert "recompute=selective(core_attn+moe)" in moe.plan.describe()


def test_check_names_an_unknown_or_inapplicable_module():
    assert "recompute_modules=attention has 'attention'" in check(MOE, None, Plan(recompute_modules=("attention",)))[0]
    with pytest.raises(SpecError, match="recompute_modules=attention has 'attention'"):
        Space(global_batch=8, recompute_modules=("attention",))
    assert "mla_up_proj needs multi-head latent attention" in check(MOE, None,
                                                                     Plan(recompute_modules=("mla_up_proj",)))[0]
    assert "names a module twice" in check(MOE, None, Plan(recompute_modules=("moe", "moe")))[0]
    assert not check(load_model("deepseek-v3"), None, Plan(recompute_modules=("mla_up_proj",)))


@pytest.mark.parametrize(("args", "message"), [
    (["--recompute-modules", "moe,attention"], "recompute-modules=moe,attention has 'attention': the modules are"),
    (["--recompute", "none", "--recompute-modules", "moe"], "recompute-modules=moe needs --recompute selective"),
])
def test_cli_refuses_bad_recompute_modules(capsys, args, message):
    code = main(["estimate", "--model", "mixtral-8x7b", "--system", "h100", "--gpus", "8", "--ep", "8", *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_estimate_takes_recompute_modules(capsys):
    code = main(["estimate", "--model", "mixtral-8x7b", "--system", "h100", "--gpus", "8", "--ep", "8",
                 "--recompute-modules", "core_attn,moe_act", "--json"])
    assert code == 0
    import json

    assert json.loads(capsys.readouterr().out)["plan"]["recompute_modules"] == ["core_attn", "moe_act"]


def test_runs_again_one_spelling():
    """The one "no rerun" test (recompute.runs_again) that passes.py's recompute time and host.py's launches share:
    a plain 0 (False from a named module's mask, 0.0 from the per-op policy) runs nothing again, so rerun_part's
    0.0 is skipped; True, a share and an array (a search's for-loop experts) run something."""
    assert not runs_again(False) and not runs_again(0.0) and not runs_again(0)
    assert runs_again(True) and runs_again(1.0) and runs_again(0.5) and runs_again(np.array([0.0, 0.5]))
    assert rerun_part(False, 3.0) == 0.0 and rerun_part(True, 3.0) == 3.0 and rerun_part(0.5, 3.0) == 1.5
