"""The causal mask Megatron-DeepSpeed built on the CPU for every micro-batch in vTrain's release window
(meshplan_validation/sources.py MDS_CPU_MASK_1024, benchmarks/measure/cpu_causal_mask.py): the constant is the
committed measurement, the measurement grows with the sequence as the mask's s x s elements do, and a run of that
release timed end to end would pay it once per micro-batch slot of its critical path, at the A100 host's speed
(vTrain's released times do not: meshplan_validation/source_vtrain.py)."""

import json
from pathlib import Path

import pytest

from meshplan.estimate import estimate
from meshplan.specs.stack import load_stack
from meshplan_validation.case import map_run
from meshplan_validation.records import clean_record, read_runs
from meshplan_validation.sources import MDS_CPU_MASK_1024, VTRAIN

ROOT = Path(__file__).resolve().parents[1]
MEASURED = json.loads((ROOT / "data" / "measured" / "2026-11-28-cpu-causal-mask.json").read_text())


def test_constant_is_the_committed_measurement():
    """1.14 ms: the file's least time at sequence 1024, to the 0.01 ms the constant is written to."""
    assert MEASURED["seconds_by_sequence"]["1024"] == pytest.approx(MDS_CPU_MASK_1024, abs=5e-6)


def test_mask_time_grows_with_the_sequence():
    """ones, tril and < 0.5 each touch all s x s elements: 512, 1024, 2048 take longer in turn, and at least as long
    per element (the larger masks leave the caches)."""
    t = MEASURED["seconds_by_sequence"]
    assert t["512"] < t["1024"] < t["2048"]
    per = MEASURED["ns_per_mask_element"]
    assert per["512"] <= per["1024"] <= per["2048"]


def test_neither_the_preset_nor_vtrains_graph_pays_it():
    """The megatron-deepspeed preset (f4157bea, after #411 moved the mask to the GPU) does not carry the mask; nor do
    vTrain's released times, which its graph composes from its own model's traced modules, whose mask is built on the
    GPU outside them (meshplan_validation/source_vtrain.py): a run of 4822c87e timed end to end would pay it."""
    assert VTRAIN.stack.microbatch_host == 0.0
    assert load_stack("megatron-deepspeed").microbatch_host == 0.0


@pytest.mark.parametrize(("tp", "pp", "gbs", "slots"), [(8, 1, 16, 16), (2, 2, 8, 9)])
def test_paid_per_micro_batch_slot(tp, pp, gbs, slots):
    """The 12 x 1024 GPT at micro-batch 1: tp 8 pp 1 runs 16 micro-batches, tp 2 pp 2 runs 8 over 2 stages, 8 + 2 - 1
    = 9 slots on its critical path; each pays 1.14 ms x 1.34 (the DGX A100 host's python_host) = 1.528 ms, so 24.44
    and 13.75 ms a step."""
    records = [clean_record(r) for r in read_runs(ROOT / "data" / "validation" / "vtrain_single_node_dev.jsonl")]
    record = next(r for r in records if r["model"]["num_layers"] == 12 and r["model"]["hidden_size"] == 1024
                  and (r["parallel"]["tp"], r["parallel"]["pp"], r["parallel"]["micro_batch_size"],
                       r["parallel"]["global_batch_size"]) == (tp, pp, 1, gbs))
    case = map_run(record, False)
    with_mask = estimate(case.model, case.cluster, case.plan, case.stack.with_(microbatch_host=MDS_CPU_MASK_1024),
                         case.efficiency()).step_time
    without = estimate(case.model, case.cluster, case.plan, case.stack, case.efficiency()).step_time
    assert with_mask - without == pytest.approx(slots * MDS_CPU_MASK_1024 * 1.34, rel=1e-9)
