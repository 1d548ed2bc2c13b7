"""Bad input of every kind a fuzzing review found: one line naming the field and the value, exit status 2.

Each case is a command line (and the files it reads) with the words its error must contain. Before these fixes
each one ended in a traceback, a hang, silently wrong output or a vague message; ``meshplan: internal error``
(the safety net for bugs) must not appear either.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from meshplan.cli import main
from meshplan.errors import SpecError
from meshplan.files import read_text, write_text
from meshplan.search.combos import divisors
from meshplan_validation.records import runs_from_command_line

H100 = Path(__file__).parents[1] / "src" / "meshplan" / "presets" / "hardware" / "h100.toml"
LLAMA = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_attention_heads": 8,
         "num_key_value_heads": 4, "num_hidden_layers": 4, "vocab_size": 32000, "max_position_embeddings": 1024}
QWEN_MOE = {**LLAMA, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 256}
DEEPSEEK = {**LLAMA, "model_type": "deepseek_v3", "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
            "kv_lora_rank": 128, "v_head_dim": 64, "n_routed_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 256}
SMALL = 'name = "x"\nnum_layers = 2\nhidden_size = 64\nnum_heads = 4\nffn_hidden_size = 128\nvocab_size = 100\n'


def fails(args: list[str], capsys) -> str:
    """Run the CLI; assert one line on stderr, exit status 2, no traceback and no internal error; the line."""
    code = main(args)
    _, err = capsys.readouterr()
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "internal error" not in err, err
    return err.strip()


def estimate(model: str = "llama3-8b", system: str = "h100", *extra: str) -> list[str]:
    return ["estimate", "--model", model, "--system", system, "--gpus", "8", *extra]


def hf(tmp_path: Path, config: dict, name: str = "m") -> str:
    (tmp_path / name).mkdir()
    path = tmp_path / name / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def system(tmp_path: Path, old: str, new: str) -> str:
    text = H100.read_text()
    assert old in text
    path = tmp_path / "system.toml"
    path.write_text(text.replace(old, new, 1))
    return str(path)


@pytest.mark.parametrize(("extra", "message"), [
    (["--dp", "0"], "dp=0 must be a positive integer"),  # was ZeroDivisionError
    (["--dp", "-64"], "dp=-64 must be a positive integer"),  # was reported as global_batch=-64
    (["--global-batch", "0"], "global-batch=0 must be a positive integer"),  # was silently dp × micro-batch
    (["--recompute-layers", "3"], "recompute_layers=3 needs recompute='full' (got 'selective')"),
    (["--recompute", "full", "--recompute-layers", "300"], "recompute_layers=300 is more than the 32 layers"),
    (["--seq", "100000000000000000000"], "seq=100000000000000000000 must be a positive integer up to"),
    (["--recompute-modules", "attn"], "recompute-modules=attn has 'attn': the modules are core_attn"),
    (["--recompute", "full", "--recompute-modules", "mlp"], "recompute-modules=mlp needs --recompute selective"),
    (["--recompute-modules", "mla_up_proj"], "recompute_modules mla_up_proj needs multi-head latent attention"),
    (["--last-stage-layers", "2"], "last_stage_layers=2 needs pp > 1"),
    (["--pp", "4", "--last-stage-layers", "-1"], "last-stage-layers=-1 is outside 1 … 10,000 (or 0: an even split)"),
    (["--pp", "4", "--last-stage-layers", "31"], "last_stage_layers=31 leaves 1 of num_layers=32"),
])
def test_estimate_options(extra, message, capsys):
    assert message in fails(estimate("llama3-8b", "h100", *extra), capsys)


def test_ring_context_parallelism_of_a_windowed_model_says_what_to_use(capsys):
    message = fails(estimate("gpt-oss-20b", "h100", "--cp", "2"), capsys)
    assert "cp=2 with cp_comm='ring' cannot run sliding-window attention (sliding_window=128)" in message
    assert "--cp-comm allgather" in message
    assert main(estimate("gpt-oss-20b", "h100", "--cp", "2", "--cp-comm", "allgather", "--json")) == 0


@pytest.mark.parametrize(("extra", "message"), [
    (["--gpus", "8", "--global-batch", "0"], "global-batch=0 must be a positive integer"),
    (["--gpus", "1000000000"], "gpus=1000000000 is more than 1,048,576"),  # was a hang (divisors in O(n))
    (["--gpus", "8", "--top", "100000000"], "top=100000000 is outside 1 … 1,000"),  # was 50 s
    (["--gpus", "8", "--tokens", "1e400"], "tokens='1e400' is not a count from 1 to 1e+18"),  # was Infinity in JSON
    (["--gpus", "8", "--tokens", "15T", "--price", "nan"], "price=nan must be a number from 0 to 1e+06"),
    (["--gpus", "8", "--tokens", "15T", "--price", "inf"], "price=inf must be a number from 0 to 1e+06"),
    (["--gpus", "8", "--tokens", ""], "tokens='' is not a count from 1"),  # was ignored
    (["--gpus", "8", "--rank", "cost"], "rank=cost needs --tokens"),  # was ranked by time
    (["--gpus", "8", "--seq", "100000000000000000000"], "seq=100000000000000000000 must be"),  # OverflowError
    (["--gpus", "8", "--recompute-modules", "moe,moe"], "recompute-modules=moe,moe names a module twice"),
    (["--gpus", "8", "--recompute", "none", "--recompute-modules", "moe"],
     "recompute-modules=moe needs selective among --recompute (got none)"),
])
def test_plan_options(extra, message, capsys):
    assert message in fails(["plan", "--model", "llama3-8b", "--system", "h100", *extra], capsys)


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
    assert fails(estimate(str(folder)), capsys).endswith(f"model={str(folder)!r} is a directory, not a file")
    assert "is a directory, not a file" in fails(estimate("llama3-8b", str(folder)), capsys)
    assert "validation file='' is empty" in fails(["validate", ""], capsys)
    upper = tmp_path / "CONFIG.JSON"  # suffixes in any case: read as JSON, not looked up as a preset
    upper.write_text(json.dumps(LLAMA))
    assert main(estimate(str(upper), "h100", "--json")) == 0


@pytest.mark.parametrize(("record", "message"), [
    ({"id": None, "model": {"name": "llama3-8b"}}, "runs.jsonl:1: a record must be an object with a non-empty"),
    ({"id": "", "model": {"name": "llama3-8b"}}, "non-empty string 'id'"),
])
def test_validate_records_need_an_id(record, message, tmp_path, capsys):
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps(record) + "\n")
    assert message in fails(["validate", str(runs)], capsys)


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


def test_report_without_matplotlib_checks_its_input_first(capsys, tmp_path, monkeypatch):
    """The README's test command installs no plot extra: bad input still gets its own line, good input the hint."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.chdir(tmp_path)
    report = ["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8"]
    assert "scaling='12,20': 12 GPUs is not" in fails([*report, "--scaling", "12,20"], capsys)
    assert "the search space of llama3-8b on 8 GPUs holds" in fails([*report, "--max-plans", "100"], capsys)
    assert fails(report, capsys) == "meshplan: error: matplotlib is not installed: run  pip install 'meshplan[plot]'"
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize(("output", "message"), [
    ("", "output='.' is a directory, not a file"),  # click reads "" as "."
    ("/proc/x.html", "output='/proc/x.html': "),  # permission denied, or (as root) the write itself fails
])
def test_report_output_that_cannot_be_written(output, message, capsys):
    if output.startswith("/proc") and not Path("/proc/self").is_dir():
        pytest.skip("needs Linux /proc")
    if output.startswith("/proc"):  # as root only the write itself fails, after the pictures are drawn
        pytest.importorskip("matplotlib", reason="as root the write fails only after drawing: needs meshplan[plot]")
    assert message in fails(["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "-o", output],
                            capsys)


def test_a_system_table_that_is_not_a_table(tmp_path, capsys):
    path = tmp_path / "system.toml"
    path.write_text("network = 5\n" + H100.read_text().replace("[network]\n", "[spare]\n"))
    assert fails(estimate("llama3-8b", str(path)), capsys).endswith(f"{str(path)!r}.network=5 must be a table "
                                                                     "([network] with its keys)")


def test_output_paths_that_are_not_what_they_seem(tmp_path, capsys):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    report = ["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "-o"]
    assert f"{str(a_file)!r} is a file, not a directory" in fails([*report, str(a_file / "r.html")], capsys)
    assert f"File {str(tmp_path)!r} is a directory" in fails([*report, str(tmp_path)], capsys)
    sweep = ["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "-o"]
    assert f"Directory {str(a_file)!r} is a file" in fails([*sweep, str(a_file)], capsys)
    assert f"{str(a_file)!r} is a file, not a directory" in fails([*sweep, str(a_file / "sub")], capsys)


def test_a_failing_write_is_one_line(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    with pytest.raises(SpecError, match=r"^output='/dev/full': cannot write: no space left on device$"):
        write_text("/dev/full", "report", "output")
    with pytest.raises(SpecError, match="is a directory, not a file"):
        read_text(tmp_path, "model")


@pytest.mark.parametrize(("extra", "message"), [
    (["--factors", "1,2"], "factors=1,2 needs --param"),  # was silently a strong-scaling sweep
    (["--param", "hbm_bandwidth", "--factors", "1e308"], "factors='1e308' must be numbers from 1e-06 to 1e+06"),
])
def test_sweep_factors(extra, message, tmp_path, capsys):
    args = ["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "-o", str(tmp_path / "s"), *extra]
    assert message in fails(args, capsys)


@pytest.mark.parametrize(("extra", "message"), [
    (["--world-size", "1000000"], "world-size=1000000 is more than the 64 local ranks"),  # forked without bound
    (["--mesh", "100000x100000x100000"], "ranks is more than the 64 local ranks"),  # was MemoryError
    (["--out", ""], "out='' must end in .toml"),
])
def test_calibrate_sizes_are_bounded_before_forking(extra, message, capsys):
    assert message in fails(["calibrate", "--quick", *extra], capsys)


def test_divisors_in_square_root_time():
    """Pairs (d, n/d) with d ≤ √n: 36 → 1 2 3 4 6 | 9 12 18 36 (6·6 once); 2^20 · 3 has 21 · 2 divisors."""
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert divisors(1) == [1] and divisors(97) == [1, 97]
    assert len(divisors(3 * 2**20)) == 42 and divisors(10**12)[-1] == 10**12


def test_a_bug_is_one_line_with_exit_status_3(monkeypatch, capsys):
    """The safety net: an unexpected exception (a bug, not bad input) still prints one line, says how to see
    the traceback, and exits 3; MESHPLAN_DEBUG=1 re-raises it."""
    import meshplan.estimate

    def broken(*args, **kwargs):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(meshplan.estimate, "estimate", broken)
    assert main(estimate()) == 3
    err = capsys.readouterr().err
    assert err.startswith("meshplan: internal error: ZeroDivisionError: float division by zero (a bug")
    assert len(err.strip().splitlines()) == 1
    monkeypatch.setenv("MESHPLAN_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(estimate())


# ---- the second round of fuzzing --------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "message"), [
    (estimate("llama3-8b", "h100", "--global-batch", "9223372036854775808"), "global-batch=9223372036854775808 must"),
    (estimate("llama3-8b", "h100", "--micro-batch", "100000000000000000000"), "micro-batch=100000000000000000000"),
    (["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--global-batch", "100000000000000000"],
     "global-batch=100000000000000000 must be a positive integer up to 2,147,483,647"),  # was a 40 s hang
    (["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--tokens", "1e300", "--price", "1e300"],
     "tokens='1e300' is not a count from 1 to 1e+18"),  # was "cost": Infinity
    (["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--tokens", "15T", "--price", "1e300"],
     "price=1e+300 must be a number from 0 to 1e+06"),
    (["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8,,16"], "gpus='8,,16' must be integers"),
    (["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--sp", "on,,"], "sp='' must be one of"),
    (estimate("llama3-8b", "h100", "--offload-layers", "100"), "offload_layers=100 is more than the 32 layers"),
    (estimate("llama3-8b", "h100", "--recompute-layers", "-1"),
     "recompute-layers=-1 is outside 1 … 10,000 (or 0: all of them)"),
    (estimate("llama3-8b", "h100", "--etp", "4", "--tp", "8"), "etp=4 but llama3-8b has no experts"),
    (estimate("llama3-8b", "h100", "--lora-targets", "qkv"), "lora-targets=qkv needs --lora-rank"),
    (estimate("../hardware/h100"), "model='../hardware/h100' is not a preset"),
    (["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--scaling", "12,20"],
     "scaling='12,20': 12 GPUs is not a whole number of 8-GPU NVLink domains"),  # was dropped silently
    (["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--seq", "100000000000000000000"],
     "seq=100000000000000000000 must be a positive integer"),  # as estimate and plan say it
    (["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "--format", ""], "format='' must be"),
    (["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "--nvlink", ""], "nvlink='' must be"),
    (["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "--param", "", "--factors", "1,2"],
     "param='' must be one of"),
    (["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "--param", "hbm_bandwidth", "--factors",
      "1e-300"], "factors='1e-300' must be numbers from 1e-06"),
    (["calibrate", "--quick", "--base", ""], "base='' is empty"),
    (["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--max-plans", "-1"],
     "max-plans=-1 must be a count of plans (0: no limit)"),
    (["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--max-plans", "-1"],
     "max-plans=-1 must be a count"),
    (["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "--max-plans", "-1"],
     "max-plans=-1 must be a count"),
    # a space too large is refused before anything runs: the report's own search, a sweep's points
    (["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--max-plans", "100"],
     "the search space of llama3-8b on 8 GPUs holds"),
    (["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8,16", "--max-plans", "100"],
     "the search space of llama3-8b on 8 GPUs holds"),
])
def test_second_round(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert message in fails(args, capsys)


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
    ("tdp_watts = 700", "tdp_watts = 700\nbogus = 1", "accelerator: unknown field 'bogus' (known: "),
    ("nics_per_gpu = 1 ", "nics_per_gpu = 1e300 ", "nics_per_gpu=1e+300 is outside 0.001 … 64"),  # bandwidth=inf
])
def test_system_toml_second_round(old, new, message, tmp_path, capsys):
    path = system(tmp_path, old, new)
    err = fails(estimate("llama3-8b", path), capsys)
    assert message in err and err.count(f"system={path!r}") == 1, err  # the file named once, not twice


def test_a_validation_record_with_an_absurd_batch_is_not_a_bug(tmp_path, capsys):
    """A global batch of 1e308 (an OverflowError before) and a subnormal measurement: skipped, exit 0, and
    nothing on stderr (no internal error, no RuntimeWarning)."""
    record = {"id": "r", "group": "g", "framework": "Megatron-LM",
              "model": {"name": "GPT-1.7B", "num_layers": 24, "hidden_size": 2304, "num_heads": 24,
                        "ffn_hidden_size": 9216, "vocab_size": 51200, "seq_length": 2048},
              "hardware": {"gpu": "A100-SXM4-80GB", "num_gpus": 32, "gpus_per_node": 8},
              "parallel": {"tp": 1, "pp": 1, "dp": 32, "global_batch_size": 1e308},
              "measured": {"model_tflops_per_gpu": 1e-320}}
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps(record) + "\n")
    code = main(["validate", str(runs)])
    out, err = capsys.readouterr()
    assert code == 0 and err == "" and "no comparable measurement" in out, err


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


@pytest.mark.parametrize(("content", "message"), [
    (None, "validation file={path!r}: no such file"),
    ('{"x": 1}\n', "{path}:1: a record must be an object with a non-empty string 'id'"),
])
def test_benchmark_scripts_name_a_bad_runs_file_in_one_line(content, message, tmp_path, monkeypatch):
    """benchmarks/accuracy.py and fit_efficiency.py read their runs file through records.runs_from_command_line:
    a missing or malformed file ends them with one line, not a traceback."""
    path = tmp_path / "runs.jsonl"
    if content is not None:
        path.write_text(content)
    monkeypatch.setattr(sys, "argv", ["accuracy.py", str(path)])
    with pytest.raises(SystemExit) as stop:
        runs_from_command_line(tmp_path / "default.jsonl", "Validate.\n\nMore.")
    assert stop.value.code == "accuracy.py: " + message.format(path=str(path))


# ---- the repros of the what-if review: each a finite answer or one line ----------------------------------------
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


@pytest.mark.parametrize(("value", "message"), [
    ("1024", "grad-bytes=1024 must be 2 or 4 (bytes per gradient: bf16 or fp32)"),  # was "No feasible plan", exit 0
    ("3", "grad-bytes=3 must be 2 or 4"),  # was exit 2 after the whole search
    ("1e30", "Invalid value for '--grad-bytes': '1e30' is not a valid integer."),  # was float32 overflow warnings
])
def test_grad_bytes_is_checked_before_the_search(value, message, capsys, monkeypatch):
    monkeypatch.setattr("meshplan.search.run.search", lambda *a, **k: pytest.fail("searched"))
    assert message in fails(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--grad-bytes",
                             value], capsys)


def test_a_huge_value_is_cut_in_its_message(tmp_path, capsys):
    """A 20,000-character value was echoed whole; now its first 60 characters and its length."""
    err = fails(estimate("x" * 20000), capsys)
    assert len(err) < 300 and "(20,000 characters)" in err
    path = tmp_path / "model.toml"
    path.write_text(SMALL.replace('name = "x"', 'name = "x"\nmlp = "' + "y" * 20000 + '"'))
    err = fails(estimate(str(path)), capsys)
    assert len(err) < 400 and "(20,000 characters)" in err and "mlp=" in err


def test_a_gpu_without_bf16_runs_its_own_16_bit_precision(capsys):
    """``--system v100`` failed until ``--precision fp16`` was given; the default is what the GPU has."""
    for command in (estimate("gpt2", "v100"), ["plan", "--model", "gpt2", "--system", "v100", "--gpus", "8",
                                               "--zero", "1", "--placements", "default", "--no-offload"]):
        code = main([*command, "--json"])
        out, err = capsys.readouterr()
        assert code == 0 and err == "", err
        data = json.loads(out)
        plan = data["plan"] if "plan" in data else data["plans"][0]["plan"]
        assert plan["precision"] == "fp16"


def test_a_squared_relu_model_runs_eagerly(tmp_path, capsys):
    """mlp = "relu2" with --fusion eager raised KeyError (exit 3): its relu and square kernels are costed."""
    path = tmp_path / "model.toml"
    path.write_text(SMALL + 'mlp = "relu2"\n')
    for fusion in ("fused", "eager"):
        code = main(estimate(str(path), "h100", "--fusion", fusion, "--json"))
        out, err = capsys.readouterr()
        assert code == 0 and err == "", err
    assert json.loads(out)["step_time_s"] > 0


def test_ordinary_searches_print_no_numpy_warnings(capsys):
    """NumPy RuntimeWarnings reached stderr in ordinary plan runs: none, warnings raised as errors."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for model, system in (("llama3-70b", "h100"), ("mixtral-8x7b", "b200"), ("gpt3-175b", "v100")):
            code = main(["plan", "--model", model, "--system", system, "--gpus", "64", "--global-batch", "256"])
            out, err = capsys.readouterr()
            assert code == 0 and err == "", (model, err)
