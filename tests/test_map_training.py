"""A published record's training settings (map_training.py): the precision (MXFP8 told apart from per-tensor FP8,
NVFP4) and the FP8 scaling, the ZeRO stage in each source's words (ZeRO-1 under pipeline parallelism), activation
recompute in other words, and the LoRA targets of each source."""

from __future__ import annotations

import pytest

from meshplan_validation.case import map_run
from published_helpers import record


@pytest.mark.parametrize(("group", "framework", "targets"), [
    ("megatron_bridge_26.06", "Megatron-Bridge", "all"),  # peft.LoRA: linear_qkv, linear_proj, linear_fc1, fc2
    ("nemo_24.07", "NeMo 24.07", "qkv"),  # NeMo 1.x PEFT: target_modules defaults to ['attention_qkv']
])
def test_lora_targets_follow_the_source(group, framework, targets):
    case = map_run(record(group=group, framework=framework, task="lora"))
    assert (case.plan.finetune, case.plan.lora_rank, case.plan.lora_targets) == ("lora", 32, targets)
    assert any(a.startswith("LoRA rank 32") for a in case.assumptions)


@pytest.mark.parametrize(("text", "precision"), [("mxfp8", "mxfp8"), ("mxfp8 (32x32 blocks)", "mxfp8"),
                                                ("fp8 (current scaling)", "fp8"), ("float8 linears + bf16", "fp8")])
def test_mxfp8_is_told_apart_from_per_tensor_fp8(text, precision):
    hw = {"gpu": "GB200", "num_gpus": 64, "gpus_per_node": 4}
    assert map_run(record(precision=text, hardware=hw)).plan.precision == precision


@pytest.mark.parametrize(("group", "text", "scaling"), [
    ("megatron_bridge_26.02", "fp8", "current"),  # the performance summary's FP8-CS
    ("nemo_24.07", "fp8", "delayed"),  # Transformer Engine 1.x: DelayedScaling only
    ("nemo_24.07", "fp8 (current scaling)", "current"),  # stated
    ("megatron_bridge_26.02", "fp8 (delayed scaling)", "delayed"),
    ("megatron_bridge_26.02", "fp8 blockwise (128x128 weights, 1x128 activations)", "delayed"),  # no amax pass
])
def test_fp8_scaling_as_stated_else_the_sources_default(group, text, scaling):
    case = map_run(record(group=group, precision=text))
    assert case.stack.fp8_scaling == scaling
    assert f"fp8 {'block-wise' if 'block' in text else scaling} scaling" in " | ".join(case.assumptions)


def test_nvfp4_turns_tp_overlap_off_and_runs_fp4():
    case = map_run(record(precision="nvfp4", hardware={"gpu": "GB200", "num_gpus": 64, "gpus_per_node": 4}))
    assert case.plan.precision == "fp4" and not case.stack.overlap_tp
    assert case.cluster.nvlink_domain == 64  # the NVL72 rack holds all 64 GPUs


@pytest.mark.parametrize(("stated", "zero"), [
    ("DeepSpeed ZeRO-3", 3), ("zero stage 2", 2), ("zero_stage: 1", 1), (3, 3), ("3", 3), (2.0, 2),
    ("FSDP2 (fully_shard)", 3),
    ("HSDP, hybrid shard within the node", 3), ("PyTorch FSDP SHARD_GRAD_OP", 2),
    ("DDP (FSDP=0 in table; distributed optimizer is the NeMo default but not stated)", 1),  # the source default
    ("none (single data-parallel rank)", 0), ("no", 0),
])
def test_other_sources_state_the_zero_stage_in_their_own_words(stated, zero):
    flat = {"pp": 1, "vp": None, "tp": 8}  # no pipeline: ZeRO-2/3 keep their per-micro-batch reductions
    assert map_run(record(parallel={"zero_or_fsdp": stated} | flat)).plan.zero == zero


@pytest.mark.parametrize("stated", ["DeepSpeed ZeRO-3", "zero stage 2", "FSDP2 (fully_shard)"])
def test_zero_2_and_3_under_pipeline_parallelism_reduce_gradients_once_per_step(stated):
    """DeepSpeed's pipeline engine runs ZeRO-1 only, and PyTorch's pipelined FSDP syncs gradients on the last
    micro-batch: with pp = 8 the plan is ZeRO-1, said so, and charges no per-micro-batch reduce-scatter."""
    case = map_run(record(parallel={"zero_or_fsdp": stated}))
    assert case.plan.pp == 8 and case.plan.zero == 1 and case.stack.fsdp == "none"
    assert any("with pipeline parallelism as ZeRO-1" in a for a in case.assumptions)


@pytest.mark.parametrize(("stated", "recompute"), [
    (True, "full"), (False, "none"), ("gradient checkpointing", "full"), ("no activation checkpointing", "none"),
    ("full (not selective)", "full"), ("Full recompute; TP overlap off", "full"), (0, "none"),
    ("selective", "selective"), ("not stated", "none"),  # not stated: Megatron-Bridge's default, none
])
def test_recompute_in_other_words(stated, recompute):
    case = map_run(record(parallel={"activation_recompute": stated}))
    assert case.plan.recompute == recompute
    assert any(("not stated" in a) == (stated == "not stated") for a in case.assumptions if "recompute" in a)


@pytest.mark.parametrize(("group", "framework", "grad_bytes"), [
    ("nemo_24.07", "NeMo 24.07", 4),  # NeMo 1.x: fp32 main grads, reduced in fp32
    # NeMo 2.0's performance scripts: an FP8 run's plugins = bf16_with_fp8_mixed(), grad_reduce_in_fp32 = False
    # (NVIDIA/NeMo scripts/performance/llm/pretrain_*.py @ 5f6fba5)
    ("nemo_2502_b200_perf_summary", "NeMo 25.02 (NeMo 2.0 / Megatron-Core), Transformer Engine", 2),
    ("nemo_2504_gb200_perf_summary", "NeMo 25.04 (NeMo 2.0 / Megatron-Core), Transformer Engine", 2),
])
def test_nemo_2_reduces_an_fp8_runs_gradients_in_bf16(group, framework, grad_bytes):
    assert map_run(record(group=group, framework=framework, precision="fp8")).plan.grad_bytes == grad_bytes
