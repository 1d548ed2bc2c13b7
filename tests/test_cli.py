"""The command line: a real estimate, JSON that scripts rely on, one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from meshplan.cli import main


def run(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_with_defaults_only(capsys):
    code, out, _ = run(["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "8"], capsys)
    assert code == 0 and "step time" in out and "MFU" in out


def test_estimate_json_keys(capsys):
    code, out, _ = run(["estimate", "--model", "llama3-70b", "--system", "h100", "--gpus", "1024", "--tp", "8",
                        "--pp", "4", "--json"], capsys)
    data = json.loads(out)
    assert code == 0
    assert data["params"] == 70_553_706_496
    for key in ("step_time_s", "tokens_per_s", "mfu", "hfu", "peak_memory_bytes"):
        assert data[key] > 0
    assert data["plan"]["dp"] == 1024 // 32


def test_estimate_of_an_eager_pytorch_stack_is_slower(capsys):
    base = ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--json"]
    fused = json.loads(run(base, capsys)[1])
    code, out, _ = run([*base, "--fusion", "eager"], capsys)
    eager = json.loads(out)
    assert code == 0 and eager["stack"]["fusion"] == "eager" and fused["stack"]["fusion"] == "fused"
    assert eager["step_time_s"] > fused["step_time_s"]


def test_estimate_of_grouped_expert_gemms_drops_the_host_floor(capsys):
    base = ["estimate", "--model", "qwen3-30b-a3b", "--system", "b200", "--gpus", "8", "--ep", "8",
            "--precision", "fp8", "--json"]
    per_expert = json.loads(run(base, capsys)[1])
    code, out, _ = run([*base, "--expert-gemm", "grouped"], capsys)
    grouped = json.loads(out)
    assert code == 0 and grouped["stack"]["expert_gemm"] == "grouped"
    assert per_expert["stack"]["expert_gemm"] == "per_expert"
    assert grouped["step_time_s"] < per_expert["step_time_s"]


def test_estimate_with_overlapped_pipeline_sends(capsys):
    """--overlap-pp with an interleaved schedule: each send costs the overlap slowdown (18.9 %) of its time."""
    base = ["estimate", "--model", "llama3-70b", "--system", "h100", "--gpus", "64", "--tp", "4", "--pp", "8",
            "--vpp", "5", "--global-batch", "128", "--framework", "generic", "--json"]
    exposed = json.loads(run(base, capsys)[1])
    code, out, _ = run([*base, "--overlap-pp"], capsys)
    hidden = json.loads(out)
    assert code == 0 and hidden["stack"]["overlap_pp"] and not exposed["stack"]["overlap_pp"]
    assert hidden["breakdown_s"]["pp"] == pytest.approx(0.189 * exposed["breakdown_s"]["pp"])
    assert hidden["step_time_s"] < exposed["step_time_s"]
    code, out, _ = run(["plan", "--model", "llama3-70b", "--system", "h100", "--gpus", "64", "--global-batch", "128",
                        "--top", "1", "--overlap-pp", "--json"], capsys)
    assert code == 0 and json.loads(out)["plans"]


def test_estimate_with_fp8_attention(capsys):
    """--attention-kernel fp8: cuDNN's FP8 attention, faster than the bf16 kernel, and only with an fp8 precision
    (one line naming the setting otherwise); the search takes the same setting."""
    base = ["estimate", "--model", "llama3-70b", "--system", "gb200", "--gpus", "64", "--tp", "2", "--pp", "4",
            "--precision", "fp8", "--json"]
    bf16_kernel = json.loads(run(base, capsys)[1])
    code, out, _ = run([*base, "--attention-kernel", "fp8"], capsys)
    fp8_kernel = json.loads(out)
    assert code == 0 and fp8_kernel["stack"]["attention_kernel"] == "fp8"
    assert fp8_kernel["step_time_s"] < bf16_kernel["step_time_s"]
    code, out, err = run(["estimate", "--model", "llama3-70b", "--system", "gb200", "--gpus", "64", "--tp", "2",
                          "--attention-kernel", "fp8"], capsys)
    assert code == 2 and not out and err.count("\n") == 1
    assert "attention_kernel=fp8" in err and "precision=bf16" in err
    code, out, _ = run(["plan", "--model", "llama3-70b", "--system", "gb200", "--gpus", "64", "--precision", "fp8",
                        "--attention-kernel", "fp8", "--top", "1", "--json"], capsys)
    assert code == 0 and json.loads(out)["plans"]


def test_estimate_of_an_fsdp_stack_adds_its_gradient_preparation(capsys):
    """--fsdp fsdp1: 18 bytes per parameter per micro-batch in the backward pass make the step slower."""
    base = ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--zero", "3", "--json"]
    plain = json.loads(run(base, capsys)[1])
    code, out, _ = run([*base, "--fsdp", "fsdp1"], capsys)
    fsdp = json.loads(out)
    assert code == 0 and fsdp["stack"]["fsdp"] == "fsdp1" and plain["stack"]["fsdp"] == "none"
    assert fsdp["step_time_s"] > plain["step_time_s"]
    code, _, err = run([*base, "--fsdp", "fsdp3"], capsys)
    assert code != 0 and "fsdp3" in err
    code, _, err = run(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--zero", "1",
                        "--fsdp", "fsdp2"], capsys)
    assert code == 2 and "zero=1: framework megatron-core (fsdp=fsdp2) runs none of them" in err
    assert len(err.strip().splitlines()) == 1


def test_estimate_with_the_torch_pipeline_runtime_keeps_its_per_micro_batch_tensors(capsys):
    """--pipeline-runtime torch: the last rank keeps m bf16 logits (the default loss keeps them in 16 bits) and
    2·m layer inputs all step; the step time does not change."""
    base = ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "16", "--tp", "2", "--pp", "2",
            "--global-batch", "16", "--recompute", "full", "--json"]
    plain = json.loads(run(base, capsys)[1])
    code, out, _ = run([*base, "--pipeline-runtime", "torch"], capsys)
    torch_rt = json.loads(out)
    assert code == 0 and torch_rt["stack"]["pipeline_runtime"] == "torch"
    # dp = 4, m = 16 / 4 = 4 micro-batches of 8192 tokens; logits 8192 × 128256 / 2 × 2 B, a layer input
    # 8192 / 2 tokens × 4096 × 2 B
    m, logits, layer_input = 4, 8192 * 128256 / 2 * 2, 8192 / 2 * 4096 * 2
    kept = torch_rt["rank_memory_bytes"]["last"] - plain["rank_memory_bytes"]["last"]
    assert kept == pytest.approx(m * logits + 2 * m * layer_input)
    assert torch_rt["step_time_s"] == plain["step_time_s"]


def test_hf_config_model(capsys, tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_attention_heads": 8,
           "num_key_value_heads": 4, "num_hidden_layers": 4, "vocab_size": 32000, "max_position_embeddings": 1024,
           "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, out, _ = run(["estimate", "--model", str(path), "--system", "a100", "--gpus", "8", "--json"], capsys)
    assert code == 0 and json.loads(out)["step_time_s"] > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "nope", "--system", "h100", "--gpus", "8"], "model='nope' is not a preset"),
    (["--model", "llama3-8b", "--system", "h999", "--gpus", "8"], "system='h999' is not a preset"),
    (["--model", "llama3-70b", "--system", "h100", "--gpus", "48", "--tp", "6"], "tp=6 does not divide num_heads=64"),
    (["--model", "llama3-8b", "--system", "h100", "--gpus", "16", "--dp", "3"], "!= gpus=16"),
    (["--model", "llama3-8b", "--system", "h100", "--gpus", "0"], "gpus=0 must be a positive integer"),
    (["--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--tp", "-2"], "tp=-2 must be a positive"),
    (["--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--seq", "0"], "seq=0 must be a positive"),
    (["--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--zero", "7"], "zero=7 must be 0, 1, 2 or 3"),
    (["--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--recompute", "some"], "'some' is not one of"),
    (["--model", "llama3-8b", "--system", "h100", "--gpus", "eight"], "'eight' is not a valid integer"),
    (["--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--placement", "tp,foo"],
     "placement=tp,foo must order each of tp, cp, dp, pp once"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, out, err = run(["estimate", *args], capsys)
    assert code == 2
    assert err.count("\n") == 1 and message in err, err
    assert "Traceback" not in err


def test_malformed_files(capsys, tmp_path):
    bad_json = tmp_path / "config.json"
    bad_json.write_text("{not json")
    bad_toml = tmp_path / "model.toml"
    bad_toml.write_text("name = \n")
    for path, message in ((bad_json, "malformed JSON"), (bad_toml, "malformed TOML")):
        code, _, err = run(["estimate", "--model", str(path), "--system", "h100", "--gpus", "8"], capsys)
        assert code == 2 and message in err and err.count("\n") == 1
    code, _, err = run(["estimate", "--model", "llama3-8b", "--system", str(bad_toml), "--gpus", "8"], capsys)
    assert code == 2 and "malformed TOML" in err
    not_a_config = tmp_path / "wrong.json"
    not_a_config.write_text('{"foo": 1}')
    code, _, err = run(["estimate", "--model", str(not_a_config), "--system", "h100", "--gpus", "8"], capsys)
    assert code == 2 and err.strip().startswith(f"meshplan: error: model={str(not_a_config)!r}: no model_type and")


def test_console_script_exit_code():
    proc = subprocess.run([sys.executable, "-m", "meshplan.cli", "estimate", "--model", "nope", "--system", "h100",
                           "--gpus", "8"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("meshplan: error:") and "Traceback" not in proc.stderr


END_PROBE = ("import atexit, sys\n"
             "sys.argv[0] = '/usr/bin/meshplan'\n"  # the console script's condition (meshplan/cli/__init__.py)
             "def ran():\n"  # called by the interpreter's own exit: no Python frame above it
             "    above = sys._getframe().f_back\n"
             "    print('atexit ran from', above.f_code.co_name if above else 'the interpreter', file=sys.stderr)\n"
             "atexit.register(ran)\n"
             "from meshplan.cli import run\n"
             "sys.argv[1:] = sys.argv[1].split()\n"
             "run()\n")


@pytest.mark.parametrize(("args", "status"), [("estimate --model llama3-8b --system h100 --gpus 8 --json", 0),
                                              ("estimate --model nope --system h100 --gpus 8", 2)])
def test_the_console_script_ends_without_the_teardown(args, status):
    """cli/main.py's _exit_now: the whole output and the exit status, atexit's functions run (by it, then
    os._exit: not by the interpreter's exit, whose teardown frees every object one by one)."""
    proc = subprocess.run([sys.executable, "-c", END_PROBE, args], capture_output=True, text=True)
    assert proc.returncode == status and "atexit ran from _exit_now" in proc.stderr
    if status == 0:
        assert json.loads(proc.stdout)["step_time_s"] > 0
    else:
        assert proc.stdout == "" and proc.stderr.startswith("meshplan: error:")


def test_estimate_offloads_some_layers(capsys):
    base = ["estimate", "--model", "llama3-70b", "--system", "gb200", "--gpus", "64", "--zero", "3", "--json"]
    code, out, _ = run([*base, "--offload-layers", "40"], capsys)
    plan = json.loads(out)["plan"]
    assert code == 0 and plan["offload_activations"] and plan["offload_layers"] == 40
    code, _, err = run([*base, "--offload-layers", "-1"], capsys)
    assert code != 0 and "offload-layers=-1 is outside 1 … 10,000 (or 0: all of them)" in err


def test_plan_searches_with_the_stacks_expert_gemm(capsys):
    base = ["plan", "--model", "qwen3-30b-a3b", "--system", "b200", "--gpus", "8", "--global-batch", "64",
            "--precision", "fp8", "--top", "1", "--no-offload", "--placements", "default", "--json"]
    # (pinned: without --expert-gemm, plan searches both where the framework has them, tests/test_switches.py)
    per_expert = json.loads(run([*base, "--expert-gemm", "per_expert"], capsys)[1])
    code, out, _ = run([*base, "--expert-gemm", "grouped"], capsys)
    grouped = json.loads(out)
    assert code == 0 and grouped["plans"][0]["stack"]["expert_gemm"] == "grouped"
    assert grouped["plans"][0]["step_time_s"] < per_expert["plans"][0]["step_time_s"]


@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_mxfp8_on_a_gpu_without_block_scaled_tensor_cores_is_one_line(command, capsys):
    code, out, err = run([command, "--model", "llama3-8b", "--system", "h100", "--gpus", "8",
                          "--precision", "mxfp8"], capsys)
    assert code == 2 and out == ""
    assert err.strip() == ("meshplan: error: precision=mxfp8 is not supported by H100 SXM5 80GB "
                           "(it has bf16, fp32, fp8, tf32)")


def test_mxfp8_on_blackwell_is_slower_than_per_tensor_fp8(capsys):
    base = ["estimate", "--model", "llama3-8b", "--system", "b200", "--gpus", "8", "--json"]
    fp8 = json.loads(run([*base, "--precision", "fp8"], capsys)[1])
    mx = json.loads(run([*base, "--precision", "mxfp8"], capsys)[1])
    # block-scaled GEMMs at 163.5 / 171.9 of the FP8 rate and 1.8x slower quantization: at most the GEMMs-plus-
    # quantization ratio TE measures against delayed scaling (215.6 / 187.2 ms, B300), the rest of the step the same
    assert 1.0 < mx["step_time_s"] / fp8["step_time_s"] < 215.608 / 187.246


def test_current_fp8_scaling_costs_an_amax_read_in_estimate_and_plan(capsys):
    for command, extra, pick in (("estimate", [], lambda d: d),
                                 ("plan", ["--top", "1", "--no-offload", "--placements", "default"],
                                  lambda d: d["plans"][0])):
        base = [command, "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--global-batch", "64",
                "--precision", "fp8", *extra, "--json"]
        delayed = pick(json.loads(run(base, capsys)[1]))
        code, out, _ = run([*base, "--fp8-scaling", "current"], capsys)
        current = pick(json.loads(out))
        assert code == 0 and delayed["stack"]["fp8_scaling"] == "delayed"
        assert current["stack"]["fp8_scaling"] == "current"
        assert current["step_time_s"] > delayed["step_time_s"]


def test_estimate_prices_lora_fine_tuning(capsys):
    """--lora-rank freezes the base weights: no weight-gradient GEMMs, and gradients / optimizer state only for the
    adapters (qkv only: r·(h + q + 2·kv) = 16·(4096 + 4096 + 2·1024) = 163,840 parameters per layer, 32 layers;
    fp32 gradients, 4 bytes each, replicated over the 8 data-parallel ranks)."""
    base = ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--json"]
    full = json.loads(run(base, capsys)[1])
    lora = json.loads(run([*base, "--lora-rank", "16", "--lora-targets", "qkv"], capsys)[1])
    assert (lora["plan"]["finetune"], lora["plan"]["lora_rank"], lora["plan"]["lora_targets"]) == ("lora", 16, "qkv")
    assert lora["step_time_s"] < full["step_time_s"]
    assert lora["memory_bytes"]["grads"] == 4 * 32 * 16 * (4096 + 4096 + 2 * 1024)
    code, out, err = run([*base, "--lora-rank", "-3"], capsys)
    assert code == 2 and err.strip() == ("meshplan: error: lora-rank=-3 is outside 1 … 65,536 (or 0: full training "
                                         "(the --lora-rank option))")


@pytest.mark.parametrize(("extra", "message"), [
    (["--tokens", "-5T", "--price", "2"], "tokens='-5T' is not a count from 1 to 1e+18 like '15T'"),
    (["--tokens", "80 GiB", "--price", "2"], "tokens='80 GiB' is not a count from 1"),
    (["--tokens", "15Q"], "tokens='15Q' is not a count from 1"),
    (["--price", "2"], "price=2.0 needs --tokens"),
])
def test_plan_budget_is_a_positive_token_count(capsys, extra, message):
    code, _, err = run(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", *extra], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_model_file_missing_fields_names_them(capsys, tmp_path):
    path = tmp_path / "model.toml"
    path.write_text("num_layers = 2\nhidden_size = 64\n")
    code, _, err = run(["estimate", "--model", str(path), "--system", "h100", "--gpus", "8"], capsys)
    assert code == 2 and err.strip().endswith("missing fields name, num_heads, ffn_hidden_size, vocab_size")


def test_validate_bad_input_is_one_line(capsys, tmp_path):
    """A malformed line names the file and line; a missing file and an unknown group are named too."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text('{"id": "a", "group": "g1", "model": {"name": "llama3-8b"}}\nnot json\n')
    for args, message in ((["validate", str(runs)], "runs.jsonl:2: malformed JSON"),
                          (["validate", str(tmp_path / "none.jsonl")], "no such file")):
        code, _, err = run(args, capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    runs.write_text('{"id": "a", "group": "g1", "model": {"name": "llama3-8b"}}\n')
    code, _, err = run(["validate", str(runs), "--group", "g2"], capsys)
    assert code == 2 and "group='g2' is not in" in err and "(groups: g1)" in err
    runs.write_text('{"id": "a", "model": {"name": "llama3-8b"}}\n')
    code, _, err = run(["validate", str(runs), "--group", "g2"], capsys)
    assert code == 2 and "no record names a group" in err
    runs.write_text("\n")
    code, _, err = run(["validate", str(runs)], capsys)
    assert code == 2 and "no records" in err and len(err.strip().splitlines()) == 1


def test_estimate_overlaps_the_expert_all_to_alls_when_asked(capsys):
    base = ["estimate", "--model", "mixtral-8x7b", "--system", "h100", "--gpus", "16", "--ep", "8", "--json"]
    exposed = json.loads(run(base, capsys)[1])
    code, out, _ = run([*base, "--overlap-ep"], capsys)
    overlapped = json.loads(out)
    assert code == 0 and overlapped["stack"]["overlap_ep"] and not exposed["stack"]["overlap_ep"]
    assert overlapped["breakdown_s"]["ep"] < exposed["breakdown_s"]["ep"]
