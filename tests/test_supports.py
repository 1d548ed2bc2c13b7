"""What each framework runs (Stack.supports, the presets' [supports] tables) bounds the search: every plan it
returns for a framework is one that framework runs; the command line's default framework gives a runnable first
answer, and ``--framework any`` still finds the 2D SUMMA winner. Plans must leave the memory headroom."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.cli import main
from meshplan.errors import SpecError
from meshplan.search import Space, search
from meshplan.search.space import MEMORY_HEADROOM
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import frameworks_running, load_stack, stack_from_dict, stack_names
from meshplan.specs.supports import Supports

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = [n for n in stack_names() if n not in ("any", "generic")]


@pytest.mark.parametrize("name", FRAMEWORKS)
@pytest.mark.parametrize(("model", "gpus", "batch"), [("llama3-8b", 32, 256), ("qwen3-30b-a3b", 32, 256)])
def test_every_plan_the_search_returns_for_a_framework_is_one_it_runs(name, model, gpus, batch):
    stack = load_stack(name)
    result = search(load_model(model), load_system("h100").cluster(gpus), Space(global_batch=batch, stack=stack),
                    top_k=20)
    assert result.plans, f"{name}: no plan"
    for est in result.plans:
        assert stack.supports.problems(est.plan) == [], (name, est.plan.describe())
        assert name in frameworks_running(est.plan)


def test_a_framework_without_model_parallelism_searches_data_parallel_plans_only():
    result = search(load_model("llama3-8b"), load_system("h100").cluster(16),
                    Space(global_batch=64, stack=load_stack("pytorch-fsdp")), top_k=50)
    assert {(e.plan.tp, e.plan.pp, e.plan.cp, e.plan.ep) for e in result.plans} == {(1, 1, 1, 1)}
    assert {e.plan.zero for e in result.plans} <= {0, 2, 3}  # FSDP: NO_SHARD, SHARD_GRAD_OP, FULL_SHARD


def _plan_json(argv, capsys) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_the_quick_start_is_runnable_in_the_default_framework_and_any_finds_the_2d_winner(capsys):
    quick = ["plan", "--model", "llama3-70b", "--system", "h100", "--gpus", "1024", "--global-batch", "512",
             "--top", "3"]
    default = _plan_json(quick, capsys)["plans"][0]
    assert default["stack"]["name"] == "megatron-core" and default["plan"]["tensor_layout"] == "1d"
    assert "megatron-core" in default["frameworks"]
    anything = _plan_json([*quick, "--framework", "any"], capsys)["plans"][0]
    assert anything["plan"]["tensor_layout"] == "summa" and anything["frameworks"] == []
    assert anything["step_time_s"] < default["step_time_s"]  # the 2D layout is faster, and no framework runs it


def test_supports_name_what_a_framework_does_not_run():
    summa = Plan(dp=8, tp=4, tp2=2, tensor_layout="summa", zero=2)
    assert load_stack("megatron-core").supports.problems(summa) == ["tensor_layout=summa", "zero=2"]
    assert load_stack("pytorch-fsdp").supports.problems(Plan(dp=4, tp=2, pp=2, schedule="1f1b", zero=0,
                                                             sequence_parallel=False)) == ["tp=2", "pp=2"]
    assert Supports().runs(summa)


@pytest.mark.parametrize(("table", "message"), [
    ({"layouts": ["2d"]}, "supports.layouts=('2d',) must list some of 1d, summa"),
    ({"zero": [4]}, "supports.zero=(4,) must list some of 0, 1, 2, 3"),
    ({"offload_optimizer": "yes"}, "supports.offload_optimizer='yes' must be true or false"),
    ({"gpus": 8}, "gpus"),
])
def test_a_bad_supports_table_is_one_clear_error(table, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        stack_from_dict({"name": "x", "supports": table}, "x.toml")


def test_plans_leave_the_memory_headroom_and_those_inside_it_are_rejected_as_such():
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(64)
    result = search(model, cluster, Space(global_batch=128, headroom=0.2), top_k=20)
    hbm = cluster.accelerator.hbm_bytes
    assert result.plans and all(e.peak_memory <= 0.8 * hbm for e in result.plans)
    assert result.rejected.get("memory within the 20% headroom", 0) > 0
    full = search(model, cluster, Space(global_batch=128), top_k=1).plans[0]
    assert full.step_time <= result.plans[0].step_time  # more memory to use is never slower


def test_the_default_headroom_covers_the_measured_memory_error():
    """MEMORY_HEADROOM (0.10) is at least the largest |error| of predicted peak memory in docs/ACCURACY.md."""
    measured = json.loads((ROOT / "docs" / "accuracy_summary.json").read_text())["memory"]["max_abs_error"]
    assert measured <= MEMORY_HEADROOM < measured + 0.01
