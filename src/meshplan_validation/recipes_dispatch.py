"""The Megatron-Bridge (and NeMo) performance recipes' MoE token dispatcher, which a release's published table does
not state: the flex dispatcher and its backend (DeepEP or HybridEP), and the permutation left unfused, read from the
release's performance scripts, each with the file it comes from (map_kernels.recipe_settings applies it;
collectives/dispatch.py prices what each sends, cost/moe_permute.py the permutation).
"""

from __future__ import annotations

import re
from typing import Any

from meshplan.specs.model import ModelSpec
from meshplan_validation.recipes import first_source, recipe_key

# Megatron-Bridge performance recipes that dispatch the MoE tokens with a forwarding backend
# (moe_token_dispatcher_type "flex", moe_flex_dispatcher_backend "deepep" or "hybridep": a token crosses the network
# once per other node it hits, Stack.moe_dispatcher "flex", priced by its backend's own measured table:
# Stack.flex_backend): (regex on "group model gpu precision ep<EP>", backend, source).
# Every DeepSeek-V3 recipe of the files sets one (hybridep on every GPU from the unified launchers, @ c3e43e6aa,
# 2025-12-03, on); inside one node too it prices differently: no local sort, no fp8-padding copy (cost/moe_permute).
# HybridEP as these recipes run it: the performance harness sets moe_hybridep_num_sms = 32 wherever the backend is
# hybridep (Megatron-Bridge scripts/performance/utils/helpers.py:113 @ v0.2.0, 25.11; utils/overrides.py:69 @ v0.3.0,
# :71 @ v0.4.0, :75 @ v0.5.1, :89 @ v0.6.0), over Megatron-Core's 16 (specs/stack_variants.py "hybridep-32sm")
BRIDGE_HYBRIDEP = "hybridep-32sm"
FLEX_DISPATCH: tuple[tuple[str, str, str], ...] = (
    (r"megatron_bridge_25\.(09|11)\S*.*deepseek-v3.*h100", "deepep",
     "Megatron-Bridge scripts/performance/run_script.py @ v0.1.0rc3 (bf71eba07, the 25.09 scripts): enable_deepep "
     "on h100 unless token drop, recipes/deepseek/deepseek_v3.py: moe_token_dispatcher_type 'flex', "
     "moe_enable_deepep; v0.2.0 (25.11) configs/deepseek/workload_base_configs.py DEEPSEEK_V3_H100_BASE_CONFIG "
     "moe_flex_dispatcher_backend='deepep'"),
    # the release tags that hold it: v0.4.2 (26.04.01, the newest table of its docs/performance-summary.md), v0.5.0,
    # v0.5.1 (26.06, 26.06.01) and v0.6.0 (26.08); v0.4.0 and v0.4.1 (26.04) alias _B200_FP8_MX_V2 to _FP8_CS_V2
    (r"megatron_bridge_(26\.04\.01|26\.0[68])\S*\s.*deepseek-v3 b200\b.*\bep32\b", "deepep",
     "Megatron-Bridge deepseek_workload_base_configs.py @ 5acef93 ('b200 DSv3 better cfg', #3368; in v0.4.2, v0.5.0 "
     "and v0.5.1): DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2 moe_flex_dispatcher_backend='deepep', pp 8, vp 2, "
     "ep 32 (v0.6.0, 26.08: src/megatron/bridge/perf_recipes/deepseek/b200/deepseek_v3.py "
     "deepseek_v3_pretrain_256gpu_b200_fp8mx_config the same)"),
    # Grace Blackwell's layouts inside the NVL72 domain: HybridEP from 25.11 (25.09 drops tokens: alltoall)
    (r"megatron_bridge_(25\.11|26\.0[2468])\S*\s.*deepseek-v3 gb[23]00\b", BRIDGE_HYBRIDEP,
     "Megatron-Bridge scripts/performance/configs/deepseek/workload_base_configs.py @ v0.2.0 (25.11): "
     "DEEPSEEK_V3_GB200_ / _GB300_BASE_CONFIG moe_flex_dispatcher_backend='hybridep'; deepseek_workload_base_configs"
     ".py @ v0.3.0 to v0.5.0: DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_V1 / _GB300_V1 the same (v0.6.0, 26.08: src/megatron/"
     "bridge/perf_recipes/deepseek/common.py, the MXFP8 full-iteration helper the GB200 recipes call, "
     "moe_flex_dispatcher_backend = 'hybridep')"),
    # the pp 16 / ep 8 layout inside one DGX node: HybridEP from 26.02 (25.11's DEEPSEEK_V3_B200_BASE_CONFIG, v0.2.0,
    # names no backend: the all-to-all dispatcher)
    (r"megatron_bridge_26\.0[246]\S*\s.*deepseek-v3 b[23]00\b.*\bep8\b", BRIDGE_HYBRIDEP,
     "Megatron-Bridge scripts/performance/configs/deepseek/deepseek_workload_base_configs.py @ v0.3.0 (26.02), "
     "v0.3.1, v0.4.0 and v0.5.0 (26.06): DEEPSEEK_V3_PRETRAIN_CONFIG_B200_V1 / _B300_V1 pp 16, ep 8, "
     "moe_flex_dispatcher_backend='hybridep' (the _V2 variants, GBS 4096, are V1's), which training/"
     "flex_dispatcher_backend.py apply_flex_dispatcher_backend turns into moe_token_dispatcher_type 'flex'"),
    (r"megatron_bridge_26\.0[468]\S*\s.*qwen3-30b-a3b h100\b.*\bep16\b", BRIDGE_HYBRIDEP,
     "Megatron-Bridge PR #2477 (4a64507, 'Update Qwen3 30B H100 Base Configs with HybridEP', in v0.4.0 / 26.04 and "
     "v0.5.0 / 26.06): QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 ep 16, moe_a2a_overlap=False, "
     "moe_flex_dispatcher_backend='hybridep', and qwen3_30b_a3b_pretrain_config_h100 moe_token_dispatcher_type "
     "'flex' (v0.6.0, 26.08: src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py the same)"),
    # inside one NVLink domain the flex dispatcher forwards nothing; mapped still, since it permutes once after its
    # exchange where the all-to-all dispatcher also sorts the rows it receives (cost/moe_permute.local_sort)
    (r"megatron_bridge_(25\.11|26\.0[2468])\S*\s.*qwen3-(235b-a22b|30b-a3b) gb[23]00\b", BRIDGE_HYBRIDEP,
     "Megatron-Bridge scripts/performance/configs/qwen3/workload_base_configs.py @ v0.2.0 (25.11): QWEN3_235B_A22B_ "
     "and QWEN3_30B_A3B_GB200_ / _GB300_*_BASE_CONFIG, passed to the library recipe by qwen3_llm_pretrain.py; "
     "configs/qwen/qwen3_workload_base_configs.py @ v0.3.0 (26.02), v0.4.0, "
     "v0.5.0: QWEN3_235B_A22B_ and QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_ / _GB300_* moe_flex_dispatcher_backend="
     "'hybridep', which training/flex_dispatcher_backend.py apply_flex_dispatcher_backend turns into "
     "moe_token_dispatcher_type 'flex' (v0.3.1 on: qwen3_llm_pretrain.py sets 'flex' itself; v0.6.0, 26.08: "
     "src/megatron/bridge/perf_recipes/qwen/gb200/qwen3_moe.py moe_flex_dispatcher_backend = 'hybridep')"),
    (r"megatron_bridge_26\.0[246]\S*\s.*qwen3-30b-a3b b300\b", BRIDGE_HYBRIDEP,
     "the same files: QWEN3_30B_A3B_PRETRAIN_CONFIG_B300_* moe_flex_dispatcher_backend='hybridep' @ v0.3.0, "
     "v0.4.0 and v0.5.0"),
    (r"megatron_bridge_(26\.02\.\d+|26\.0[46])\S*\s.*qwen3-30b-a3b b200\b", BRIDGE_HYBRIDEP,
     "the same files: QWEN3_30B_A3B_PRETRAIN_CONFIG_B200_BF16_V1 micro_batch_size=4, "
     "moe_flex_dispatcher_backend='hybridep' @ v0.3.1, v0.4.0 and v0.5.0 (the 26.02.01 table's mbs 4; v0.3.0's, "
     "mbs 1, sets none)"),
    (r"megatron_bridge_26\.02(\.01)?\s.*qwen3-30b-a3b h100\b.*\bep8\b", "deepep",
     "the same file @ v0.3.0: QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 pp 2, vp 12, ep 8, "
     "moe_flex_dispatcher_backend='deepep' (the 26.02 and 26.02.01 tables' layout)"),
    # Nemotron 3 Super (hybrid Mamba-2 / latent MoE): HybridEP on every GPU, its ep 64 over 8 DGX B200 servers or
    # inside a GB200 NVL72 rack
    (r"megatron_bridge_26\.0[468]\S*\s.*nemotron-3-super\b", BRIDGE_HYBRIDEP,
     "Megatron-Bridge scripts/performance/configs/nemotronh/nemotron_3_workload_base_configs.py @ v0.4.0 to v0.5.1 "
     "(26.04 to 26.06.01): BASE_NEMOTRON_3_SUPER_CONFIG moe_flex_dispatcher_backend='hybridep' (every GPU's config "
     "derives from it), which utils/overrides.py set_workload_base_configs passes to training/"
     "flex_dispatcher_backend.py apply_flex_dispatcher_backend (moe_token_dispatcher_type 'flex'); v0.6.0 (26.08): "
     "src/megatron/bridge/perf_recipes/nemotronh/{b200,gb200}/nemotronh.py moe_flex_dispatcher_backend = "
     "'hybridep', moe_token_dispatcher_type = 'flex'"),
    # Nemotron 3 Nano: HybridEP on every GPU, its ep 8 inside one node (H100: 16 GPUs, two ep groups)
    (r"megatron_bridge_(26\.02\.01|26\.0[468])\S*\s.*nemotron-3-nano\b", BRIDGE_HYBRIDEP,
     "Megatron-Bridge scripts/performance/configs/nemotronh/nemotron_3_nano_workload_base_configs.py @ v0.3.1 "
     "(26.02.01) and nemotron_3_workload_base_configs.py @ v0.4.0 to v0.5.1: BASE_NEMOTRON_3_NANO_CONFIG "
     "moe_flex_dispatcher_backend='hybridep' (the H100, B200 and GB200 configs derive from it; set_workload_base_"
     "configs: apply_flex_dispatcher_backend); v0.6.0 perf_recipes/nemotronh/*/nemotronh.py the same"),
)


def dispatcher(record: dict[str, Any], model: ModelSpec, ep: int = 1) -> tuple[str, str]:
    """The release recipe's flex dispatcher backend (``FLEX_DISPATCH``): ("deepep" or "hybridep-32sm", why), else
    ("", ""). The flex dispatcher forwards a token once per other node it hits, and permutes once after its
    exchange."""
    if not model.is_moe:
        return "", ""
    key = recipe_key(record, record.get("precision") or "", f"ep{ep}")
    for pattern, backend, why in FLEX_DISPATCH:
        if re.search(pattern, key):
            return backend, f"MoE tokens forwarded through each node (flex dispatcher, {backend}: {why})"
    return "", ""


# Performance recipes that permute the MoE tokens without Transformer Engine's fused kernels (Megatron-Core
# moe_permute_fusion False, its default: Stack.moe_permute "gather_scatter", moe_utils' eager gathers): (regex on
# "group model gpu", source).
UNFUSED_PERMUTE: tuple[tuple[str, str], ...] = (
    (r"^nemo_25(02|04)_\S+ mixtral[- ]8x7b ",
     "NVIDIA/NeMo nemo/collections/llm/gpt/model/mixtral.py MixtralConfig and recipes/mixtral_8x7b.py @ v2.2.0 / "
     "v2.3.0 (the 25.02 / 25.04 containers) set no moe_permute_fusion; the 25.04 scripts set it True for "
     "DeepSeek-V3 and Llama 4 only (scripts/performance/llm/pretrain_deepseek_v3.py, pretrain_llama4_e16.py)"),
)


def permute_unfused(record: dict[str, Any], model: ModelSpec) -> str:
    """The source of the release recipe that leaves the MoE permutation unfused (``UNFUSED_PERMUTE``), or ""."""
    key = recipe_key(record)
    return first_source(UNFUSED_PERMUTE, key) if model.is_moe else ""
