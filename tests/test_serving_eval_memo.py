"""serving_eval.predict memoised (meshplan validate and the accuracy benchmarks price the same records again): a
record priced twice gives equal figures in a dict of its own; a record changed in one field is priced anew."""

from __future__ import annotations

import copy
from pathlib import Path

from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan_validation.records import read_runs
from meshplan_validation.serving_eval import _predict, predict
from meshplan_validation.serving_map import case_of

RECORD = read_runs(Path(__file__).parents[1] / "data/serving/published_serving.jsonl")[0]


def test_a_record_priced_twice_gives_the_same_figures_in_its_own_dict():
    first, batch = predict(case_of(RECORD))
    first["output_tokens_per_s"] = -1.0  # the caller's copy: the memo keeps its own
    again, batch_again = predict(case_of(copy.deepcopy(RECORD)))
    assert (again, batch_again) == _predict(case_of(RECORD), SERVE_DEFAULT)  # priced afresh, not from the memo
    assert again["output_tokens_per_s"] > 0 and batch_again == batch


def test_a_changed_record_is_priced_anew():
    longer = copy.deepcopy(RECORD)
    longer["workload"]["output_len"] = 2 * RECORD["workload"]["output_len"]
    base, changed = predict(case_of(RECORD))[0], predict(case_of(longer))[0]
    assert changed["e2e_latency_ms"] > base["e2e_latency_ms"]


def test_a_record_mapped_again_gets_the_same_specs_and_holds_itself():
    """serving_map.case_of keeps its cases by the record's JSON text: the same record, or an equal copy, again gets
    the same specs in a case that holds the record it was given; a record at tp 2 (2 GPUs) is mapped anew; a skipped
    record's reason is kept as well."""
    first = case_of(RECORD)
    assert case_of(RECORD).record is RECORD and case_of(RECORD).cluster is first.cluster
    twin = copy.deepcopy(RECORD)
    again = case_of(twin)
    assert again == first and again.record is twin and again.model is first.model and again.plan is first.plan
    wider = copy.deepcopy(RECORD)
    wider["parallel"]["tp"], wider["hardware"]["num_gpus"] = 2, 2
    assert (case_of(wider).plan.tp, case_of(wider).cluster.num_gpus) == (2, 2) and first.plan.tp == 1
    bare = copy.deepcopy(RECORD)
    bare["hardware"]["preset"] = None
    assert case_of(bare) == case_of(copy.deepcopy(bare)) == "no meshplan hardware preset for H200-SXM-141GB"
