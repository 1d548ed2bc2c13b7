"""What each framework release does where its published table is silent: the sources' documented defaults
(``SourceDefaults``) and the Megatron-Bridge recipe settings read from its performance scripts, each with the file
or pull request it comes from. validate.py applies them when it maps a record onto a Plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from meshplan.specs.model import ModelSpec
from meshplan.specs.stack import Stack, load_stack
from meshplan_validation.records import positive_int


# ---- the sources' defaults ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceDefaults:
    """What a framework release does when its table does not say: the stack it runs (a preset of stack.py, or one
    with the release's departures from it) and its defaults for what a record may leave out of its plan; each
    carries its source."""

    name: str
    match: str  # regex on "group framework"
    stack: Stack
    sequence_parallel: bool | None  # None: on when tp > 1
    zero: int  # when the record does not say
    grad_bytes: int
    recompute: str  # when the record does not say
    why: str
    whole_batch: bool = False  # no gradient accumulation: an unstated micro-batch is global batch / dp
    # Plan.lora_targets, the source's default (the tables do not state it): every attention and MLP linear
    # (Megatron-Bridge / NeMo 2 peft.LoRA), unless the stack's LoRA adapts the QKV projection only
    lora_targets: str = "all"
    # a pipeline whose record states neither vp nor its schedule interleaves (the smallest v dividing the layers per
    # stage) rather than running plain 1F1B
    interleaved: bool = False
    # the stack's attention is PyTorch's scaled_dot_product_attention, whose kernel depends on the PyTorch release
    # (SDPA_CUDNN_FROM; validate._attention_kernel)
    sdpa: bool = False
    # expert tensor parallelism when the record does not state it (MoE with ep > 1): 1, the expert weights whole on
    # each expert-parallel rank, unless the stack takes Megatron-Core's own default, etp = tp
    # (megatron/training/arguments.py: expert_tensor_parallel_size None → tensor_model_parallel_size; before
    # Megatron-Core 0.10 there was no separate expert TP and the experts were split over the TP group)
    expert_tp_is_tp: bool = False


# PyTorch's scaled_dot_product_attention picks its FlashAttention-2 backend on Hopper and Blackwell; cuDNN's kernel
# comes first only from PyTorch 2.11, whose pip wheels bundle a cuDNN that passes sdp_utils.cpp's
# check_prefer_cudnn_attention (cuDNN > 9.15; pytorch/pytorch#138522 had made it opt-in after the 2.5 bugs). A
# stack built against another cuDNN (an NGC container) may differ; the records rarely say which.
SDPA_CUDNN_FROM = (2, 11)
SDPA = ("PyTorch SDPA (FlashAttention-2 on Hopper and Blackwell: sdp_utils.cpp check_prefer_cudnn_attention puts cuDNN "
        "first only with the cuDNN > 9.15 that PyTorch 2.11 bundles)")

# Megatron-LM before FlashAttention and before its communication overlaps (2020-2022 releases, and the Megatron-LM
# model code on DeepSpeed's engine of 2022): unfused softmax attention, data-parallel gradients all-reduced after the
# backward pass, TP and pipeline communication exposed
MEGATRON_2021 = Stack(name="megatron-lm-2021", flash_attention=False, overlap_dp=False,
                      source="Megatron-LM 2020-22 (Shoeybi et al. 2019; Narayanan et al. 2021; Korthikanti et al. "
                             "2022): fused-softmax attention, no overlap flags yet")
# Megatron-Core 0.8 with the overlaps its README scaling runs state (--overlap-grad-reduce --overlap-param-gather
# --tp-comm-overlap) and its default of pipeline sends overlapped under interleaving
MEGATRON_CORE_2024 = Stack(name="megatron-core-0.8", overlap_tp=True, overlap_pp=True,
                           source="Megatron-Core r0.8 README scaling runs")


def pytorch_fsdp(name: str, match: str, fsdp: str, grad_bytes: int, who: str) -> SourceDefaults:
    """A PyTorch-native FSDP stack (the pytorch-fsdp preset with this FSDP): full shard with prefetch, SDPA
    attention, F.cross_entropy in eager autograd, element-wise kernels in eager PyTorch unless torch.compile is
    stated, sequence parallelism inside a TP plan, no recompute unless stated."""
    return SourceDefaults(name, match, load_stack("pytorch-fsdp").with_(fsdp=fsdp), None, 3, grad_bytes, "none",
                          f"{who}; full shard with prefetch, {SDPA} attention, F.cross_entropy in eager autograd, "
                          "element-wise kernels in eager PyTorch unless torch.compile is stated, sequence parallelism "
                          "inside a TP plan, no recompute unless stated", sdpa=True)


SOURCES: tuple[SourceDefaults, ...] = (
    SourceDefaults("Megatron-LM 2020", r"megatron_readme_2020|megatron2020", MEGATRON_2021, False, 0, 2, "full",
                   "Megatron-LM 2020 (before pipeline parallelism): --batch-size is the per-GPU batch, no "
                   "gradient accumulation; no sequence parallelism or TP overlap; fp16 gradients all-reduced after "
                   "the backward pass; unfused softmax attention; --checkpoint-activations in its example scripts",
                   whole_batch=True),
    SourceDefaults("Megatron-LM 2021", r"narayanan|megatron_readme", MEGATRON_2021, False, 0, 2, "full",
                   "Megatron-LM 2020-21: no sequence parallelism or TP overlap yet, fp16 gradients all-reduced "
                   "after the backward pass, no distributed optimizer, unfused softmax attention, full "
                   "activation checkpointing (--checkpoint-activations in its example scripts)"),
    SourceDefaults("Megatron-LM 2022", r"korthikanti", MEGATRON_2021, False, 0, 2, "full",
                   "Korthikanti et al. 2022: Megatron-LM of 2022 (no TP overlap, no distributed optimizer, "
                   "fused-softmax attention, no FlashAttention), dp = 1 benchmark"),
    SourceDefaults("Megatron-DeepSpeed (BLOOM)", r"bloom|gpt-?neox|megatron.{0,20}deepspeed|deepspeed.{0,20}megatron",
                   MEGATRON_2021, False, 1, 4, "full",
                   "Megatron-DeepSpeed 2022: no sequence parallelism, BF16_Optimizer (ZeRO-1) with fp32 "
                   "gradient reduction after the backward pass, no FlashAttention; EleutherAI's GPT-NeoX is the same "
                   "construction (Megatron-LM model code on DeepSpeed's pipeline engine and ZeRO-1)"),
    # the framework text's hyphenated name: the group of its README's cost table also holds a DeepSpeed row
    SourceDefaults("Megatron-LLaMA", r"megatron-llama", Stack(name="megatron-llama", overlap_dp=False), None, 1, 4,
                   "none",
                   "Megatron-LLaMA (Alibaba, 2023; a Megatron-LM fork): sequence parallelism with tp > 1, no TP "
                   "overlap, fp32 gradients, no recompute, FlashAttention; Megatron-LM's DistributedOptimizer "
                   "reduce-scatters the gradients after the last micro-batch's backward pass and all-gathers the "
                   "parameters after the step, not overlapped (its README: 'the solution provided by Megatron-LM does "
                   "not fully overlap GPU computation with communication'); its OverlappedDistributedOptimizer, where "
                   "a record names it, overlaps them (validate._overlap_dp)"),
    SourceDefaults("Megatron-Core 2024", r"megatron_core", MEGATRON_CORE_2024, None, 1, 4, "none",
                   "Megatron-Core r0.8 README scaling runs: --overlap-grad-reduce --overlap-param-gather "
                   "--tp-comm-overlap (stated), distributed optimizer, fp32 gradient reduction (bf16 default), "
                   "TE fused attention, sequence parallelism with tp > 1, no recompute flag given; pipeline sends "
                   "overlapped with interleaving (megatron/training/arguments.py: --no-overlap-p2p-communication "
                   "is a store_false flag, so overlap_p2p_comm is on unless the schedule is not interleaved)",
                   expert_tp_is_tp=True),
    SourceDefaults("Megatron-Bridge", r"megatron_bridge|mbridge", load_stack("megatron-bridge"), None, 1, 2, "none",
                   "Megatron-Bridge scripts/performance: sequence parallelism with tp > 1, userbuffers TP overlap "
                   "(off for nvfp4), distributed optimizer with overlapped grad reduce / param gather, "
                   "grad_reduce_in_fp32 = False (set_basic_perf_overrides), TE attention, no recompute except "
                   "a few memory-bound recipes; FP8 is current scaling (the performance summary's 'FP8-CS' column); "
                   "pipeline sends overlapped with interleaving (src/megatron/bridge/training/comm_overlap.py: "
                   "overlap_p2p_comm = True, batch_p2p_comm = False when pp > 1 and vp > 1)"),
    # before NeMo: these runs' framework text names the NeMo performance scripts their configs follow
    SourceDefaults("Megatron-LM examples", r"megatron_lm_examples", load_stack("nemo"), None, 1, 4, "none",
                   "Megatron-LM examples/llama (configs follow the NeMo performance scripts): as NeMo, with "
                   "Megatron-LM's own default of pipeline sends overlapped under interleaving "
                   "(--no-overlap-p2p-communication is a store_false flag)", expert_tp_is_tp=True),
    SourceDefaults("NeMo 24.x", r"^(?!.*automodel).*nemo", load_stack("nemo"), None, 1, 4, "none",
                   "NeMo 24.03/24.07 performance recipes: sequence parallelism and userbuffers TP overlap with "
                   "tp > 1, distributed optimizer with overlapped grad reduce / param gather, fp32 main grads, "
                   "FlashAttention (TE), no activation recompute; LoRA (NeMo 1.x PEFT, the Framework Launcher's "
                   "peft/llama/squad.yaml leaves lora_tuning.target_modules unset) on the QKV projection only: "
                   "nemo/collections/nlp/parts/peft_config.py get_target_modules defaults to ['attention_qkv']; "
                   "pipeline sends overlapped with interleaving (NeMo-Framework-Launcher "
                   "launcher_scripts/conf/training/gpt3/175b.yaml and llama/llama3_70b.yaml set overlap_p2p_comm: "
                   "true, batch_p2p_comm: false over the model config's False default)",
                   lora_targets="qkv", expert_tp_is_tp=True),
    SourceDefaults("MosaicML llm-foundry", r"mosaic|llm[-_ ]?foundry|\bcomposer\b", load_stack("llm-foundry"), False,
                   3, 4, "none",
                   "llm-foundry benchmarks: PyTorch FSDP (prefetching, overlapped), Composer mixed_precision "
                   "DEFAULT = bf16 params, fp32 gradient reduce-scatter; FlashAttention-2 through MPT's "
                   "attn_impl 'flash' (scripts/train/benchmarking/submit_benchmarks.py: --attn_impl defaults to "
                   "'flash' and installs .[gpu-flash2] in the version that leaves fsdp mixed_precision at DEFAULT, "
                   "as both tables record; sweep.sh passes no --attn_impl), whose flash_attn_fn packs q, k and v "
                   "with flash-attn's unpad_input and scatters the output back with pad_input in every layer, "
                   "after splitting the fused Wqkv output with qkv.split (llmfoundry/models/layers/attention.py); "
                   "PyTorch eager (no torch.compile), the model's "
                   "default loss_fn fused_crossentropy (flash-attn's fused kernel); Composer (0.15, the version "
                   "llm-foundry 0.2.0 pins) evaluates the model's train metrics after every micro-batch's backward "
                   "pass (Trainer._eval_train_metrics), and MPT's are LanguageCrossEntropy and LanguagePerplexity, "
                   "each a torch.nn.CrossEntropyLoss over the full-vocabulary logits"),
    SourceDefaults("torchtitan", r"torchtitan", load_stack("torchtitan"), None, 3, 4, "none",
                   "torchtitan: FSDP2 (reshard after forward, prefetch), mixed_precision_reduce = float32, "
                   "sequence parallelism inside its TP plan, PyTorch SDPA flash backend (FlashAttention-2); async TP "
                   "only where stated; loss = F.cross_entropy(pred.float()) in eager autograd (the loss is not "
                   "compiled at the benchmark commit); the blocks in eager PyTorch unless the row says torch.compile; "
                   "float8 linears scale each tensor from its current amax (torchao Float8Linear, tensorwise dynamic "
                   "scaling); pipeline parallelism by torch.distributed.pipelining, of the PyTorch the December 2024 "
                   "benchmarks name (torch 1963fc8)", sdpa=True),
    # Stacks that run Hugging Face model code in eager PyTorch under DeepSpeed ZeRO or accelerate / Trainer FSDP.
    SourceDefaults("DeepSpeed / Hugging Face",
                   r"^(?!.*automodel).*(?:deepspeed|hugging ?face|transformers|accelerate|llama[-_ ]?factory|axolotl)",
                   load_stack("deepspeed"), False, 3, 4, "none",
                   "Hugging Face model code in eager PyTorch (one kernel per aten op; F.cross_entropy on fp32 logits) "
                   "with FlashAttention-2 (attn_implementation='flash_attention_2'), data parallel with ZeRO-3 / FSDP "
                   "full shard (prefetch overlapped), fp32 gradient accumulation, no tensor or sequence parallelism, "
                   "no recompute unless stated"),
    # PyTorch-native trainers that shard with FSDP and run PyTorch's own kernels (no Megatron, no Transformer Engine
    # unless the record names it): torchtitan's stack without torchtitan's name. A bare "FSDP" names no stack (Llama
    # 3's "DP(=FSDP)" is Meta's own, with fused kernels): the generic profile, sharding as _zero reads it.
    pytorch_fsdp("PyTorch FSDP2", r"^(?!.*megatron).*(?:fsdp2|fully[-_ ]shard|automodel)", "fsdp2", 4,
                 "PyTorch-native FSDP2 trainers (fully_shard; NeMo AutoModel, torchtitan-style stacks): gradients "
                 "reduced in fp32 (MixedPrecisionPolicy reduce_dtype float32, as torchtitan)"),
    pytorch_fsdp("PyTorch FSDP", r"^(?!.*megatron).*(?:pytorch\W{0,3}fsdp|\bhsdp\b|fms[-_]fsdp)", "fsdp1", 2,
                 "PyTorch-native FSDP (FlatParameter) trainers such as IBM's fms-fsdp: the bf16 mixed-precision "
                 "policy of PyTorch's FSDP tutorial and of fms-fsdp (MixedPrecision param, reduce and buffer dtype "
                 "bfloat16: gradients reduced in bf16)"),
)
GENERIC = SourceDefaults("generic", r"", Stack(), None, 1, 4, "none",
                         "no source profile matched: sequence parallelism with tp > 1, distributed optimizer, "
                         "fp32 gradients, no recompute, FlashAttention; a pipeline of unstated schedule interleaved "
                         "(Megatron-LM's interleaved 1F1B, which the NeMo / Megatron-Bridge recipes, Meta's Llama 3 "
                         "training and torchtitan run at scale), with the smallest v dividing the layers per stage (a "
                         "heuristic: the records that state their schedule at scale interleave, with v unstated)",
                         interleaved=True)


def source_defaults(record: dict[str, Any]) -> SourceDefaults:
    text = f"{record.get('group', '')} {record.get('framework', '')}".lower()
    return next((s for s in SOURCES if re.search(s.match, text)), GENERIC)


# ---- Megatron-Bridge recipe settings --------------------------------------------------------------------------
# Megatron-Bridge performance recipes that turn on the EP all-to-all overlap (``moe_a2a_overlap=True`` →
# Megatron-Core --overlap-moe-expert-parallel-comm): (regex on "group model gpu precision ep<EP>", source).
# The other MoE recipes of those files leave it off (Qwen3 30B, Qwen3 235B on B200 and on GB200 before the 26.06
# MXFP8 recipes, DeepSeek-V3's pp 16 / ep 8 B200, its pre-26.06 GB200 layouts and its later H100 one, GPT-OSS V1),
# except the B300 / GB300 MXFP8 ones, which no run in the data uses.
# GPT-OSS-120B's GB200 "V2" variant (GBS 1280, gpt_oss_workload_base_configs.py) also sets it, but which
# releases ran V2 cannot be pinned from the tables (V1 and V2 coexist in one file), so it is not assumed.
# the Megatron-Bridge releases from 26.06 on, as the start of a recipe key (``recipe_key``)
BRIDGE_26_06_ON = r"megatron_bridge_(26\.(0[6-9]|1\d)|2[7-9]\.\d+)\S*"
MOE_A2A_OVERLAP: tuple[tuple[str, str], ...] = (
    (r"megatron_bridge_25\.\S*.*deepseek-v3.*h100",
     "Megatron-Bridge scripts/performance/configs/deepseek/deepseek_workload_base_configs.py (the 25.x recipes): "
     "DEEPSEEK_V3_H100_BASE_CONFIG moe_flex_dispatcher_backend='deepep', moe_a2a_overlap=True; later versions of "
     "the file switch the H100 layout to hybridep with the overlap off"),
    (r"megatron_bridge_(25\.1[12]|2[6-9])\S*.*qwen3-235b.*h100",
     "Megatron-Bridge scripts/performance/configs/qwen/qwen3_workload_base_configs.py (from the 25.11 recipes "
     "on): QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_BF16_V1 / _FP8_CS_V1 tp 2, pp 8, vp 4, ep 32, moe_a2a_overlap=True"),
    (r"megatron_bridge\S*.*deepseek-v3 b200\b.*\bep32\b",
     "Megatron-Bridge scripts/performance/configs/deepseek/deepseek_workload_base_configs.py: "
     "DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2 / _NVFP4_V2 (the only B200 layout with pp 8, vp 2, ep 32): "
     "moe_flex_dispatcher_backend='deepep', moe_a2a_overlap=True"),
    (BRIDGE_26_06_ON + r".*qwen3.*gb200.*mxfp8",
     "Megatron-Bridge PR #4249 (Qwen3 GB200/GB300 MXFP8 CuTeDSL fusion and full-iteration CUDA graphs for 26.06): "
     "the full-iteration helper turns on the HybridEP all-to-all overlap (PR #4606 brings B200/B300 onto 'the same "
     "optimization path already used by GB200/GB300': moe_a2a_overlap, full-iteration CUDA graphs, CuTeDSL grouped "
     "MLP; PR #5356: 'the B300 recipe gets this for free from the full-iteration helper')"),
    (BRIDGE_26_06_ON + r".*deepseek-v3.*gb200.*mxfp8",
     "Megatron-Bridge scripts/performance/configs/deepseek/deepseek_workload_base_configs.py: "
     "DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V1 / _V2, the 26.06 MXFP8 recipe with full-iteration CUDA graphs and "
     "the CuTeDSL grouped MLP (GROUPED_EXPERT_GEMM_FROM): moe_a2a_overlap=True"),
    (BRIDGE_26_06_ON + r".*gpt-oss.*gb200.*mxfp8",
     "Megatron-Bridge scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py @ 07eea52: "
     "GPT_OSS_120B_PRETRAIN_CONFIG_GB200_FP8_MX_V2 cuda_graph_impl='full_iteration', "
     "moe_flex_dispatcher_backend='hybridep', moe_a2a_overlap=True (26.08: perf_recipes/gpt_oss/common.py "
     "overlap_moe_expert_parallel_comm = True)"),
)


# Megatron-Bridge performance recipes that leave the TP communication exposed (CommOverlapConfig(tp_comm_overlap=False))
# where the harness otherwise overlaps it with userbuffers: (regex on "group model gpu", source).
TP_OVERLAP_OFF: tuple[tuple[str, str], ...] = (
    (r"megatron_bridge_(25\.1[12]|2[6-9])\S*.*qwen3-235b.*h100",
     "Megatron-Bridge scripts/performance/configs/qwen/qwen3_llm_pretrain.py (the 25.11 to 26.04 recipes) "
     "qwen3_235b_a22b_pretrain_config_h100: CommOverlapConfig(tp_comm_overlap=False), where the B200, B300, GB200 and "
     "GB300 functions set True; 26.06 on, src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py @ 04eb4f8: "
     "tp_comm_overlap=False"),
)


def overlap_tp_off(record: dict[str, Any]) -> str:
    """The source of the release's recipe that leaves the TP communication exposed, or ""."""
    key = recipe_key(record)
    return next((why for pattern, why in TP_OVERLAP_OFF if re.search(pattern, key)), "")


# Megatron-Bridge recipes that run cuDNN's FP8 attention (fp8_dot_product_attention → Plan.attention_kernel = "fp8"):
# (regex on "group model gpu precision", source).
FP8_ATTENTION: tuple[tuple[str, str], ...] = (
    (BRIDGE_26_06_ON + r".*qwen3.*gb200.*mxfp8",
     "Megatron-Bridge PR #4249 (Qwen3 GB200/GB300 MXFP8 recipes for 26.06); PR #4606 lists FP8 dot-product "
     "attention in 'the same optimization path already used by GB200/GB300'"),
)
# Not assumed: GPT-OSS-120B's GB200 MXFP8 recipes from 26.06 also set fp8_dot_product_attention=True
# (gpt_oss_workload_base_configs.py @ 07eea52), but its learnable attention sinks reach cuDNN's fused kernel only in
# 16 bits (TE PR #2148: FP16/BF16; FUSED_SINK_ATTENTION_FROM) as far as the sources say, so which kernel ran is not
# known.


def fp8_attention(record: dict[str, Any]) -> tuple[bool, str]:
    key = recipe_key(record, record.get("precision") or "")
    for pattern, why in FP8_ATTENTION:
        if re.search(pattern, key):
            return True, f"cuDNN FP8 attention: {why}"
    return False, ""


# Megatron-Bridge recipes that offload the saved activations of some layers to the Grace CPU's memory
# (cpu_offloading_num_layers; Megatron-Core --cpu-offloading with Transformer Engine's offload handler), on the
# Megatron-FSDP GB200 runs: (regex on "group model gpu zero_or_fsdp", layers, source).
CPU_OFFLOAD: tuple[tuple[str, int, str], ...] = (
    (r"megatron_bridge.*llama3-70b gb200 megatron fsdp", 40,
     "Megatron-Bridge scripts/performance/configs/llama: LLAMA3_70B_GB200_64GPUS_FP8_CS_PARALLEL_CONFIG / "
     "LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS: use_megatron_fsdp=True, micro_batch_size=2, "
     "cpu_offloading_num_layers=40"),
    (r"megatron_bridge.*llama3-70b gb300 megatron fsdp", 20,
     "Megatron-Bridge scripts/performance/configs/llama/llama3_workload_base_configs.py: "
     "LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_CS_V1 / _V2: micro_batch_size=2, use_megatron_fsdp=True, "
     "cpu_offloading_num_layers=20"),
    (r"megatron_bridge.*llama3\.1-405b gb200 megatron fsdp", 95,
     "Megatron-Bridge scripts/performance/configs/llama31: LLAMA31_405B_GB200_128GPUS_FP8_CS_PARALLEL_CONFIG: tp 2, "
     "use_megatron_fsdp=True, cpu_offloading_num_layers=95"),
)


def recipe_key(record: dict[str, Any], *extra: str) -> str:
    """"group model gpu [extra …]" in lower case, the text the recipe tables' patterns match."""
    fields = (record.get("group", ""), (record.get("model") or {}).get("name", ""),
              (record.get("hardware") or {}).get("gpu", ""), *extra)
    return " ".join(str(x) for x in fields).lower()


def cpu_offload(record: dict[str, Any]) -> tuple[int, str]:
    key = recipe_key(record, (record.get("parallel") or {}).get("zero_or_fsdp") or "")
    for pattern, layers, why in CPU_OFFLOAD:
        if re.search(pattern, key):
            return layers, f"activations of {layers} layers offloaded to host memory ({why})"
    return 0, ""


def overlap_ep(record: dict[str, Any], model: ModelSpec, ep: int = 1) -> tuple[bool, str]:
    if not model.is_moe:
        return False, ""
    key = recipe_key(record, record.get("precision") or "", f"ep{ep}")
    for pattern, why in MOE_A2A_OVERLAP:
        if re.search(pattern, key):
            return True, f"EP all-to-all overlapped with compute ({why})"
    return False, "EP all-to-all exposed (the release's recipe does not set moe_a2a_overlap)"


# Attention with learnable sinks (GPT-OSS, softmax_type="learnable") has no FlashAttention kernel. Transformer Engine
# runs it in cuDNN's FusedAttention from TE 2.8 for FP16/BF16 in the BSHD/SBHD layouts with cuDNN 9.13.1+ (TE PR
# #2148; cuDNN 9.18 is needed only for packed THD sequences, TE PR #2568: TE#2318 fell back to the unfused kernel on
# cuDNN 9.10). Megatron-Bridge's GPTOSSProvider uses it from TE 2.8 (older TE: Megatron-Core's local, unfused sink
# attention), and the NeMo image of December 2025 ships cuDNN 9.13.1 with Megatron-Bridge training GPT-OSS in the
# fused kernel (NVIDIA-NeMo/RL#1685). Memory says the same: the unfused kernel keeps b·h·s² probabilities per layer,
# which the published layouts (recompute of layernorm and moe_act at most) have no room for. Releases from 25.11
# (TE 2.9+, cuDNN 9.13.1+) are evaluated with the fused kernel; earlier ones (TE 2.7 in 25.09) with unfused attention.
FUSED_SINK_ATTENTION_FROM = (25, 11)


# Expert GEMMs launched without the host in the loop (Plan.expert_gemm = "grouped"): from the 26.06 release the
# Megatron-Bridge MXFP8 MoE recipes on Blackwell run full-iteration CUDA graphs with Transformer Engine's fused
# CuTeDSL grouped MLP (one kernel for all experts, on-device group sizes, TE 2.14+) and sync-free paged stashing
# (Megatron-Bridge PR #4249 / #4211 for Qwen3 on GB200/GB300, "MXFP8 CuTeDSL Fusion and Full-Iter CUDA Graphs for
# 26.06"; #4606 for B200/B300; the GPT-OSS V2 and DeepSeek-V3 MXFP8 recipes likewise; NeMo 26.06 ships TE 2.16,
# Megatron-Bridge PR #4535). Earlier releases, other precisions and Hopper keep TE GroupedLinear's per-expert
# cuBLAS GEMMs after the per-layer tokens-per-expert sync (Megatron-Core MoEAlltoAllTokenDispatcher).
GROUPED_EXPERT_GEMM_FROM = (26, 6)
BLACKWELL = re.compile(r"B[23]00")  # B200, GB200, B300, GB300
# the MoE models whose MXFP8 Blackwell recipes switched to full-iteration CUDA graphs with the fused grouped MLP; the
# Nemotron 3 recipes keep per-layer graph scopes (attn, mamba, moe_router, moe_preprocess: nemotron_3_workload_base_
# configs.py, and the 26.08 perf_recipes/nemotronh), outside which the experts stay host-launched
FULL_ITERATION_MOE = re.compile(r"qwen3|gpt-oss|deepseek-v3", re.I)


def expert_gemm(record: dict[str, Any], model: ModelSpec) -> tuple[str, str]:
    if not model.is_moe:
        return "per_expert", ""
    found = release(record)
    gpu = str((record.get("hardware") or {}).get("gpu", "")).upper()
    mx = "mxfp8" in str(record.get("precision") or "").lower()
    name = str((record.get("model") or {}).get("name", ""))
    if (found is not None and found >= GROUPED_EXPERT_GEMM_FROM and BLACKWELL.search(gpu) and mx
            and FULL_ITERATION_MOE.search(name)):
        return "grouped", ("expert GEMMs as one fused grouped kernel in full-iteration CUDA graphs (the release's "
                           "MXFP8 Blackwell MoE recipes: Megatron-Bridge PR #4249 / #4606)")
    return "per_expert", ("expert GEMMs launched per expert by the host after the per-layer tokens-per-expert sync "
                          "(TE GroupedLinear, Megatron-Core dropless token dispatcher)")


def release(record: dict[str, Any]) -> tuple[int, ...] | None:
    found = re.search(r"megatron_bridge_(\d+)\.(\d+)", str(record.get("group", "")))
    return (int(found.group(1)), int(found.group(2))) if found else None


# ---- Megatron-Bridge recipes: recompute modules, multi-token prediction, pipeline layouts -----------------------
# Megatron-Bridge performance recipes that recompute modules (selective granularity, Plan.recompute_modules; the perf
# harness's _set_recompute_overrides sets recompute_granularity = "selective" with the workload's recompute_modules
# from PR #1653, 2025-12-09): (regex on "group model gpu precision", modules, source). First match wins.
RECOMPUTE: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (r"megatron_bridge\S*.*deepseek-v3 h100", ("mla_up_proj", "mlp"),
     "scripts/performance/configs/deepseek (every release): the H100 workload's recompute_modules "
     "['mla_up_proj', 'mlp']"),
    (r"megatron_bridge_26\.04\.01.*deepseek-v3 b200", ("mla_up_proj", "mlp"),
     "deepseek_workload_base_configs.py @ 0426418: DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2 (pp 8, vp 2, ep 32, "
     "DeepEP) recompute_modules=['mla_up_proj', 'mlp']"),
    (r"megatron_bridge_26\.04(\.01)?\s.*deepseek-v3 gb200 (mxfp8|fp8)", ("mlp",),
     "Megatron-Bridge PR #3031 ('Update DeepSeek V3 GB200 recompute strategy from mla_up_proj to mlp', verified in "
     "the 26.04 RC3 container)"),
    (r"megatron_bridge\S*.*deepseek-v3", ("mla_up_proj",),
     "the DeepSeek-V3 workload configs' recompute_modules=['mla_up_proj'] (the library recipe sets "
     "recompute_granularity 'selective')"),
    (r"megatron_bridge_26\.0[24](\.01)?\s.*gpt-oss-120b \S+ bf16", ("layernorm", "moe_act"),
     "gpt_oss_workload_base_configs.py @ 1e7adfa / 07eea52: the GB200, B200 and H100 BF16 workloads' "
     "recompute_modules=['layernorm', 'moe_act']"),
    (r"megatron_bridge\S*.*nemotron-3-nano h100", ("moe", "layernorm", "core_attn", "moe_act"),
     "nemotron_3_workload_base_configs.py: NEMOTRON_3_NANO_PRETRAIN_CONFIG_H100_FP8_CS_V1 "
     "recompute_modules=['moe', 'layernorm', 'core_attn', 'moe_act'] (PR #4628 dropped it to ['layernorm'] in July "
     "2026, after the 26.06 branch)"),
    (r"megatron_bridge\S*.*nemotron-3-super b200 mxfp8", ("moe_act", "layernorm"),
     "nemotron_3_workload_base_configs.py @ f601ba9: BASE_NEMOTRON_3_SUPER_CONFIG_B200 (tp 1, ep 64, "
     "cuda_graph_impl 'none') recompute_modules=['moe_act', 'layernorm']"),
)


def recompute_modules(record: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    """The modules the release's recipe recomputes (selective), or () where it recomputes none or is unknown."""
    key = recipe_key(record, record.get("precision") or "")
    for pattern, modules, why in RECOMPUTE:
        if re.search(pattern, key):
            return modules, f"selective recompute of {', '.join(modules)} (not stated; {why})"
    return (), ""


# Multi-token prediction as the stacks train it: Megatron-Bridge's DeepSeek-V3 recipe keeps the library default
# mtp_num_layers = 1 (recipes/deepseek/deepseek_v3.py of release 0.3.0; every perf config), except the runs the table
# marks "w/o MTP"; its Nemotron 3 Super recipe runs two depths of one shared "*E" layer (the preset's). Other stacks
# train the MTP module only where the record says so.
MTP_STACKS = re.compile(r"megatron|nemo(?!.*automodel)", re.I)


def mtp_layers(record: dict[str, Any], model: ModelSpec) -> tuple[int, str]:
    """The MTP depths the run trains: the model's (its preset's) on a Megatron stack, none elsewhere or where the
    record's id says "withoutmtp"."""
    if not model.mtp_layers:
        return 0, ""
    rid = str(record.get("id", "")).lower()
    text = f"{record.get('group', '')} {record.get('framework', '')}"
    if "withoutmtp" in rid:
        return 0, "no multi-token prediction (the run is 'w/o MTP')"
    if MTP_STACKS.search(text) or "withmtp" in rid:
        return model.mtp_layers, (f"{model.mtp_layers} multi-token-prediction depth(s) on the last stage (the "
                                  "stack's recipe default; ops.mtp_ops)")
    return 0, "no multi-token prediction (not stated for this stack)"


# Megatron-Core pipeline layouts (pipeline_model_parallel_layout: "E" embedding, "t" decoder layer, "m" MTP, "L"
# loss, "|" between model chunks; chunk i runs on pipeline rank i mod p) of Megatron-Bridge's DeepSeek-V3 recipes:
# (regex on "group model gpu", layout, source). The last rank's decoder layers become Plan.last_stage_layers.
DSV3_LAYOUT_16 = "Etttt|" + "tttt|" * 14 + "tmL"
PIPELINE_LAYOUTS: tuple[tuple[str, str, str], ...] = (
    (r"megatron_bridge\S*.*deepseek-v3 h100", "Et|" + "tt|" * 30 + "mL",
     "scripts/performance/configs/deepseek/deepseek_llm_pretrain.py @ 69655bf: pipeline_model_parallel_layout = "
     "pp_layout or 'Et|(tt|)*30mL'"),
    (r"megatron_bridge\S*.*deepseek-v3", DSV3_LAYOUT_16,
     "recipes/deepseek/deepseek_v3.py set_deepseek_v3_pipeline_model_parallel_layout (release 0.3.0): for (pp, vp) "
     "(4, 4), (8, 2) and (16, 1), [embedding + 4 decoder] + 14 x [4 decoder] + [1 decoder + mtp + loss]"),
)


# Recipes that count the embedding and the loss as a pipeline layer each (Megatron-Core account_for_embedding_in_
# pipeline_split / account_for_loss_in_pipeline_split, get_num_layers_to_build): the L + 2 slots split evenly over the
# ranks, so the first and the last rank hold one decoder layer fewer than the others. (regex on "group model gpu",
# source)
EMBEDDING_LOSS_SPLIT: tuple[tuple[str, str], ...] = (
    (r"megatron_bridge\S*.*llama ?3\.1[- ]?405b",
     "src/megatron/bridge/recipes/llama/llama3.py llama31_405b_pretrain_config: account_for_embedding_in_pipeline_"
     "split = account_for_loss_in_pipeline_split = True"),
    (r"megatron_bridge\S*.*qwen3[- ]?235b",
     "src/megatron/bridge/recipes/qwen/qwen3_moe.py qwen3_235b_a22b_pretrain_config: account_for_embedding_in_"
     "pipeline_split = account_for_loss_in_pipeline_split = True"),
)
# Megatron-Core's stacks build pp·vp model chunks of whole layers only: where the record's L layers do not split into
# them but L + 2 do, the run must count the embedding and the loss as a layer each (get_num_layers_to_build)
MCORE_STACKS = ("Megatron-Bridge", "Megatron-Core 2024", "Megatron-LM examples", "NeMo 24.x")


def layout_last_stage(layout: str, pp: int) -> int:
    """Decoder layers ("t") of a pipeline layout's chunks on the last rank (chunk i on rank i mod pp)."""
    chunks = layout.split("|")
    return sum(chunk.count("t") for i, chunk in enumerate(chunks) if i % pp == pp - 1)


def last_stage_layers(record: dict[str, Any], model: ModelSpec, pp: int, vpp: int) -> tuple[int, str]:
    """The last pipeline rank's decoder layers under the recipe's pipeline layout, where one applies to this
    (pp, vpp): as many chunks as pp·vpp and as many decoder layers as the model's; else 0 (an even split)."""
    if pp == 1:
        return 0, ""
    key = recipe_key(record)
    for pattern, layout, why in PIPELINE_LAYOUTS:
        if re.search(pattern, key):
            chunks, decoders = layout.count("|") + 1, layout.count("t")
            if chunks != pp * vpp or decoders != model.num_layers:
                return 0, (f"pipeline layout: the recipe's ({why}) has {chunks} chunks of {decoders} decoder layers, "
                           f"not pp*vp = {pp * vpp} of num_layers = {model.num_layers}: an even split assumed")
            last = layout_last_stage(layout, pp)
            if last == 0:  # Plan.last_stage_layers has no "none": a last rank of MTP and loss alone is not modelled
                return 0, f"pipeline layout: the recipe's last rank holds no decoder layer ({why}): an even split"
            return last, f"last pipeline rank {last} decoder layers ({why})"
    return embedding_loss_split(record, model, pp)


def embedding_loss_split(record: dict[str, Any], model: ModelSpec, pp: int) -> tuple[int, str]:
    """The last rank's decoder layers when the embedding and the loss take a pipeline slot each: (L + 2)/pp − 1, by
    the recipe (EMBEDDING_LOSS_SPLIT) or because a Megatron-Core stack could not split the layers otherwise."""
    slots = model.num_layers + 2
    if slots % pp:
        return 0, ""
    last = slots // pp - 1
    key = recipe_key(record)
    why = next((why for pattern, why in EMBEDDING_LOSS_SPLIT if re.search(pattern, key)), "")
    chunks = pp * (positive_int((record.get("parallel") or {}).get("vp")) or 1)
    if not why and source_defaults(record).name in MCORE_STACKS and model.num_layers % chunks and not slots % chunks:
        why = (f"{model.num_layers} layers do not split into pp*vp = {chunks} model chunks but {slots} slots do: "
               "Megatron-Core's account_for_embedding/loss_in_pipeline_split")
    return (last, f"last pipeline rank {last} decoder layers and the loss ({why})") if why else (0, "")
