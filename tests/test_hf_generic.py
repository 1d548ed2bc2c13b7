"""The meta-device check and the generic reader (specs/hf/meta.py, verify.py, generic.py): small configs of the
families issue 48 found read as Llama (Gemma 2 +77.6 %, StarCoder2 +88.8 %, OLMo 2 −2,048 parameters) now read with
their own structure, MoE and hybrid layouts keep their per-layer kinds, a reading that disagrees with the build is
refused naming the layer and both counts, and without transformers only the hand-written families are read."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.errors import SpecError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from meshplan.specs.hf.config import from_hf_config  # noqa: E402
from meshplan.specs.hf.meta import build_meta  # noqa: E402
from meshplan.specs.hf.verify import mismatch, shape_mismatch  # noqa: E402

SMALL = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 96, "vocab_size": 128, "max_position_embeddings": 256}
HF = Path(__file__).parent / "data" / "hf"


def config(model_type: str, **keys: object) -> dict:
    """The full config.json transformers writes for ``model_type`` with these keys."""
    cfg = transformers.AutoConfig.for_model(model_type, **keys)
    return json.loads(cfg.to_json_string(use_diff=False))


def built(config_: dict) -> int:
    """transformers' own count of the model built from the config.json (its {"__float__": "Infinity"} decoded)."""
    config_ = json.loads(json.dumps(config_), object_hook=lambda d: float(d["__float__"]) if set(d) == {"__float__"}
                         else d)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(
            config_["model_type"], **{k: v for k, v in config_.items() if k != "model_type"}))
    return sum(p.numel() for p in model.parameters())


def test_gemma2_has_four_norms_a_layer_and_a_tied_head() -> None:
    c = config("gemma2", **SMALL, head_dim=16)
    spec = from_hf_config(c, "gemma2")
    assert (spec.layer_norms, spec.tied_embeddings, spec.mlp, spec.norm) == (4, True, "swiglu", "rmsnorm")
    # a layer: q 64·64, k and v 64·32 each, o 64·64, gated MLP 3·64·96, four norms 4·64 = 30,976
    assert spec.layer_params(0) == 4096 + 2 * 2048 + 4096 + 3 * 64 * 96 + 4 * 64 == 30_976
    assert spec.params() == built(c) == 4 * 30_976 + 128 * 64 + 64


def test_starcoder2_has_biases_layernorm_and_an_ungated_mlp() -> None:
    c = config("starcoder2", **SMALL)
    spec = from_hf_config(c, "starcoder2")
    assert (spec.mlp, spec.norm, spec.norm_bias, spec.qkv_bias, spec.linear_bias) == ("gelu", "layernorm", True,
                                                                                      True, True)
    # q 64·64+64, k and v 64·32+32 each, o 64·64+64, c_fc 64·96+96, c_proj 96·64+64, two LayerNorms 2·128
    assert spec.layer_params(0) == 4160 + 2 * 2080 + 4160 + 6240 + 6208 + 256 == 25_184
    assert spec.params() == built(c)


def test_olmo2_normalises_all_of_q_and_k() -> None:
    c = config("olmo2", **SMALL)
    spec = from_hf_config(c, "olmo2")
    assert spec.qk_norm and spec.qk_norm_full
    # q_norm over A·d = 64 and k_norm over K·d = 32: 96 weights, not the 2·d = 32 of per-head norms
    assert spec.attention_params() == 4096 + 2 * 2048 + 4096 + 96
    assert spec.params() == built(c)


def test_interleaved_moe_keeps_its_layers_and_active_parameters() -> None:
    """Llama 4: MoE every second layer with a shared expert; the spec carries the layout, not just the total."""
    c = config("llama4_text", **SMALL, head_dim=16, intermediate_size_mlp=80, num_local_experts=4,
               num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layers=[1] * 4)
    spec = from_hf_config(c, "llama4")
    assert [spec.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert (spec.num_experts, spec.moe_topk, spec.shared_expert_ffn_size) == (4, 1, 96)
    assert spec.params() == built(c)
    # active: one routed expert of four in each MoE layer, 3·64·96 each
    assert spec.params() - spec.params(active=True) == 2 * 3 * 3 * 64 * 96
    # Llama4TextMoe weights the experts' inputs by the scores (hf/config.SCORED_BEFORE), as the preset says
    assert spec.moe_score_before_experts and not from_hf_config(config("mixtral", **SMALL, num_local_experts=4,
                                                                       num_experts_per_tok=2)).moe_score_before_experts


def test_a_mamba_hybrid_becomes_one_block_per_mixer_and_mlp() -> None:
    """Bamba: each layer a Mamba-2 mixer and an MLP, each with its norm: two blocks ("M-") a layer."""
    c = config("bamba", **SMALL, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1,
               attn_layer_indices=[2])
    spec = from_hf_config(c, "bamba")
    assert spec.layer_pattern == "M-M-*-M-"
    assert spec.block_counts == {"mamba": 3, "attention": 1, "mlp": 4}
    assert spec.params() == built(c)


def test_a_reading_that_disagrees_with_the_build_is_named() -> None:
    c = config("llama", **SMALL)
    meta = build_meta(c)
    assert not isinstance(meta, str)
    spec = from_hf_config(c, "llama")
    assert mismatch(spec, meta) is None
    # a layer: q, o 64·64 each, k, v 64·32 each, MLP 3·64·96, two norms 2·64 = 30,848; q/k norms add 2·16
    wrong = replace(spec, qk_norm=True)
    message = mismatch(wrong, meta)
    assert message is not None and message.startswith("layer 0: meshplan counts 30,880 parameters, transformers "
                                                       "builds 30,848 (self_attn.q_proj.weight (64, 64)")
    assert mismatch(replace(spec, vocab_size=130), meta) == (
        "embedding, final norm and head: meshplan counts 16,704 parameters, transformers builds 16,448")


def test_the_shapes_behind_the_counts_are_checked() -> None:
    """shape_mismatch compares the widths themselves: q, k, v and F of the first dense layer, E and F_e of the first
    MoE layer."""
    c = config("llama", **SMALL)
    meta = build_meta(c)
    assert not isinstance(meta, str)
    spec = from_hf_config(c, "llama")
    assert shape_mismatch(spec, meta) is None
    assert shape_mismatch(replace(spec, ffn_hidden_size=97), meta) == (
        "layer 0: transformers builds ffn 96 (meshplan 97)")
    assert shape_mismatch(replace(spec, num_kv_heads=4), meta) == (
        "layer 0: transformers builds k 32 (meshplan 64), v 32 (meshplan 64)")


def test_llama_mlp_bias_is_read() -> None:
    """mlp_bias without attention_bias: read as the MLP's biases alone (it was dropped: −(2F + H) a layer)."""
    c = config("llama", **SMALL, mlp_bias=True)
    spec = from_hf_config(c, "llama")
    assert (spec.mlp_bias, spec.out_bias, spec.linear_bias) == (True, False, False)
    assert spec.params() == built(c)


@pytest.mark.parametrize("model_type, named", [("gemma3", "vision_tower"), ("rwkv", "time_decay"),
                                               ("zamba", "ZambaMambaMixer"), ("bert", "encoder")])
def test_what_cannot_be_modelled_is_named(model_type: str, named: str) -> None:
    with pytest.raises(SpecError, match=named) as err:
        from_hf_config(config(model_type), model_type)
    assert "\n" not in str(err.value)


def test_without_transformers_only_the_exact_families_are_read() -> None:
    """A subprocess where transformers does not import: a family (Llama) reads, any other type is refused."""
    gemma = json.dumps(config("gemma2", **SMALL, head_dim=16))
    code = f"""
import sys, json
sys.modules["transformers"] = None
from meshplan.specs.hf.config import from_hf_config, EXACT
from meshplan.errors import SpecError
print(from_hf_config(json.load(open({str(HF / "llama-3-8b" / "config.json")!r})), "l").params())
try:
    from_hf_config(json.loads({gemma!r}), "g")
except SpecError as exc:
    print(exc)
print(len(EXACT))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(Path(__file__).parents[1] / "src")}).stdout.splitlines()
    assert out[0] == "8030261248"
    assert "model_type='gemma2' is not one meshplan reads exactly" in out[1] and "meshplan[hf]" in out[1]
    assert out[2] == "13"


def test_torch_init_is_skipped_only_while_a_model_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """build_meta skips torch.nn.init's fills (a meta tensor has no values: meta._torch_init_skipped), also where a
    torch module imported them by name, and puts them back after a build, a failed one too. The tying of a shared
    weight (transformers' init_weights, which its own no_init_weights would skip as well) still happens: Gemma 2's
    head is its embedding, counted once."""
    from torch.nn import init
    from torch.nn.modules import activation
    originals = (init.kaiming_uniform_, init.normal_, activation.xavier_uniform_)
    # a config of its own (builds are cached by their text): the test above's Gemma 2, 4·30,976 + 128·64 + 64
    meta = build_meta(config("gemma2", **SMALL, head_dim=16, initializer_range=0.0125))
    assert not isinstance(meta, str) and meta.total == 4 * 30_976 + 128 * 64 + 64 == 132_160
    assert (init.kaiming_uniform_, init.normal_, activation.xavier_uniform_) == originals
    during = []

    def failing(cfg: object) -> None:
        during.append((init.kaiming_uniform_ is originals[0], activation.xavier_uniform_ is originals[2]))
        raise RuntimeError("no build")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", failing)
    assert "cannot build it (RuntimeError: no build)" in str(build_meta(config("llama", **SMALL,
                                                                              initializer_range=0.0125)))
    assert during == [(False, False)]  # replaced while building
    assert (init.kaiming_uniform_, init.normal_, activation.xavier_uniform_) == originals
    assert torch.nn.Linear(8, 8).weight.abs().sum() > 0  # a real layer is filled again
