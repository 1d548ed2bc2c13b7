"""estimate's host-bound note (report/host_note.py): said where the GPUs wait on the host for 10 % of the step or more,
with the host cost per kernel and the same plan's step under CUDA graphs; silent where the GPUs are the limit."""

from __future__ import annotations

import json

import pytest

from meshplan.cli import main
from meshplan.estimate import estimate
from meshplan.report.host_note import HOST_BOUND_SHARE, host_note
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

SMALL = ["--model", "gpt2", "--system", "a100", "--gpus", "8", "--tp", "2", "--global-batch", "64",
         "--framework", "megatron-deepspeed"]


def _small():
    plan = Plan(dp=4, tp=2, micro_batch=1, global_batch=64)
    return estimate(load_model("gpt2"), load_system("a100").cluster(8), plan, load_stack("megatron-deepspeed"))


def test_a_host_bound_step_says_so_with_its_graphed_twin():
    est = _small()
    note = host_note(est)
    assert note is not None
    # GPT-2 small at micro-batch 1 under Megatron-DeepSpeed's module code: 38.4 us a kernel on a DGX H100's host
    # (presets/stacks/megatron-deepspeed.toml), 1.34 x that on a DGX A100's (python_host): 51.5 us; the GPUs idle most
    # of the step
    # and the optimizer step's per-parameter loops: DeepSpeed's BF16_Optimizer walks all of GPT-2's 148 tensors on
    # every rank at 30 us, x 1.34: 5.95 ms (step/host.step_host)
    assert note.tensor_loops == pytest.approx(148 * 30e-6 * 1.34)
    assert note.wait == pytest.approx(est.breakdown["host"] + note.tensor_loops)
    assert note.share == pytest.approx(note.wait / est.step_time)
    assert "5.95 ms of it in the optimizer step's per-parameter loops" in note.text()
    assert note.share > 0.5 and note.per_kernel == pytest.approx(38.4e-6 * 1.34)
    assert "51.5 us of host time per launched kernel" in note.text()
    graphed = estimate(est.model, est.cluster, est.plan, est.stack.with_(cuda_graphs=True)).step_time
    assert note.graphed_step == graphed and graphed < est.step_time - note.wait / 2
    assert "host-bound" in note.text() and "--cuda-graphs" in note.text()


def test_zero3_hooks_are_named_and_stay_under_cuda_graphs():
    """GPT-2 small (12 layers) under DeepSpeed ZeRO-3 at micro-batch 1 on one A100 host: the note names the module
    hooks' host seconds (the */zero3_hooks rows: per layer 9 modules, its 6 parameter-holding ones (2 norms, the
    QKV and output projections, fc1 and fc2) and 3 containers, and 12 tensors), and the graphed twin keeps them."""
    from meshplan.cost.wrapper_work import ZERO3_HOOKS  # noqa: PLC0415

    plan = Plan(dp=8, micro_batch=1, global_batch=8, zero=3, grad_bytes=2)
    est = estimate(load_model("gpt2"), load_system("a100").cluster(8), plan, load_stack("deepspeed"))
    note = host_note(est)
    assert note is not None
    layers = 12 * (9 * ZERO3_HOOKS["module"] + 12 * ZERO3_HOOKS["tensor"]) * 1.34  # A100's host: python_host 1.34
    assert layers < note.module_hooks < layers * 1.2  # and the ends' (tables, final norm, the micro-batch's own)
    assert "in ZeRO-3's module hooks" in note.text()
    assert note.graphed_step is not None and note.graphed_step > layers


def test_no_note_where_the_gpus_are_the_limit_and_no_twin_for_a_graphed_stack():
    big = estimate(load_model("llama3-70b"), load_system("h100").cluster(64),
                   Plan(dp=4, tp=8, pp=2, micro_batch=1, global_batch=128), load_stack("megatron-core"))
    assert big.breakdown.get("host", 0.0) < HOST_BOUND_SHARE * big.step_time and host_note(big) is None
    est = _small()
    graphed = estimate(est.model, est.cluster, est.plan, est.stack.with_(cuda_graphs=True, host_dispatch=2e-3))
    note = host_note(graphed)
    assert note is not None and note.graphed_step is None and "--cuda-graphs" not in note.text()


def test_estimate_prints_it_at_80_columns_and_in_json(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["estimate", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "host-bound: the GPUs wait on the host" in out and max(map(len, out.splitlines())) <= 80
    assert main(["estimate", *SMALL, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["host_bound"]["host_wait_share"] > 0.5
    assert data["host_bound"]["cuda_graphs_step_time_s"] < data["step_time_s"]


def test_plan_says_it_of_its_first_plan(capsys, monkeypatch):
    # GPT-2 small, one sequence per GPU: the search's best plan still waits on the host most of its step
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", "--model", "gpt2", "--system", "a100", "--gpus", "8", "--global-batch", "8",
                 "--framework", "megatron-deepspeed"]) == 0
    out = capsys.readouterr().out
    assert out.index("#1 in detail") < out.index("host-bound: the GPUs wait on the host")
