"""The CLI's safety net and the runs reviews found failing: a bug (not bad input) is one line and exit status 3
(MESHPLAN_DEBUG=1 re-raises it); a GPU without bf16 runs its own 16-bit precision, a squared-ReLU model runs
eagerly, and ordinary searches print no NumPy warnings."""

from __future__ import annotations

import json

import pytest

from bad_input_helpers import SMALL, estimate
from meshplan.cli import main


def test_a_bug_is_one_line_with_exit_status_3(monkeypatch, capsys):
    """The safety net: an unexpected exception (a bug, not bad input) still prints one line, says how to see
    the traceback, and exits 3; MESHPLAN_DEBUG=1 re-raises it."""
    import meshplan.estimate

    def broken(*args, **kwargs):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(meshplan.estimate, "estimate", broken)
    assert main(estimate()) == 3
    err = capsys.readouterr().err
    assert err.startswith("meshplan: internal error: ZeroDivisionError: float division by zero (a bug")
    assert len(err.strip().splitlines()) == 1
    monkeypatch.setenv("MESHPLAN_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(estimate())


def test_a_gpu_without_bf16_runs_its_own_16_bit_precision(capsys):
    """``--system v100`` failed until ``--precision fp16`` was given; the default is what the GPU has."""
    for command in (estimate("gpt2", "v100"), ["plan", "--model", "gpt2", "--system", "v100", "--gpus", "8",
                                               "--zero", "1", "--placements", "default", "--no-offload"]):
        code = main([*command, "--json"])
        out, err = capsys.readouterr()
        assert code == 0 and err == "", err
        data = json.loads(out)
        plan = data["plan"] if "plan" in data else data["plans"][0]["plan"]
        assert plan["precision"] == "fp16"


def test_a_squared_relu_model_runs_eagerly(tmp_path, capsys):
    """mlp = "relu2" with --fusion eager raised KeyError (exit 3): its relu and square kernels are costed."""
    path = tmp_path / "model.toml"
    path.write_text(SMALL + 'mlp = "relu2"\n')
    for fusion in ("fused", "eager"):
        code = main(estimate(str(path), "h100", "--fusion", fusion, "--json"))
        out, err = capsys.readouterr()
        assert code == 0 and err == "", err
    assert json.loads(out)["step_time_s"] > 0


def test_ordinary_searches_print_no_numpy_warnings(capsys):
    """NumPy RuntimeWarnings reached stderr in ordinary plan runs: none, warnings raised as errors."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for model, system in (("llama3-70b", "h100"), ("mixtral-8x7b", "b200"), ("gpt3-175b", "v100")):
            code = main(["plan", "--model", model, "--system", system, "--gpus", "64", "--global-batch", "256"])
            out, err = capsys.readouterr()
            assert code == 0 and err == "", (model, err)
