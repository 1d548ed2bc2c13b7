"""Fuzz classes of the torch.compile stack fields (issue 48, a second campaign). A compiled region's host time
(``Stack.region_host``) given to a stack that compiles nothing did nothing, silently (``--region-host 0.05`` on
megatron-core: 2.31 s, as without it): refused now, from an option, a stack TOML or the Python API alike. And one
torch.compile run reads the same by every door: ``--compiled`` priced its regions at 0 s while a torchtitan job with
``[compile] enable = true`` (``--from``) priced them at the 0.29 ms measured (TORCH_COMPILE_REGION_HOST)."""

from __future__ import annotations

import json

import pytest

from meshplan.cli import main
from meshplan.configs import emit
from meshplan.errors import SpecError
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import TORCH_COMPILE_REGION_HOST, Stack, load_stack

RUN = ["estimate", "--model", "gpt2", "--system", "h100", "--gpus", "8"]


def one_line(args, capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    return err[0]


@pytest.mark.parametrize("framework", ["megatron-core", "torchtitan", "any"])
def test_a_region_host_time_without_a_compiled_region_is_refused(framework, tmp_path, capsys):
    assert "region_host=0.05 s needs compiled = true" in one_line(
        [*RUN, "--framework", framework, "--region-host", "0.05"], capsys)
    assert "region_host=0.001 s needs compiled" in one_line(
        [*RUN, "--framework", framework, "--no-compiled", "--region-host", "0.001"], capsys)
    with pytest.raises(SpecError, match="region_host=0.0003 s needs compiled = true"):
        load_stack(framework).with_(region_host=3e-4)
    toml = tmp_path / "stack.toml"
    toml.write_text('name = "mine"\nregion_host = 0.0003\n')
    assert "stack mine: region_host=0.0003 s needs compiled" in one_line([*RUN, "--framework", str(toml)], capsys)
    assert Stack(compiled=True, region_host=3e-4).region_host == 3e-4 and Stack(region_host=0.0).region_host == 0


def test_compiled_reads_alike_from_the_option_and_a_torchtitan_job(tmp_path, capsys):
    """--compiled on torchtitan's stack and [compile] enable = true in its job config: the same stack fields;
    --region-host beside --compiled overrides the measured 0.29 ms; --no-compiled drops it."""
    model, plan = load_model("llama3-8b"), Plan(dp=8, micro_batch=1, global_batch=64, zero=3,
                                                  recompute_modules=("op_sac",))
    run = ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "8"]
    job = tmp_path / "job.toml"
    job.write_text(emit("torchtitan", model, plan, load_stack("torchtitan")).replace("enable = false", "enable = true"))

    def stack(args):
        assert main([*run, *args, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        return out["stack"]["compiled"], out["stack"]["region_host"], out["stack"]["fusion"]

    via_job = stack(["--from", str(job)])
    assert via_job == (True, TORCH_COMPILE_REGION_HOST, "fused")
    via_option = stack(["--framework", "torchtitan", "--compiled", "--fusion", "fused"])
    assert via_option == via_job
    assert stack(["--compiled", "--region-host", "0.001"])[1] == 0.001
    assert stack(["--from", str(job), "--no-compiled"])[:2] == (False, 0.0)


@pytest.mark.parametrize("extra", [[], ["--dp-mode", "allreduce"]])
def test_parameter_server_shards_without_a_parameter_server_are_refused(extra, capsys):
    """--servers 4 on an all-reduce plan priced the plan as without it (27.2 s for llama3-8b on 16 H100s, both);
    like --summa-panels without SUMMA it is refused, by estimate and by the search alike."""
    assert "servers=4 needs --dp-mode ps (got allreduce)" in one_line([*RUN, "--servers", "4", *extra], capsys)
    search = ["plan", "--model", "gpt2", "--system", "h100", "--gpus", "8", "--servers", "4", *extra]
    assert "servers=4 needs ps among dp_modes (got allreduce)" in one_line(search, capsys)
    assert main([*RUN, "--servers", "4", "--dp-mode", "ps", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["servers"] == 4


def test_sweep_refuses_simplest_first_which_it_would_leave_without_effect(tmp_path, capsys):
    """sweep takes the search's options, --simplest-first among them, but ranks each point by time alone
    (``prefer_simple=False``): the option changed nothing. Refused, before any search; --fastest-first is what it
    does anyway and passes."""
    args = ["sweep", "--model", "gpt2", "--systems", "h100", "--gpus", "8", "-o", str(tmp_path / "s"),
            "--workers", "1", "--zero", "1", "--placements", "default", "--max-micro-batch", "2"]
    assert "simplest-first: each point of a sweep is its fastest plan" in one_line([*args, "--simplest-first"], capsys)
    assert not (tmp_path / "s").exists()
    assert main([*args, "--fastest-first"]) == 0


@pytest.mark.parametrize(("option", "value", "runs"), [("--dp-mode", "ps", "dp_modes=allreduce"),
                                                       ("--collectives", "mst", "collectives=nccl")])
def test_a_refused_exchange_says_what_the_framework_runs(option, value, runs, capsys):
    """megatron-core runs no parameter server and no MST collectives: the refusal named what it runs as "off"."""
    line = one_line(["plan", "--model", "gpt2", "--system", "h100", "--gpus", "8", option, value], capsys)
    assert line.endswith(f"framework megatron-core runs none of them (it runs {runs})")
