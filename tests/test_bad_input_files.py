"""Bad input files: a Hugging Face config.json, a model TOML and a system TOML with values of the wrong kind or out of
range, and files that cannot be read (too many digits, not UTF-8, a directory). One line naming the file, the field
and its value (for a config.json, the key read too), exit status 2, before any arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bad_input_helpers import DEEPSEEK, H100, LLAMA, QWEN_MOE, SMALL, estimate, fails, hf, system
from meshplan.cli import main
from meshplan.files import _shown


@pytest.mark.parametrize(("config", "message"), [
    ({**LLAMA, "attention_dropout": "abc"}, "attention_dropout='abc' must be a probability"),
    ({**LLAMA, "attention_dropout": [0.1]}, "attention_dropout=[0.1] must be a probability"),
    ({**LLAMA, "tie_word_embeddings": "false"}, "tie_word_embeddings='false' must be true or false"),
    ({**LLAMA, "num_hidden_layers": 4.5}, "num_hidden_layers=4.5 must be a positive integer"),
    ({**QWEN_MOE, "decoder_sparse_step": 0}, "decoder_sparse_step=0 must be a positive integer"),
    ({**QWEN_MOE, "decoder_sparse_step": "2"}, "decoder_sparse_step='2' must be a positive integer"),
    ({**QWEN_MOE, "mlp_only_layers": 5}, "mlp_only_layers=5 must be a list of layer indices"),
    ({**QWEN_MOE, "mlp_only_layers": [0, "1"]}, "mlp_only_layers='1' must be a non-negative integer"),
    ({**DEEPSEEK, "qk_nope_head_dim": "64"}, "qk_nope_head_dim='64' must be a positive integer"),
    ({**DEEPSEEK, "n_shared_experts": "2"}, "n_shared_experts='2' must be a non-negative integer"),  # was "22"
])
def test_hf_config_values_of_the_wrong_kind(config, message, tmp_path, capsys):
    path = hf(tmp_path, config)
    err = fails(estimate(path), capsys)
    assert err.startswith(f"meshplan: error: model={path!r}: config.json ") and message in err


def test_unreadable_files_name_the_option(tmp_path, capsys):
    huge = hf(tmp_path, LLAMA).replace("m/config.json", "m/config.json")
    Path(huge).write_text(json.dumps(LLAMA).replace("512", "9" * 5000, 1))
    assert fails(estimate(huge), capsys).endswith(f"model={huge!r}: hidden_size=99999999999999999999… (5,000 "
                                                  "digits) is an integer of more digits than Python converts (4,300)")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b'name = "\xff"\n')
    assert fails(estimate(str(binary)), capsys).endswith(f"model={str(binary)!r}: not UTF-8 text (byte 0xff at 8)")
    assert f"system={str(binary)!r}: not UTF-8 text" in fails(estimate("llama3-8b", str(binary)), capsys)
    runs = tmp_path / "runs.jsonl"
    runs.write_bytes(b"\xff\n")
    assert "validation file=" in fails(["validate", str(runs)], capsys)
    folder = tmp_path / "dir.toml"
    folder.mkdir()
    # quoted whole up to 80 characters, else by its ends (files._shown): a long temporary folder reads shortened
    assert fails(estimate(str(folder)), capsys).endswith(f"model={_shown(str(folder))} is a directory, not a file")
    assert "is a directory, not a file" in fails(estimate("llama3-8b", str(folder)), capsys)
    assert "validation file='' is empty" in fails(["validate", ""], capsys)
    upper = tmp_path / "CONFIG.JSON"  # suffixes in any case: read as JSON, not looked up as a preset
    upper.write_text(json.dumps(LLAMA))
    assert main(estimate(str(upper), "h100", "--json")) == 0


@pytest.mark.parametrize(("text", "message"), [
    (SMALL + 'tied_embeddings = "false"\n', "tied_embeddings='false' must be true or false"),
    (SMALL.replace('name = "x"', "name = 5"), "name=5 must be a string"),
    (SMALL.replace("num_layers = 2", 'num_layers = "2"'), "num_layers='2' must be an integer"),
    (SMALL + "moe_topk = 2\n", "moe_topk=2 needs num_experts > 0"),
    (SMALL + "num_experts = 4\nmoe_topk = 2\nfirst_k_dense_layers = 5\n",
     "first_k_dense_layers=5 leaves no MoE layer of num_layers=2"),
    (SMALL.replace("hidden_size = 64", "hidden_size = 4294967296"), "hidden_size=4294967296 is outside 1 … 1,048,576"),
])
def test_model_toml_fields(text, message, tmp_path, capsys):
    path = tmp_path / "model.toml"
    path.write_text(text)
    err = fails(estimate(str(path)), capsys)
    assert err.startswith(f"meshplan: error: model={str(path)!r}: ") and message in err


@pytest.mark.parametrize(("old", "new", "message"), [
    ('hbm_bandwidth = "3.35 TB/s"', 'hbm_bandwidth = "- TB/s"', "hbm_bandwidth='- TB/s' is not a quantity"),
    ('hbm_bandwidth = "3.35 TB/s"', "hbm_bandwidth = inf", "hbm_bandwidth=inf is not a quantity"),
    ("[network]\n", "[spare]\n", "missing table [network]"),
    ("fp32 = ", "nope = ", "peak_flops has unknown precision 'nope'"),
    ("matmul_bf16 = 0.803", 'matmul_bf16 = "high"', "matmul_bf16='high' must be a number"),
    ("matmul_bf16 = 0.803", "matmul_bf16 = 3.0", "matmul_bf16=3.0 is outside 1e-09 … 1 (or 0: looked up)"),
    ("tdp_watts = 700", "tdp_watts = -700", "tdp_watts=-700 W is outside 1 … 100,000 W (or 0: unknown)"),
    ("num_sms = 132", "num_sms = 132.5", "num_sms=132.5 must be an integer"),
    ("async_mma = true", 'async_mma = "false"', "async_mma='false' must be true or false"),
    ('host_bandwidth = "55 GB/s"', "host_bandwidth = 0", "host_bandwidth=0.0 B/s is outside 1e+06 … 1e+15 B/s"),
    ('host_bandwidth = "55 GB/s"', "host_bandwidth = -5", "host_bandwidth=-5.0 B/s is outside 1e+06"),
    ('host_memory = "256 GB"', "host_memory = -1", "host_memory=-1.0 B is outside 1e+06 … 1e+15 B"),
    ('nic_latency = "5 us"', "nic_latency = -1", "network: nic_latency=-1.0 s is outside 0 … 1 s"),  # "tier network"
    ("nics_per_gpu = 1 ", 'nics_per_gpu = "1" ', "nics_per_gpu='1' must be a number"),
])
def test_system_toml_fields(old, new, message, tmp_path, capsys):
    path = system(tmp_path, old, new)
    err = fails(estimate("llama3-8b", path, "--offload-optimizer"), capsys)
    assert err.startswith(f"meshplan: error: system={path!r}") and message in err


def test_a_system_table_that_is_not_a_table(tmp_path, capsys):
    path = tmp_path / "system.toml"
    path.write_text("network = 5\n" + H100.read_text().replace("[network]\n", "[spare]\n"))
    assert fails(estimate("llama3-8b", str(path)), capsys).endswith(f"{str(path)!r}.network=5 must be a table "
                                                                     "([network] with its keys)")


@pytest.mark.parametrize(("config", "message"), [
    ({**LLAMA, "num_key_value_heads": 0}, "num_key_value_heads=0 must be a positive integer"),  # was read as MHA
    ({**LLAMA, "model_type": 5}, "model_type=5 must be a string"),  # was read as Llama
    ({**DEEPSEEK, "first_k_dense_replace": 1, "moe_layer_freq": 2},
     "first_k_dense_replace=1 with moe_layer_freq=2 cannot be modelled"),  # MoE layers at [1, 3] vs HF's [2]
])
def test_hf_config_second_round(config, message, tmp_path, capsys):
    assert message in fails(estimate(hf(tmp_path, config)), capsys)


@pytest.mark.parametrize(("text", "message"), [
    (SMALL.replace("num_layers = 2", "num_layers = 2147483647"), "num_layers=2147483647 is outside 1 … 10,000"),
    (SMALL + "q_lora_rank = 64\n", "q_lora_rank=64 needs kv_lora_rank > 0"),
    (SMALL + "router_bias = true\n", "router_bias=True needs num_experts > 0"),
    (SMALL + "moe_layer_freq = 2\n", "moe_layer_freq=2 needs num_experts > 0"),
    (SMALL + "num_experts = 4\nmoe_topk = 2\nshared_expert_gate = true\n", "shared_expert_gate=true needs shared"),
    (SMALL + 'position_embedding = "learned"\nmax_position_embeddings = 10\n',
     "max_position_embeddings=10 is shorter than seq_length=2048"),
])
def test_model_toml_second_round(text, message, tmp_path, capsys):
    path = tmp_path / "model.toml"
    path.write_text(text)
    assert message in fails(estimate(str(path)), capsys)


@pytest.mark.parametrize(("old", "new", "message"), [
    ('hbm_bandwidth = "3.35 TB/s"', "hbm_bandwidth = 1e-300", "hbm_bandwidth=1e-300 B/s is outside 1e+06 … 1e+17"),
    ('bf16 = "989 TFLOP/s"', 'bf16 = "1e-300 TFLOP/s"', "peak_flops.bf16=1e-288 FLOP/s is outside 1e+06 … 1e+18"),
    ('hbm_bandwidth = "3.35 TB/s"', 'hbm_bandwidth = "3 us"', "hbm_bandwidth='3 us' must be in B/s"),
    ('hbm_bandwidth = "3.35 TB/s"', 'hbm_bandwidth = "3 TB"', "hbm_bandwidth='3 TB' must be in B/s"),
    ('nvlink_latency = "3 us"', 'nvlink_latency = "3 GB/s"', "nvlink_latency='3 GB/s' must be in s"),
    ("tdp_watts = 700", "tdp_watts = 700\nbogus = 1",  # 25 fields: too many to list, where they are documented
     "accelerator: unknown field 'bogus' (the 28 fields are meshplan.specs.hardware.Accelerator's)"),
    ("nics_per_gpu = 1 ", "nics_per_gpu = 1e300 ", "nics_per_gpu=1e+300 is outside 0.001 … 64"),  # bandwidth=inf
])
def test_system_toml_second_round(old, new, message, tmp_path, capsys):
    path = system(tmp_path, old, new)
    err = fails(estimate("llama3-8b", path), capsys)
    assert message in err and err.count(f"system={path!r}") == 1, err  # the file named once, not twice


@pytest.mark.parametrize(("config", "message"), [
    ({"model_type": "gpt2", "n_embd": 2**31, "n_layer": 2, "n_head": 4, "n_positions": 1024, "vocab_size": 100},
     "config.json n_embd → hidden_size=2147483648 is outside 1 … 1,048,576"),
    ({**LLAMA, "model_type": "mixtral", "num_local_experts": 1, "num_experts_per_tok": 2},
     "config.json num_experts_per_tok → moe_topk=2 must be in 1..num_experts=1"),
    ({**QWEN_MOE, "mlp_only_layers": [0, 1, 2, 3, 4, 5]},
     "config.json mlp_only_layers → first_k_dense_layers=6 leaves no MoE layer of num_layers=4"),
])
def test_hf_errors_name_the_config_key(config, message, tmp_path, capsys):
    """ModelSpec checks values under its own names; for a config.json the message also names the key read."""
    path = hf(tmp_path, config)
    assert fails(estimate(path), capsys) == f"meshplan: error: model={path!r}: {message}"


@pytest.mark.parametrize(("key", "value", "message"), [
    ("nics_per_gpu", "1e-320", "nics_per_gpu=1e-320 is outside 0.001 … 64"),  # was "step time nan s", exit 0
    ("nic_latency", "1.7e308", "nic_latency=1.7e+308 s is outside 0 … 1 s"),  # was NaN
    ("nvlink_latency", "1.7e308", "nvlink_latency=1.7e+308 s is outside 0 … 1 s"),  # was inf
    ("matmul_bf16", "1e-320", "matmul_bf16=1e-320 is outside 1e-09 … 1 (or 0: looked up)"),  # was NaN
    ("tdp_watts", "1e-320", "tdp_watts=1e-320 W is outside 1 … 100,000 W (or 0: unknown)"),  # ZeroDivisionError
    ("matmul_watts", "1e-320", "matmul_watts=1e-320 W is outside 1 … 100,000 W (or 0: unknown)"),
    ("exp_rate", "1e-320", "exp_rate=1e-320 is outside 0.1 … 10"),
])
def test_extreme_hardware_values_are_one_line_before_any_arithmetic(key, value, message, tmp_path, capsys):
    text = H100.read_text()
    line = next((ln for ln in text.splitlines() if ln.startswith(f"{key} =")), None)
    path = tmp_path / "system.toml"
    if line is None:  # a field the preset leaves at its default
        path.write_text(text.replace("[accelerator]\n", f"[accelerator]\n{key} = {value}\n", 1))
    else:
        path.write_text(text.replace(line, f"{key} = {value}", 1))
    for command in (estimate("llama3-8b", str(path)), ["plan", "--model", "llama3-8b", "--system", str(path),
                                                         "--gpus", "16"]):
        assert fails(command, capsys).endswith(message)
