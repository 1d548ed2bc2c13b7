"""Every command's default output reads at 80 columns (COLUMNS=80): no line wider, no table cell cut to "…", no
number split over two lines. plan, estimate and serve fold their tables (report/fold.py); every other table printed
through the terminal console is folded the same way (fold.refold), which the last test checks on a table of any
shape. And what takes more than a moment shows progress on stderr (cli/common.working), on a terminal only."""

from __future__ import annotations

import os
import re
import sys

import pytest

from meshplan.cli import main

RUN = ["--model", "llama3-8b", "--system", "h100", "--gpus", "8"]
TORCH_FACTORY = "tests/data/measure_model.py:make"
COMMANDS = {
    "plan": ["plan", *RUN],
    "estimate": ["estimate", *RUN],
    "serve": ["serve", *RUN, "--input-len", "512", "--output-len", "128"],
    "sweep": ["sweep", "--model", "llama3-8b", "--systems", "h100,a100", "--gpus", "8,16", "--workers", "1"],
    "trace": ["trace", "{mlp}:make", "--input-shape", "4x128"],
    "sharding planner": ["plan", "--autoshard", "--model", "gpt2", "--system", "h100", "--gpus", "8"],
    "check-step": ["check-step", TORCH_FACTORY, "--steps", "3", "--warmup", "0", "--rounds", "2"],  # the least it takes
}
NUMBER_SPLIT = re.compile(r"│ +(?:us|ms|s|ns|KiB|MiB|GiB|k|M) │")  # a unit whose number stayed on the line above


def _check(out: str) -> None:
    lines = out.splitlines()
    assert lines and max(map(len, lines)) <= 80, max(lines, key=len)
    cells = [line for line in lines if "│" in line or "┃" in line]
    assert not [c for c in cells if "…" in c], [c for c in cells if "…" in c][:3]
    assert not NUMBER_SPLIT.search(out), NUMBER_SPLIT.search(out)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reads_at_80_columns(command, tmp_path, monkeypatch, capsys):
    if command in ("trace", "sharding planner", "check-step"):
        pytest.importorskip("torch")
    mlp = tmp_path / "mlp.py"
    mlp.write_text("import torch\n\ndef make():\n    return torch.nn.Sequential(torch.nn.Embedding(1000, 64), "
                   "torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 1000))\n")
    monkeypatch.setenv("COLUMNS", "80")
    args = [a.replace("{mlp}", str(mlp)) for a in COMMANDS[command]]
    if command == "sweep":
        args += ["-o", str(tmp_path / "sweep")]
    assert main(args) == 0
    _check(capsys.readouterr().out)


def test_any_table_is_folded_to_the_terminal(monkeypatch, capsys):
    """A table of eleven columns (check-step's discrepancies had them cut to 'net…', '14.5\\n us'): folded into
    tables that repeat the key column, every cell whole."""
    from rich.table import Table

    from meshplan.report.console import terminal_console

    monkeypatch.setenv("COLUMNS", "80")
    table = Table(title="wide")
    for h in ("#", "op", "phase", "class", "shape", "predicted", "measured", "launches", "host", "fused", "time"):
        table.add_column(h, justify="left" if h in ("op", "phase", "class", "shape") else "right")
    for i in range(5):
        table.add_row(str(i), f"Classifier/net.{i}/gelu_backward", "bwd_x", "pointwise", "16x32x4096", "14.5 us",
                      "112 us", "1", "2.53 us", "5", "1.74 us")
    terminal_console().print(table)
    out = capsys.readouterr().out
    _check(out)
    assert "Classifier/net.4/gelu_backward" in out and out.count("(continued, by #)") >= 1
    assert not NUMBER_SPLIT.search(out)


def _drain(fd: int) -> str:
    """Everything written to the pseudo-terminal so far: rich writes the hidden cursor and the line in separate
    writes, and one read may return only the first (CI saw '\x1b[?25l' alone)."""
    import select

    chunks = []
    while select.select([fd], [], [], 0.2)[0]:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def test_progress_shows_on_a_terminal_only(monkeypatch):
    """working(): a line with the task on stderr when it is a terminal (a pseudo-terminal here), nothing otherwise
    or with quiet (--json)."""
    import io

    from meshplan.cli.common import working

    primary, secondary = os.openpty()
    with os.fdopen(secondary, "w") as tty:
        monkeypatch.setattr(sys, "stderr", tty)
        with working("measuring the step"):
            pass
        tty.flush()
        shown = _drain(primary)
    os.close(primary)
    assert "measuring the step" in shown
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    with working("measuring the step"):
        pass
    with working("measuring the step", quiet=True):
        pass
    assert quiet.getvalue() == ""
