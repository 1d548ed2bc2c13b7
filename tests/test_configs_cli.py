"""``meshplan plan --emit`` writes the fastest plan's config and ``meshplan estimate --from`` prices it again: the
same step time; plan options beside ``--from`` are refused."""

from __future__ import annotations

import json

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
