"""``meshplan serve`` answers or refuses, never a NaN nor a silent no-op: a format the GPU lacks, sizes no instance
fits, a time target without its unit or out of range, options that would have no effect and contexts past the
model's are one line and exit 2 naming the field; a fixed configuration says whether it meets each target, and one
that does not fit says why and prices nothing."""

from __future__ import annotations

import json

import pytest

from meshplan import load_model, load_system
from meshplan.cli.main import main
from meshplan.errors import SpecError
from meshplan.serve.check import targets
from meshplan.serve.precision import Quant, formats_run, half_formats, native, parse_quant, unsupported
from meshplan.units import parse_duration

IO = ["--input-len", "1024", "--output-len", "256"]
BIG = ["serve", "--model", "llama3-70b", "--system", "h100", "--gpus", "8", *IO]
SMALL = ["serve", "--model", "llama3-8b", "--system", "v100", "--gpus", "8", "--input-len", "512",
         "--output-len", "128"]
AXES = ["--tp", "8", "--pp", "1", "--dpa", "1", "--ep", "1", "--batch", "64", "--replicas", "1",
        "--prefill-replicas", "0"]


def refusal(capsys, args: list[str]) -> str:
    """The one line of an exit-2 refusal."""
    code = main(args)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and not out and len(lines) == 1 and lines[0].startswith("meshplan: error: "), (code, out, err)
    return lines[0]


def answer(capsys, args: list[str]) -> str:
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 0 and not err, err
    return out


# ---- 1. formats the GPU lacks -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("system", "quant", "lacks", "runs"), [
    ("h100", "fp4", "no tensor cores for fp4 activations", "bf16, fp16, fp8, int8"),
    ("a100", "fp8", "no tensor cores for fp8 activations", "bf16, fp16, int8"),
    ("v100", "bf16", "has no bf16", "in fp16 (")])
@pytest.mark.parametrize("fixed", [True, False])
def test_a_format_the_gpu_lacks_is_refused_naming_what_it_runs(capsys, system, quant, lacks, runs, fixed):
    args = [*BIG[:4], system, *BIG[5:], "--quant", quant] + (AXES if fixed else [])
    line = refusal(capsys, args)
    assert f"quant={quant}" in line and lacks in line and runs in line


def test_the_16_bit_format_is_the_gpus_own():
    """V100 (Volta) has fp16 tensor cores and no bf16 (its datasheet), as ``estimate --precision`` has it: a single
    format's unsaid 16-bit parts are fp16 there; an explicit bf16 anywhere is a format it lacks."""
    v100, h100 = (load_system(s).cluster(8).accelerator for s in ("v100", "h100"))
    assert half_formats(v100) == ("fp16",) and half_formats(h100) == ("bf16", "fp16")
    assert parse_quant("int4", "fp16") == Quant(weights="int4", activations="fp16", kv_cache="fp16")
    assert native(v100, Quant(weights="int4")) == Quant(weights="int4", activations="fp16", kv_cache="fp16")
    assert native(h100, Quant(weights="int4")) == Quant(weights="int4")
    assert unsupported(v100, Quant(kv_cache="fp16", weights="fp16", activations="fp16")) == ""
    assert "bf16" in unsupported(v100, Quant(weights="fp16", activations="fp16"))  # the KV cache in bf16
    assert formats_run(v100) == "fp16" and formats_run(load_system("b200").cluster(8).accelerator).endswith("fp4")


def test_the_default_search_on_a_v100_serves_fp16(capsys):
    """The tester's command listed int4/bf16/bf16 first on a V100; now every plan is in fp16 and none in bf16."""
    d = json.loads(answer(capsys, SMALL + ["--top", "5", "--json"]))
    labels = {f"{p['plan']['weights']}/{p['plan']['activations']}/{p['plan']['kv_cache']}" for p in d["plans"]}
    assert labels and not any("bf16" in label for label in labels), labels
    assert all(p["plan"]["activations"] == "fp16" for p in d["plans"])


def test_the_search_still_tallies_the_formats_the_gpu_lacks(capsys):
    """Every scheme (--quant all) on an H100 includes NVFP4: rejected with its reason, never ranked."""
    d = json.loads(answer(capsys, ["serve", "--model", "llama3-8b", "--system", "h100", "--gpus", "8",
                                   "--input-len", "512", "--output-len", "128", "--top", "3", "--json",
                                   "--quant", "all"]))
    assert d["rejected"]["reasons"]["the GPU has no tensor cores for the activations' format"] > 0
    assert all(p["plan"]["activations"] != "fp4" for p in d["plans"])


# ---- 2. sizes no instance fits ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("sizes", "says"), [
    (["--gpus", "7", "--tp", "8"], "tp=8 exceeds gpus=7"), (["--gpus", "8", "--tp", "16"], "tp=16 exceeds gpus=8"),
    (["--gpus", "8", "--pp", "100"], "pp=100 exceeds gpus=8"),
    (["--gpus", "8", "--tp", "4,8", "--pp", "4"], "tp·pp·dpa = 4·4·1 = 16")])  # 4 · 4 · 1 = 16 > 8
def test_sizes_no_instance_fits_are_refused(capsys, sizes, says):
    args = ["serve", "--model", "llama3-70b", "--system", "h100", *IO, *sizes]
    assert says in refusal(capsys, args)


# ---- 3. time targets ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "seconds"), [("50ms", 0.05), ("2 s", 2.0), ("1min", 60.0), ("1.5min", 90.0),
                                               ("1h", 3600.0), ("1us", 1e-6), ("250µs", 250e-6)])
def test_a_time_reads_with_its_unit(text, seconds):
    assert parse_duration(text, "tpot-slo", 1e-6, 3600) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize(("text", "says"), [
    ("50", "needs a unit"), ("1ns", "outside 1 us to 1 h"), ("0.5us", "outside 1 us to 1 h"),
    ("1e-9ms", "outside 1 us to 1 h"), ("2h", "outside 1 us to 1 h"), ("5 parsecs", "has unit 'parsecs'"),
    ("-1s", "is not a time"), ("nan", "is not a time")])
def test_a_time_without_unit_or_out_of_range_is_one_line(capsys, text, says):
    line = refusal(capsys, BIG + ["--tpot-slo", text])
    assert f"tpot-slo={text!r}" in line and says in line


def test_an_hour_long_target_is_a_target(capsys):
    d = json.loads(answer(capsys, BIG + ["--tpot-slo", "1h", "--ttft-slo", "1min", "--top", "1", "--json"]))
    assert d["tpot_slo_s"] == 3600 and d["ttft_slo_s"] == 60 and d["plans"]


# ---- 4. targets of a fixed configuration, options without effect, contexts ----------------------------------------
def test_a_fixed_configuration_says_whether_it_meets_each_target(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    d = json.loads(answer(capsys, BIG + AXES + ["--tpot-slo", "1ms", "--ttft-slo", "2s", "--json"]))
    ttft, tpot = d["targets"]
    assert ttft["metric"] == "ttft" and ttft["met"] and ttft["value_s"] == d["ttft_s"] <= 2
    assert tpot["metric"] == "tpot" and not tpot["met"] and tpot["value_s"] == d["tpot_s"] > 0.001
    assert d["fits"] and d["meets_targets"] is False
    out = answer(capsys, BIG + AXES + ["--tpot-slo", "1ms", "--ttft-slo", "2s"])
    assert "> 1 ms: NOT met" in out and "≤ 2 s: met" in out
    assert json.loads(answer(capsys, BIG + AXES + ["--json"]))["meets_targets"] is None  # no target given


def test_targets_closed_form():
    # 20 ms ≤ 50 ms met; 0.8 s > 0.5 s not; one that does not fit meets nothing and has no value
    assert targets(0.8, 0.02, True, 0.5, 0.05) == [
        {"metric": "ttft", "target_s": 0.5, "value_s": 0.8, "met": False},
        {"metric": "tpot", "target_s": 0.05, "value_s": 0.02, "met": True}]
    assert targets(0.1, 0.01, False, 0.0, 0.05) == [{"metric": "tpot", "target_s": 0.05, "value_s": None,
                                                      "met": False}]


@pytest.mark.parametrize(("extra", "says"), [
    (["--replicas", "2"], "replicas=2 applies only with every axis fixed"),
    (["--ep", "2"], "ep=2 applies only with every axis fixed"),
    (["--prefill-replicas", "1"], "prefill-replicas=1 applies only with every axis fixed"),
    (["--dpa", "2"], "dpa=2: llama3-70b is dense"),
    (AXES[:6] + ["--ep", "8"] + AXES[8:], "ep=8: llama3-70b is dense"),
    (AXES + ["--top", "3"], "top: with every axis fixed"), (AXES + ["--rank", "latency"], "rank: with every axis"),
    (AXES + ["--no-disaggregate"], "disaggregate: with every axis fixed"),
    (AXES + ["--quant", "bf16,fp8"], "give one scheme")])
def test_options_without_effect_are_refused(capsys, extra, says):
    assert says in refusal(capsys, BIG + extra)


def test_the_report_with_every_axis_fixed_is_refused(capsys, tmp_path):
    line = refusal(capsys, BIG + AXES + ["--report", str(tmp_path / "r.html")])
    assert "report: with every axis fixed" in line and not (tmp_path / "r.html").exists()


def test_a_context_past_the_models_is_refused_and_seq_serves_a_longer_one(capsys):
    """llama3-70b's seq_length is 8,192 (Meta-Llama-3-70B's max_position_embeddings): 1,000,000 + 256 tokens exceed
    it; --seq sets the context served (vLLM's --max-model-len), below the request's or past a learned table
    refused."""
    args = ["serve", "--model", "llama3-70b", "--system", "h100", "--gpus", "8", "--output-len", "256", "--top", "1"]
    assert load_model("llama3-70b").seq_length == 8192
    line = refusal(capsys, args + ["--input-len", "1000000"])
    assert "input-len + output-len = 1,000,256 tokens exceed llama3-70b's context of 8,192" in line
    assert "1,280 tokens exceed seq=100" in refusal(capsys, args + ["--input-len", "1024", "--seq", "100"])
    d = json.loads(answer(capsys, args + ["--input-len", "16000", "--seq", "16384", "--json"]))
    assert d["plans"] and d["input_len"] == 16000  # 16,000 + 256 = 16,256 ≤ 16,384
    gpt2 = ["serve", "--model", "gpt2", "--system", "h100", "--gpus", "1", "--input-len", "512", "--output-len", "8"]
    assert "max_position_embeddings=1,024" in refusal(capsys, gpt2 + ["--seq", "4096"])


# ---- 5. a fixed configuration that does not fit --------------------------------------------------------------------
def test_one_that_does_not_fit_says_why_and_prices_nothing(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    big = [*AXES[:9], "100000", *AXES[10:]]
    d = json.loads(answer(capsys, BIG + big + ["--tpot-slo", "50ms", "--json"]))
    assert not d["fits"] and d["meets_targets"] is False
    assert all(d[k] is None for k in ("ttft_s", "tpot_s", "e2e_s", "output_tokens_per_s", "running"))
    memory = next(r for r in d["reasons"] if r.startswith("memory"))
    assert "TiB needed" in memory and "left for it of" in memory  # the batch's KV cache against the pool
    assert d["memory"]["kv_cache"] > d["memory"]["kv_pool"]
    out = answer(capsys, BIG + big)
    assert "fits" in out and "NO: " in out and "not priced: the configuration does not fit" in out
    assert "sequences in flight" not in out and "decode step by op" not in out


def test_the_python_api_keeps_its_checks():
    """ServeSpace's targets share the command line's range (ranges.RANGES['slo']), 0 for none."""
    from meshplan.serve.space import ServeSpace

    with pytest.raises(SpecError, match="tpot-slo=1e-09 s is outside"):
        ServeSpace(input_len=1, output_len=1, tpot_slo=1e-9)
    assert ServeSpace(input_len=1, output_len=1, tpot_slo=0.0).tpot_slo == 0.0


def test_the_context_served_is_the_checkpoints_not_the_pretraining_one(capsys):
    """DeepSeek-V3 pretrained at 4,096 tokens but serves 163,840 (its config.json's max_position_embeddings, YaRN):
    an 8,192 + 1,024-token request is served; Llama 3 70B's 8,192 still refuses 1,000,000."""
    from meshplan.cli import main

    args = ["serve", "--model", "deepseek-v3", "--system", "h200", "--gpus", "16", "--input-len", "8192",
            "--output-len", "1024", "--json"]
    assert main(args) == 0
    capsys.readouterr()
    big = ["serve", "--model", "llama3-70b", "--system", "h100", "--gpus", "8", "--input-len", "1000000",
           "--output-len", "16"]
    assert main(big) == 2
    assert "exceed llama3-70b's context of 8,192" in capsys.readouterr().err
