"""benchmarks/measure/speed_guard.py, CI's check of the speed margin (issue 83): its arithmetic on made-up timings (the
ratio of each command to the reference runs around it, the verdict against the baseline), and that its baseline covers
every command against today's reference workload. The timing itself runs in .ci/run, not here (a timed test fails on a
loaded machine; a ratio to the reference does not)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("speed_guard", ROOT / "benchmarks" / "measure" / "speed_guard.py")
guard = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = guard  # its dataclasses look their module up there
_spec.loader.exec_module(guard)


def test_a_ratio_is_the_command_over_the_reference_runs_around_it(monkeypatch):
    """Reference runs take 1, 2, 1, 2 … s (a machine slowing and recovering), a command twice the reference run
    before it: each ratio is its time over the mean of its two neighbours, 2·r / ((r + r') / 2); the median over the
    rounds is the verdict's."""
    calls = {"n": 0}

    def fake(cmd: list[str]) -> tuple[float, float]:
        if cmd[:2] == [sys.executable, "-c"] and cmd[2] == guard.REFERENCE:
            calls["n"] += 1
            return (1.0 if calls["n"] % 2 else 2.0), 9.0
        return 3.0, 4.0  # every command: 3 s of CPU, 4 s of wall clock

    monkeypatch.setattr(guard, "timed", fake)
    one = (guard.Command("a", ("--help",), 1.0),)
    measured, reference = guard.measure(one, rounds=3, tmp="/tmp")
    # the warm-up's reference is run 1 (1 s); each round then runs 2 s before the command, 1 s after: 3 / 1.5 = 2
    assert measured[0].ratio == pytest.approx(2.0) and measured[0].cpu_s == 3.0 and measured[0].wall_s == 4.0
    assert reference == pytest.approx(1.5)  # the median of 2, 1, 1, 2, 2, 1 … (six reference runs after the warm-up)


def test_a_command_fails_only_when_its_ratio_grew_more_than_the_tolerance():
    made = [guard.Measured("fast", 1.0, 1.0, 1.19, 1.0), guard.Measured("slow", 1.0, 1.0, 1.21, 1.0),
            guard.Measured("new", 1.0, 1.0, 9.0, 1.0)]
    lines = guard.verdicts(made, {"fast": 1.0, "slow": 1.0})  # 1.19 is within +20 %, 1.21 is not; "new" has none
    assert len(lines) == 1 and lines[0].startswith("slow: 1.21 x the reference, baseline 1.00 (+21% > +20%)")


def test_the_baseline_covers_every_command_against_todays_reference():
    saved = json.loads(guard.BASELINE.read_text())
    assert saved["reference"] == guard.reference_id(), "the reference workload changed: --baseline-update"
    assert set(saved["ratios"]) == {c.label for c in guard.COMMANDS}
    assert all(r > 0 for r in saved["ratios"].values())


def test_ci_runs_the_guard():
    assert "benchmarks/measure/speed_guard.py" in (ROOT / ".ci" / "run").read_text()


def test_a_command_runs_under_its_env_and_the_strong_scaling_plan_in_one_process(monkeypatch):
    """A command's ``env`` is set for its runs, over the guard's own environment; the 8-count plan's keeps one process
    (MESHPLAN_WORKERS=1: forked or not by the load, its CPU seconds would move with the load, not the code)."""
    seen = []
    monkeypatch.setattr(guard, "timed", lambda cmd, env=None: seen.append((cmd, env)) or (1.0, 1.0))
    guard.run(["meshplan"], guard.Command("a", ("--help",), 1.0, env=(("MESHPLAN_WORKERS", "1"),)), "/tmp")
    guard.run(["meshplan"], guard.Command("b", ("--help",), 1.0), "/tmp")
    assert seen[0][0] == ["meshplan", "--help"] and seen[0][1]["MESHPLAN_WORKERS"] == "1"
    assert seen[0][1]["PATH"] == os.environ["PATH"]  # the rest of the environment kept
    assert seen[1][1] is None  # no env of its own: the guard's
    (scaling,) = [c for c in guard.COMMANDS if c.label == "plan with 8 GPU counts"]
    assert dict(scaling.env) == {"MESHPLAN_WORKERS": "1"}
