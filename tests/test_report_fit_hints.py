"""A plan that does not fit says what would: the README's llama3-8b on 8 H100 (96.1 GiB > 79.6 GiB) gets variants
that fit, each priced as ``estimate`` prices it with those options, in text and in --json."""

from __future__ import annotations

import json
import shlex

import pytest

from meshplan.cli import main
from meshplan.estimate import estimate
from meshplan.report.fit_hints import fit_hints, variants
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

README = ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "8"]


@pytest.fixture(scope="module")
def too_big():
    # the command line's defaults for README: dp 8, 512 sequences, ZeRO-1, selective recompute, fp32 gradients
    plan = Plan(dp=8, global_batch=512, zero=1, recompute="selective", grad_bytes=4)
    est = estimate(load_model("llama3-8b"), load_system("h100").cluster(8), plan, load_stack("megatron-core"))
    assert not est.fits
    return est


def test_variants_lower_memory_one_option_at_a_time():
    plan = Plan(dp=8, global_batch=512, zero=1, recompute="none", micro_batch=2)
    assert variants(plan) == [{"zero": 2}, {"zero": 3}, {"recompute": "selective"}, {"recompute": "full"},
                              {"tp": 2, "dp": 4, "sequence_parallel": True}, {"pp": 2, "dp": 4},
                              {"micro_batch": 1}, {"offload_optimizer": True}]
    assert variants(Plan(dp=1, zero=3, recompute="full", offload_optimizer=True)) == []


def test_hints_fit_first_and_match_a_fresh_estimate(too_big):
    hints = fit_hints(too_big)
    assert hints and hints[0].est.fits
    fits = [h.est.fits for h in hints]
    assert fits == sorted(fits, reverse=True)  # those that fit first
    assert any(h.changes == {"zero": 3} and h.est.fits for h in fit_hints(too_big, limit=20))
    for h in hints:  # smaller than the plan that did not fit, and the estimate of the changed plan
        assert h.est.peak_memory < too_big.peak_memory
        assert all(getattr(h.est.plan, k) == v for k, v in h.changes.items())
        assert h.est.plan.num_gpus == too_big.plan.num_gpus and h.est.plan.etp == h.est.plan.tp
        again = estimate(too_big.model, too_big.cluster, h.est.plan, too_big.stack)
        assert (again.step_time, again.peak_memory) == (h.est.step_time, h.est.peak_memory)
    zero3 = next(h for h in fit_hints(too_big, limit=20) if h.changes == {"zero": 3})
    # Megatron-Core has no ZeRO-3; torchtitan's FSDP2 has, but its selective recompute is per-op SAC, not core_attn
    assert not zero3.runs and "pytorch-fsdp" in zero3.frameworks and "torchtitan" not in zero3.frameworks
    sac = estimate(too_big.model, too_big.cluster, too_big.plan.with_(recompute_modules=("op_sac",)), too_big.stack)
    op_sac = next(h for h in fit_hints(sac, limit=20) if h.changes == {"zero": 3})
    assert "torchtitan" in op_sac.frameworks


def test_a_plan_that_fits_has_no_hints(too_big):
    fine = estimate(too_big.model, too_big.cluster, too_big.plan.with_(zero=3), too_big.stack)
    assert fine.fits and fit_hints(fine) == []


def test_estimate_prints_the_hints_and_the_options_reproduce_them(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(README) == 0
    out = capsys.readouterr().out
    assert "does not fit (memory 96.1 GiB > 79.6 GiB HBM)" in out
    assert "what would make it fit" in out and "legend: options: " in out
    assert "or search every plan: meshplan plan --model llama3-8b --system h100 --gpus 8 --global-batch 512" in \
        out.replace(" \\\n    ", " ")  # wrapped to the terminal with shell continuations
    assert "…" not in out
    assert main([*README, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] is False and data["fit_hints"][0]["fits"] is True
    assert data["fit_search"].startswith("meshplan plan ")
    first = data["fit_hints"][0]
    assert main([*README, *shlex.split(first["options"]), "--json"]) == 0  # the options, given: the same numbers
    again = json.loads(capsys.readouterr().out)
    assert again["fits"] and "fit_hints" not in again
    assert (again["step_time_s"], again["peak_memory_bytes"]) == (first["step_time_s"], first["peak_memory_bytes"])
