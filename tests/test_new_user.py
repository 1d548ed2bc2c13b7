"""What a new user met in issue 80, each fixed: serving tables under load at the terminal's width with a legend and
their ranking stated (passing rows first); progress on stderr where there is no terminal to draw a spinner on;
``plan --help`` in sections; (tests/test_fuzz_classes.py: `presets` as a table, the extra a command misses)."""

from __future__ import annotations

import time

import click
import pytest

from meshplan.cli import common as cli_common
from meshplan.cli import main

SERVE = ["serve", "--model", "llama3-8b", "--system", "h100", "--gpus", "16", "--input-len", "2048", "--output-len",
         "256", "--rate", "40", "--requests", "300", "--top", "6"]


@pytest.mark.parametrize("width", [80, 120])
def test_load_tables_fit_the_terminal_and_explain_themselves(monkeypatch, capsys, width):
    monkeypatch.setenv("COLUMNS", str(width))
    assert main([*SERVE, "--tpot-slo", "7ms"]) == 0  # a tight target: some rows meet it, some do not
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width, max(lines, key=len)
    text = " ".join(out.split())
    assert "legend: #: rank: the configurations that meet every target first, then by goodput per GPU" in text
    assert "goodput: requests per second that meet every target" in text
    assert "preempted: requests the engine preempted for KV-cache room" in text
    assert "whether it meets the targets (TPOT p99 ≤ 7 ms)" in text
    meets = [line.split("│")[-2].strip() for line in lines if line.startswith("│") and
             line.split("│")[-2].strip() in ("yes", "no")]
    assert "yes" in meets and "no" in meets and meets == sorted(meets, key=lambda m: m != "yes")


def test_plan_help_is_in_sections():
    from meshplan.cli.main import cli

    plan = cli.commands["plan"]
    ctx = click.Context(plan, info_name="plan")
    text = plan.get_help(ctx)
    titles = [line.rstrip(":") for line in text.splitlines() if line and not line.startswith(" ")
              and line.endswith(":")]
    assert titles[:3] == ["Model, system and GPUs",
                          "Search space: what the search may choose (each axis fixed or narrowed)",
                          "Framework and software stack (each option overrides one field of the --framework preset)"]
    assert {"Time and cost", "Failures and checkpoints (--mtbf)", "Output",
            "Sharding planner (--autoshard, or a MODULE:FACTORY model)"} <= set(titles)
    listed = [p for p in plan.params if p.get_help_record(ctx) is not None]
    untagged = [p.name for p in listed if not hasattr(p, "meshplan_section")]
    assert untagged == [], untagged  # (click adds its own --help under "Options")


def test_progress_is_said_where_no_spinner_can_be_drawn(monkeypatch, capsys):
    """stderr is no terminal here (a pipe or a log): work that takes longer than NOTE_AFTER says what it does and
    how long it took; quick work says nothing; --json says nothing."""
    monkeypatch.setattr(cli_common, "NOTE_AFTER", 0.05)
    with cli_common.working("a long job"):
        time.sleep(0.3)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "meshplan: a long job …" and err[1].startswith("meshplan: a long job: ")
    with cli_common.working("a quick job"):
        pass
    with cli_common.working("a long job", quiet=True):
        time.sleep(0.2)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(cli_common, "NOTE_AFTER", 0.0001)
    assert main([*SERVE[:-2], "--top", "1"]) == 0
    assert "meshplan: serve: simulating 300 requests on each configuration" in capsys.readouterr().err
