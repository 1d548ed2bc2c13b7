"""``--emit`` never fails after a search (issue 47): for the issue's four models every format writes the plan its
framework's search ranks first, and where the format cannot express the plans listed (``--framework any`` ranks
ZeRO-3 first; Megatron's distributed optimizer is ZeRO-1) it looks further down the same ranking and says so."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from meshplan.cli.emit import EMIT_FRAMEWORK
from meshplan.cli.main import cli
from meshplan.configs import read
from meshplan.specs.model_load import load_model

MODELS = [("llama3-8b", "8"), ("llama3-70b", "64"), ("mixtral-8x7b", "64"), ("deepseek-v3", "256")]


@pytest.mark.parametrize(("model", "gpus", "fmt"), [(m, g, f) for f in sorted(EMIT_FRAMEWORK) for m, g in MODELS
                                                   if (m, f) != ("deepseek-v3", "deepspeed")])
def test_every_format_writes_the_best_plan_its_framework_runs(tmp_path, model, gpus, fmt):
    path = tmp_path / "config"
    result = CliRunner().invoke(cli, ["plan", "--model", model, "--system", "h100", "--gpus", gpus,
                                      "--global-batch", "512", "--top", "3", "--emit", fmt, "--emit-to", str(path)])
    assert result.exit_code == 0, result.output
    assert f"wrote {fmt} config of #1 " in result.output  # the framework's own search ranks only what it runs
    plan, _ = read(fmt, load_model(model), int(gpus), path.read_text())
    assert plan.num_gpus == int(gpus)


def test_emit_looks_past_the_listed_plans_when_it_can_write_none_of_them(tmp_path):
    """With ``--framework any --top 1``, GPT-3 175B's #1 on 256 H100s (the fastest plan) offloads activations, which no
    Megatron argument writes: the deeper search of the same ranking finds the first plan below it that Megatron runs
    (#5, dp=8 tp=4 pp=8 ZeRO-1), and says why #1 was not written."""
    path = tmp_path / "args.sh"
    result = CliRunner().invoke(cli, ["plan", "--model", "gpt3-175b", "--system", "h100", "--gpus", "256",
                                      "--global-batch", "512", "--framework", "any", "--top", "1", "--emit",
                                      "megatron", "--emit-to", str(path)])
    assert result.exit_code == 0, result.output
    assert re.search(r"#1 \(dp=\d+ tp=\d+ pp=\d+ .*offload-act\)", result.output)
    assert "cannot be written as megatron (megatron cannot express offload_activations=True" in result.output
    found = re.search(r"wrote megatron config of #([2-9]) \(dp=(\d+) tp=(\d+) pp=(\d+) .*zero=1", result.output)
    assert found, result.output
    plan, _ = read("megatron", load_model("gpt3-175b"), 256, path.read_text())
    assert (plan.dp, plan.tp, plan.pp, plan.zero, plan.offload_activations) == (
        int(found.group(2)), int(found.group(3)), int(found.group(4)), 1, False)


def test_a_format_whose_framework_fits_no_plan_says_so_in_one_line():
    """deepseek-v3 under DeepSpeed: data parallelism alone, 671B parameters fit no H100 of 256: no plan to write."""
    result = CliRunner().invoke(cli, ["plan", "--model", "deepseek-v3", "--system", "h100", "--gpus", "256",
                                      "--global-batch", "512", "--top", "3", "--emit", "deepspeed"])
    assert result.exit_code != 0 and "no feasible plan to write" in str(result.exception)
