"""data/rl/published_rl.jsonl: every record cites its source pinned to a commit, states what it measured in phases
meshplan prices, and maps to specs meshplan accepts (the model, the system, the job and the placement); the records
cover at least ten published runs and three phases."""

from __future__ import annotations

import re

import pytest

from meshplan.serve.engine import load_engine
from meshplan_validation.rl_eval import PHASES, job_of, model_of, placement, read_records

RECORDS = read_records()
REQUIRED = ("id", "group", "source", "source_url", "source_locator", "framework", "algorithm", "model", "hardware",
            "setup", "trainer", "engine", "sync", "measured")


def test_at_least_ten_runs_and_three_phases():
    assert len(RECORDS) >= 10
    assert len({k for r in RECORDS for k in r["measured"]}) >= 3


def test_ids_are_unique():
    ids = [r["id"] for r in RECORDS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("rec", RECORDS, ids=[r["id"] for r in RECORDS])
def test_a_record_is_complete_and_cited(rec):
    missing = [k for k in REQUIRED if k not in rec]
    assert not missing, missing
    assert re.search(r"/blob/[0-9a-f]{7,40}/", rec["source_url"]), "pin the source to a commit"
    assert set(rec["measured"]) <= set(PHASES) and all(v > 0 for v in rec["measured"].values())
    assert rec["assumptions"], "a record states what it assumed (or says none was needed)"


@pytest.mark.parametrize("rec", RECORDS, ids=[r["id"] for r in RECORDS])
def test_a_record_maps_to_specs(rec):
    model = model_of(rec)
    job = job_of(rec)
    plan = placement(rec, job, load_engine(rec["engine"].get("preset", "vllm")).max_seqs)
    assert plan.num_gpus == rec["hardware"]["gpus"]
    assert model.params() > 1e9
    if job is not None:
        assert job.sequences == rec["job"]["prompts"] * rec["job"]["samples_per_prompt"]
