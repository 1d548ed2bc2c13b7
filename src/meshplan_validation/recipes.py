"""The Megatron-Bridge (and NeMo) recipe settings that a release's published table does not state, read from its
performance scripts, each with the file or pull request it comes from: EP all-to-all overlap, FP8 attention,
activation offload, the expert-GEMM launch, CUDA graphs, selective recompute modules and multi-token prediction (what
a recipe turns off, or a release's regressed kernel: recipes_off.py).
Each table is keyed by a pattern on the record's ``recipe_key``; map_plan.py applies them when it maps a record onto a
Plan and a Stack (the pipeline layouts of these recipes: layouts.py).
"""

from __future__ import annotations

import re
from typing import Any

from meshplan.specs.model import ModelSpec
from meshplan_validation.patterns import BLACKWELL, BRIDGE_RELEASE, FULL_ITERATION_MOE, MTP_STACKS


def recipe_key(record: dict[str, Any], *extra: str) -> str:
    """"group model gpu [extra …]" in lower case, the text the recipe tables' patterns match."""
    fields = (record.get("group", ""), (record.get("model") or {}).get("name", ""),
              (record.get("hardware") or {}).get("gpu", ""), *extra)
    return " ".join(str(x) for x in fields).lower()


def first_source(table: tuple[tuple[str, str], ...], key: str) -> str:
    """The source of the first (pattern, source) row of ``table`` whose pattern ``key`` matches (re.search), or ""."""
    return next((why for pattern, why in table if re.search(pattern, key)), "")


def release(record: dict[str, Any]) -> tuple[int, ...] | None:
    """The Megatron-Bridge release (year, month) its group names, or None."""
    found = BRIDGE_RELEASE.search(str(record.get("group", "")))
    return (int(found.group(1)), int(found.group(2))) if found else None


# ---- Megatron-Bridge recipe settings --------------------------------------------------------------------------
# Megatron-Bridge performance recipes that turn on the EP all-to-all overlap (``moe_a2a_overlap=True`` →
# Megatron-Core --overlap-moe-expert-parallel-comm): (regex on "group model gpu precision ep<EP>", source).
# The other MoE recipes of those files leave it off (Qwen3 30B on Blackwell before 26.06 and in v0.3.1-v0.5.0's ep 16
# H100 HybridEP recipe, Qwen3 235B on B200 from v0.3.0 and on GB200 before the 26.06 MXFP8 recipes, Qwen3 235B on
# GB300 in the v0.2.0-v0.4.0 files, DeepSeek-V3's pp 16 / ep 8 B200, its pre-26.06 GB200 layouts and its later H100
# one, GPT-OSS V1). Two v0.2.0 (25.11) configs set it but the 25.11 table did not run them as written, so it is not
# mapped there: configs/qwen3/workload_base_configs.py QWEN3_235B_A22B_B200_BF16 / _FP8_CS_BASE_CONFIG (vp 4,
# moe_a2a_overlap=True; the table states vp 2) and QWEN3_30B_A3B_H100_BF16 / _FP8_CS_BASE_CONFIG (vp 12, mbs 1,
# moe_a2a_overlap=True; the table states vp 24, mbs 2, the 25.09 layout). Qwen3 235B on B300 sets it in the 26.02
# files (v0.3.0), not in v0.3.1 or v0.4.0; the 26.02 B300 MXFP8 run (benchmarks/data/independent_runs.jsonl) has that
# recipe's layout.
# GPT-OSS-120B's GB200 "V2" variant (GBS 1280, gpt_oss_workload_base_configs.py) also sets it from 26.04 (@ 0fbfe7d:
# HybridEP; @ c810129, 26.04.x: the all-to-all dispatcher, PR #3561); the 26.02 V2 (@ 21b02e0) is V1 at GBS 1280. The
# published GBS (1280 from 26.02; V1 is 512) and the B200 runs' ep (64 at 26.02 as its B200 V2, 8 from 26.02.01 as
# the 26.04 B200 V2; v0.3.1's is still 64) say the tables ran V2; not yet applied to the 26.04 / 26.04.01 GB200
# BF16 runs (issue 79: priced so, they read +59 / +66 % where they read +41 / +47 %).
# the Megatron-Bridge releases from 26.06 on, as the start of a recipe key (``recipe_key``)
BRIDGE_26_06_ON = r"megatron_bridge_(26\.(0[6-9]|1\d)|2[7-9]\.\d+)\S*"
MOE_A2A_OVERLAP: tuple[tuple[str, str], ...] = (
    (r"megatron_bridge_25\.(09|11)\S*.*deepseek-v3.*h100",
     "Megatron-Bridge scripts/performance/run_script.py @ v0.1.0rc3 (25.09): A2A_1F1B on h100 sets "
     "overlap_moe_expert_parallel_comm = True; configs/deepseek/workload_base_configs.py @ v0.2.0 (25.11): "
     "DEEPSEEK_V3_H100_BASE_CONFIG moe_flex_dispatcher_backend='deepep', moe_a2a_overlap=True; later versions of "
     "the file switch the H100 layout to hybridep with the overlap off"),
    (r"megatron_bridge_(25\.11|26\.0[246])\S*.*qwen3-235b.*h100",
     "Megatron-Bridge scripts/performance/configs/qwen3/workload_base_configs.py @ v0.2.0 (25.11): "
     "QWEN3_235B_A22B_H100_BF16 / _FP8_CS_BASE_CONFIG, configs/qwen/qwen3_workload_base_configs.py @ v0.3.0 to "
     "v0.5.0 (26.02-26.06): QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_BF16_V1 / _FP8_CS_V1 (V2: GBS 8192) tp 2, pp 8, "
     "vp 4, ep 32, moe_a2a_overlap=True"),
    (r"megatron_bridge_26\.02(\.01)?\s.*qwen3-30b-a3b h100\b.*\bep8\b",
     "Megatron-Bridge scripts/performance/configs/qwen/qwen3_workload_base_configs.py @ v0.3.0 (21b02e0, the "
     "26.02 recipes): QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 / _BF16_V1 pp 2, vp 12, ep 8, mbs 1, GBS 1024, "
     "moe_flex_dispatcher_backend='deepep', moe_a2a_overlap=True (the 26.02 and 26.02.01 tables' layout, as "
     "recipes_dispatch.FLEX_DISPATCH; v0.3.1's ep 16 HybridEP recipe sets it False)"),
    (r"megatron_bridge_26\.02(?!\.\d)\S*.*qwen3-235b.*\bb300\b",
     "Megatron-Bridge scripts/performance/configs/qwen/qwen3_workload_base_configs.py @ 21b02e0 (v0.3.0, the 26.02 "
     "recipes): QWEN3_235B_A22B_PRETRAIN_CONFIG_B300_BF16_V1 / _FP8_CS_V1 pp 8, vp 4, ep 8, moe_a2a_overlap=True "
     "(_FP8_MX_V1 is _FP8_CS_V1; the _V2 variants are V1 at 256 GPUs, GBS 8192); v0.3.1 sets it False"),
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


# Megatron-Bridge recipes that run cuDNN's FP8 attention (fp8_dot_product_attention → Stack.attention_kernel = "fp8"):
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


# Expert GEMMs launched without the host in the loop (Stack.expert_gemm = "grouped"): from the 26.06 release the
# Megatron-Bridge MXFP8 MoE recipes on Blackwell run full-iteration CUDA graphs with Transformer Engine's fused
# CuTeDSL grouped MLP (one kernel for all experts, on-device group sizes, TE 2.14+) and sync-free paged stashing
# (Megatron-Bridge PR #4249 / #4211 for Qwen3 on GB200/GB300, "MXFP8 CuTeDSL Fusion and Full-Iter CUDA Graphs for
# 26.06"; #4606 for B200/B300; the GPT-OSS V2 and DeepSeek-V3 MXFP8 recipes likewise; NeMo 26.06 ships TE 2.16,
# Megatron-Bridge PR #4535). Earlier releases, other precisions and Hopper keep TE GroupedLinear's per-expert
# cuBLAS GEMMs after the per-layer tokens-per-expert sync (Megatron-Core MoEAlltoAllTokenDispatcher).
GROUPED_EXPERT_GEMM_FROM = (26, 6)  # on the MoE models of patterns.FULL_ITERATION_MOE


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


# Megatron-Bridge performance recipes that drop tokens (Plan.moe_expert_capacity_factor, specs/token_drop.py): the
# 25.09 scripts (scripts/performance/run_script.py @ v0.1.0rc3 bf71eba07 and v0.1.0rc5 684a68616, whose DeepSeek-V3
# perf_matrix rows, B200 tp 1 / pp 16 / vp null and GB200 pp 4 / vp 4, are the 25.09 table's; rc3's are not) call
# ``apply_moe_token_drop(recipe.model)`` for Qwen3 30B-A3B and 235B-A22B on every GPU and for DeepSeek-V3 where
# ``use_tokendrop`` defaults on, B200 and GB200 (H100 runs DeepEP, dropless); its defaults are capacity factor 1.0 with
# the experts' input padded to capacity (src/megatron/bridge/training/utils/moe_token_drop.py @ bf71eba07:
# moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True). From 25.11 (v0.2.0 utils/helpers.py) token
# drop is opt-in (--use_tokendrop, default None) and the published recipes run dropless. (regex on "group model gpu",
# factor, padded). NeMo 2.0's Mixtral performance recipes drop tokens too: nemo/collections/llm/recipes/mixtral_8x7b.py
# pretrain_performance_optimizations (@ v2.2.0 and v2.3.0, the 25.02 and 25.04 containers; scripts/llm/performance/
# pretrain_mixtral_8x7b.py and scripts/performance/llm/ call pretrain_recipe(performance_mode=True)) adds
# MegatronTokenDropCallback, whose defaults are capacity factor 1.0, padded (nemo/lightning/pytorch/callbacks/
# moe_token_drop.py).
TOKEN_DROP: tuple[tuple[str, float, bool], ...] = (
    (r"megatron_bridge_25\.09\S*\s(qwen3-30b-a3b|qwen3-235b-a22b) ", 1.0, True),
    (r"megatron_bridge_25\.09\S*\sdeepseek-v3 g?b200\b", 1.0, True),
    (r"^nemo_25(02|04)_\S+ mixtral[- ]8x7b ", 1.0, True),
)


def token_drop(record: dict[str, Any], model: ModelSpec) -> tuple[float | None, bool, str]:
    """The release recipe's MoE capacity factor and padding (``TOKEN_DROP``), with its note; (None, False, "")
    dropless."""
    key = recipe_key(record)
    for pattern, factor, padded in TOKEN_DROP if model.is_moe else ():
        if re.search(pattern, key):
            return factor, padded, (f"token-drop MoE, capacity factor {factor:g}{', padded to capacity' * padded} "
                                    "(the release's performance recipe: recipes.TOKEN_DROP)")
    return None, False, ""


# ---- Megatron-Bridge recipes: CUDA graphs ------------------------------------------------------------------------
# Which performance recipes capture CUDA graphs (Stack.cuda_graphs). The perf harness applies a workload config's
# cuda_graph_impl / cuda_graph_scope only where the config sets them (scripts/performance/utils/utils.py
# set_workload_base_configs -> helpers.set_cuda_graph_overrides, 25.11 @ 7af9601 to 26.06 @ fcbb603); where it leaves
# them unset the library recipe's holds: cuda_graph_impl = "none" (src/megatron/bridge/recipes/{gpt_oss,qwen,deepseek}
# @ 0fbfe7d set it; before them Megatron-Core TransformerConfig's default "none"). The 25.09 scripts set it per GPU
# (perf_matrix.<gpu>.cuda_graphs in scripts/performance/configs/*/*_llm_pretrain.yaml @ 684a686). (regex on
# "group model gpu precision", graph scope, source); scope () = no graphs. First match wins; a record no row matches
# keeps its stack's setting (the megatron-bridge preset: graphed). A scope names what is captured (Megatron-Core
# cuda_graph_scope: attn, moe_router, moe_preprocess, mamba; full_iteration: the whole step); the stack prices any
# scope as one graph launch per layer and pass (presets/stacks/megatron-bridge.toml), which no record's step time
# depends on: priced with no graphs at all, every graphed Megatron-Bridge record reads the same (the eager layer's
# host time stays below its GPU time).
_TE_MOE_SCOPE = ("attn", "moe_router", "moe_preprocess")
CUDA_GRAPHS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (r"megatron_bridge_(25\.1[12]|26\.0[24])\S*\s.*gpt-oss-120b (gb200|b200|h100)\b", (),
     "gpt_oss workload configs (workload_base_configs.py @ 7af9601, gpt_oss_workload_base_configs.py @ 21b02e0 / "
     "0fbfe7d): GPT_OSS_120B_*_{GB200,B200,H100}_BF16 (and their FP8 aliases) set no cuda_graph_impl (they recompute "
     "layernorm and moe_act instead); the library recipe gpt_oss.py: cuda_graph_impl = 'none'"),
    (r"megatron_bridge\S*\s.*gpt-oss-120b g?b300\b", _TE_MOE_SCOPE,
     "gpt_oss workload configs @ 7af9601 to fcbb603: GPT_OSS_120B_*_{GB300,B300}_BF16 cuda_graph_impl="
     "'transformer_engine', cuda_graph_scope=['attn', 'moe_router', 'moe_preprocess']"),
    (r"megatron_bridge\S*\s.*qwen3-30b-a3b h100\b", (),
     "qwen3 configs: 25.09 qwen3_30b_a3b_llm_pretrain.yaml h100 cuda_graphs: false; workload_base_configs.py @ "
     "7af9601 QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG and qwen3_workload_base_configs.py @ 21b02e0 to fcbb603 "
     "QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1: no cuda_graph_impl (qwen3_moe.py: 'none')"),
    (r"megatron_bridge\S*\s.*qwen3-235b-a22b (h100|b200)\b", (),
     "qwen3 configs: 25.09 qwen3_235b_a22b_llm_pretrain.yaml h100 / b200 cuda_graphs: false; 7af9601 to fcbb603 "
     "QWEN3_235B_A22B_*_{H100,B200}_*: no cuda_graph_impl (qwen3_moe.py: 'none')"),
    (r"megatron_bridge\S*\s.*deepseek-v3 h100\b", (),
     "deepseek configs: 25.09 deepseek_v3_llm_pretrain.yaml h100 cuda_graphs: false; 7af9601 to fcbb603 "
     "DEEPSEEK_V3_*_H100_*: no cuda_graph_impl (deepseek_v3.py: 'none')"),
    (r"megatron_bridge_(25\.\d+|26\.0[24])\S*\s.*deepseek-v3 b200\b", (),
     "deepseek configs: 25.09 deepseek_v3_llm_pretrain.yaml b200 cuda_graphs: false; 7af9601 to 0fbfe7d "
     "DEEPSEEK_V3_*_B200_* (V1 and V2): no cuda_graph_impl (26.06's B200_FP8_MX_V2 captures attn, moe_router, "
     "moe_preprocess)"),
    (r"megatron_bridge\S*\s.*nemotron-3-super b200 (mxfp8|bf16)", (),
     "nemotron_3_workload_base_configs.py @ 0fbfe7d / fcbb603: BASE_NEMOTRON_3_SUPER_CONFIG_B200 "
     "cuda_graph_impl='none' (the NVFP4 recipe captures mamba, attn, moe_router, moe_preprocess)"),
)


def cuda_graphs(record: dict[str, Any]) -> tuple[bool | None, str]:
    """Whether the release's recipe captures CUDA graphs (``CUDA_GRAPHS``), with its note; None where no row says."""
    key = recipe_key(record, record.get("precision") or "")
    for pattern, scope, why in CUDA_GRAPHS:
        if re.search(pattern, key):
            what = f"CUDA graphs of {', '.join(scope)}" if scope else "no CUDA graphs: the host launches every kernel"
            return bool(scope), f"{what} ({why})"
    return None, ""


# ---- Megatron-Bridge recipes: recompute modules, multi-token prediction ----------------------------------------
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
# (patterns.MTP_STACKS) train the MTP module only where the record says so.


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
                                  "stack's recipe default; embed_head.mtp_ops)")
    return 0, "no multi-token prediction (not stated for this stack)"


# Megatron-Core pipeline layouts (pipeline_model_parallel_layout: "E" embedding, "t" decoder layer, "m" MTP, "L"
