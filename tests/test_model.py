"""ModelSpec parameter counts: closed forms, published counts, the validation set's models, hybrids.

Two independent methods agree: the closed forms below (arithmetic in the comments) and PyTorch's count of the
same Hugging Face model built on the meta device (tests/test_hf_config.py, skipped without torch + transformers).
Published counts are compared at the precision they were printed with.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model

HF = Path(__file__).parent / "data" / "hf"
VALIDATION = Path(__file__).resolve().parents[1] / "data" / "validation" / "published_runs.jsonl"


def fixture(name: str) -> ModelSpec:
    return load_model(str(HF / name / "config.json"))


def hf_dict(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())


# ---- exact counts: closed form = PyTorch's count of the HF model --------------------------------------------
BOTH = ["preset", "config.json"]


def both(preset: str, config: str) -> list[tuple[str, str]]:
    """The two readings of one model, named here and read in the test (the ``spec`` fixture): a config.json is read
    through transformers' model on the meta device (seconds), which collection would otherwise do in every worker."""
    return [("preset", preset), ("config.json", config)]


@pytest.fixture
def spec(request: pytest.FixtureRequest) -> ModelSpec:
    kind, name = request.param
    return load_model(name) if kind == "preset" else fixture(name)


@pytest.mark.parametrize("spec", both("llama3-8b", "llama-3-8b"), ids=BOTH, indirect=True)
def test_llama3_8b(spec: ModelSpec) -> None:
    # attention: q 4096*4096 + k, v 2*4096*1024 + o 4096*4096 = 16,777,216 + 8,388,608 + 16,777,216
    assert spec.attention_params() == 41_943_040
    # MLP: gate, up, down 3*4096*14336 = 176,160,768; layer = 41,943,040 + 176,160,768 + 2 RMSNorms 2*4096
    assert spec.layer_params(0) == 41_943_040 + 176_160_768 + 8_192 == 218_112_000
    # 32 * 218,112,000 = 6,979,584,000; untied embedding + head 2*128256*4096 = 1,050,673,152; final norm 4096
    assert spec.params() == 6_979_584_000 + 1_050_673_152 + 4_096 == 8_030_261_248


@pytest.mark.parametrize("spec", both("mixtral-8x7b", "mixtral-8x7b"), ids=BOTH, indirect=True)
def test_mixtral_8x7b(spec: ModelSpec) -> None:
    # attention as Llama-3-8B: 41,943,040; router 4096*8 = 32,768; experts 8 * 3*4096*14336 = 1,409,286,144
    assert spec.moe_params() == 32_768 + 1_409_286_144
    # layer 41,943,040 + 1,409,318,912 + 8,192 = 1,451,270,144; * 32 = 46,440,644,608
    # + embedding and head 2*32000*4096 = 262,144,000 + final norm 4096
    assert spec.params() == 46_440_644_608 + 262_144_000 + 4_096 == 46_702_792_704
    # active: 2 of 8 experts, 2*176,160,768 = 352,321,536 -> layer 394,305,536; * 32 = 12,617,777,152
    assert spec.params(active=True) == 12_617_777_152 + 262_144_000 + 4_096 == 12_879_925_248


@pytest.mark.parametrize("spec", both("gpt2", "gpt2"), ids=BOTH, indirect=True)
def test_gpt2_small(spec: ModelSpec) -> None:
    # c_attn 768*2304 + 2304 = 1,771,776; attn.c_proj 768*768 + 768 = 590,592
    assert spec.attention_params() == 1_771_776 + 590_592
    # c_fc 768*3072 + 3072 = 2,362,368; mlp.c_proj 3072*768 + 768 = 2,360,064; ln_1, ln_2 4*768 = 3,072
    assert spec.layer_params(0) == 2_362_368 + 2_360_064 + 1_771_776 + 590_592 + 3_072 == 7_087_872
    # 12 * 7,087,872 = 85,054,464; wte 50257*768 = 38,597,376; wpe 1024*768 = 786,432; ln_f 1,536; head tied
    assert spec.params() == 85_054_464 + 38_597_376 + 786_432 + 1_536 == 124_439_808


@pytest.mark.parametrize("spec", both("qwen3-30b-a3b", "qwen3-30b-a3b"), ids=BOTH, indirect=True)
def test_qwen3_30b_a3b(spec: ModelSpec) -> None:
    # head_dim 128: q 2048*4096 + k, v 2*2048*512 + o 4096*2048 + q_norm, k_norm 2*128
    assert spec.attention_params() == 8_388_608 + 2_097_152 + 8_388_608 + 256 == 18_874_624
    # router 2048*128 = 262,144; experts 128 * 3*2048*768 = 603,979,776
    assert spec.moe_params() == 262_144 + 603_979_776
    # layer 18,874,624 + 604,241,920 + 4,096 = 623,120,640; * 48 = 29,909,790,720
    # + embedding and head 2*151936*2048 = 622,329,856 + final norm 2048
    assert spec.params() == 29_909_790_720 + 622_329_856 + 2_048 == 30_532_122_624
    # active: 8 experts 8*4,718,592 = 37,748,736 -> layer 56,889,600; * 48 = 2,730,700,800
    assert spec.params(active=True) == 2_730_700_800 + 622_329_856 + 2_048 == 3_353_032_704


def test_deepseek_v3_config_json() -> None:
    spec = fixture("deepseek-v3")
    # MLA: q_a 7168*1536 + norm 1536 + q_b 1536*128*192 + kv_a 7168*576 + norm 512 + kv_b 512*128*256
    #      + o 16384*7168
    assert spec.attention_params() == (11_010_048 + 1_536 + 37_748_736 + 4_128_768 + 512 + 16_777_216
                                       + 117_440_512) == 187_107_328
    # MoE: router 256*7168 + bias 256; 256 experts * 3*7168*2048 = 11,274,289,152; shared 3*7168*2048
    assert spec.moe_params() == 1_835_008 + 256 + 11_274_289_152 + 44_040_192
    # 3 dense layers: 187,107,328 + 3*7168*18432 + 2*7168 = 583,483,392; 58 MoE layers: 11,507,286,272 each
    assert (spec.num_dense_layers, spec.num_moe_layers) == (3, 58)
    # 3*583,483,392 + 58*11,507,286,272 + embedding and head 2*129280*7168 + final norm 7168
    assert spec.params() == 1_750_450_176 + 667_422_603_776 + 1_853_358_080 + 7_168 == 671_026_419_200
    # a config.json trains at model_load.CONFIG_SEQ_LENGTH = 4,096 (the report's 4K pre-training length, as the
    # preset) and serves its max_position_embeddings 163,840
    assert spec == load_model("deepseek-v3")
    assert (spec.seq_length, spec.max_position_embeddings) == (4096, 163_840)


def test_other_fixtures() -> None:
    # GPT-NeoX-20B layer: qkv 6144*18432 + 18432, dense 6144^2 + 6144, MLP 2*6144*24576 + 24576 + 6144, 4 LN
    neox = fixture("gpt-neox-20b")
    assert neox.layer_params(0) == 113_264_640 + 37_754_880 + 302_020_608 + 24_576 == 453_064_704
    # 44 * 453,064,704 + embed_in, embed_out 2*50432*6144 + final LayerNorm 2*6144
    assert neox.params() == 19_934_846_976 + 619_708_416 + 12_288 == 20_554_567_680
    # Mistral-7B: Llama-3-8B's layer (218,112,000) * 32 + 2*32000*4096 + 4096
    assert fixture("mistral-7b").params() == 6_979_584_000 + 262_144_000 + 4_096 == 7_241_732_096
    # Qwen2-7B layer: q 3584^2 + 3584, k, v 2*(3584*512 + 512), o 3584^2, MLP 3*3584*18944, 2 norms 2*3584
    qwen2 = fixture("qwen2-7b")
    assert qwen2.layer_params(0) == 12_848_640 + 3_671_040 + 12_845_056 + 203_685_888 + 7_168 == 233_057_792
    # 28 * 233,057,792 + 2*152064*3584 + 3584
    assert qwen2.params() == 6_525_618_176 + 1_089_994_752 + 3_584 == 7_615_616_512


# ---- published counts -------------------------------------------------------------------------------------
# Narayanan et al. 2021, Table 1 (billions as printed). P = 12*l*h^2*(1 + 13/(12h) + (V + s)/(12*l*h)) + 2h,
# e.g. 1.7B: 12*24*2304^2 = 1,528,823,808 + 13*2304*24 = 718,848 + (51200 + 2048)*2304 = 122,683,392 + 4608.
NARAYANAN_TABLE_1 = [("megatron-1.7b", "1.7"), ("megatron-3.6b", "3.6"), ("megatron-7.5b", "7.5"),
                     ("megatron-18b", "18.4"), ("megatron-39b", "39.1"), ("megatron-76b", "76.1"),
                     ("megatron-145b", "145.6"), ("megatron-310b", "310.1"), ("megatron-530b", "529.6"),
                     ("megatron-1t", "1008")]


def billions_as_printed(params: int, printed: str) -> str:
    decimals = len(printed.partition(".")[2])
    return f"{params / 1e9:.{decimals}f}"


@pytest.mark.parametrize("preset, printed", NARAYANAN_TABLE_1)
def test_megatron_series_matches_narayanan_2021(preset: str, printed: str) -> None:
    assert billions_as_printed(load_model(preset).params(), printed) == printed


def test_megatron_1_7b_arithmetic() -> None:
    params = load_model("megatron-1.7b").params()
    assert params == 1_528_823_808 + 718_848 + 122_683_392 + 4_608 == 1_652_230_656


@pytest.mark.parametrize("preset, printed", [("megatron2020-1.16b", "1.16"), ("megatron2020-2.03b", "2.03"),
                                             ("megatron2020-4.24b", "4.24"), ("megatron2020-8.67b", "8.67"),
                                             ("megatron-291b", "290.8")])
def test_megatron_readme_tables(preset: str, printed: str) -> None:
    assert billions_as_printed(load_model(preset).params(), printed) == printed


def test_gpt3_175b() -> None:
    # 12*96*12288^2 = 173,946,175,488 + 13*12288*96 = 15,335,424 + (51200 + 2048)*12288 = 654,311,424
    # + final LayerNorm 2*12288
    assert load_model("gpt3-175b").params() == 173_946_175_488 + 15_335_424 + 654_311_424 + 24_576
    assert billions_as_printed(load_model("gpt3-175b").params(), "174.6") == "174.6"


def test_deepseek_v3_671b_total_37b_active() -> None:
    spec = load_model("deepseek-v3")
    assert spec.params() == pytest.approx(671e9, rel=0.005)  # 671,026,419,200 (MTP module excluded)
    active = spec.params(active=True)  # 37,552,297,472
    # README_WEIGHTS.md: "Activation parameters: 36.6B (including 0.9B for the output head)", i.e. without the
    # input embedding 129280*7168 = 926,679,040; the report's "37B activated" rounds it.
    assert billions_as_printed(active - 129_280 * 7_168, "36.6") == "36.6"
    assert active == pytest.approx(37e9, rel=0.015)


def test_llama31_405b() -> None:
    # 126 * (16384^2*2 + 2*16384*1024 + 3*16384*53248 + 2*16384) + 2*128256*16384 + 16384 = 405,853,388,800
    assert load_model("llama3.1-405b").params() == 405_853_388_800
    assert billions_as_printed(load_model("llama3.1-405b").params(), "405.9") == "405.9"


@pytest.mark.parametrize("preset, total, active", [
    ("llama2-7b", 6_738_415_616, None), ("llama2-13b", 13_015_864_320, None),
    ("llama2-70b", 68_976_648_192, None),
    ("llama3-70b", 70_553_706_496, None), ("mixtral-8x22b", 140_630_071_296, 39_161_468_928),
    ("qwen3-235b-a22b", 235_093_634_560, 22_190_763_520), ("gpt-oss-120b", 116_829_156_672, 5_711_982_912),
    ("gpt-oss-20b", 20_914_757_184, 4_187_440_704),  # model card: 20.9B total, 3.6B active without the embedding
    ("nemotron4-15b", 15_628_775_424, None), ("nemotron4-340b", 341_029_195_776, None),
    ("bloom-176b", 176_247_271_424, None), ("opt-175b", 174_604_468_224, None),
])
def test_presets_equal_torch_counts(preset: str, total: int, active: int | None) -> None:
    """Totals measured with torch on the meta device (test_torch_preset_counts repeats it where installed)."""
    spec = load_model(preset)
    assert spec.params() == total
    assert spec.params(active=True) == (active or total)


def test_gpt_oss_and_bloom_extras() -> None:
    oss = load_model("gpt-oss-120b")
    # q 2880*4096 + 4096, k, v 2*(2880*512 + 512), o 4096*2880 + 2880, sinks 64
    assert oss.attention_params() == 11_800_576 + 2_950_144 + 11_799_360 + 64
    # router 2880*128 + 128; 128 experts * (3*2880*2880 + 2*2880 + 2880 biases)
    assert oss.moe_params() == 368_768 + 128 * (24_883_200 + 8_640)
    bloom = load_model("bloom-176b")  # word_embeddings_layernorm: 2*14336 after the 250880*14336 embedding
    assert bloom.embedding_params() == 250_880 * 14_336 + 28_672


# MPT as benchmarked by llm-foundry: learned positions of the run's sequence length, so the published count
# moves with it: P(s) = P(2048) + (s - 2048) * h.
@pytest.mark.parametrize("preset, seq, published", [
    ("mpt-125m", 512, 124_131_840), ("mpt-125m", 2048, 125_311_488), ("mpt-125m", 65536, 174_070_272),
    ("mpt-1b", 2048, 1_315_950_592), ("mpt-7b", 2048, 6_658_859_008), ("mpt-7b", 65536, 6_918_905_856),
    ("mpt-30b", 8192, 30_019_254_272), ("mpt-70b", 2048, 64_862_437_376),
])
def test_mpt_matches_llm_foundry_table(preset: str, seq: int, published: int) -> None:
    spec = load_model(preset)
    assert spec.params() + (seq - 2048) * spec.hidden_size == published
    assert replace(spec, seq_length=seq, max_position_embeddings=seq).params() == published


def test_mpt_7b_arithmetic() -> None:
    # 32 * (12*4096^2 + 13*4096) = 6,444,154,880; wte 50368*4096 = 206,307,328; wpe 2048*4096 = 8,388,608;
    # ln_f 2*4096
    assert load_model("mpt-7b").params() == 6_444_154_880 + 206_307_328 + 8_388_608 + 8_192 == 6_658_859_008


# ---- the validation set: every model has a preset of the same sizes ----------------------------------------
VALIDATION_PRESETS = {
    "BLOOM-176B": "bloom-176b", "DeepSeek-V3": "deepseek-v3", "GPT-OSS-120B": "gpt-oss-120b",
    "GPT-1.7B (Megatron)": "megatron-1.7b", "GPT-3.6B (Megatron)": "megatron-3.6b",
    "GPT-7.5B (Megatron)": "megatron-7.5b", "GPT-18B (Megatron)": "megatron-18b",
    "GPT-39B (Megatron)": "megatron-39b",
    "GPT-76B (Megatron)": "megatron-76b", "GPT-145B (Megatron)": "megatron-145b",
    "GPT-291B (Megatron)": "megatron-291b", "GPT-310B (Megatron)": "megatron-310b",
    "GPT-530B (Megatron)": "megatron-530b", "GPT-1T (Megatron)": "megatron-1t",
    "GPT-22B (Korthikanti 2022)": "megatron-22b", "GPT-175B (Korthikanti 2022)": "gpt3-175b",
    "GPT-530B (Korthikanti 2022)": "megatron-530b", "GPT-1T (Korthikanti 2022)": "megatron-1t",
    "GPT-2-style 1B (Megatron 2020)": "megatron2020-1.16b",
    "GPT-2-style 2B (Megatron 2020)": "megatron2020-2.03b",
    "GPT-2-style 4B (Megatron 2020)": "megatron2020-4.24b",
    "GPT-2-style 8B (Megatron 2020)": "megatron2020-8.67b",
    "GPT-1.7B (Megatron-Core 2024)": "mcore-gpt-1.7b", "GPT-7.1B (Megatron-Core 2024)": "mcore-gpt-7.1b",
    "GPT-16B (Megatron-Core 2024)": "mcore-gpt-16b", "GPT-32B (Megatron-Core 2024)": "mcore-gpt-32b",
    "GPT-70B (Megatron-Core 2024)": "mcore-gpt-70b", "GPT-119B (Megatron-Core 2024)": "mcore-gpt-119b",
    "GPT-177B (Megatron-Core 2024)": "mcore-gpt-177b", "GPT-314B (Megatron-Core 2024)": "mcore-gpt-314b",
    "GPT-462B (Megatron-Core 2024)": "mcore-gpt-462b",
    "GPT3-5B": "nemo-gpt3-5b", "GPT3-20B": "nemo-gpt3-20b", "GPT3-175B": "gpt3-175b",
    "Llama2-7B": "llama2-7b", "Llama2-13B": "llama2-13b", "Llama2-70B": "llama2-70b",
    "Llama3-8B": "llama3-8b", "Llama3-70B": "llama3-70b", "Llama3.1-405B": "llama3.1-405b",
    "MPT-125m": "mpt-125m", "MPT-350m": "mpt-350m", "MPT-760m": "mpt-760m", "MPT-1b": "mpt-1b",
    "MPT-3b": "mpt-3b",
    "MPT-7b": "mpt-7b", "MPT-13b": "mpt-13b", "MPT-30b": "mpt-30b", "MPT-70b": "mpt-70b",
    "Nemotron3-8B": "nemotron3-8b", "Nemotron3-22B": "nemotron3-22b", "Nemotron4-340B": "nemotron4-340b",
    "OPT-175B": "opt-175b", "Qwen3-30B-A3B": "qwen3-30b-a3b", "Qwen3-235B-A22B": "qwen3-235b-a22b",
    "Nemotron-3-Nano": "nemotron-3-nano", "Nemotron-3-Super": "nemotron-3-super",
}


NOT_MODELLED = {  # no architecture in the record and no preset: configs not public, or not read
    "Nemotron-3-Ultra", "Nemotron-3.5-Lightning", "DeepSeek-V4-Flash",
}


# Where the record prints the tokenizer's size and the model has padded / special-token rows.
VOCAB_AS_TRAINED = {"Llama3-8B": (128_000, 128_256), "Llama3-70B": (128_000, 128_256),
                    "Llama3.1-405B": (128_000, 128_256), "BLOOM-176B": (250_680, 250_880)}


SIZES = {"num_layers": "num_layers", "hidden_size": "hidden_size", "num_heads": "num_heads",
         "num_kv_heads": "num_kv_heads", "ffn_hidden_size": "ffn_hidden_size", "vocab_size": "vocab_size",
         "num_experts": "num_experts", "moe_topk": "moe_topk", "moe_ffn_hidden_size": "moe_ffn_hidden_size",
         "shared_expert_ffn": "shared_expert_ffn_size"}


def validation_models() -> list[dict]:
    if not VALIDATION.is_file():
        pytest.skip(f"{VALIDATION} not present")
    models = {}
    for line in VALIDATION.read_text().splitlines():
        model = json.loads(line)["model"]
        models[json.dumps(model, sort_keys=True)] = model
    return list(models.values())


def test_every_validation_model_has_a_preset_of_its_sizes() -> None:
    mismatches = []
    for record in validation_models():
        name = record["name"]
        if name in NOT_MODELLED:
            continue
        assert name in VALIDATION_PRESETS, f"validation model {name!r} has no preset"
        spec = load_model(VALIDATION_PRESETS[name])
        for key, field in SIZES.items():
            want = record.get(key)
            if key == "vocab_size" and name in VOCAB_AS_TRAINED:
                assert (want, spec.vocab_size) == VOCAB_AS_TRAINED[name]
            elif want is not None and getattr(spec, field) != want:
                mismatches.append(f"{name}: {key} {want} != {getattr(spec, field)}")
        if "params_b" in record:
            printed = str(record["params_b"]).removesuffix(".0")
            assert billions_as_printed(spec.params(), printed) == printed, name
        if "params_as_reported" in record:
            seq = record["seq_length"]
            at_seq = replace(spec, seq_length=seq, max_position_embeddings=seq)
            assert at_seq.params() == record["params_as_reported"], name
    assert not mismatches, mismatches


# ---- hybrid (Nemotron-H) -----------------------------------------------------------------------------------
def test_nemotron_3_nano_blocks_and_counts() -> None:
    """52 blocks: 23 Mamba-2, 6 attention, 23 MoE. H = 2688, D_i = 64 heads × 64 = 4096, G·N = 8 × 128 = 1024.
    Mamba: in_proj 2688 × (4096 + 4096 + 2048 + 64) = 27,697,152; conv1d 6144 × (4 + 1) = 30,720; dt_bias, A_log,
    D 3 × 64; gated norm 4096; out_proj 4096 × 2688 = 11,010,048; pre-norm 2688 → 38,744,896.
    Attention: 2688 × (4096 + 2·256) + 4096 × 2688 = 23,396,352 + 2688.
    MoE: router 2688 × 128 + 128 (bias), 128 experts × 2 × 2688 × 1856, shared 2 × 2688 × 3712, norm 2688.
    Published: 31,577,940,288 (the checkpoint's tensors, llama.cpp's n_params), 3,580,076,352 active."""
    spec = load_model("nemotron-3-nano")
    assert spec.block_counts == {"mamba": 23, "attention": 6, "moe": 23}
    assert spec.block_params("mamba") == 38_744_896
    assert spec.block_params("attention") == 23_396_352 + 2688
    moe = 2688 * 128 + 128 + 128 * 2 * 2688 * 1856 + 2 * 2688 * 3712 + 2688
    assert spec.block_params("moe") == moe
    embed_and_head = 2 * 131072 * 2688 + 2688
    assert spec.params() == 23 * 38_744_896 + 6 * (23_396_352 + 2688) + 23 * moe + embed_and_head == 31_577_940_288
    assert spec.params(active=True) == 3_580_076_352
    assert [spec.is_moe_layer(i) for i in range(4)] == [False, True, False, True]  # M E M E
    assert spec.num_attention_layers == 6


def test_nemotron_3_super_latent_experts() -> None:
    """Latent MoE: 512 experts of 2 × 1024 × 2688 = 5,505,024 on the 1024-wide latent, projections 4096 × 1024 each
    way. Checkpoint: 123,611,012,096 BF16 weights less 2,942,324,736 of the MTP layer, plus 40 × 512 fp32 router
    biases = 120,668,707,840; the 490 inactive experts of 40 layers are 107,898,470,400."""
    spec = load_model("nemotron-3-super")
    assert spec.block_counts == {"mamba": 40, "attention": 8, "moe": 40}
    assert spec.expert_params() == 5_505_024 and spec.moe_width == 1024
    assert spec.params() == 123_611_012_096 - 2_942_324_736 + 40 * 512 == 120_668_707_840
    assert spec.params() - spec.params(active=True) == 40 * (512 - 22) * 5_505_024 == 107_898_470_400
