"""The Megatron-Bridge release recipes a published table does not state (recipes.py): the expert-GEMM launch, EP
all-to-all overlap (DeepSeek-V3's per layout), TP overlap, FP8 attention, the Grace Blackwell activation offload and
CUDA graphs, each as the release's performance scripts set it."""

from __future__ import annotations

import pytest

from meshplan_validation.case import map_run
from published_helpers import QWEN3_30B, QWEN3_235B, record


@pytest.mark.parametrize(("group", "gpu", "precision", "expected"), [
    ("megatron_bridge_26.04", "GB200", "mxfp8", "per_expert"),  # TE GroupedLinear after the per-layer sync
    ("megatron_bridge_26.06", "GB200", "mxfp8", "grouped"),  # full-iteration CUDA graphs, fused grouped MLP
    ("megatron_bridge_26.08", "GB200", "mxfp8", "grouped"),
    ("megatron_bridge_26.06", "H100", "fp8", "per_expert"),  # the MXFP8 CuTeDSL path is Blackwell-only
])
def test_expert_gemm_launch_follows_the_release(group, gpu, precision, expected):
    case = map_run(record(group=group, precision=precision, model=QWEN3_30B,
                          hardware={"gpu": gpu, "num_gpus": 8, "gpus_per_node": 4 if gpu == "GB200" else 8},
                          parallel={"tp": 1, "pp": 1, "vp": None, "ep": 8, "micro_batch_size": 4,
                                    "global_batch_size": 512}))
    assert case.stack.expert_gemm == expected
    assert any("expert GEMMs" in a for a in case.assumptions)


@pytest.mark.parametrize(("group", "gpu", "overlap", "precision"), [
    ("megatron_bridge_26.04", "H100", True, "fp8"),  # QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_*: moe_a2a_overlap=True
    ("megatron_bridge_25.11", "H100", True, "fp8"),
    ("megatron_bridge_25.09", "H100", False, "fp8"),  # before the Megatron-Bridge recipe files that say so
    ("megatron_bridge_26.04", "GB200", False, "mxfp8"),  # the Blackwell recipes leave it off
    # from 26.06 the GB200 MXFP8 recipes run the full-iteration CUDA graph path, which overlaps the all-to-all
    # (Megatron-Bridge PR #4249, #4606)
    ("megatron_bridge_26.06", "GB200", True, "mxfp8"),
    ("megatron_bridge_26.08", "GB200", True, "mxfp8"),
    ("megatron_bridge_26.06", "GB200", False, "bf16"),
    # QWEN3_235B_A22B_PRETRAIN_CONFIG_B300_*_V1 @ 21b02e0 (v0.3.0, 26.02): moe_a2a_overlap=True; v0.3.1: False
    ("megatron_bridge_26.02_blackwell_ultra", "B300", True, "mxfp8"),
    ("megatron_bridge_26.02.01_blackwell_ultra", "B300", False, "mxfp8"),
    ("megatron_bridge_26.02_blackwell_ultra", "GB300", False, "mxfp8"),
    # QWEN3_235B_A22B_B200_*_BASE_CONFIG @ v0.2.0 sets it with vp 4; the 25.11 table states vp 2 (not mapped);
    # v0.3.0 to v0.5.0 set it False
    ("megatron_bridge_25.11", "B200", False, "mxfp8"),
    ("megatron_bridge_26.02", "B200", False, "mxfp8"),
])
def test_ep_overlap_follows_the_release_recipe(group, gpu, overlap, precision):
    case = map_run(record(group=group, model=QWEN3_235B, precision=precision,
                          hardware={"gpu": gpu, "num_gpus": 256, "gpus_per_node": 8},
                          parallel={"tp": 2, "pp": 8, "vp": 4, "ep": 32, "micro_batch_size": 1,
                                    "global_batch_size": 2048}))
    assert case.stack.overlap_ep is overlap



@pytest.mark.parametrize(("group", "gpu", "ep", "dispatcher", "backend"), [
    ("megatron_bridge_26.04.01", "B200", 32, "flex", "deepep"),  # DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2, ep 32
    # ... @ 5acef93, in the tags v0.4.2 (26.04.01), v0.5.0 / v0.5.1 (26.06) and v0.6.0 (26.08) only: v0.4.0 / v0.4.1
    # (26.04) alias it to _FP8_CS_V2, and a tag not read keeps the all-to-all dispatcher
    ("megatron_bridge_26.06.01", "B200", 32, "flex", "deepep"),
    ("megatron_bridge_26.08", "B200", 32, "flex", "deepep"),
    ("megatron_bridge_26.04", "B200", 32, "alltoall", "deepep"),
    ("megatron_bridge_25.11", "B200", 32, "alltoall", "deepep"),
    ("megatron_bridge_26.10", "B200", 32, "alltoall", "deepep"),
    ("megatron_bridge_25.09", "H100", 32, "flex", "deepep"),  # the 25.x H100 recipe: DeepEP
    # (hybridep-32sm: HybridEP at the 32 SMs the performance harness sets, recipes_dispatch.BRIDGE_HYBRIDEP)
    # the pp 16 / ep 8 layout inside one node: DEEPSEEK_V3_PRETRAIN_CONFIG_B200_V1 / _B300_V1 name hybridep from
    # v0.3.0 (26.02) on; 25.11's DEEPSEEK_V3_B200_BASE_CONFIG (v0.2.0) names none, the all-to-all dispatcher
    ("megatron_bridge_26.02", "B200", 8, "flex", "hybridep-32sm"),
    ("megatron_bridge_26.02.01", "B200", 8, "flex", "hybridep-32sm"),
    ("megatron_bridge_26.04", "B200", 8, "flex", "hybridep-32sm"),
    ("megatron_bridge_26.02_blackwell_ultra", "B300", 8, "flex", "hybridep-32sm"),
    # the NVL72 layouts: DEEPSEEK_V3_GB200_ / _GB300_BASE_CONFIG (v0.2.0) and _PRETRAIN_CONFIG_GB200_V1 / _GB300_V1
    # (v0.3.0 to v0.5.0) hybridep; 25.09 drops tokens on GB200, which needs the all-to-all dispatcher
    ("megatron_bridge_25.11", "GB200", 32, "flex", "hybridep-32sm"),
    ("megatron_bridge_26.04", "GB200", 32, "flex", "hybridep-32sm"),
    ("megatron_bridge_25.11_blackwell_ultra", "GB300", 32, "flex", "hybridep-32sm"),
    ("megatron_bridge_25.09", "GB200", 32, "alltoall", "deepep"),
    ("megatron_bridge_25.11", "B200", 8, "alltoall", "deepep"),  # "deepep": the field's default, unused
])
def test_deepseek_v3_dispatches_through_the_backend_its_recipe_names(group, gpu, ep, dispatcher, backend):
    model = {"name": "DeepSeek-V3", "arch": "moe", "num_layers": 61, "hidden_size": 7168, "num_heads": 128,
             "num_kv_heads": None, "ffn_hidden_size": 18432, "moe_ffn_hidden_size": 2048, "num_experts": 256,
             "moe_topk": 8, "shared_expert_ffn": 2048, "attention": "MLA (q_lora_rank 1536, kv_lora_rank 512)",
             "vocab_size": None, "seq_length": 4096}
    case = map_run(record(group=group, model=model, precision="mxfp8" if gpu == "B200" else "fp8",
                          hardware={"gpu": gpu, "num_gpus": 256, "gpus_per_node": 8},
                          parallel={"tp": 1, "pp": 8, "vp": 2, "ep": ep, "micro_batch_size": 1,
                                    "global_batch_size": 4096}))
    assert case.stack.moe_dispatcher == dispatcher
    assert case.stack.flex_backend == backend  # priced at the backend's own table (dispatch.py)



@pytest.mark.parametrize(("group", "ep", "backend", "overlap"), [
    # PR #2477: QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 ep 16, hybridep, moe_a2a_overlap=False
    ("megatron_bridge_26.04", 16, "hybridep-32sm", False),
    ("megatron_bridge_26.04.01", 16, "hybridep-32sm", False),
    ("megatron_bridge_26.06", 16, "hybridep-32sm", False),  # v0.5.0: the same base config
    # v0.3.0's H100 config: pp 2, vp 12, ep 8, deepep (one node) and moe_a2a_overlap=True, the tables' layout
    ("megatron_bridge_26.02.01", 8, "deepep", True),
    ("megatron_bridge_26.02", 8, "deepep", True),
    # v0.2.0 names no backend: the all-to-all dispatcher; its moe_a2a_overlap=True goes with vp 12 and mbs 1, where
    # the 25.11 table states vp 24 and mbs 2 (not the config as written: not mapped)
    ("megatron_bridge_25.11", 8, "", False),
])
def test_qwen3_30b_on_h100_dispatches_through_the_recipes_flex_backend(group, ep, backend, overlap):
    pp, vp = (1, None) if ep == 16 else (2, 12)  # the records' layouts
    case = map_run(record(group=group, model=QWEN3_30B, precision="fp8",
                          hardware={"gpu": "H100", "num_gpus": 16, "gpus_per_node": 8},
                          parallel={"tp": 1, "pp": pp, "vp": vp, "ep": ep, "micro_batch_size": 1,
                                    "global_batch_size": 1024}))
    assert case.stack.moe_dispatcher == ("flex" if backend else "alltoall")
    assert any("hybridep" in note for note in case.assumptions) is (backend == "hybridep-32sm")
    # priced at HybridEP's own H100 table (0.539 of the NIC over 2 nodes), not DeepEP's (0.43)
    assert case.stack.flex_backend == (backend or "deepep")
    assert case.stack.overlap_ep is overlap


@pytest.mark.parametrize(("group", "gpu", "model"), [
    # the recipe tables name only the releases whose files were read (v0.2.0 = 25.11 to v0.6.0 = 26.08): a later or
    # unreleased tag keeps the all-to-all dispatcher until its files are read
    ("megatron_bridge_25.12", "GB200", QWEN3_30B),
    ("megatron_bridge_26.10", "GB200", QWEN3_235B),
    ("megatron_bridge_26.10", "H100", QWEN3_30B),
])
def test_flex_backends_are_mapped_only_for_the_releases_read(group, gpu, model):
    case = map_run(record(group=group, model=model, precision="mxfp8" if gpu != "H100" else "fp8",
                          hardware={"gpu": gpu, "num_gpus": 16, "gpus_per_node": 8 if "GB" not in gpu else 4},
                          parallel={"tp": 1, "pp": 1, "vp": None, "ep": 16, "micro_batch_size": 1,
                                    "global_batch_size": 1024}))
    assert case.stack.moe_dispatcher == "alltoall"


@pytest.mark.parametrize(("group", "gpu", "model", "dispatcher"), [
    # qwen3_workload_base_configs.py @ v0.3.0 on: the GB200 / GB300 Qwen3 configs and B300's Qwen3-30B set hybridep
    ("megatron_bridge_26.02", "GB200", QWEN3_30B, "flex"),
    ("megatron_bridge_26.04", "GB300", QWEN3_30B, "flex"),
    ("megatron_bridge_26.06", "GB200", QWEN3_235B, "flex"),
    ("megatron_bridge_26.02", "B300", QWEN3_235B, "alltoall"),  # B300's Qwen3-235B: none until v0.5.0
    ("megatron_bridge_26.02", "B300", QWEN3_30B, "flex"),
    # v0.2.0 configs/qwen3/workload_base_configs.py: QWEN3_*_GB200_ / _GB300_*_BASE_CONFIG hybridep, B200's none
    ("megatron_bridge_25.11", "GB200", QWEN3_30B, "flex"),
    ("megatron_bridge_25.11", "GB300", QWEN3_235B, "flex"),
    ("megatron_bridge_25.11", "B200", QWEN3_30B, "alltoall"),
    ("megatron_bridge_25.09", "GB200", QWEN3_30B, "alltoall"),  # token drop (run_script.py @ 684a686): alltoall
    ("megatron_bridge_26.02", "B200", QWEN3_30B, "alltoall"),  # v0.3.0's B200 config: none
    ("megatron_bridge_26.02.01", "B200", QWEN3_30B, "flex"),  # v0.3.1: mbs 4 and hybridep
])
def test_qwen3_on_blackwell_runs_the_flex_dispatcher_where_its_recipe_names_a_backend(group, gpu, model, dispatcher):
    case = map_run(record(group=group, model=model, precision="mxfp8",
                          hardware={"gpu": gpu, "num_gpus": 8, "gpus_per_node": 8 if "GB" not in gpu else 4},
                          parallel={"tp": 1, "pp": 1, "vp": None, "ep": 8, "micro_batch_size": 1,
                                    "global_batch_size": 512}))
    assert case.stack.moe_dispatcher == dispatcher
    assert dispatcher == "alltoall" or case.stack.flex_backend == "hybridep-32sm"


@pytest.mark.parametrize(("group", "gpu", "overlap"), [
    ("megatron_bridge_25.09", "H100", True),  # qwen3_235b_a22b_llm_pretrain.py: tp_comm_overlap=True
    ("megatron_bridge_25.11", "H100", False),  # qwen3_llm_pretrain.py ..._config_h100: tp_comm_overlap=False
    ("megatron_bridge_26.06", "H100", False),  # perf_recipes/qwen/h100/qwen3_moe.py: tp_comm_overlap=False
    ("megatron_bridge_26.04", "B200", True),  # the Blackwell functions set True
])
def test_tp_overlap_follows_the_release_recipe(group, gpu, overlap):
    case = map_run(record(group=group, model=QWEN3_235B, precision="fp8",
                          hardware={"gpu": gpu, "num_gpus": 256, "gpus_per_node": 8},
                          parallel={"tp": 2, "pp": 8, "vp": 4, "ep": 32, "micro_batch_size": 1,
                                    "global_batch_size": 2048}))
    assert case.stack.overlap_tp is overlap
    assert any("tp_comm_overlap=False" in note for note in case.assumptions) is (not overlap)


@pytest.mark.parametrize(("group", "precision", "kernel"), [
    ("megatron_bridge_26.06", "mxfp8", "fp8"),  # PR #4249 / #4606: the GB200 MXFP8 path runs FP8 attention
    ("megatron_bridge_26.08", "mxfp8", "fp8"),
    ("megatron_bridge_26.04", "mxfp8", "fused"),  # before the 26.06 recipes
    ("megatron_bridge_26.06", "bf16", "fused"),
])
def test_fp8_attention_follows_the_release_recipe(group, precision, kernel):
    case = map_run(record(group=group, model=QWEN3_235B, precision=precision,
                          hardware={"gpu": "GB200", "num_gpus": 256, "gpus_per_node": 4},
                          parallel={"tp": 1, "pp": 8, "vp": 3, "ep": 32, "micro_batch_size": 1,
                                    "global_batch_size": 8192}))
    assert case.stack.attention_kernel == kernel
    assert any("FP8 attention" in note for note in case.assumptions) is (kernel == "fp8")


@pytest.mark.parametrize(("group", "gpu", "precision", "pp", "vp", "ep", "overlap"), [
    # DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2: deepep, pp 8, vp 2, ep 32, moe_a2a_overlap=True
    ("megatron_bridge_26.04.01", "B200", "mxfp8", 8, 2, 32, True),
    ("megatron_bridge_26.04", "B200", "mxfp8", 16, None, 8, False),  # _B200_V1 / _V2: hybridep, overlap off
    # _GB200_FP8_MX_V1 / _V2, the 26.06 MXFP8 recipe (full-iteration CUDA graphs): moe_a2a_overlap=True
    ("megatron_bridge_26.06", "GB200", "mxfp8", 4, 4, 64, True),
    ("megatron_bridge_26.04", "GB200", "mxfp8", 4, 4, 64, False),
    ("megatron_bridge_25.11", "GB200", "mxfp8", 8, 4, 32, False),  # a GB200 ep 32 layout is not the B200 one
])
def test_deepseek_ep_overlap_follows_the_recipe_of_the_layout(group, gpu, precision, pp, vp, ep, overlap):
    sizes = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size")
    case = map_run(record(group=group, precision=precision,
                          model={k: None for k in sizes} | {"name": "DeepSeek-V3", "arch": "moe"},
                          hardware={"gpu": gpu, "num_gpus": 256, "gpus_per_node": 4 if gpu == "GB200" else 8},
                          parallel={"tp": 1, "pp": pp, "vp": vp, "ep": ep, "micro_batch_size": 1,
                                    "global_batch_size": 4096}))
    assert case.stack.overlap_ep is overlap


@pytest.mark.parametrize(("gpu", "layers"), [("GB200", 40), ("GB300", 20)])  # llama3_workload_base_configs.py
def test_grace_blackwell_megatron_fsdp_recipes_offload_activations(gpu, layers):
    case = map_run(record(hardware={"gpu": gpu, "num_gpus": 64, "gpus_per_node": 4},
                          parallel={"tp": 1, "pp": 1, "vp": None, "micro_batch_size": 2, "global_batch_size": 256,
                                    "zero_or_fsdp": "Megatron FSDP (64)"}))
    assert case.plan.offload_activations and case.plan.offload_layers == layers and case.plan.zero == 3
    h100 = map_run(record(parallel={"zero_or_fsdp": "Megatron FSDP (64)", "tp": 1, "pp": 1, "vp": None}))
    assert not h100.plan.offload_activations  # the H100 recipes do not offload


GPT_OSS_120B = {"name": "GPT-OSS-120B", "arch": "moe", "num_layers": 36, "hidden_size": 2880, "num_heads": 64,
                "num_kv_heads": 8, "ffn_hidden_size": 2880, "moe_ffn_hidden_size": 2880, "num_experts": 128,
                "moe_topk": 4, "vocab_size": 201088, "seq_length": 4096}


@pytest.mark.parametrize(("group", "gpu", "graphed"), [
    # GPT_OSS_120B_*_{GB200,B200,H100}_BF16 set no cuda_graph_impl: the library recipe's "none" holds
    ("megatron_bridge_26.04", "GB200", False),
    ("megatron_bridge_25.11", "B200", False),
    ("megatron_bridge_26.02.01", "H100", False),
    # GPT_OSS_120B_*_GB300_BF16: transformer_engine graphs of attn, moe_router, moe_preprocess
    ("megatron_bridge_26.02_blackwell_ultra", "GB300", True),
])
def test_gpt_oss_recipes_capture_cuda_graphs_as_their_workload_config_says(group, gpu, graphed):
    h100 = gpu == "H100"  # tp 1 / pp 4 / ep 8 / mbs 1 there; ep 64 / mbs 4 on Blackwell
    case = map_run(record(group=group, precision="bf16", model=GPT_OSS_120B,
                          hardware={"gpu": gpu, "num_gpus": 64, "gpus_per_node": 4 if gpu.startswith("GB") else 8},
                          parallel={"tp": 1, "pp": 4 if h100 else 1, "vp": None, "ep": 8 if h100 else 64,
                                    "micro_batch_size": 1 if h100 else 4, "global_batch_size": 512}))
    assert case.stack.cuda_graphs is graphed
    assert any(("no CUDA graphs" if not graphed else "CUDA graphs of attn") in a for a in case.assumptions)


@pytest.mark.parametrize(("group", "gpu", "precision", "graphed"), [
    ("megatron_bridge_26.04", "H100", "fp8", False),  # QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1: unset
    ("megatron_bridge_25.09", "H100", "fp8", False),  # qwen3_30b_a3b_llm_pretrain.yaml h100: cuda_graphs: false
    ("megatron_bridge_26.04", "GB200", "mxfp8", True),  # _GB200_FP8_MX_V1: moe_router, moe_preprocess
    ("megatron_bridge_26.06", "GB200", "mxfp8", True),  # full_iteration
])
def test_qwen3_30b_recipes_capture_cuda_graphs_as_their_workload_config_says(group, gpu, precision, graphed):
    case = map_run(record(group=group, precision=precision, model=QWEN3_30B,
                          hardware={"gpu": gpu, "num_gpus": 16, "gpus_per_node": 4 if gpu == "GB200" else 8},
                          parallel={"tp": 1, "pp": 1, "vp": None, "ep": 8, "micro_batch_size": 1,
                                    "global_batch_size": 512}))
    assert case.stack.cuda_graphs is graphed


@pytest.mark.parametrize(("group", "model", "gpu", "dropped"), [
    ("megatron_bridge_25.09", QWEN3_30B, "H100", True),  # run_script.py @ v0.1.0rc3: Qwen3 on every GPU
    ("megatron_bridge_25.09", QWEN3_235B, "B200", True),
    ("megatron_bridge_25.09", QWEN3_235B, "GB200", True),
    ("megatron_bridge_25.11", QWEN3_235B, "B200", False),  # v0.2.0 helpers.py: --use_tokendrop opt-in
    ("megatron_bridge_26.04", QWEN3_30B, "H100", False),
])
def test_the_25_09_recipes_drop_tokens_at_capacity_1_padded(group, model, gpu, dropped):
    """Megatron-Bridge's 25.09 scripts call apply_moe_token_drop(recipe.model) for Qwen3 (and DeepSeek-V3 on
    B200 / GB200), whose defaults are capacity factor 1.0 padded to capacity (moe_token_drop.py @ v0.1.0rc3); later
    releases run dropless."""
    case = map_run(record(group=group, model=model, precision="fp8",
                          hardware={"gpu": gpu, "num_gpus": 64, "gpus_per_node": 8 if gpu != "GB200" else 4},
                          parallel={"tp": 1, "pp": 4, "vp": None, "ep": 8, "micro_batch_size": 1,
                                    "global_batch_size": 1024}))
    factor, padded = case.plan.moe_expert_capacity_factor, case.plan.moe_pad_expert_input_to_capacity
    assert (factor, padded) == ((1.0, True) if dropped else (None, False))
    assert any("token-drop MoE" in note for note in case.assumptions) is dropped


@pytest.mark.parametrize(("gpu", "dropped"), [("B200", True), ("GB200", True), ("H100", False)])
def test_deepseek_v3_drops_tokens_where_use_tokendrop_defaults_on(gpu, dropped):
    """run_script.py @ v0.1.0rc3: use_tokendrop = gpu in (b200, gb200); H100 runs DeepEP, dropless."""
    model = {"name": "DeepSeek-V3", "arch": "moe", "num_layers": 61, "hidden_size": 7168, "num_heads": 128,
             "num_kv_heads": None, "ffn_hidden_size": 18432, "moe_ffn_hidden_size": 2048, "num_experts": 256,
             "moe_topk": 8, "shared_expert_ffn": 2048, "attention": "MLA (q_lora_rank 1536, kv_lora_rank 512)",
             "vocab_size": None, "seq_length": 4096}
    case = map_run(record(group="megatron_bridge_25.09", model=model, precision="fp8",
                          hardware={"gpu": gpu, "num_gpus": 256, "gpus_per_node": 4 if gpu == "GB200" else 8},
                          parallel={"tp": 1, "pp": 4, "vp": 4, "ep": 64, "micro_batch_size": 1,
                                    "global_batch_size": 2048}))  # the 25.09 GB200 record's layout
    assert (case.plan.moe_expert_capacity_factor is not None) is dropped
