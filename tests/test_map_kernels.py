"""What a published run's stack did, as the Stack's settings read from its framework text (map_kernels.py): the
attention kernel family and flash attention turned off or named, fused kernels of an eager stack, the pipeline-send
and DP overlaps (Megatron-LLaMA's two optimizers), and learnable sinks in the fused kernel from the release that
ships it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost.params import stage_params
from meshplan.specs.efficiency import DEFAULT
from meshplan.step.channels import dp_collectives
from meshplan_validation.case import map_run
from meshplan_validation.evaluate import evaluate_case
from published_helpers import indep, record


@pytest.mark.parametrize(("over", "overlap"), [
    ({}, True),
    ({"parallel": {"vp": None}}, False),  # 1F1B: Megatron turns overlap_p2p_comm off without virtual stages
    # NeMo 24.x: the Framework Launcher's recipes set overlap_p2p_comm over the model config's False default
    ({"group": "nemo_24.07", "framework": "NeMo 24.07"}, True),
    ({"group": "torchtitan_h100_2024_12", "framework": "torchtitan"}, False),
])
def test_pipeline_send_overlap_follows_the_stack(over, overlap):
    assert map_run(record(**over)).stack.overlap_pp is overlap


@pytest.mark.parametrize(("framework", "kernel"), [
    ("PyTorch FSDP + SDPA FlashAttention-2", "fa2"),  # named
    ("NeMo AutoModel (PyTorch FSDP2), kernels: TE + DeepEP", "fused"),  # Transformer Engine runs cuDNN's kernel
    ("KempnerForge (PyTorch FSDP2 + TP, torch.compile)", "fused"),  # its profile's: torch 2.11 in its uv.lock
    ("PyTorch FSDP2 + TP, torch.compile", "fa2"),  # SDPA of an unstated PyTorch: FlashAttention-2
    ("KempnerForge (PyTorch 2.11 FSDP2 + TP, torch.compile)", "fused"),  # PyTorch 2.11 SDPA prefers cuDNN
    ("MaxText (JAX/XLA)", "fused"),  # generic
    ("PyTorch FSDP2, torch==2.11.0, SDPA", "fused"),  # SDPA by release
    ("PyTorch FSDP2 in the NGC PyTorch 24.07 container", "fa2"),  # an NGC tag is no PyTorch 2.x release
    ("custom trainer, SDPA, PyTorch 2.4", "fa2"),  # SDPA named outside an SDPA profile, before 2.11
    ("custom trainer, SDPA, PyTorch 2.12", "fused"),
    ("PyTorch FSDP2 + FlashAttention v3", "fused"), ("PyTorch FSDP2 + FA-3", "fused"),
    ("PyTorch FSDP2 + flash-attn 3", "fused"),
    ("HF Trainer (DeepSpeed ZeRO-3), Transformer Engine disabled", "fa2"),  # a negated name names nothing
    ("HF Trainer (DeepSpeed ZeRO-3), no TE", "fa2"),
    ("Megatron-LM, NVTE_FLASH_ATTN=0", "fused"),  # TE falls back to cuDNN's fused kernel, flash stays on
    ("NeMo AutoModel, kernels: TE + DeepEP + FlexAttn", "fa2"),  # FlexAttention runs the attention, TE the linears
    ("torchtitan, flex_attention", "fa2"),
])
def test_the_attention_kernel_follows_the_stack_text(framework, kernel):
    case = map_run(indep(framework, parallel={"pp": 1, "vp": None, "tp": 8}))
    assert case.stack.attention_kernel == kernel and case.stack.flash_attention


@pytest.mark.parametrize("framework", [
    "ROCm/Megatron-LM fork; USE_FLASH_ATTN=0", "Megatron-LM --no-flash-attn", "trainer.yaml use_flash_attn: false",
    "HF Trainer, attn_implementation='eager'", "Megatron-LM, NVTE_FLASH_ATTN=0 NVTE_FUSED_ATTN=0",
    "Megatron-LM without flash attention",
])
def test_a_stack_that_turns_flash_attention_off_runs_unfused_attention(framework):
    case = map_run(indep(framework, parallel={"pp": 1, "vp": None, "tp": 8}))
    assert not case.stack.flash_attention
    assert any("turns flash attention off" in a for a in case.assumptions)


def test_a_stack_that_names_flash_attention_runs_it_where_its_source_predates_it():
    """Megatron-DeepSpeed's profile (BLOOM's 2022 stack) has no flash attention; a record that names it runs it."""
    flat = {"pp": 1, "vp": None, "tp": 8}
    old = map_run(indep("Megatron-DeepSpeed", parallel=flat)).stack
    new = map_run(indep("Megatron-DeepSpeed --use-flash-attn-v2", parallel=flat)).stack
    assert not old.flash_attention
    assert new.flash_attention and new.attention_kernel == "fa2"


@pytest.mark.parametrize(("framework", "fusion"), [
    ("lit-gpt, PyTorch FSDP, FlashAttention-2, fused layernorm, fused SwiGLU (xformers), fused rotary", "fused"),
    ("PyTorch FSDP with Apex fused ops", "fused"),
    ("PyTorch FSDP, Liger kernels", "fused"),
    ("PyTorch FSDP, torch.compile", "fused"),
    ("PyTorch FSDP", "eager"),
])
def test_an_eager_stack_that_names_fused_kernels_runs_them(framework, fusion):
    case = map_run(indep(framework, parallel={"pp": 1, "vp": None, "tp": 8}))
    assert case.stack.fusion == fusion


def megatron_llama_case(optimizer: str):
    return map_run(record(group="megatron_llama_readme_scaling_table", precision="bf16",
                          framework=f"Megatron-LLaMA (Megatron-LM based) with {optimizer}",
                          parallel={"tp": 1, "pp": 1, "vp": None, "zero_or_fsdp": optimizer,
                                    "distributed_optimizer": True}))


def test_megatron_llamas_distributed_optimizer_is_not_overlapped():
    """Megatron-LLaMA's README: Megatron-LM's DistributedOptimizer reduce-scatters the gradients after the last
    micro-batch and all-gathers the weights after the step; its OverlappedDistributedOptimizer overlaps them. Without
    the overlap the step pays both whole: dp = t(reduce-scatter of the 4-byte gradients) + t(all-gather of the
    2-byte weights) over the 64 data-parallel ranks."""
    plain = megatron_llama_case("Megatron DistributedOptimizer")
    overlapped = megatron_llama_case("OverlappedDistributedOptimizer (reduce-scatter overlapped with compute)")
    assert not plain.stack.overlap_dp and overlapped.stack.overlap_dp
    assert any(n.startswith("DP communication overlapped (stated") for n in overlapped.assumptions)
    p = plain.plan
    assert (p.dp, p.zero, p.grad_bytes) == (64, 1, 4)
    c = dp_collectives(plain.model, plain.cluster, p, stage_params(plain.model, p, first=True), DEFAULT)
    gather, scatter = c.gather, c.scatter
    assert evaluate_case(plain).breakdown["dp"] == pytest.approx(gather + scatter)
    assert evaluate_case(overlapped).breakdown["dp"] < 0.5 * (gather + scatter)


def gpt_oss_record(group: str) -> dict:
    """GPT-OSS-120B on 64 GB200s as Megatron-Bridge's tables print it: ep 64, micro-batch 4, 4,096 tokens."""
    return record(group=group, precision="bf16", hardware={"gpu": "GB200", "num_gpus": 64, "gpus_per_node": 4},
                  model={"name": "GPT-OSS-120B", "arch": "moe", "num_layers": 36, "hidden_size": 2880,
                         "num_heads": 64, "num_kv_heads": 8, "ffn_hidden_size": 2880, "vocab_size": 201088,
                         "seq_length": 4096, "num_experts": 128, "moe_topk": 4, "moe_ffn_hidden_size": 2880},
                  parallel={"tp": 1, "pp": 1, "cp": 1, "vp": None, "ep": 64, "micro_batch_size": 4,
                            "global_batch_size": 1280})


def test_learnable_sinks_run_in_the_fused_kernel_from_the_release_that_ships_it():
    """TE 2.8 + cuDNN 9.13.1 run GPT-OSS's learnable sinks in cuDNN's fused kernel (TE PR #2148; the NeMo image's
    cuDNN, NVIDIA-NeMo/RL#1685): 25.11 on. An older release (TE 2.7) falls back to the unfused kernel, which keeps
    every layer's probabilities for the backward pass: b·h·s²·2 bytes = 4·64·4096²·2 = 8.59 GB per layer, 36 of them
    on this single-stage layout (309 GB), more than a GB200 holds: the published runs cannot have used it."""
    fused, unfused = (map_run(gpt_oss_record(g)) for g in ("megatron_bridge_25.11", "megatron_bridge_25.09"))
    assert fused.stack.flash_attention and not unfused.stack.flash_attention
    assert any("sinks in cuDNN's fused kernel" in a for a in fused.assumptions)
    assert any(a.startswith("unfused attention: learnable attention sinks") for a in unfused.assumptions)
    probabilities = 4 * 64 * 4096**2 * 2
    assert probabilities == pytest.approx(8.59e9, rel=1e-3)
    fits, spills = (evaluate_case(c) for c in (replace(fused, plan=unfused.plan,
                                                       stack=unfused.stack.with_(flash_attention=True)),
                                               unfused))
    # the fused kernel keeps its softmax statistics instead (b·h·s fp32 numbers, 0.1 % of that)
    assert spills.memory_predicted - fits.memory_predicted == pytest.approx(36 * probabilities, rel=0.01)
    assert 36 * probabilities > spills.memory_capacity
    assert fits.fits and not spills.fits
