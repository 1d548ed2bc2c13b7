"""A new user's mistakes, from a tour of every command (configs with the wrong suffix, a BERT config.json, a system
file without its HBM bandwidth, LoRA rank 0, options of one command given to another): one line, exit status 2,
naming what is wrong; and the defaults that made good input fail (FSDP frameworks have no ZeRO-1)."""

from __future__ import annotations

import json

from bad_input_helpers import H100, estimate, fails, hf
from meshplan.cli import main
from meshplan.configs import emit
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

BERT = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512}


def _transformers() -> bool:
    from meshplan.specs.hf.meta import available
    return available()


def test_an_encoder_config_is_not_read_as_llama(tmp_path, capsys):
    """BERT-base read as Llama would be 160 M parameters (a SwiGLU MLP of three 768 x 3072 matrices), not 110 M."""
    line = fails(estimate(hf(tmp_path, BERT)), capsys)
    assert "model_type='bert' (BertForMaskedLM) is not a decoder-only language model" in line
    assert "trace the module instead" in line
    bare = {k: v for k, v in BERT.items() if k != "architectures"}  # no head named: transformers' registry says
    assert "is an encoder" in fails(estimate(hf(tmp_path, bare, "bare")), capsys) or not _transformers()
    t5 = {**BERT, "architectures": [], "model_type": "t5x", "is_encoder_decoder": True}
    assert "(encoder-decoder) is not a decoder-only" in fails(estimate(hf(tmp_path, t5, "t5")), capsys)
    # a causal type without a hand-written family: read from the model transformers builds (issue 51)
    causal = {**BERT, "architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2"}
    assert main(estimate(hf(tmp_path, causal, "sc2"), "h100", "--json")) == (0 if _transformers() else 2)
    capsys.readouterr()


def test_a_deepspeed_config_saved_as_txt_is_read_as_deepspeed(tmp_path, capsys):
    model = load_model("llama3-8b")
    plan = Plan(dp=16, micro_batch=2, global_batch=512, zero=2, recompute="none")
    path = tmp_path / "ds.txt"
    path.write_text(emit("deepspeed", model, plan, load_stack("deepspeed")))
    assert main(["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "16", "--from", str(path),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["plan"]["zero"], out["plan"]["global_batch"]) == (2, 512)
    (tmp_path / "empty.sh").write_text("")
    assert "sets none of --tensor-model-parallel-size" in fails(
        ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "16", "--from", str(tmp_path / "empty.sh")],
        capsys)


def test_fsdp_frameworks_default_to_full_shard(capsys):
    """torchtitan, PyTorch FSDP, llm-foundry: no ZeRO-1, so the default is their FULL_SHARD (ZeRO-3); --zero 1
    given is still refused."""
    for framework in ("torchtitan", "pytorch-fsdp", "llm-foundry"):
        assert main(estimate("llama3-8b", "h100", "--framework", framework, "--json")) == 0
        assert json.loads(capsys.readouterr().out)["plan"]["zero"] == 3
    refused = fails(estimate("llama3-8b", "h100", "--framework", "torchtitan", "--zero", "1"), capsys)
    # torchtitan's ZeRO-1 is its FSDP2 under pipeline parallelism only (FsdpMode.has_zero: check's reason)
    assert "fsdp=fsdp2 has no ZeRO-1 strategy" in refused


def test_lora_rank_zero_is_full_training_as_its_range_says(capsys):
    assert main(estimate("llama3-8b", "h100", "--lora-rank", "0", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["finetune"] == "full"
    assert fails(estimate("llama3-8b", "h100", "--lora-rank", "0", "--finetune", "lora"), capsys) == (
        "meshplan: error: lora-rank=0 is full training: --finetune lora needs a rank of 1 … 65,536")
    assert "lora-rank=-3 is outside 1 … 65,536" in fails(estimate("llama3-8b", "h100", "--lora-rank", "-3"), capsys)


def test_a_system_file_without_a_required_field_names_it(tmp_path, capsys):
    text = "\n".join(ln for ln in H100.read_text().splitlines() if not ln.startswith("hbm_bandwidth"))
    (tmp_path / "s.toml").write_text(text)
    assert fails(estimate("llama3-8b", str(tmp_path / "s.toml")), capsys).endswith(
        ".accelerator: missing field hbm_bandwidth")


def test_options_of_another_command_are_named_as_written(capsys):
    plan = ["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8"]
    assert fails([*plan, "--input-shape", "8x128"], capsys).startswith(
        "meshplan: error: --input-shape is an option of the sharding planner")
    assert fails([*plan, "--autoshard", "--emit", "megatron"], capsys).startswith(
        "meshplan: error: --emit is an option of the template search")


def test_check_step_learned_profiles_are_checked_before_measuring(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = fails(["check-step", "gpt2", "--learned", "--profiles", "nothere"], capsys)
    assert "profiles='nothere' does not exist: --learned needs the zoo's profiles" in line


def test_estimate_prints_its_error_band(capsys):
    """The README promises step time with its error band: the text shows it as the JSON's error_band does."""
    assert main(estimate("llama3-8b", "h100", "--json")) == 0
    band = json.loads(capsys.readouterr().out)["error_band"]
    assert main(estimate("llama3-8b", "h100")) == 0
    assert f"±{band:.0%} (error band: 80% of " in capsys.readouterr().out


def test_report_compare_mine_without_from_says_so(capsys, tmp_path):
    report = ["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "-o", str(tmp_path / "r.html")]
    assert fails([*report, "--compare", "mine,#1"], capsys) == (
        "meshplan: error: compare='mine,#1': 'mine' is the plan of --from, which is not given")


def test_options_the_plan_leaves_without_effect_are_refused(capsys):
    assert fails(estimate("llama3-8b", "h100", "--summa-panels", "4"), capsys).endswith(
        "summa-panels=4 needs --layout summa (got 1d)")
    assert fails(estimate("llama3-8b", "h100", "--finetune", "full", "--lora-rank", "16"), capsys).endswith(
        "lora-rank=16 needs --finetune lora (got full; or leave --finetune out)")
    assert fails(estimate("llama3-8b", "h100", "--recompute-modules", "moe_act"), capsys).endswith(
        "recompute_modules moe_act needs a mixture-of-experts model (llama3-8b is dense)")
    assert fails(estimate("mixtral-8x7b", "h100", "--recompute-modules", "shared_experts"), capsys).endswith(
        "recompute_modules shared_experts needs shared experts (mixtral-8x7b has none)")


def test_a_factory_model_takes_its_batch_from_its_input_shape(capsys, tmp_path):
    (tmp_path / "m.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(8, 8)\n")
    line = fails(["plan", "--model", f"{tmp_path / 'm.py'}:make", "--input-shape", "4x8", "--system", "h100",
                  "--gpus", "2", "--global-batch", "64"], capsys)
    assert line.endswith("global-batch=64: a MODULE:FACTORY model's batch is its --input-shape (the first dimension "
                         "of each input); leave --global-batch out")
