"""``meshplan plan --emit`` writes the config of the plan ranked #1 and ``meshplan estimate --from`` prices it again:
the same step time; plan options beside ``--from`` are refused."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from meshplan.cli.main import cli
from meshplan.errors import SpecError

SEARCH = ["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "16", "--global-batch", "64",
          "--placements", "default", "--zero", "0,1", "--no-offload", "--framework", "megatron-core", "--top", "1"]


def test_plan_emit_then_estimate_from_gives_the_same_step_time(tmp_path):
    path = tmp_path / "args.sh"
    runner = CliRunner()
    found = runner.invoke(cli, [*SEARCH, "--json", "--emit", "megatron", "--emit-to", str(path)])
    assert found.exit_code == 0, found.output
    best = json.loads(found.stdout)["plans"][0]
    assert "--tensor-model-parallel-size" in path.read_text()
    again = runner.invoke(cli, ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "16",
                                "--from", str(path), "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["step_time_s"] == best["step_time_s"]


def test_plan_emit_prints_the_config_after_the_table():
    result = CliRunner().invoke(cli, [*SEARCH, "--emit", "nemo"])
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().splitlines()[-1].startswith("model.") or "train.global_batch_size=64" in result.output


def test_plan_options_beside_from_are_refused(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}')
    result = CliRunner().invoke(cli, ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "16",
                                      "--from", str(path), "--tp", "2"])
    assert isinstance(result.exception, SpecError) and "--tp given with --from" in str(result.exception)
    result = CliRunner().invoke(cli, ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "16",
                                      "--from", str(path), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["plan"]["zero"] == 2


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan", "deepspeed", "nemo"])
def test_the_emitted_config_is_the_plan_ranked_first(tmp_path, fmt):
    """The tester's search (Llama-3-8B on 64 H100): #1 is the simplest plan within the fastest one's error band, not
    the fastest listed plan, which --emit wrote before (dp=32 tp=1 pp=1 cp=2 for megatron where #1 was dp=32 tp=2;
    zero=2 where #1 had zero=3); read back with --from, the config prices the same plan at #1's step time."""
    path = tmp_path / f"config.{fmt}"
    runner = CliRunner()
    found = runner.invoke(cli, ["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "64", "--top", "5",
                                "--json", "--emit", fmt, "--emit-to", str(path)])
    assert found.exit_code == 0, found.output
    search = json.loads(found.stdout)
    first, fastest = search["plans"][0], search["fastest"]
    assert "wrote" in found.stderr and "of #1 (" in found.stderr
    again = runner.invoke(cli, ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "64",
                                "--from", str(path), "--json"])
    assert again.exit_code == 0, again.output
    read = json.loads(again.stdout)
    assert read["step_time_s"] == first["step_time_s"]
    assert {k: read["plan"][k] for k in first["plan"]} == first["plan"]
    assert fastest["step_time_s"] <= first["step_time_s"] <= fastest["step_time_s"] * (1 + fastest["error_band"])
