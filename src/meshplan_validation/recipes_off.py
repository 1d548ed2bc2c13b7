"""Megatron-Bridge recipes that turn off what the harness otherwise runs, or ran a regressed kernel, each with the
file or issue it comes from: the TP communication left exposed, the weight all-gather left synchronous, the grouped
MLP's backward GLU kernel of one release; and NVIDIA's DGX Cloud recipes that turn off Transformer Engine's cuDNN
attention. Keyed like recipes.py by a pattern on the record's ``recipe_key``;
map_kernels.py and map_plan.py apply them.
"""

from __future__ import annotations

import re
from typing import Any

from meshplan_validation.recipes import first_source, recipe_key

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
    return first_source(TP_OVERLAP_OFF, key)


# Recipes leaving the weight all-gather synchronous (overlap_param_gather=False): ("group model gpu precision", source).
# recipe_key holds no task: the 25.11 patterns would match a finetune record of those models too, whose configs
# (llama3_llm_finetune.py @ v0.2.0) leave it off only on GB200 (8B SFT, 70B SFT and LoRA); no such record is mapped.
# The 26.06 pattern is the V2 layout's (256 GPUs, GBS 1536), the only such record; V1 overlaps the gather.
PARAM_GATHER_OFF: tuple[tuple[str, str], ...] = (
    (r"megatron_bridge_25\.11\S* (llama3-70b|llama3\.1-405b) (b200|gb200|gb300) mxfp8",
     "Megatron-Bridge scripts/performance/configs/llama3/llama3_llm_pretrain.py and llama31/llama31_llm_pretrain.py "
     "@ v0.2.0-v0.2.2 (7af9601, the 25.11 scripts), the 70B and 405B B200 / GB200 / GB300 configs: 'if precision == "
     "\"fp8_mx\": # keeping this eanbled causes NaN grad norm', overlap_param_gather = False"),
    (r"megatron_bridge_25\.11\S* deepseek-v3 (gb200|gb300) mxfp8",
     "Megatron-Bridge scripts/performance/configs/deepseek/deepseek_llm_pretrain.py @ v0.2.0 (7af9601): "
     "deepseek_v3_gb300_config / _gb200_config, fp8_mx: overlap_param_gather = False (not the B200 config)"),
    (r"megatron_bridge_26\.06 llama3\.1-405b gb200 nvfp4",
     "Megatron-Bridge scripts/performance/configs/llama/llama31_llm_pretrain.py @ v0.5.0 (fcbb603, the 26.06 "
     "scripts) llama31_405b_pretrain_config_gb200: nvfp4 with config_variant v2 (256 GPUs, GBS 1536: "
     "LLAMA31_405B_PRETRAIN_CONFIG_GB200_NVFP4_V2) calls disable_param_gather_overlap (issue #3714: peak memory)"),
)


def param_gather_off(record: dict[str, Any]) -> str:
    """The source of the release's recipe that leaves the weight all-gather synchronous, or ""."""
    key = recipe_key(record, record.get("precision") or "")
    return first_source(PARAM_GATHER_OFF, key)


# Releases whose grouped MLP's backward GLU kernel regressed (Stack.dglu_slowdown): (regex on "group model gpu
# precision", times, source). cudnn-frontend#256: grouped_gemm_dglu_wrapper_sm100 (MoEGroupedGemmDgluDbiasKernel,
# block-scaled) "became 10x slower between cudnn-frontend v1.23.0 and v1.24.0" on GPT-OSS-20B's dGeGLU; Megatron-
# Bridge's performance-summary.md (@ b03c72c9c / 75aba37c9) marks its 26.06.01 GPT-OSS 120B MXFP8 rows "a known issue
# (cudnn-frontend#256)", and its #5028 measures that container's GPT-OSS 20B GB200 MXFP8 step 421.1 -> 627.3 ms.
# The fix (cudnn-frontend PR #322) times the shape at 1362.8 us against 155.6 us with the bias gradient (8.8x;
# GPT-OSS's experts have biases, so its rows take that path): the 10 is kept, its own figure.
DGLU_SLOWDOWN = ((r"megatron_bridge_26\.06\.01\s.*gpt-oss\S* \S+ mxfp8", 10.0, "cudnn-frontend#256"),)


def dglu_slowdown(record: dict[str, Any]) -> tuple[float, str]:
    """The times ``DGLU_SLOWDOWN`` gives the release's grouped backward GLU kernel (1: none), with its note."""
    key = recipe_key(record, record.get("precision") or "")
    for pattern, times, why in DGLU_SLOWDOWN:
        if re.search(pattern, key):
            return times, f"the grouped MLP's backward GLU kernel at {times:g}x its time ({why})"
    return 1.0, ""


# Recipes that export NVTE_FUSED_ATTN=0: Transformer Engine's DotProductAttention then runs its FlashAttention backend
# (the flash-attn package, FlashAttention-2 class), not cuDNN's fused kernel (map_kernels.attention_kernel). (regex on
# "group model gpu", source)
TE_FUSED_ATTENTION_OFF: tuple[tuple[str, str], ...] = (
    (r"^dgxc_grok1",
     "NVIDIA/dgxc-benchmarking grok1/configure.sh @143b90dd: export NVTE_FUSED_ATTN=0 (model.transformer_engine=true)"),
)


def te_fused_attention_off(record: dict[str, Any]) -> str:
    """The source of the recipe that turns Transformer Engine's cuDNN attention off, or ""."""
    key = recipe_key(record)
    return first_source(TE_FUSED_ATTENTION_OFF, key)


# NeMo 2 performance scripts whose model code runs its squared-ReLU MLP activation unfused (Stack.fusion
# "fused-eager-act", specs/fusion.py), the fusion Megatron-Core's and NeMo 1's jit_fuser would give it turned off:
# (regex on "group model gpu", source). The NeMo 2.0 Nemotron-4 recipes (scripts/llm/performance/pretrain_nemotron4_
# {15b,340b}.py @ v2.2.0, scripts/performance/llm/ @ v2.3.0) build NemotronConfig, whose activation_func is
# nemo/collections/llm/fn/activation.py squared_relu (torch.pow(F.relu(x), 2), "# @torch.jit.script # remove until we
# have serialization") with bias_activation_fusion left False.
EAGER_ACTIVATION: tuple[tuple[str, str], ...] = (
    (r"^nemo_25(02|04)_\S+ nemotron-4 ",
     "NVIDIA/NeMo nemo/collections/llm/gpt/model/nemotron.py NemotronConfig.activation_func = "
     "nemo/collections/llm/fn/activation.py squared_relu, not compiled (@ v2.2.0 / v2.3.0, the 25.02 / 25.04 "
     "containers)"),
)


def eager_activation(record: dict[str, Any]) -> str:
    """The source of the release's model code that runs a squared-ReLU activation as eager ops, or ""."""
    key = recipe_key(record)
    return first_source(EAGER_ACTIVATION, key)
