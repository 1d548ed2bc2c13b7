"""Every plan ``plan`` prints can be re-run with ``estimate``: the command line it gives for each plan
(``estimate_command``, cli/options.estimate_args) prices the same plan under the same stack to the same step time,
2D SUMMA layouts, context parallelism, expert parallelism, interleaved pipelines, offload and framework presets
included."""

from __future__ import annotations

import json

import pytest

from meshplan.cli import main

SEARCHES = [
    ["--model", "llama3-8b", "--system", "h100", "--gpus", "64", "--framework", "any"],  # 2D SUMMA leads here
    ["--model", "llama3-70b", "--system", "h100", "--gpus", "256", "--global-batch", "512"],  # megatron-core
    ["--model", "qwen3-30b-a3b", "--system", "b200", "--gpus", "64", "--global-batch", "256"],  # experts
    ["--model", "gpt3-175b", "--system", "a100", "--gpus", "1024", "--framework", "megatron-core"],
    ["--model", "llama3-8b", "--system", "h100", "--gpus", "16", "--seq", "32768", "--global-batch", "64"],  # cp
    ["--model", "llama3-8b", "--system", "h100", "--gpus", "32", "--framework", "torchtitan", "--zero", "2,3"],
    ["--model", "llama3-8b", "--system", "v100", "--gpus", "64", "--framework", "deepspeed"],  # fp16, offload
]


def _json(argv, capsys) -> dict:
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("search", SEARCHES, ids=lambda s: "-".join(s[1:6:2]) + ("-" + s[-1] if "--framework" in s
                                                                                 else ""))
def test_the_top_plans_re_run_with_estimate_to_the_same_step_time(search, capsys):
    found = _json(["plan", *search, "--top", "4", "--json"], capsys)
    assert found["plans"], "the search found no plan"
    for plan in found["plans"]:
        command = plan["estimate_command"]
        assert command[:2] == ["meshplan", "estimate"]
        again = _json([*command[1:], "--json"], capsys)
        assert again["plan"] == plan["plan"], command
        assert again["stack"] == plan["stack"], command
        assert again["step_time_s"] == pytest.approx(plan["step_time_s"], rel=1e-9), command


def test_the_table_shows_the_command_of_the_best_plan(capsys):
    capsys.readouterr()
    assert main(["plan", *SEARCHES[0], "--top", "2"]) == 0
    out = capsys.readouterr().out
    joined = out.replace(" \\\n    ", " ")  # a command wrapped to the terminal, continued with " \\"
    line = next(x for x in joined.splitlines() if x.startswith("re-run it: "))
    assert line.startswith("re-run it: meshplan estimate --model llama3-8b") and line.endswith("--framework any")
