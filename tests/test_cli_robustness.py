"""The command line under what a shell does to it: a closed pipe (``… | head -1``), no arguments, Ctrl-C, a user
module that prints, an over-long error, sizes of zero or below. Each a class: every command that prints, every
interrupt point, every option of the kind."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal

import pytest

from bad_input_helpers import fails
from meshplan.cli import main

RUN = ["--model", "llama3-8b", "--system", "h100", "--gpus", "8"]


class _ClosedPipe(io.TextIOBase):
    """stdout whose reader has gone: every write is EPIPE, as after `| head -1`."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        raise io.UnsupportedOperation("no descriptor")


@pytest.mark.parametrize("args", [
    ["presets"], ["estimate", *RUN, "--ops"], ["estimate", *RUN, "--json"], ["plan", *RUN, "--top", "3"],
    ["serve", *RUN, "--input-len", "100", "--output-len", "10", "--top", "2"],
])
def test_a_closed_pipe_is_a_quiet_exit_0(args, monkeypatch, capsys):
    """rich exits 1 on EPIPE and click exits 1 too: both become exit status 0 and nothing on stderr."""
    monkeypatch.setattr("sys.stdout", _ClosedPipe())
    assert main(args) == 0
    assert capsys.readouterr().err == ""


def test_bare_meshplan_prints_the_usage(capsys):
    """The help as --help prints it (was one 1,013-character line with literal \\n), on stderr, exit status 2."""
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Usage: meshplan [OPTIONS] COMMAND [ARGS]...") and "\\n" not in err
    assert max(map(len, err.splitlines())) <= 110 and "estimate" in err


def test_an_error_line_is_capped(monkeypatch, capsys):
    """A message past MAX_ERROR (400) characters is cut and says how much was left out."""
    from meshplan.cli.main import MAX_ERROR
    from meshplan.errors import PlanError

    def many(*args, **kwargs):
        raise PlanError([f"violation number {i} of a long list" for i in range(40)])

    monkeypatch.setattr("meshplan.specs.model_load.load_model", many)
    line = fails(["estimate", *RUN], capsys)
    assert len(line) <= len("meshplan: error: ") + MAX_ERROR + 30
    assert line.endswith("more characters)")


@pytest.mark.parametrize(("seq", "message"), [
    ("0", "seq=0 must be a positive integer up to 2,147,483,647"),  # was silently the model's default
    ("-5", "seq=-5 must be a positive integer up to 2,147,483,647"),  # was blamed on --input-shape
])
def test_the_sharding_planner_checks_seq(seq, message, capsys):
    assert fails(["plan", "--autoshard", *RUN, "--seq", seq], capsys).endswith(message)


def test_a_module_that_prints_keeps_json_on_stdout(tmp_path, capsys):
    """A user module printing at import, in its factory and in forward: all on stderr, stdout one JSON object."""
    pytest.importorskip("torch")
    module = tmp_path / "noisy.py"
    module.write_text("import torch\nprint('import')\n\nclass M(torch.nn.Linear):\n    def forward(self, x):\n"
                      "        print('forward')\n        return super().forward(x)\n\n"
                      "def make():\n    print('factory')\n    return M(4, 4)\n\n"
                      "def empty():\n    return torch.nn.ReLU()\n")
    assert main(["trace", f"{module}:make", "--input-shape", "2x4", "--dtype", "float32", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["params"] == 20 and {"import", "factory", "forward"} <= set(err.split())
    pytest.importorskip("scipy")
    assert main(["plan", "--model", f"{module}:empty", "--system", "h100", "--gpus", "8", "--input-shape", "2x4",
                 "--dtype", "float32"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines()[-1].endswith(
        f"model='{module}:empty' has no parameters: the sharding planner places parameters (meshplan "
                        "trace times a module without any)")  # was the ILP's internal error


def test_ctrl_c_swallowed_inside_c_code_still_exits_130(monkeypatch, capsys):
    """NumPy's loops check for signals and may clear the KeyboardInterrupt: the run must not exit 0."""
    import meshplan.cli.tools as tools

    real = tools.stack_names

    def interrupted():
        with contextlib.suppress(KeyboardInterrupt):  # swallowed, as inside NumPy
            os.kill(os.getpid(), signal.SIGINT)
        return real()

    monkeypatch.setattr(tools, "stack_names", interrupted)
    # the console script's condition: Python's own SIGINT handler (an earlier test file in this worker process, or a
    # library it imported, may have left another one, under which cli.main rightly leaves SIGINT alone)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(["presets"]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "meshplan: aborted" in capsys.readouterr().err


def test_an_interrupted_sweep_keeps_what_finished(tmp_path, monkeypatch, capsys):
    """Ctrl-C at the third of four points (the user's interrupt, raised where it lands): the two points done are
    written to sweep.csv / sweep.json, the run exits 130."""
    import meshplan.search.sweep as sweep

    real, calls = sweep.search_point, []

    def point(p):
        calls.append(p)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(p)

    monkeypatch.setattr(sweep, "search_point", point)
    out = tmp_path / "sw"
    code = main(["sweep", "--model", "gpt2", "--systems", "h100,a100", "--gpus", "1,2", "--workers", "1",
                 "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 130 and "interrupted: wrote the 2 of 4 points done" in err
    assert len((out / "sweep.csv").read_text().splitlines()) == 1 + 2
    assert len(json.loads((out / "sweep.json").read_text())) == 2
