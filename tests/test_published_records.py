"""A published record as read (records.py, record_fields.py, map_model.py, measurement.py): a complete configuration
states layout, batches, recompute and precision, judged on the record as published; numbers and flags written as
text; other names for the measured quantities; a record without sizes takes the preset it names; and what cannot be
read is a Skip with its reason, never an exception."""

from __future__ import annotations

import pytest

from meshplan.specs.model_load import load_model
from meshplan_validation.case import map_run
from meshplan_validation.map_model import map_model
from meshplan_validation.record_fields import fill_from_siblings, lenders
from meshplan_validation.records import clean_record, unstated_settings
from meshplan_validation.skip import Skip
from meshplan_validation.summary import summaries
from meshplan_validation.validate import run_validation
from published_helpers import indep, record


@pytest.mark.parametrize(("over", "unstated"), [
    ({"parallel": {"activation_recompute": "selective"}}, ()),
    ({}, ("activation_recompute",)),  # the NVIDIA tables' gap
    ({"parallel": {"activation_recompute": "none", "micro_batch_size": None}}, ("micro_batch_size",)),
    ({"parallel": {"activation_recompute": "full", "tp": None, "pp": None}}, ()),  # zero_or_fsdp stated: DP only
    ({"parallel": {"activation_recompute": "full", "tp": None, "zero_or_fsdp": None}},
     ("parallel layout (tp and pp, or zero_or_fsdp)",)),
    ({"parallel": {"activation_recompute": "full"}, "precision": "not stated (assumed BF16)"}, ("precision",)),
    ({"parallel": {"activation_recompute": "unknown"}, "precision": ""}, ("activation_recompute", "precision")),
    ({"parallel": {"activation_recompute": "none (stated in the text)"}}, ()),
])
def test_a_complete_configuration_states_layout_batches_recompute_and_precision(over, unstated):
    assert unstated_settings(clean_record(record(**over))) == unstated


def test_completeness_is_judged_on_the_record_as_published():
    """A sibling's micro-batch lent by fill_from_siblings does not make a record complete."""
    stated = record(id="a", parallel={"activation_recompute": "none", "dp": 2})
    lent = record(id="b", parallel={"activation_recompute": "none", "dp": 2, "micro_batch_size": None})
    assert fill_from_siblings(clean_record(lent), [clean_record(stated)])["parallel"]["micro_batch_size"] == 1
    results = {r.id: r for r in run_validation([stated, lent])}
    assert results["a"].complete and not results["b"].complete
    assert results["b"].error == pytest.approx(results["a"].error)  # evaluated with the sibling's micro-batch
    summary = summaries(list(results.values()))
    assert (summary["complete"]["evaluated"], summary["overall"]["evaluated"]) == (1, 2)


def test_the_lender_is_the_first_current_sibling_that_states_the_settings_looked_up_or_scanned():
    """fill_from_siblings with the index a validation builds once (``lenders``) lends what the search without it
    lends: the first record of the same group, model and tp/pp that is current, states every borrowed setting and a
    dp; its global batch scaled by dp (256 × 4 / 2 = 512)."""
    def run(rid, **parallel):
        return clean_record(record(id=rid, parallel={"activation_recompute": "none", "dp": 2} | parallel))
    lent = run("lent", dp=4, micro_batch_size=None, global_batch_size=None)
    superseded = run("old", micro_batch_size=7) | {"superseded": True}
    no_dp = run("no-dp", dp=None, micro_batch_size=6)
    other_tp = run("tp8", tp=8, micro_batch_size=5)
    other_group = run("grp", micro_batch_size=4) | {"group": "paper"}
    first, second = run("first", micro_batch_size=3), run("second", micro_batch_size=2)
    records = [lent, superseded, no_dp, other_tp, other_group, first, second]
    index = lenders(records)
    assert index is not None and [r["id"] for r in index[("megatron_bridge_26.04", "Llama3-70B", 4, 8)]] == [
        "first", "second"]
    for given in (None, index):
        filled = fill_from_siblings(lent, records, given)
        assert (filled["parallel"]["micro_batch_size"], filled["parallel"]["global_batch_size"]) == (3, 512)
        assert filled["_borrowed"].startswith("from first ")
    listed = lent | {"model": lent["model"] | {"name": ["Llama3-70B"]}}  # raw: a list where a name goes, scanned
    assert lenders([listed, listed | {"parallel": first["parallel"]}]) is None
    assert fill_from_siblings(listed, [listed, listed | {"id": "l2", "parallel": first["parallel"]}])["_borrowed"] \
        .startswith("from l2 ")


def test_a_repeated_model_section_maps_to_the_same_spec_and_notes():
    """map_model's memo: the same section and text give an equal spec and a fresh list of the same notes (a caller
    that extends it does not change the next answer); another text is mapped afresh."""
    m = dict(record()["model"], ffn_hidden_size=None, vocab_size=32000)
    spec, notes = map_model(m, "")
    notes.append("changed by the caller")
    again, notes_again = map_model(dict(m), "")
    assert again == spec and "changed by the caller" not in notes_again and notes_again == notes[:-1]
    assert map_model(m | {"vocab_size": 32001}, "")[0].vocab_size == 32001


@pytest.mark.parametrize(("over", "reason"), [
    ({"model": {"name": "Nemotron-3-Super", "arch": None, "num_layers": None, "hidden_size": None,
                "num_heads": None, "num_kv_heads": None, "ffn_hidden_size": None, "vocab_size": None}},
     "hybrid Mamba-2 model with a latent MoE, compared apart"),
    ({"model": {"name": "Nemotron-3-Ultra", "arch": None, "num_layers": None, "hidden_size": None,
                "num_heads": None}}, "sizes not recorded"),
    ({"measured": {"tokens_per_s_per_gpu": None, "model_tflops_per_gpu": None}}, "all values null"),
    ({"hardware": {"gpu": "TPU v5p", "num_gpus": 64}}, "no system preset"),
])
def test_unmappable_records_raise_skip_with_the_reason(over, reason):
    with pytest.raises(Skip, match=reason):
        map_run(record(**over))


def test_a_moe_record_without_a_dense_ffn_or_with_uneven_heads_still_maps():
    """Grok-1-like sizes (all layers MoE: F from the experts) and GPT-OSS-like heads (64 heads of 64 on a hidden size
    of 2880, not of 2880 / 64 = 45) that no preset matches; heads that do not split the hidden size (48 on 2000)
    without a head_dim are a reason to skip, not an error."""
    moe = {"name": "some-moe", "arch": "moe", "num_layers": 4, "hidden_size": 2880, "num_heads": 64,
           "num_kv_heads": 8, "ffn_hidden_size": None, "head_dim": 64, "vocab_size": 32000, "seq_length": 4096,
           "num_experts": 8, "moe_topk": 2, "moe_ffn_hidden_size": 5760}
    case = map_run(indep("x", model=moe, parallel={"tp": 1, "pp": 1, "vp": None}))
    assert (case.model.ffn_hidden_size, case.model.moe_ffn_hidden_size, case.model.head_dim) == (5760, 5760, 64)
    with pytest.raises(Skip, match="head_dim is not recorded"):
        map_run(indep("x", model=moe | {"hidden_size": 2000, "num_heads": 48, "head_dim": None},
                       parallel={"tp": 1, "pp": 1, "vp": None}))


def test_numbers_written_as_text_are_read_and_unknowns_are_not_stated():
    rec = clean_record(record(model={"hidden_size": "8,192", "seq_length": "8192"},
                              parallel={"tp": "4", "pp": "n/a", "micro_batch_size": "", "global_batch_size": [256]},
                              measured={"tokens_per_s_per_gpu": "1664.0"}))
    assert rec["model"]["hidden_size"] == 8192 and rec["parallel"]["tp"] == 4
    assert rec["parallel"]["pp"] is None and rec["parallel"]["micro_batch_size"] is None
    assert rec["parallel"]["global_batch_size"] is None and rec["measured"]["tokens_per_s_per_gpu"] == 1664.0
    case = map_run(record(parallel={"tp": "4", "pp": "8", "vp": "5"}, measured={"tokens_per_s_per_gpu": "1664"}))
    assert (case.plan.tp, case.plan.pp, case.plan.vpp, case.measured) == (4, 8, 5, 1664.0)


@pytest.mark.parametrize("broken", [
    {"model": "Llama3-70B"}, {"parallel": [4, 8]}, {"hardware": {"gpu": 7, "num_gpus": "sixty-four"}},
    {"parallel": {"micro_batch_size": 0, "dp": -1}}, {"measured": {"tokens_per_s_per_gpu": "n/a"}},
])
def test_a_record_it_cannot_read_is_listed_with_a_reason_never_raised(broken):
    rec = record() | broken
    (result,) = run_validation([rec])
    assert result.error is not None or result.skipped  # evaluated, or skipped with its reason


@pytest.mark.parametrize(("name", "preset"), [
    ("Llama-2-7b-hf", "llama2-7b"), ("Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"), ("Llama 3.1 405B", "llama3.1-405b"),
    ("DeepSeek-V3", "deepseek-v3"),
    ("GPT-2 XL", None), ("Llama 2 70B chat", "llama2-70b"),
])
def test_a_record_without_sizes_takes_the_preset_it_names(name, preset):
    from meshplan_validation.map_model import preset_by_name

    assert preset_by_name(name) == preset
    if preset:
        sizes = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size")
        case = map_run(record(model={k: None for k in sizes} | {"name": name, "arch": None}))
        assert any(f"preset {preset}" in a for a in case.assumptions)
        assert case.model.num_layers == load_model(preset).num_layers


def test_flags_written_as_text_and_values_that_are_not_numbers():
    off = map_run(record(parallel={"sequence_parallel": "false", "async_tp": "no"}))
    assert not off.plan.sequence_parallel and not off.stack.overlap_tp
    on = map_run(record(parallel={"sequence_parallel": "true"}))
    assert on.plan.sequence_parallel
    (result,) = run_validation([record(measured={"tokens_per_s_per_gpu": "nan", "model_tflops_per_gpu": None})])
    assert result.skipped and "no comparable measurement" in result.skipped


@pytest.mark.parametrize(("measured", "metric", "value"), [
    ({"step_time_ms": 1500.0}, "iteration_time_s", 1.5), ({"mfu": 0.41}, "mfu_pct", 41.0),
    ({"mfu": 41.0}, "mfu_pct", 41.0),
    ({"samples_per_s": 2.0}, "tokens_per_s_total", 2.0 * 8192),
])
def test_other_names_for_the_measured_quantities(measured, metric, value):
    case = map_run(record(measured={"tokens_per_s_per_gpu": None, "model_tflops_per_gpu": None} | measured))
    assert case.metric == metric and case.measured == pytest.approx(value)


def test_a_measured_zero_is_no_measurement():
    (result,) = run_validation([record(measured={"tokens_per_s_per_gpu": 0, "model_tflops_per_gpu": None})])
    assert result.skipped and "no comparable measurement" in result.skipped
