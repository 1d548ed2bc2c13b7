"""The ``validate`` click command of the validation layer (meshplan_validation.command.validate), run on its own as
the CLI's entry point registers it: text and JSON output, its options, and an unknown group refused by name."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from meshplan.errors import SpecError
from meshplan_validation.command import validate

RECORD = {"id": "r1", "group": "g", "framework": "Megatron-Bridge", "precision": "bf16",
          "model": {"name": "Llama3-8B"}, "hardware": {"gpu": "H100", "num_gpus": 8},
          "parallel": {"tp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 8},
          "measured": {"tokens_per_s_per_gpu": 10000}}


@pytest.fixture
def runs(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(RECORD) + "\n" + json.dumps(RECORD | {"id": "r2", "group": "h"}) + "\n")
    return str(path)


def test_the_command_is_named_validate_with_its_options():
    assert validate.name == "validate"
    assert {p.name for p in validate.params} == {"path", "group", "exclude_superseded", "hybrid", "as_json"}


def test_json_output_lists_every_run_of_the_group(runs):
    result = CliRunner().invoke(validate, [runs, "--json", "--group", "g"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [r["id"] for r in out["runs"]] == ["r1"] and out["summary"]["evaluated"] == 1


def test_text_output_is_the_table_and_the_summaries(runs):
    result = CliRunner().invoke(validate, [runs])
    assert result.exit_code == 0, result.output
    assert "Published runs: predicted vs measured" in result.output and "|error| by group" in result.output


def test_an_unknown_group_is_a_spec_error_naming_the_groups(runs):
    result = CliRunner().invoke(validate, [runs, "--group", "x"])
    assert isinstance(result.exception, SpecError)
    assert "group='x' is not in" in str(result.exception) and "groups: g, h" in str(result.exception)
