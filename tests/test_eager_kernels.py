"""The kernels of an eager layer (cost/eager.py ``EAGER_KERNELS``) are PyTorch's own count:
benchmarks/measure/eager_kernels.py counts the aten ops of the reference layers with a TorchDispatchMode (plus the GPU's
extra kernels of the few aten ops that launch several, ``CUDA_EXTRA``), and this test recounts them on tiny layers and
fails if the committed table drifts; an eager layer's records then launch those kernels, per pass."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from meshplan.cost.eager import EAGER_KERNELS, eager_rows, fused_softmax_runs, softmax_batch_per_block
from meshplan.cost.layers import dense_layer
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack
from meshplan.step.host import launches

ROOT = Path(__file__).resolve().parents[1]
GPT = ModelSpec(name="gpt-1.3b", num_layers=24, hidden_size=2048, num_heads=16, ffn_hidden_size=8192,
                vocab_size=50257, seq_length=1024, mlp="gelu", norm="layernorm", position_embedding="learned",
                max_position_embeddings=1024, tied_embeddings=True, qkv_bias=True, linear_bias=True, dropout=True)
EAGER_GPT = Stack(flash_attention=False, fusion="eager", host_dispatch=15e-6)


def _bench():  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("bench_eager_kernels", ROOT / "benchmarks/measure/eager_kernels.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.parametrize("style", ["gpt", "gpt-no-dropout", "sdpa", "llama"])
def test_the_committed_table_is_what_pytorch_counts(style: str) -> None:
    assert _bench().kernel_table(style) == EAGER_KERNELS[style]


def test_the_count_does_not_depend_on_the_sizes_or_tp() -> None:
    bench = _bench()
    assert bench.kernel_table("gpt", h=96, heads=6, ffn=384, seq=10, batch=2, tp=2) == EAGER_KERNELS["gpt"]


def test_views_and_allocations_launch_nothing() -> None:
    import torch
    bench = _bench()
    aten = torch.ops.aten
    assert not any(bench.launches_kernel(f) for f in (aten.view.default, aten.transpose.int, aten.empty.memory_format,
                                                      aten._unsafe_view.default, aten.split.Tensor))
    assert all(bench.launches_kernel(f) for f in (aten.mm.default, aten.add_.Tensor, aten.clone.default))


def per_pass(ops: list) -> dict[str, float]:  # type: ignore[type-arg]
    total = {"fwd": 0.0, "bwd": 0.0}
    for op in ops:
        total["fwd" if op.phase == "fwd" else "bwd"] += float(launches(op))
    return total


def test_the_gpu_launches_more_kernels_than_the_aten_ops_of_a_few() -> None:
    # LayerNorm's backward: the input gradient, then GammaBetaBackward (the weight and bias gradients); softmax's
    # backward: grad * output, then the softmax kernel; SDPA's flash backward: dot(o, do), the kernel, dq's cast
    extra = _bench().CUDA_EXTRA
    assert extra["native_layer_norm_backward"] == ("bwd_w",) and len(extra["_softmax_backward_data"]) == 1
    assert all(len(extra[f"_scaled_dot_product_{k}_backward"]) == 2 for k in ("flash_attention", "cudnn_attention"))
    assert EAGER_KERNELS["sdpa"]["attn/norm"] == (1, 1, 1, 2)  # the GammaBetaBackward kernel as a weight gradient


def test_an_eager_gpt_layer_launches_what_pytorch_counts() -> None:
    # Megatron-Core's module code with dropout: forward 1 + 2 + 8 + 1 + 3 + 1 + 1 + 2 + 1 + 3 = 23 kernels; backward
    # (input gradient + weight gradient + accumulation) 4 + 5 + 13 + 3 + 4 + 4 + 3 + 3 + 3 + 4 = 46
    assert per_pass(dense_layer(GPT, Plan(micro_batch=1), EAGER_GPT)) == {"fwd": 23.0, "bwd": 46.0}
    # tp 8 without sequence parallelism: Megatron's mapping regions add two all-reduce calls to each pass
    assert per_pass(dense_layer(GPT, Plan(tp=8, micro_batch=1, sequence_parallel=False), EAGER_GPT)) == {
        "fwd": 25.0, "bwd": 48.0}
    # without dropout no dropout kernel (1 each way in the core and each bias-dropout-add): 23 - 3 = 20, 46 - 3 = 43
    no_dropout = replace(GPT, dropout=False)
    assert per_pass(dense_layer(no_dropout, Plan(micro_batch=1), EAGER_GPT)) == {"fwd": 20.0, "bwd": 43.0}
    # the same layer fused (Megatron-Core / TE kernels) keeps cost/'s fused counts: far fewer
    fused = per_pass(dense_layer(GPT, Plan(micro_batch=1), Stack(flash_attention=False)))
    assert fused["fwd"] < 20 and fused["bwd"] < 41


def test_megatron_lm_fused_module_code_launches_the_measured_layer_less_its_fusions() -> None:
    # Megatron-LM 2020-22 / Megatron-DeepSpeed (fusion "jit"): the measured Megatron layer (forward 23, backward 46)
    # with the fused scale-mask-softmax (forward 4 kernels -> 1, backward 5 -> 1), TorchScript bias-GeLU (forward 2 ->
    # 1) and two bias-dropout-adds (forward 3 -> 1 each), Megatron's LayerNorm (backward 3 kernels, not ATen's 2: +1
    # per norm): forward 23 - 3 - 1 - 2 - 2 = 15, backward 46 - 4 + 2 = 44
    megatron_ds = load_stack("megatron-deepspeed")
    jit = per_pass(dense_layer(GPT, Plan(micro_batch=1), megatron_ds))
    assert jit == {"fwd": 15.0, "bwd": 44.0}
    # at dropout 0 the scripted bias-dropout-add still draws its mask (native_dropout): its rows stand, the core's
    # dropout goes (forward 1, backward 1): 14 and 43
    no_dropout = replace(GPT, dropout=False)
    assert per_pass(dense_layer(no_dropout, Plan(micro_batch=1), megatron_ds)) == {"fwd": 14.0, "bwd": 43.0}
    # keys beyond 2048: the fused softmax kernel does not run, its eager path does (+3 forward, +4 backward)
    long = replace(GPT, seq_length=4096, max_position_embeddings=4096)
    assert per_pass(dense_layer(long, Plan(micro_batch=1), megatron_ds)) == {"fwd": 18.0, "bwd": 48.0}
    # more than cost/'s one kernel per fused record, fewer than the same code with its fusions off
    fused = per_pass(dense_layer(GPT, Plan(micro_batch=1), Stack(flash_attention=False)))
    eager = per_pass(dense_layer(GPT, Plan(micro_batch=1), EAGER_GPT))
    assert sum(fused.values()) < sum(jit.values()) < sum(eager.values())
    # an RMSNorm model keeps cost/'s counts (Megatron-LM 2020-22 has no RMSNorm layer)
    assert eager_rows(load_model("llama3-8b"), megatron_ds) == {}
    # validation prices Megatron-LM's published runs with the same physics (the stacks compare equal) but for the
    # optimizer's wrapper: the one DeepSpeed's pipeline engine picks per plan (cost/wrappers.py: BF16_Optimizer, 30 us
    # a tensor over the whole model, in bf16) against Megatron-LM's own (32 us, its distributed optimizer's shard)
    from meshplan_validation.sources import MEGATRON_2021
    assert (megatron_ds.optimizer_wrapper, MEGATRON_2021.tensor_host) == ("deepspeed-pipeline", 32e-6)
    # and the host's cost per kernel and per collective call (the megatron-deepspeed preset's: its module code's
    # Python calls a kernel, c10d's call per collective) and its loss, priced as the eager fp32 ops of Megatron-
    # DeepSpeed's code (cost/embed_head.py VOCAB_PARALLEL_EAGER)
    assert megatron_ds == MEGATRON_2021.with_(tensor_host=0.0, tensor_sharded=False,
                                              optimizer_wrapper="deepspeed-pipeline",
                                              host_dispatch=megatron_ds.host_dispatch,
                                              collective_host=megatron_ds.collective_host,
                                              cross_entropy="vocab_parallel_eager")


def test_a_plain_pytorch_gpt_layer_launches_what_pytorch_counts() -> None:
    # nn.Linear with biases, SDPA (flash), no dropout, whole gradients: forward 10 (2 norms, 4 linears, SDPA, 2
    # residual adds, GeLU); backward 4 + 5 + 5 + 5 + 1 + 4 + 5 + 1 + 5 + 1 = 36: each norm 1 + 1 + 2 accumulations,
    # each linear 2 GEMMs + its bias sum + 2 accumulations, the core SDPA's 3 + the q, k, v stack + its layout copy
    plain = replace(GPT, dropout=False)
    assert per_pass(dense_layer(plain, Plan(micro_batch=1), EAGER_GPT.with_(flash_attention=True))) == {
        "fwd": 10.0, "bwd": 36.0}


def test_an_eager_llama_layer_launches_what_pytorch_counts() -> None:
    # torchtitan: the table's rows, SDPA's flash kernel 1 forward and 3 backward; forward 8 + 3 + 6 + 2 + 1 + 1 + 1 +
    # 8 + 2 + 2 + 1 + 1 = 36; backward without the accumulation (FSDP2 accumulates the shards): 16 + 8 + 8 + 2 + 3 +
    # 2 + 1 + 16 + 5 + 3 + 2 + 1 = 67, and FSDP's gradient preparation (1)
    llama = load_model("llama3-8b")
    assert per_pass(dense_layer(llama, Plan(micro_batch=1), load_stack("torchtitan"))) == {"fwd": 36.0, "bwd": 68.0}
    # without FSDP each of its 9 weights' gradients is accumulated by one add more
    no_fsdp = load_stack("torchtitan").with_(fsdp="none")
    assert per_pass(dense_layer(llama, Plan(micro_batch=1, zero=1), no_fsdp)) == {"fwd": 36.0, "bwd": 76.0}


def test_rows_that_differ_from_the_model_stay_as_costed() -> None:
    # a fused stack has no eager rows; flash attention keeps its kernel; fused projections are not torchtitan's
    # separate wq / wk / wv; a LayerNorm model with SwiGLU has no GeLU row
    assert eager_rows(GPT, Stack()) == {}
    # flash attention: SDPA's own kernels (1 forward, 3 backward), not Megatron's unfused core (8, 13)
    assert eager_rows(GPT, EAGER_GPT.with_(flash_attention=True))["attn/core"] == (1, 3, 0)
    # plain PyTorch without dropout: SDPA's 3 + the unbind's stack of the q, k, v gradients + its layout copy = 5; a
    # stack that splits the QKV with torch.split has the concatenation as a record of its own (cost/attention.py)
    plain, flash = replace(GPT, dropout=False), EAGER_GPT.with_(flash_attention=True)
    assert eager_rows(plain, flash)["attn/core"] == (1, 5, 0)
    assert eager_rows(plain, flash.with_(qkv_concat=True))["attn/core"] == (1, 3, 0)
    llama_rows = eager_rows(load_model("llama3-8b"), EAGER_GPT.with_(projections="fused"))
    assert "attn/qkv" not in llama_rows and "mlp/fc1" not in llama_rows and "mlp/act" in llama_rows
    assert "mlp/act" not in eager_rows(replace(GPT, mlp="swiglu", ffn_hidden_size=5504), EAGER_GPT)


def test_megatrons_fused_softmax_needs_its_rows_per_block() -> None:
    # get_batch_per_block (scaled_masked_softmax.h): 128 threads a block, a warp of min(p, 32) threads, 2 rows a warp
    # up to 128 keys: 1,024 keys -> 128 / 32 x 1 = 4 rows; 128 keys -> 4 x 2 = 8; 16 keys -> 128 / 16 x 2 = 16
    assert (softmax_batch_per_block(1024), softmax_batch_per_block(128), softmax_batch_per_block(16)) == (4, 8, 16)
    # is_kernel_available: b x heads per rank a multiple of 4 and of the rows per block. GPT (16 heads, 1,024 keys)
    # over tp 8 at micro-batch 1: 1 x 2 = 2 rows, the torch path; at micro-batch 2: 4, the kernel; tp 4: 4, the kernel
    assert [fused_softmax_runs(GPT, b, tp) for b, tp in ((1, 8), (2, 8), (1, 4), (1, 1))] == [0, 1, 1, 1]
    short = replace(GPT, seq_length=128, max_position_embeddings=128)  # 8 rows a block: 1 x 4 heads is not enough
    assert (fused_softmax_runs(short, 1, 4), fused_softmax_runs(short, 2, 4)) == (0, 1)
    # a batch of plans: one answer each
    assert list(fused_softmax_runs(GPT, np.array([1, 2, 1]), np.array([8, 8, 4]))) == [0, 1, 1]


def test_megatron_falls_back_to_the_torch_softmax_where_its_kernel_cannot_run() -> None:
    # tp 8, micro-batch 1 (b x heads per rank = 2): forward_torch_softmax's kernels, as past 2,048 keys (+3 forward,
    # +4 backward) and its fp32 bytes; micro-batch 2 runs the kernel
    megatron_ds = load_stack("megatron-deepspeed")
    kernel = per_pass(dense_layer(GPT, Plan(tp=8, micro_batch=2), megatron_ds))
    torch_path = per_pass(dense_layer(GPT, Plan(tp=8, micro_batch=1), megatron_ds))
    assert (torch_path["fwd"] - kernel["fwd"], torch_path["bwd"] - kernel["bwd"]) == (3.0, 4.0)
    core = {op.phase: op.nbytes for op in dense_layer(GPT, Plan(tp=8, micro_batch=1), megatron_ds)
            if op.name == "attn/core"}
    fused = {op.phase: op.nbytes for op in dense_layer(GPT, Plan(tp=8, micro_batch=2), megatron_ds)
             if op.name == "attn/core"}
    assert core["fwd"] > fused["fwd"] / 2 and core["bwd_x"] > fused["bwd_x"] / 2  # per sequence: more bytes unfused
    # a stack without Megatron's fused module code is untouched
    assert per_pass(dense_layer(GPT, Plan(tp=8, micro_batch=1), EAGER_GPT)) == per_pass(
        dense_layer(GPT, Plan(tp=8, micro_batch=2), EAGER_GPT))


def test_a_batch_of_plans_takes_each_plans_softmax_path() -> None:
    # the search evaluates a PlanBatch: its plans at tp 8 / micro-batch 1 (the torch path) and the others (the
    # kernel) each cost what the plan alone costs
    from meshplan.search.batch import PlanBatch
    from meshplan.specs.hardware import load_system
    from meshplan.step.assemble import step_costs
    megatron_ds, cluster = load_stack("megatron-deepspeed"), load_system("a100").cluster(8)
    plans = [Plan(dp=8 // t, tp=t, micro_batch=b, global_batch=16, precision="fp16") for t, b in
             ((8, 1), (8, 2), (4, 1), (2, 2))]
    vec = step_costs(GPT, cluster, PlanBatch.of(plans), megatron_ds)
    one = [step_costs(GPT, cluster, p, megatron_ds).step_time for p in plans]
    assert np.asarray(vec.step_time) == pytest.approx(one, rel=1e-12)
