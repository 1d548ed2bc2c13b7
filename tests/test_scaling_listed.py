"""The strong-scaling table lists one plan a count (issue 83): ``meshplan plan --gpus A,B,...`` shows each count's first
plan alone, so its searches list one (cli/plan.py ``_listed``) and the plans under #1 are not estimated (80 of the
guard's 8-count plan's 101 ``estimate()`` calls). The table is the same, byte for byte, as the one drawn from the
searches listing ``--top`` plans: the first plan, the fastest and the counts do not depend on the number listed
(tests/test_top_k.py), and what the shares keep is the stage DP's ``POOL`` either way (search/run.py ``_kept``)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from meshplan.cli import plan as plan_cli
from meshplan.cli.main import main
from meshplan.search.stage_pool import POOL

COUNTS = plan_cli._counts
ARGS = ["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8,16,32", "--global-batch", "64"]


def _text(capsys, monkeypatch, listed) -> tuple[str, list[int]]:
    """The table's text (the timing figures masked) and the number each search was asked to list."""
    asked: list[int] = []

    def spy(spaces, top_k, *rest):
        asked.append(top_k)
        return COUNTS(spaces, top_k, *rest)

    monkeypatch.setattr(plan_cli, "_counts", spy)
    if listed is not None:
        monkeypatch.setattr(plan_cli, "_listed", listed)
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    return re.sub(r"in [0-9.]+ s \([0-9,]+ plans/s", "in T s (R plans/s", out), asked


def test_the_table_listing_one_is_the_table_listing_top(capsys, monkeypatch):
    one, asked_one = _text(capsys, monkeypatch, None)
    top, asked_top = _text(capsys, monkeypatch, lambda spaces, top_k, read_all: top_k)
    assert asked_one == [1] and asked_top == [10]  # the default --top 10
    assert "strong scaling" in one and one == top


@pytest.mark.parametrize(("count", "top_k", "read_all", "stage_layers", "asynchronous", "simplest", "listed"), [
    (3, 10, False, True, False, False, 1),  # the table alone: one
    (3, POOL, False, True, False, False, 1),
    (1, 10, False, True, False, False, 10),  # one count: the full listing is shown
    (3, 10, True, True, False, False, 10),  # --json, --emit, --all or --mtbf read the rest
    (3, POOL + 1, False, True, False, False, POOL + 1),  # the shares would keep more than the DP's pool
    (3, 10, False, False, False, False, 10),  # no stage DP: the shares keep top_k
    (3, 10, False, True, True, False, 10),  # asynchronous schedules: their notes name the listed plans'
    (3, 10, False, True, False, True, 10),  # the simplest of the band leads
])
def test_what_is_listed(count, top_k, read_all, stage_layers, asynchronous, simplest, listed):
    space = SimpleNamespace(stage_layers=stage_layers, async_schedules=("pipedream",) if asynchronous else (),
                            simplest_leads=simplest)
    assert plan_cli._listed([(None, None, space, None)] * count, top_k, read_all) == listed
