"""map_model's steps one by one: a named preset's sizes, the preset whose sizes equal the record's (vocabulary first,
then name), a spec of the record's own sizes with its family's convention, the record's vocabulary and sequence
length; and the Skip each missing or contradictory size ends in."""

from __future__ import annotations

import pytest

from meshplan_validation.map_model import map_model, model_from_record, preset_by_name
from meshplan_validation.skip import Skip

# Llama 3 70B and Llama 2 70B share every size (80 layers of 8192, 64 heads, 8 kv-heads, F 28672): only the
# vocabulary (128256 / 32000) and the name tell them apart
LLAMA_70B = {"num_layers": 80, "hidden_size": 8192, "num_heads": 64, "num_kv_heads": 8, "ffn_hidden_size": 28672}


def test_equal_sizes_of_a_record_leaving_sizes_out_take_the_preset_of_the_records_vocabulary_first():
    spec, notes = map_model({"name": "X", "vocab_size": 32000} | LLAMA_70B)
    assert spec.name == "llama2-70b" and notes[0] == "model: preset llama2-70b (sizes match the record)"


def test_a_record_stating_every_size_is_priced_as_written_the_preset_of_its_sizes_only_named():
    """Issue 79, item 4: a record of every size that does not name the preset of those sizes is built from them; the
    preset is named in the notes, none of its other fields taken (a Llama-like spec: F is not 4h)."""
    spec, notes = map_model({"name": "X", "vocab_size": 32000, "seq_length": 4096} | LLAMA_70B)
    assert spec.name == "X" and (spec.num_layers, spec.num_kv_heads, spec.mlp) == (80, 8, "swiglu")
    assert notes[0].startswith("model: built from the record's sizes (priced as written; sizes as preset llama2-70b, "
                               "whose other fields are not taken)")


def test_a_gpt_record_of_a_presets_sizes_takes_its_text_and_family_not_the_preset():
    """24 x 2048 GPT of 16 heads has mpt-1b's sizes; MPT runs without dropout, Megatron's GPT with it: the record's
    text (biases, learned positions) and the GPT convention (tied embeddings, dropout 0.1) set the rest."""
    m = {"name": "GPT h2048 l24", "num_layers": 24, "hidden_size": 2048, "num_heads": 16, "num_kv_heads": 16,
         "ffn_hidden_size": 8192, "vocab_size": 50257, "seq_length": 1024,
         "arch_source": "fused QKV with bias, 4h MLP, LayerNorm, learned position embedding"}
    spec, notes = map_model(m)
    assert (spec.qkv_bias, spec.linear_bias, spec.position_embedding, spec.tied_embeddings, spec.dropout) == (
        True, True, "learned", True, True)
    assert notes[:2] == ["as the record states: qkv_bias True, linear_bias True, position_embedding learned",
                         "the GPT convention: tied_embeddings True, dropout True"]
    assert "sizes as preset mpt-1b" in notes[2]


def test_what_a_record_states_overrides_its_family():
    m = {"name": "GPT small", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 4,
         "ffn_hidden_size": 256, "vocab_size": 100, "seq_length": 32, "arch_source": "rotary positions, no dropout"}
    spec, _ = map_model(m, text="untied embeddings")
    assert (spec.position_embedding, spec.dropout, spec.tied_embeddings, spec.linear_bias) == (
        "rope", False, False, True)


def test_equal_sizes_of_another_vocabulary_take_the_closest_name_and_keep_the_records_vocabulary():
    spec, notes = map_model({"name": "Llama3-70B", "vocab_size": 128000, "seq_length": 8192} | LLAMA_70B)
    assert (spec.name, spec.vocab_size) == ("llama3-70b", 128000)
    assert notes == ["model: preset llama3-70b (sizes match the record)", "vocab 128000 as recorded (preset 128256)"]


def test_a_record_without_sizes_takes_the_preset_it_names_and_its_sequence_length():
    spec, notes = map_model({"name": "Llama-2-7b-hf"})
    assert (spec.name, spec.num_layers, spec.seq_length) == ("llama2-7b", 32, 4096)
    assert notes[1] == "seq_length 4096 from preset llama2-7b (not recorded)"


def test_the_records_sequence_length_replaces_the_presets():
    spec, _ = map_model({"name": "Llama3-70B", "vocab_size": 128256, "seq_length": 2048} | LLAMA_70B)
    assert (spec.name, spec.seq_length) == ("llama3-70b", 2048)


@pytest.mark.parametrize(("name", "preset"), [("DeepSeek-V3", "deepseek-v3"), ("Mixtral-8x7B-Instruct-v0.1",
                                                                                  "mixtral-8x7b"), ("GPT-2 XL", None)])
def test_a_name_names_a_preset_once_release_words_are_dropped(name, preset):
    assert preset_by_name(name) == preset


def test_a_gpt_of_no_preset_is_built_with_its_familys_ffn_and_heads():
    """GPT convention: F = 4h = 4 · 2560 = 10240, K = A = 20; F = 4h makes it a GeLU block with layer norm."""
    spec, notes = map_model({"name": "GPT-3 3B", "num_layers": 26, "hidden_size": 2560, "num_heads": 20,
                             "vocab_size": 51200, "seq_length": 2048})
    assert (spec.ffn_hidden_size, spec.num_kv_heads, spec.mlp, spec.norm) == (10240, 20, "gelu", "layernorm")
    assert notes[0].startswith("ffn_hidden_size 10240 = 4·hidden_size, num_kv_heads = num_heads = 20")
    # a record silent on its architecture takes its family's too (record_fields.GPT_ARCH: GPT-2's config)
    assert notes[1] == ("the GPT convention: qkv_bias True, linear_bias True, position_embedding learned, "
                        "tied_embeddings True, dropout True")
    assert (spec.linear_bias, spec.position_embedding, spec.tied_embeddings) == (True, "learned", True)
    assert notes[2].startswith("model: built from the record's sizes (no preset matches GPT-3 3B)")


def test_heads_come_from_head_dim_where_the_record_gives_no_heads():
    """2560 / 128 = 20 heads; F = 6912 is not 4h, so a SwiGLU block with RMSNorm."""
    spec, notes = map_model({"name": "Custom", "num_layers": 26, "hidden_size": 2560, "head_dim": 128,
                             "num_kv_heads": 4, "ffn_hidden_size": 6912, "vocab_size": 51200, "seq_length": 2048})
    assert (spec.num_heads, spec.mlp, spec.norm) == (20, "swiglu", "rmsnorm")
    assert notes[0] == "num_heads 20 = hidden_size / head_dim = 2560 / 128 (not recorded)"


def test_a_moe_record_of_expert_sizes_only_uses_them_for_f():
    notes: list[str] = []
    spec = model_from_record({"name": "M", "num_layers": 4, "hidden_size": 1024, "num_heads": 8, "num_kv_heads": 8,
                              "num_experts": 8, "moe_topk": 2, "moe_ffn_hidden_size": 2048, "vocab_size": 1000,
                              "seq_length": 512}, notes)
    assert (spec.ffn_hidden_size, spec.moe_ffn_hidden_size, spec.num_experts, spec.moe_topk) == (2048, 2048, 8, 2)


@pytest.mark.parametrize(("m", "reason"), [
    ({"name": "Nope"}, "model sizes not recorded: model.num_layers, model.hidden_size, model.num_heads missing and "
                       "no preset named 'Nope'"),
    ({"name": "a", "num_layers": -3}, "model.num_layers=-3 is not a whole number from 1 to 10000"),
    ({"name": "Custom", "num_layers": 26, "hidden_size": 2560, "num_heads": 20, "seq_length": 2048},
     "model Custom: model.ffn_hidden_size, model.vocab_size, model.num_kv_heads not recorded"),
    ({"name": "C", "num_layers": 2, "hidden_size": 100, "num_heads": 3, "num_kv_heads": 3, "ffn_hidden_size": 400,
      "vocab_size": 10, "seq_length": 8}, "num_heads=3 does not divide hidden_size=100"),
    ({"name": "C", "num_layers": 2, "hidden_size": 96, "num_heads": 6, "num_kv_heads": 4, "ffn_hidden_size": 400,
      "vocab_size": 10, "seq_length": 8}, "num_kv_heads=4 does not divide num_heads=6"),
])
def test_what_no_step_can_fill_is_a_skip_naming_the_fields(m, reason):
    with pytest.raises(Skip, match=reason.replace("(", r"\(").replace(")", r"\)")):
        map_model(m)
