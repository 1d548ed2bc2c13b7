"""The Hugging Face config.json import (specs/hf/config.py, families.py, reader.py): each family read as its
``modeling_*.py`` builds it, errors that name the key, and PyTorch's count of the same model built on the meta
device (``test_torch_*``, skipped without torch + transformers) equal to ``ModelSpec.params()``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.errors import SpecError
from meshplan.specs.hf.config import from_hf_config, translate
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import CONFIG_SEQ_LENGTH, load_model

HF = Path(__file__).parent / "data" / "hf"


def fixture(name: str) -> ModelSpec:
    return load_model(str(HF / name / "config.json"))


def hf_dict(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())


# ---- config.json translation -------------------------------------------------------------------------------
@pytest.mark.parametrize("hf, preset", [("llama-3-8b", "llama3-8b"), ("mixtral-8x7b", "mixtral-8x7b"),
                                        ("qwen3-30b-a3b", "qwen3-30b-a3b"), ("gpt2", "gpt2"),
                                        ("gpt-neox-20b", "gpt-neox-20b"), ("mistral-7b", "mistral-7b"),
                                        ("deepseek-v3", "deepseek-v3")])
def test_config_json_and_preset_are_the_same_model(hf: str, preset: str) -> None:
    """Equal in every field but the name and the lengths: a config.json gives the longest context it allows, which
    the preset states as max_position_embeddings (the context serve fills) or as its seq_length; the config.json
    model trains at model_load.CONFIG_SEQ_LENGTH = 4,096 (or that context if shorter: GPT-2's 1,024)."""
    spec, model = fixture(hf), load_model(preset)
    # DeepSeek-V3 163,840, Mistral 32,768, Qwen3 40,960, Llama 3 8,192, GPT-2 1,024
    assert spec.max_position_embeddings == max(model.seq_length, model.max_position_embeddings)
    assert spec.seq_length == min(CONFIG_SEQ_LENGTH, spec.max_position_embeddings) == min(4096, spec.seq_length)
    assert spec == replace(model, name=spec.name, seq_length=spec.seq_length,
                           max_position_embeddings=spec.max_position_embeddings)


def test_seq_length_is_a_training_length_not_the_context() -> None:
    """Issue 48 item 9: a config.json's max_position_embeddings (131,072 for Qwen2-7B) is the context served; the
    model trains at 4,096 unless --seq says otherwise."""
    qwen2 = fixture("qwen2-7b")
    assert (qwen2.seq_length, qwen2.max_position_embeddings) == (4096, 131_072)
    assert (fixture("llama-3-8b").seq_length, fixture("llama-3-8b").max_position_embeddings) == (4096, 8192)
    assert fixture("deepseek-v3").with_seq_length(163_840).seq_length == 163_840
    gpt2 = fixture("gpt2")  # learned positions: n_positions rows are parameters; the context is shorter than 4,096
    assert (gpt2.seq_length, gpt2.max_position_embeddings) == (1024, 1024)


def test_nemotron_h_config_json_is_the_preset() -> None:
    # the preset's documented 8,192 (Megatron-Bridge's seq_length) against the config.json default of 4,096
    assert fixture("nemotron-3-nano") == replace(load_model("nemotron-3-nano"), seq_length=4096,
                                                 max_position_embeddings=262_144)


def test_unknown_model_type_with_llama_keys_is_refused_not_read_as_llama() -> None:
    """Issue 51: a model_type neither a family nor built by transformers is refused, whatever its keys say (it was
    read as Llama: gemma2 +77.6 %, starcoder2 +88.8 %)."""
    config = {k: v for k, v in hf_dict("llama-3-8b").items() if k != "architectures"}
    with pytest.raises(SpecError, match="my_llama_variant") as err:
        from_hf_config(config | {"model_type": "my_llama_variant"}, "custom")
    assert "\n" not in str(err.value)


def test_a_remote_code_model_type_reads_as_the_class_it_names() -> None:
    """Kimi-K2's config.json: model_type kimi_k2 (its own modeling code), architectures DeepseekV3ForCausalLM: read
    as deepseek_v3, saying so."""
    kimi = from_hf_config(hf_dict("deepseek-v3") | {"model_type": "kimi_k2"}, "kimi")
    assert kimi.params() == fixture("deepseek-v3").params()
    assert "model_type=kimi_k2 as deepseek_v3 (DeepseekV3ForCausalLM)" in kimi.source


def test_a_model_type_without_a_causal_lm_is_refused() -> None:
    with pytest.raises(SpecError, match="model_type='t5'.*no causal language model"):
        translate({"model_type": "t5", "d_model": 512}, "t5-small")


@pytest.mark.parametrize("hf, key", [("llama-3-8b", "intermediate_size"), ("gpt2", "n_embd"),
                                     ("deepseek-v3", "kv_lora_rank"), ("mixtral-8x7b", "num_local_experts"),
                                     ("qwen3-30b-a3b", "moe_intermediate_size"),
                                     ("gpt-neox-20b", "vocab_size")])
def test_missing_key_is_a_one_line_spec_error_naming_it(hf: str, key: str) -> None:
    config = hf_dict(hf)
    del config[key]
    with pytest.raises(SpecError, match=f"'{key}'") as err:
        translate(config, hf)
    assert "\n" not in str(err.value)


def test_qwen2_moe_shared_expert_and_gate() -> None:
    config = {"model_type": "qwen2_moe", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100,
              "max_position_embeddings": 256, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
              "shared_expert_intermediate_size": 96, "decoder_sparse_step": 1, "mlp_only_layers": [0]}
    spec = from_hf_config(config, "tiny-qwen2-moe")
    assert (spec.num_dense_layers, spec.num_moe_layers, spec.shared_expert_ffn_size) == (1, 1, 96)
    # attention (q/k/v biased, as Qwen2): q 64*64 + 64, k, v 2*(64*32 + 32), o 64*64 = 12,416; two norms 2*64
    assert spec.attention_params() == 4_160 + 4_160 + 4_096 == 12_416
    # dense layer: 12,416 + 3*64*128 + 128 = 37,120
    # MoE layer: 12,416 + router 64*4 + experts 4*3*64*32 + shared 3*64*96 + shared gate 64 + 128 = 55,872
    assert spec.moe_params() == 256 + 24_576 + 18_432 + 64
    # + embedding and head 2*100*64 + final norm 64
    assert spec.params() == 37_120 + 55_872 + 12_800 + 64 == 105_856


def test_unsupported_moe_layouts_are_spec_errors() -> None:
    base = translate(hf_dict("qwen3-30b-a3b"), "q")
    assert base["moe_layer_freq"] == 1 and base["first_k_dense_layers"] == 0
    with pytest.raises(SpecError, match="mlp_only_layers"):
        translate(hf_dict("qwen3-30b-a3b") | {"mlp_only_layers": [5]}, "q")
    with pytest.raises(SpecError, match="decoder_sparse_step=5"):
        translate(hf_dict("qwen3-30b-a3b") | {"decoder_sparse_step": 5}, "q")


def test_translate_marks_provenance() -> None:
    fields = translate(hf_dict("gpt2"), "gpt2")
    assert fields["name"] == "gpt2" and "model_type=gpt2" in fields["source"]


# ---- PyTorch's count of the same models (optional dependencies) --------------------------------------------
def torch_count(config: dict) -> int:
    """Parameters of AutoModelForCausalLM built on the meta device (no memory, no weights downloaded).
    DeepSeek-V3's router score-correction bias is a buffer in transformers (an nn.Parameter in the
    checkpoint's own modeling_deepseek.py, and a tensor in its weights), so it is added."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map")}
    cfg = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    params = sum(p.numel() for p in model.parameters())
    return params + sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))


@pytest.mark.parametrize("hf", sorted(p.name for p in HF.iterdir() if (p / "config.json").is_file()))
def test_torch_fixture_counts(hf: str) -> None:
    assert fixture(hf).params() == torch_count(hf_dict(hf))


def test_torch_small_families() -> None:
    """Tiny configs of the families without a fixture: Qwen2-MoE (shared expert + gate), GPT-OSS (sinks,
    biased experts), DeepSeek-V2-Lite style MLA (q_lora_rank null), Qwen3 dense (q/k norm)."""
    small = {"num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 96, "vocab_size": 128, "max_position_embeddings": 256}
    configs = [
        small | {"model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
                 "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "mlp_only_layers": [0]},
        small | {"model_type": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 32,
                 "layer_types": ["full_attention"] * 3},
        small | {"model_type": "deepseek_v2", "num_key_value_heads": 4, "q_lora_rank": None,
                 "kv_lora_rank": 16,
                 "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 4,
                 "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 2,
                 "first_k_dense_replace": 1, "topk_method": "greedy"},
        small | {"model_type": "qwen3", "head_dim": 32},
    ]
    for config in configs:
        kind = config["model_type"]
        assert from_hf_config(config, kind).params() == torch_count(config), kind


def _llama_like(name: str, model_type: str = "llama", **extra) -> dict:
    s = load_model(name)
    return {"model_type": model_type, "num_hidden_layers": s.num_layers, "hidden_size": s.hidden_size,
            "num_attention_heads": s.num_heads, "num_key_value_heads": s.num_kv_heads, "head_dim": s.head_dim,
            "intermediate_size": s.ffn_hidden_size, "vocab_size": s.vocab_size,
            "tie_word_embeddings": s.tied_embeddings} | extra


def _gpt2_like(name: str) -> dict:
    s = load_model(name)
    return {"model_type": "gpt2", "n_layer": s.num_layers, "n_embd": s.hidden_size, "n_head": s.num_heads,
            "n_inner": s.ffn_hidden_size, "vocab_size": s.vocab_size,
            "n_positions": s.max_position_embeddings}


# Presets built as the Hugging Face class of the same module layout: Megatron GPT and MPT as benchmarked =
# GPT-2; Nemotron-4 = NemotronForCausalLM (squared ReLU, LayerNorm1p); BLOOM; OPT; Megatron-Core GPT = GPT-NeoX.
TORCH_PRESETS = {
    "llama2-70b": lambda: _llama_like("llama2-70b"),
    "llama3.1-405b": lambda: _llama_like("llama3.1-405b"),
    "mixtral-8x22b": lambda: _llama_like("mixtral-8x22b", "mixtral", num_local_experts=8,
                                         num_experts_per_tok=2),
    "qwen3-235b-a22b": lambda: _llama_like("qwen3-235b-a22b", "qwen3_moe", num_experts=128,
                                           num_experts_per_tok=8, moe_intermediate_size=1536),
    "gpt-oss-120b": lambda: _llama_like("gpt-oss-120b", "gpt_oss", num_local_experts=128,
                                        num_experts_per_tok=4),
    "gpt-oss-20b": lambda: _llama_like("gpt-oss-20b", "gpt_oss", num_local_experts=32, num_experts_per_tok=4),
    "nemotron4-340b": lambda: _llama_like("nemotron4-340b", "nemotron", hidden_act="relu2",
                                          partial_rotary_factor=0.5),
    "bloom-176b": lambda: {"model_type": "bloom", "n_layer": 70, "hidden_size": 14336, "n_head": 112,
                           "vocab_size": 250880},
    "opt-175b": lambda: {"model_type": "opt", "num_hidden_layers": 96, "hidden_size": 12288,
                         "num_attention_heads": 96, "ffn_dim": 49152, "vocab_size": 50272,
                         "max_position_embeddings": 2048, "word_embed_proj_dim": 12288},
    "mcore-gpt-177b": lambda: {"model_type": "gpt_neox", "num_hidden_layers": 96, "hidden_size": 12288,
                               "num_attention_heads": 96, "intermediate_size": 49152, "vocab_size": 131072,
                               "tie_word_embeddings": False},
    "gpt3-175b": lambda: _gpt2_like("gpt3-175b"),
    "megatron-1t": lambda: _gpt2_like("megatron-1t"),
    "megatron2020-1.16b": lambda: _gpt2_like("megatron2020-1.16b"),
    "mpt-70b": lambda: _gpt2_like("mpt-70b"),
}


@pytest.mark.parametrize("name", sorted(TORCH_PRESETS))
def test_torch_preset_counts(name: str) -> None:
    assert load_model(name).params() == torch_count(TORCH_PRESETS[name]())
