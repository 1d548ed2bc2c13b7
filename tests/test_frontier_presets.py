"""Presets of the frontier models planned in 2026 (issue 51 item 4): Grok-1, Kimi K2, Llama 4 Scout / Maverick,
GLM-4.5 / -Air, Nemotron-H 8B / 56B. Each count is checked three ways: the closed form (arithmetic in the comments),
the published total and active counts at the precision they were printed with (or the documented reason they
differ), and PyTorch's count of transformers' own model built on the meta device from the same config.json keys
(skipped without torch + transformers; Grok-1 has no transformers architecture).

Qwen3-Next-80B-A3B: 3 of its 4 layers are Gated DeltaNet linear attention ("G" blocks) and its attention layers
gate their output (q_proj 2·A·d wide, attn_output_gate); Qwen3.5-35B-A3B has the same layers at 40 layers, 256
experts and a vocabulary of 248,320 (its config.json also reads exactly through the generic reader,
tests/test_hf_registry.py).
"""

from __future__ import annotations

import pytest

from meshplan.specs.model_load import load_model

FRONTIER = ["grok-1", "kimi-k2", "llama4-scout", "llama4-maverick", "glm-4.5", "glm-4.5-air", "nemotron-h-8b",
            "nemotron-h-56b", "qwen3-next-80b-a3b", "qwen3.5-35b-a3b"]
NEMOTRON_H_56B = ("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
                  "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-")

# the config.json keys of each model (the presets' sources), as transformers reads them
HF_CONFIGS = {
    "kimi-k2": {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
                "num_key_value_heads": 64, "n_shared_experts": 1, "n_routed_experts": 384, "kv_lora_rank": 512,
                "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
                "num_experts_per_tok": 8, "first_k_dense_replace": 1, "vocab_size": 163840, "n_group": 1,
                "topk_group": 1, "tie_word_embeddings": False},
    "llama4-scout": {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                     "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                     "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "num_local_experts": 16,
                     "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "use_qk_norm": True,
                     "attention_chunk_size": 8192, "tie_word_embeddings": False},
    "llama4-maverick": {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                        "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "num_local_experts": 128,
                        "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "use_qk_norm": False,
                        "attention_chunk_size": 8192, "tie_word_embeddings": False},
    "glm-4.5": {"model_type": "glm4_moe", "hidden_size": 5120, "intermediate_size": 12288,
                "moe_intermediate_size": 1536, "num_hidden_layers": 92, "num_attention_heads": 96,
                "num_key_value_heads": 8, "head_dim": 128, "n_routed_experts": 160, "n_shared_experts": 1,
                "num_experts_per_tok": 8, "first_k_dense_replace": 3, "vocab_size": 151552, "attention_bias": True,
                "use_qk_norm": True, "partial_rotary_factor": 0.5, "tie_word_embeddings": False, "n_group": 1,
                "topk_group": 1},
    "glm-4.5-air": {"model_type": "glm4_moe", "hidden_size": 4096, "intermediate_size": 10944,
                    "moe_intermediate_size": 1408, "num_hidden_layers": 46, "num_attention_heads": 96,
                    "num_key_value_heads": 8, "head_dim": 128, "n_routed_experts": 128, "n_shared_experts": 1,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 1, "vocab_size": 151552,
                    "attention_bias": True, "use_qk_norm": False, "partial_rotary_factor": 0.5,
                    "tie_word_embeddings": False, "n_group": 1, "topk_group": 1},
    "nemotron-h-8b": {"model_type": "nemotron_h", "hidden_size": 4096, "num_hidden_layers": 52,
                      "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
                      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                      "intermediate_size": 21504, "mamba_num_heads": 128, "mamba_head_dim": 64,
                      "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
                      "vocab_size": 131072, "tie_word_embeddings": False, "use_bias": False, "use_conv_bias": True,
                      "mlp_hidden_act": "relu2"},
    "nemotron-h-56b": {"model_type": "nemotron_h", "hidden_size": 8192, "num_hidden_layers": 118,
                       "hybrid_override_pattern": NEMOTRON_H_56B, "num_attention_heads": 64,
                       "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 32768,
                       "mamba_num_heads": 256, "mamba_head_dim": 64, "ssm_state_size": 256, "n_groups": 8,
                       "conv_kernel": 4, "chunk_size": 128, "vocab_size": 131072, "tie_word_embeddings": False,
                       "use_bias": False, "use_conv_bias": True, "mlp_hidden_act": "relu2"},
    "qwen3-next-80b-a3b": {"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48,
                           "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                           "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_num_value_heads": 32,
                           "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 512,
                           "num_experts_per_tok": 10, "moe_intermediate_size": 512,
                           "shared_expert_intermediate_size": 512, "vocab_size": 151936,
                           "tie_word_embeddings": False},
    # THUDM/slime scripts/models/qwen3.5-35B-A3B.sh's Megatron arguments as config.json keys
    "qwen3.5-35b-a3b": {"model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40,
                        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                        "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_num_value_heads": 32,
                        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 256,
                        "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                        "shared_expert_intermediate_size": 512, "vocab_size": 248320, "tie_word_embeddings": False},
}

# (total, active per token) as ModelSpec.params() counts them; the meta-device build equals the total
COUNTS = {
    "grok-1": (315_684_034_560, 83_755_800_576),
    "kimi-k2": (1_026_408_232_448, 32_861_500_928),
    "llama4-scout": (107_769_861_120, 17_172_894_720),
    "llama4-maverick": (400_711_848_960, 17_184_691_200),
    "glm-4.5": (352_797_829_024, 33_632_266_144),
    "glm-4.5-air": (106_852_251_264, 13_424_129_664),
    "nemotron-h-8b": (8_100_852_736, 8_100_852_736),
    "nemotron-h-56b": (56_324_350_464, 56_324_350_464),
    "qwen3-next-80b-a3b": (79_674_391_296, 3_874_929_408),
    "qwen3.5-35b-a3b": (34_660_610_688, 3_454_988_928),
}


@pytest.mark.parametrize("name", FRONTIER)
def test_counts(name: str) -> None:
    spec = load_model(name)
    assert (spec.params(), spec.params(active=True)) == COUNTS[name]


def test_grok_1_closed_form() -> None:
    """Attention 6144·6144 (q) + 2·6144·1024 (k, v) + 6144·6144 (o) = 88,080,384; router 6144·8 = 49,152; 8 experts
    of 3·6144·32768 = 603,979,776; 2 RMSNorms 12,288 → 4,919,967,744 + 12,288 per layer; × 64 = 314,878,722,048;
    tied embedding 131072·6144 = 805,306,368; final norm 6,144. xAI's '314B' and '86B active' do not follow."""
    spec = load_model("grok-1")
    layer = 88_080_384 + 49_152 + 8 * 603_979_776 + 12_288
    assert spec.layer_params(0) == layer == 4_919_980_032
    assert spec.params() == 64 * layer + 805_306_368 + 6_144 == 315_684_034_560
    active = 64 * (88_080_384 + 49_152 + 2 * 603_979_776 + 12_288) + 805_306_368 + 6_144
    assert spec.params(active=True) == active
    assert f"{spec.params() / 1e9:.1f}" == "315.7" and f"{active / 1e9:.1f}" == "83.8"  # the preset's comment


def test_llama4_maverick_interleaves_dense_and_moe() -> None:
    """interleave_moe_layer_step 2: moe_layers = range(1, 48, 2), 24 dense layers of intermediate_size_mlp 16384
    and 24 MoE layers; Scout's 48 layers are all MoE. MoE layer: router 5120·128, 128 experts and a shared one of
    3·5120·8192 = 125,829,120 each; dense MLP 3·5120·16384 = 251,658,240."""
    maverick, scout = load_model("llama4-maverick"), load_model("llama4-scout")
    assert [maverick.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert (maverick.num_dense_layers, maverick.num_moe_layers, scout.num_moe_layers) == (24, 24, 48)
    assert maverick.moe_params() == 5120 * 128 + 129 * 125_829_120
    assert maverick.mlp_params(maverick.ffn_hidden_size) == 251_658_240


def test_nemotron_h_blocks() -> None:
    assert load_model("nemotron-h-8b").block_counts == {"mamba": 24, "attention": 4, "mlp": 24}
    assert load_model("nemotron-h-56b").block_counts == {"mamba": 54, "attention": 10, "mlp": 54}
    assert load_model("qwen3-next-80b-a3b").block_counts == {"deltanet": 36, "attention": 12, "moe": 48}
    assert load_model("qwen3.5-35b-a3b").block_counts == {"deltanet": 30, "attention": 10, "moe": 40}


def _printed(count: float, printed: str, unit: float, truncated: bool = False) -> bool:
    """``count`` printed at ``printed``'s precision in ``unit`` (rounded, or cut as some model cards do)."""
    decimals = len(printed.partition(".")[2])
    value = count / unit
    if truncated:
        value = int(value * 10**decimals) / 10**decimals
    return f"{value:.{decimals}f}" == printed


def test_published_counts() -> None:
    """Model cards' totals and active counts (active without the input embedding, as DeepSeek-V3's README)."""
    b = 1e9
    kimi = load_model("kimi-k2")
    assert _printed(kimi.params(), "1", 1e12) and _printed(kimi.params(active=True) - 163840 * 7168, "32", b)
    assert _printed(load_model("nemotron-h-8b").params(), "8", b)  # dense: every parameter active
    assert _printed(load_model("nemotron-h-56b").params(), "56", b)
    nxt = load_model("qwen3-next-80b-a3b")  # '80B total, 3B activated' (3.56B without the input embedding)
    assert _printed(nxt.params(), "80", b) and _printed(nxt.params(active=True) - 151936 * 2048, "3", b, truncated=True)
    q35 = load_model("qwen3.5-35b-a3b")  # '35B-A3B': 34.66B, 3.45B active (2.95B without the input embedding)
    assert _printed(q35.params(), "35", b) and _printed(q35.params(active=True), "3", b, truncated=True)
    air = load_model("glm-4.5-air")  # '106B total, 12B active', cut to whole billions (106.85B, 12.80B)
    assert _printed(air.params(), "106", b, truncated=True)
    assert _printed(air.params(active=True) - 151552 * 4096, "12", b, truncated=True)
    for name in ("llama4-scout", "llama4-maverick"):  # '17B active' with the embedding
        assert _printed(load_model(name).params(active=True), "17", b)
    # Maverick '400B' (two significant digits); Scout's '109B' adds the vision encoder (about 0.9B) to 107.8B
    assert round(load_model("llama4-maverick").params(), -10) == 400e9
    assert 107.5e9 < load_model("llama4-scout").params() < 109e9
    # GLM-4.5's '355B' lies between the model without and with its MTP layer; '32B active' without the embedding
    glm = load_model("glm-4.5")
    assert glm.params() < 355e9 < glm.params() + glm.mtp_params() == 356_785_898_816
    assert _printed(glm.params(active=True) - 151552 * 5120, "32", b, truncated=True)


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_meta_device_build_counts_the_same(name: str) -> None:
    """transformers' model built on the meta device (no weights) from the config: its parameters, plus the
    router's score-correction bias, a buffer in transformers and a tensor in the checkpoints (as the deepseek-v3
    preset counts it), equal ModelSpec.params()."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = dict(HF_CONFIGS[name])
    cfg = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    count = sum(p.numel() for p in model.parameters())
    count += sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert count == load_model(name).params()
