"""Bad runs files for ``meshplan validate`` and the benchmark scripts that read them: a record without an id is one
line and exit status 2, a missing or malformed file one line from the scripts, and a record of absurd numbers a
skipped run (exit 0, nothing on stderr), not a bug."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bad_input_helpers import fails
from meshplan.cli import main
from meshplan_validation.records import runs_from_command_line


@pytest.mark.parametrize(("record", "message"), [
    ({"id": None, "model": {"name": "llama3-8b"}}, "runs.jsonl:1: a record must be an object with a non-empty"),
    ({"id": "", "model": {"name": "llama3-8b"}}, "non-empty string 'id'"),
])
def test_validate_records_need_an_id(record, message, tmp_path, capsys):
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps(record) + "\n")
    assert message in fails(["validate", str(runs)], capsys)


def test_a_validation_record_with_an_absurd_batch_is_not_a_bug(tmp_path, capsys):
    """A global batch of 1e308 (an OverflowError before) and a subnormal measurement: skipped, exit 0, and
    nothing on stderr (no internal error, no RuntimeWarning)."""
    record = {"id": "r", "group": "g", "framework": "Megatron-LM",
              "model": {"name": "GPT-1.7B", "num_layers": 24, "hidden_size": 2304, "num_heads": 24,
                        "ffn_hidden_size": 9216, "vocab_size": 51200, "seq_length": 2048},
              "hardware": {"gpu": "A100-SXM4-80GB", "num_gpus": 32, "gpus_per_node": 8},
              "parallel": {"tp": 1, "pp": 1, "dp": 32, "global_batch_size": 1e308},
              "measured": {"model_tflops_per_gpu": 1e-320}}
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps(record) + "\n")
    code = main(["validate", str(runs)])
    out, err = capsys.readouterr()
    assert code == 0 and err == "" and "no comparable measurement" in out, err


@pytest.mark.parametrize(("content", "message"), [
    (None, "validation file={path!r}: no such file"),
    ('{"x": 1}\n', "{path}:1: a record must be an object with a non-empty string 'id'"),
])
def test_benchmark_scripts_name_a_bad_runs_file_in_one_line(content, message, tmp_path, monkeypatch):
    """benchmarks/docs/accuracy.py and fit_efficiency.py read their runs file through records.runs_from_command_line:
    a missing or malformed file ends them with one line, not a traceback."""
    monkeypatch.chdir(tmp_path)  # a short name: past 80 characters a path is quoted by its ends (files._shown)
    path = Path("runs.jsonl")
    if content is not None:
        path.write_text(content)
    monkeypatch.setattr(sys, "argv", ["accuracy.py", str(path)])
    with pytest.raises(SystemExit) as stop:
        runs_from_command_line(tmp_path / "default.jsonl", "Validate.\n\nMore.")
    assert stop.value.code == "accuracy.py: " + message.format(path=str(path))
