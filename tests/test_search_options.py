"""The search options plan, sweep and report share (cli/search_options.py): the same definitions on the three commands,
pins that narrow the enumeration (a partition of the space: the pinned searches' counts add up to the whole one's),
infeasible pins as results with their reason, out-of-range pins as one line and exit 2, and the partial recompute and
offload counts the search takes."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import pytest

from meshplan.cli import main
from meshplan.cli.main import cli
from meshplan.cli.search_options import NAMES
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.search.combos import divisors
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.stack import load_stack

PLAN = ["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--global-batch", "64", "--json"]


@pytest.fixture(scope="module")
def small():
    """llama3-8b on 8 H100s, 64 sequences a step, Megatron-Core's space without offload (a search of ~0.1 s)."""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(8)
    space = Space(global_batch=64, stack=load_stack("megatron-core"), offload_optimizer=(False,),
                  offload_activations=(False,))
    return model, cluster, space


def test_plan_sweep_and_report_expose_the_same_search_options():
    def described(command: str) -> dict[str, tuple]:
        params = {p.name: p for p in cli.commands[command].params}
        return {n: (tuple(params[n].opts), params[n].default, getattr(params[n], "help", None)) for n in NAMES}

    assert {"pin_tp", "pin_micro_batch", "precision", "zero_opts", "recompute_opts", "sp_opts", "headroom",
            "grad_bytes", "recompute_modules_text", "recompute_layers", "offload_layers"} <= set(NAMES)
    assert described("plan") == described("sweep") == described("report")


@pytest.mark.parametrize("axis", ["tp", "micro_batch"])
def test_pins_partition_the_space(small, axis):
    """Pinning an axis to each of its sizes in turn splits the space: the pinned searches evaluate, and find feasible,
    as many plans in all as the whole search (8 GPUs: tp in 1, 2, 4, 8; micro-batches: the divisors of 64 / dp), and
    the fastest of their best plans is the whole search's best."""
    model, cluster, space = small
    whole = search(model, cluster, space, top_k=1)
    sizes = divisors(8) if axis == "tp" else divisors(64)
    parts = [search(model, cluster, replace(space, pinned=((axis, (s,)),)), top_k=1) for s in sizes]
    assert sum(p.evaluated for p in parts) == whole.evaluated > 0
    assert sum(p.feasible for p in parts) == whole.feasible
    for size, part in zip(sizes, parts, strict=True):
        assert all(getattr(e.plan, axis) == size for e in part.plans)
    best = min((p.plans[0] for p in parts if p.plans), key=lambda e: e.step_time)
    assert best.step_time == pytest.approx(whole.plans[0].step_time, rel=1e-9)


def test_a_list_pin_is_the_union_of_its_sizes(small):
    model, cluster, space = small
    four, eight = (search(model, cluster, replace(space, pinned=(("tp", (s,)),)), top_k=1).evaluated for s in (4, 8))
    both = search(model, cluster, replace(space, pinned=(("tp", (4, 8)),)), top_k=1)
    assert both.evaluated == four + eight


def test_cli_pin_keeps_every_plan_to_it(capsys):
    assert main([*PLAN, "--tp", "4,8", "--pp", "1", "--top", "20"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and {p["plan"]["tp"] for p in plans} <= {4, 8} and {p["plan"]["pp"] for p in plans} == {1}


@pytest.mark.parametrize("args, reason", [
    (["--tp", "3"], "pinned tp does not divide the GPU count"),  # 8 % 3 = 2
    (["--tp", "8", "--pp", "2"], "no plan has the pinned sizes"),  # 8 * 2 = 16 > 8 GPUs
    (["--micro-batch", "3"], "no plan has the pinned sizes"),  # 3 divides no 64 / dp
])
def test_an_infeasible_pin_is_a_result_with_its_reason(capsys, args, reason):
    assert main([*PLAN, *args]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["plans"] == [] and reason in result["rejected"]["reasons"]


@pytest.mark.parametrize("args, message", [
    (["--tp", "0"], "tp=0 is outside"), (["--pp", "2000000"], "pp=2000000 is outside"),
    (["--micro-batch", "a"], "micro-batch='a' must be integers"),
    (["--recompute-layers", "-1"], "recompute-layers=-1 is outside"),
    (["--recompute-layers", "2", "--recompute", "none"], "recompute_layers=2 needs full"),
    (["--offload-layers", "2", "--no-offload"], "offload_layers=2 needs activation offload"),
])
def test_a_pin_out_of_range_is_one_line(capsys, args, message):
    assert main([*PLAN, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_partial_recompute_is_searched_and_priced_as_estimate_prices_it(small):
    """--recompute-layers 8 with full recompute: llama3-8b has 32 layers, so a pp = 1 or 2 stage (32, 16 layers)
    recomputes 8 of them and a pp = 4 stage (8 layers) all of its own (0); recomputing fewer layers never slows the
    same plan, nor the search's best."""
    model, cluster, space = small
    full = replace(space, recompute=("full",), recompute_layers=8)
    result = search(model, cluster, full, top_k=30)
    assert result.plans
    for est in result.plans:
        plan = est.plan
        assert plan.recompute_layers == (8 if -(-32 // plan.pp) > 8 else 0)
        every = estimate(model, cluster, replace(plan, recompute_layers=0), space.stack)
        assert est.step_time <= every.step_time
    assert any(e.plan.recompute_layers == 8 for e in result.plans)
    every_layer = search(model, cluster, replace(full, recompute_layers=0), top_k=1).plans[0]
    assert result.plans[0].step_time <= every_layer.step_time


def test_partial_offload_is_searched(small):
    model, cluster, space = small
    offload = replace(space, offload_activations=(True,), offload_layers=4)
    plans = search(model, cluster, offload, top_k=10).plans
    assert plans and all(p.plan.offload_activations and p.plan.offload_layers in (0, 4) for p in plans)


def test_sweep_takes_the_search_options(tmp_path, capsys):
    """sweep --precision fp8 finds a faster best plan than bf16 on H100 (FP8's dense peak is twice BF16's)."""
    def tokens(precision: str) -> float:
        out = tmp_path / precision
        assert main(["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "--global-batch", "64",
                     "--precision", precision, "--zero", "1", "--no-offload", "--workers", "1", "--format", "svg",
                     "-o", str(out)]) == 0
        with open(out / "sweep.csv") as f:
            return float(next(csv.DictReader(f))["tokens_per_s"])

    assert tokens("fp8") > tokens("bf16")
    capsys.readouterr()
