"""torchtitan's per-op selective activation checkpointing (recompute_modules op_sac, cost/recompute.py): which forward
kernels run again, what the layer keeps, and the torchtitan job TOML that says it (selective_ac_option "op")."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from meshplan.cli import main
from meshplan.configs import emit, read
from meshplan.cost.layers import dense_layer, moe_layer
from meshplan.cost.recompute import compiled as compiled_stack
from meshplan.cost.recompute import per_op_kept, per_op_reruns, per_op_saved, rerun_by, residual_only, tp_rerun_by
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.memory import layer_input_bytes
from meshplan.search import Space, search
from meshplan.specs.check import check
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import frameworks_running, load_stack
from meshplan.step.passes import pass_times, time_ops
from meshplan.step.units import saved_bytes, unit_costs

LLAMA = load_model("llama3-8b")  # d 4096, 8 KV heads of 128 (1024), FFN 14336, 32 heads
TITAN = load_stack("torchtitan")  # separate wq / wk / wv and w1 / w3 linears, eager element-wise kernels
OP_SAC = Plan(dp=8, micro_batch=1, global_batch=8, zero=3, recompute="selective", recompute_modules=("op_sac",))
H100 = load_system("h100")


def _forward(ops, flags):
    return [op.name for op, f in zip(ops, flags, strict=True) if f]


def test_every_second_matmul_and_the_element_wise_ops_run_again():
    """The block's matmuls in order are wq, wk, wv, wo, w1 (gate), w3 (up), w2: the policy saves the 1st, 3rd, 5th
    and 7th and recomputes wk, wo and w3; the attention kernel's output is saved; every element-wise op runs
    again."""
    ops = dense_layer(LLAMA, OP_SAC, TITAN)
    again = per_op_reruns(ops)
    gemms = [op.name for op in ops if op.phase == "fwd" and op.kind == "gemm"]
    assert gemms == ["attn/qkv/q", "attn/qkv/k", "attn/qkv/v", "attn/out", "mlp/fc1/gate", "mlp/fc1/up", "mlp/fc2"]
    assert [n for n in _forward(ops, again) if n in gemms] == ["attn/qkv/k", "attn/out", "mlp/fc1/up"]
    assert "attn/core" not in _forward(ops, again)
    memory = [op.name for op in ops if op.phase == "fwd" and op.kind == "memory"]
    assert memory and set(memory) <= set(_forward(ops, again))  # norms, RoPE, SiLU·gate, residual adds
    assert "attn/norm/eager" in memory and "attn/rope/eager" in memory
    assert rerun_by(ops, ("op_sac",)) == again
    assert not any(op.phase != "fwd" for op, f in zip(ops, again, strict=True) if f)


def test_the_layer_keeps_its_input_the_saved_matmuls_outputs_and_the_attention_output():
    """Per token: the block input 4096, wq 4096, wv 1024, w1 14336, w2 4096 (16-bit) and the attention output 4096
    with 32 heads' fp32 log-sum-exp (32 × 4 bytes): (4096·4 + 1024 + 14336)·2 + 128 = 63,616 bytes, against
    139,392 with no recompute (its records' saved 69,696 elements)."""
    ops = dense_layer(LLAMA, OP_SAC, TITAN)
    tokens = OP_SAC.micro_batch * LLAMA.seq_length
    kept = saved_bytes(ops, "selective", ("op_sac",), layer_input_bytes(LLAMA, OP_SAC))
    assert kept == tokens * ((4096 * 4 + 1024 + 14336) * 2 + 32 * 4) == tokens * 63616
    assert saved_bytes(ops) == tokens * 69696 * 2
    assert kept < saved_bytes(ops, "selective", ("core_attn",))


def test_under_torch_compile_the_block_keeps_no_output_only_the_residual_reads():
    """Compiled, the partitioner keeps only what the backward reads (cost/recompute.per_op_kept): w2's 16-bit output,
    which only the residual add reads, goes: 63,616 − 4096·2 = 55,424 bytes a token. At torchtitan's 8B micro-batch
    of 2 x 8192 tokens that is 128 MiB a layer, 4.0 GiB over 32 layers: the most of the 5.4 / 5.0 GiB its eager runs
    read above their compiled twins (82.4 / 77.0 at FSDP 8, 67.0 / 62.0 at FSDP 128, GiB reserved). Fused element-wise
    kernels, torchtitan's only way to them, mean compiled too (cost/recompute.compiled); the rerun layer's working
    set is eager's either way."""
    ops = dense_layer(LLAMA, OP_SAC, TITAN)
    tokens = OP_SAC.micro_batch * LLAMA.seq_length
    layer_input = layer_input_bytes(LLAMA, OP_SAC)
    compiled = saved_bytes(ops, "selective", ("op_sac",), layer_input, compiled=True)
    assert compiled == tokens * (63616 - 4096 * 2) == tokens * 55424
    assert saved_bytes(ops, compiled=True) == saved_bytes(ops)  # no per-op policy: nothing changes
    plan = replace(OP_SAC, micro_batch=2, global_batch=16)
    cluster = H100.cluster(8)
    units = {f: unit_costs(LLAMA, cluster, plan, replace(TITAN, fusion=f)) for f in ("eager", "fused")}
    assert units["eager"].layer_saved - units["fused"].layer_saved == 2 * 8192 * 4096 * 2 == 128 * 2**20
    assert units["fused"].layer_working == pytest.approx(units["eager"].layer_working)
    assert compiled_stack(replace(TITAN, fusion="fused")) and compiled_stack(replace(TITAN, compiled=True))
    assert not compiled_stack(TITAN)


def test_compiled_a_moe_layer_keeps_the_experts_output_the_scores_weight():
    """A MoE layer's forward GEMMs in order are wq, wk, wv, wo, the router, the experts' fc1 and fc2 (Mixtral 8x7B:
    no shared experts, no latent): the policy saves wq, wv and, expert by expert, half of the experts' w1, w3 and w2
    calls (test_recompute_op_sac_moe). The experts' fc2 output, its last
    GEMM's, is weighted by the router's scores after the experts (torchtitan's MoE, score_before_experts=False), so the
    scores' gradient reads it and the compiled graph keeps it (cost/recompute.residual_only): compiled and eager keep
    the same bytes. A dense layer's last GEMM, w2, is read only by the residual add: compiled drops its output."""
    model = load_model("mixtral-8x7b")
    assert not model.moe_score_before_experts
    ops = moe_layer(model, OP_SAC, TITAN)
    gemms = [(i, op.name) for i, op in enumerate(ops) if op.phase == "fwd" and op.kind == "gemm"]
    assert [n for _, n in gemms] == ["attn/qkv/q", "attn/qkv/k", "attn/qkv/v", "attn/out", "moe/router",
                                     "moe/experts/fc1", "moe/experts/fc2"]
    assert residual_only(ops) == ()
    assert per_op_kept(ops, compiled=True) == per_op_kept(ops)
    fc2 = ops[gemms[-1][0]]
    assert per_op_saved(ops)[gemms[-1][0]] == 0.5  # w2 of every other expert (test_recompute_op_sac_moe)
    tokens = OP_SAC.micro_batch * model.seq_length
    assert fc2.m * fc2.n * fc2.groups == tokens * model.moe_topk * 4096  # top-2 rows of width 4096
    dense = dense_layer(LLAMA, OP_SAC, TITAN)
    (last,) = residual_only(dense)
    assert dense[last].name == "mlp/fc2"
    w2 = dense[last]
    assert per_op_kept(dense) - per_op_kept(dense, compiled=True) == w2.m * w2.n * 2


def test_compiled_llama4_drops_the_routed_output_it_scored_before_the_experts():
    """Llama 4 weights the experts' inputs by the scores and sums their outputs unweighted (torchtitan v0.2.2
    moe.py:31 MoEArgs score_before_experts=True, kept by its Llama 4 flavours; transformers' Llama4TextMoe alike:
    ModelSpec.moe_score_before_experts, set by the preset). Scout's counted mms on torchtitan's for-loop experts:
    wq, wk, wv, wo (4), per expert w1, w3, w2 (3 x 16: the odd calls alternate by expert, so w2's output is saved
    for 8 of the 16), then the shared experts' gate, up and fc2 (53rd to 55th: gate and fc2 saved). Compiled, the
    shared fc2 (the last GEMM, read only by the sum into the residual) goes: T·H·2 = 8192 x 5120 x 2 = 80 MiB a
    layer; scored before the experts, the routed fc2's saved half goes too (read only by the unsort's index_put and
    the sum): 40 MiB more. Scored after the experts (Mixtral, DeepSeek-V3) it stays."""
    scout = load_model("llama4-scout")
    assert scout.moe_score_before_experts and load_model("llama4-maverick").moe_score_before_experts
    ops = moe_layer(scout, OP_SAC, TITAN)
    gemms = [i for i, op in enumerate(ops) if op.phase == "fwd" and op.kind == "gemm"]
    names = [ops[i].name for i in gemms]
    assert names[5:] == ["moe/experts/fc1", "moe/experts/fc2", "moe/shared/fc1/gate", "moe/shared/fc1/up",
                         "moe/shared/fc2"]
    routed, shared = gemms[6], gemms[9]
    saved = per_op_saved(ops)
    assert (saved[routed], saved[shared]) == (0.5, 1.0)
    assert residual_only(ops) == (shared,)
    assert residual_only(ops, scored_before=True) == (routed, shared)
    tokens = OP_SAC.micro_batch * scout.seq_length
    fc2 = ops[routed]
    assert fc2.m * fc2.n * fc2.groups == tokens * 1 * 5120  # top-1 rows of width 5120
    mib = 2**20
    assert per_op_kept(ops) - per_op_kept(ops, compiled=True) == tokens * 5120 * 2 == 80 * mib
    assert per_op_kept(ops) - per_op_kept(ops, compiled=True, scored_before=True) == 80 * mib + 40 * mib
    cluster = H100.cluster(8)
    units = {f: unit_costs(scout, cluster, OP_SAC, replace(TITAN, fusion=f)) for f in ("eager", "fused")}
    assert units["eager"].layer_saved - units["fused"].layer_saved == 120 * mib


def test_it_recomputes_less_than_the_forward_and_more_than_nothing():
    """The recompute is the forward time of wk, wo, w3 and every element-wise kernel: less than full recompute's
    whole forward, and exactly the sum of the rerun records' times."""
    ops = dense_layer(LLAMA, OP_SAC, TITAN)
    times = time_ops(ops, H100.cluster(8), OP_SAC, DEFAULT)
    redo = pass_times(ops, times, OP_SAC, TITAN, "selective").recompute
    full = pass_times(ops, times, replace(OP_SAC, recompute="full"), TITAN, "full").recompute
    again = sum(t for t, f in zip(times, per_op_reruns(ops), strict=True) if f)
    assert redo == pytest.approx(again)
    assert 0 < redo < 0.75 * full


def test_tensor_parallel_gathers_run_again_and_reduce_scatters_do_not():
    """torchtitan's save list holds the TP reduce-scatter (its output is saved) but not the all-gather: with TP and
    sequence parallelism the forward all-gathers of the block run again."""
    plan = replace(OP_SAC, dp=4, tp=2, sequence_parallel=True)
    ops = dense_layer(LLAMA, plan, TITAN)
    again = [op for op, f in zip(ops, tp_rerun_by(ops, ("op_sac",)), strict=True) if f]
    fwd_tp = [op for op in ops if op.phase == "fwd" and op.collective is not None and op.collective.axis == "tp"]
    assert again and {op.collective.kind for op in again} == {"all_gather"}
    assert {op.collective.kind for op in fwd_tp} == {"all_gather", "reduce_scatter"}


def test_op_sac_stands_alone():
    """op_sac is a policy over the whole layer: named with a Megatron-Core module it is refused, with the reason."""
    assert check(LLAMA, H100.cluster(8), OP_SAC, TITAN) == []
    reasons = check(LLAMA, H100.cluster(8), replace(OP_SAC, recompute_modules=("op_sac", "core_attn")), TITAN)
    assert len(reasons) == 1 and "op_sac" in reasons[0] and "on its own" in reasons[0]


def test_a_torchtitan_job_toml_round_trips_op_sac():
    """meshplan writes op_sac as torchtitan's [activation_checkpoint] mode "selective", selective_ac_option "op"
    (no caveat), and reads that back as op_sac; the estimate of what it read is the estimate of what it wrote."""
    text = emit("torchtitan", LLAMA, OP_SAC, TITAN)
    assert 'selective_ac_option = "op"' in text and "core_attn" not in text
    plan, stack = read("torchtitan", LLAMA, 8, text)
    assert plan.recompute == "selective" and plan.recompute_modules == ("op_sac",)
    cluster = H100.cluster(8)
    assert estimate(LLAMA, cluster, plan, stack).step_time == pytest.approx(
        estimate(LLAMA, cluster, OP_SAC, TITAN).step_time, rel=1e-9)



def test_torchtitan_writes_every_nth_layer_and_refuses_megatron_modules():
    """An integer selective_ac_option N recomputes every N-th block of a rank in full: 16 of Llama 3 8B's 32 layers is
    N = 2 and back; 12 of 32 is no N (refused), nor is Megatron-Core's core_attn (torchtitan has no such option)."""
    half = replace(OP_SAC, recompute="full", recompute_layers=16, recompute_modules=("core_attn",))
    text = emit("torchtitan", LLAMA, half, TITAN)
    assert 'mode = "selective"' in text and 'selective_ac_option = "2"' in text
    assert read("torchtitan", LLAMA, 8, text)[0] == half
    every = text.replace('selective_ac_option = "2"', 'selective_ac_option = "1"')
    assert read("torchtitan", LLAMA, 8, every)[0] == replace(half, recompute_layers=0)
    none = text.replace('selective_ac_option = "2"', 'selective_ac_option = "64"')
    assert read("torchtitan", LLAMA, 8, none)[0].recompute == "none"
    with pytest.raises(SpecError, match="recompute_layers=12"):
        emit("torchtitan", LLAMA, replace(half, recompute_layers=12), TITAN)
    with pytest.raises(SpecError, match="recompute_modules=core_attn"):
        emit("torchtitan", LLAMA, replace(OP_SAC, recompute_modules=("core_attn",)), TITAN)
    with pytest.raises(SpecError, match="selective_ac_option = 'x'"):
        read("torchtitan", LLAMA, 8, text.replace('selective_ac_option = "2"', 'selective_ac_option = "x"'))


def test_each_framework_runs_its_own_selective_recompute():
    """torchtitan runs op_sac and no Megatron-Core module; Megatron-Core runs its modules and not op_sac
    (Supports.recompute_modules), so a plan with the other's selective recompute is not among what each runs."""
    megatron = replace(OP_SAC, recompute_modules=("core_attn",))
    assert "torchtitan" in frameworks_running(OP_SAC) and "torchtitan" not in frameworks_running(megatron)
    assert TITAN.supports.problems(megatron) == ["recompute_modules=core_attn"]
    core = load_stack("megatron-core").supports  # at ZeRO-1, which it runs (FSDP's ZeRO-3 it does not)
    assert core.problems(replace(OP_SAC, zero=1)) == ["recompute_modules=op_sac"]
    assert core.problems(replace(megatron, zero=1)) == []


def test_a_torchtitan_search_prices_selective_as_op_sac_and_refuses_megatron_modules():
    """The space's default selective recompute (core_attn) becomes torchtitan's op_sac; a Megatron-Core module asked
    of torchtitan is refused with the reason; Megatron-Core keeps core_attn and refuses op_sac."""
    assert Space(global_batch=16, stack=TITAN).recompute_modules == ("op_sac",)
    assert Space(global_batch=16, stack=load_stack("megatron-core")).recompute_modules == ("core_attn",)
    with pytest.raises(SpecError, match="framework torchtitan does not run mlp"):
        Space(global_batch=16, stack=TITAN, recompute_modules=("mlp",))
    with pytest.raises(SpecError, match="framework megatron-core does not run op_sac"):
        Space(global_batch=16, stack=load_stack("megatron-core"), recompute_modules=("op_sac",))
    result = search(LLAMA, H100.cluster(8), Space(global_batch=16, stack=TITAN, recompute=("selective",)), top_k=1)
    assert result.plans[0].plan.recompute_modules == ("op_sac",)


def test_estimate_with_torchtitan_prices_its_selective_recompute(capsys):
    """`estimate --framework torchtitan --recompute selective` prices op_sac; --recompute-modules core_attn, which
    torchtitan does not run (Supports.recompute_modules), is refused naming where that is recorded (estimate refuses
    what the framework named by --framework does not run), and priced as asked under --framework any."""
    args = ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--framework", "torchtitan",
            "--recompute", "selective", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["recompute_modules"] == ["op_sac"]
    assert main([*args, "--recompute-modules", "core_attn"]) == 2
    assert "framework torchtitan does not run recompute_modules=core_attn (specs/supports.py" in capsys.readouterr().err
    anyone = [a if a != "torchtitan" else "any" for a in args]
    assert main([*anyone, "--recompute-modules", "core_attn"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["recompute_modules"] == ["core_attn"]
