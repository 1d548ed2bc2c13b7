"""validate reads what real tables print (issue 34, item 6): sizes a family's convention fixes are derived and said,
measured fields with a statistic's name are read, a layout whose dp is unstated or contradicts the GPU count takes dp
from the GPUs, and a record it still cannot evaluate names what is missing; mutated records never raise."""

from __future__ import annotations

import copy
import importlib
import json
import math
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplan_validation.case import map_run
from meshplan_validation.record_fields import family_key, llama1_ffn
from meshplan_validation.records import clean_record, number, read_runs
from meshplan_validation.render import render_text
from meshplan_validation.skip import Skip
from meshplan_validation.summary import summaries
from meshplan_validation.validate import run_validation, validate_command
from published_helpers import record, validated

ROOT = Path(__file__).parents[1]
PUBLISHED = ROOT / "data/validation/published_runs.jsonl"
INDEPENDENT = ROOT / "benchmarks/data/independent_runs.jsonl"


def gpt(**model) -> dict:
    """A GPT-3-style model no preset has (26 layers of 2560): sizes as a table prints them, some left out."""
    sizes = {"name": "GPT-3 3B (paper-style)", "arch": "dense", "num_layers": 26, "hidden_size": 2560, "num_heads": 20,
             "num_kv_heads": None, "ffn_hidden_size": None, "vocab_size": 51200, "seq_length": 2048}
    return record(model=sizes | model, parallel={"tp": 1, "pp": 1, "vp": None, "global_batch_size": 64})


def text(case) -> str:
    return " | ".join(case.assumptions)


# ---- 1. sizes a family's convention fixes ------------------------------------------------------------------------
def test_a_gpt_ffn_and_kv_heads_are_derived_and_said():
    """GPT-3 (Brown et al. 2020, Table 2.1): d_ff = 4·d_model = 4 · 2560 = 10240, multi-head attention: K = A = 20."""
    case = map_run(gpt())
    assert (case.model.ffn_hidden_size, case.model.num_kv_heads, case.model.mlp) == (10240, 20, "gelu")
    assert ("ffn_hidden_size 10240 = 4·hidden_size, num_kv_heads = num_heads = 20 (multi-head attention): not "
            "recorded, the GPT convention (Radford et al. 2019 (GPT-2) and Brown et al. 2020 (GPT-3), Table 2.1"
            ) in text(case)
    # the same model with the sizes stated maps to the same spec, without those notes
    stated = map_run(gpt(num_kv_heads=20, ffn_hidden_size=10240))
    assert stated.model == case.model and "not recorded" not in text(stated)


@pytest.mark.parametrize(("name", "family"), [
    ("BLOOM-style GPT (70L x 14336h, 64 heads)", "BLOOM"), ("OPT-30B-like", "OPT"), ("MPT-5b", "MPT"),
    ("GPT-NeoX-like 12B", "GPT-NeoX"), ("Megatron-Turing NLG 100B", "Megatron-Turing NLG"),
])
def test_other_gpt_style_families_have_the_4h_ffn(name, family):
    case = map_run(gpt(name=name))
    assert case.model.ffn_hidden_size == 4 * 2560 and f"the {family} convention" in text(case)


def test_llama1_sizes_follow_its_code():
    """LLaMA v1's FeedForward: int(2·4h/3) rounded up to a multiple of 256; 33B (h 6656): int(17749.3) = 17749 →
    70 · 256 = 17920 (the HF llama-30b intermediate_size); vocab 32,000 and 2048 tokens; multi-head attention."""
    assert [llama1_ffn(h) for h in (4096, 5120, 6656, 8192)] == [11008, 13824, 17920, 22016]
    case = map_run(gpt(name="LLaMA 33B", num_layers=60, hidden_size=6656, num_heads=52, vocab_size=None,
                       seq_length=None))
    m = case.model
    assert (m.ffn_hidden_size, m.num_kv_heads, m.vocab_size, m.seq_length, m.mlp) == (17920, 52, 32000, 2048, "swiglu")
    assert ("ffn_hidden_size 17920 = LLaMA's SwiGLU rule, num_kv_heads = num_heads = 52 (multi-head attention), "
            "vocab_size 32000, seq_length 2048: not recorded, the LLaMA (v1) convention") in text(case)


def test_a_later_llama_ffn_is_not_guessed():
    """Llama 2/3 scale the SwiGLU width by a per-model ffn_dim_multiplier: no rule fixes it, so a Llama-3-style
    model no preset matches is skipped, naming the field."""
    with pytest.raises(Skip, match=r"model\.ffn_hidden_size not recorded"):
        map_run(gpt(name="Llama 3 13B-style", num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=8,
                    vocab_size=128256))
    with pytest.raises(Skip, match=r"model\.num_kv_heads not recorded"):  # MHA or GQA: not guessed either
        map_run(gpt(name="Grok-like", ffn_hidden_size=10240))


def test_vocab_and_sequence_come_from_the_family_presets_when_they_agree():
    """Llama 3's presets (8B, 70B, 3.1 405B) share V = 128256 and s = 8192; a Llama-3 size no preset has takes them."""
    assert family_key("Llama 3.1 405B") == family_key("llama3-8b") == "llama3"
    case = map_run(gpt(name="Llama-3 13B", num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=8,
                       ffn_hidden_size=17920, vocab_size=None, seq_length=None))
    assert (case.model.vocab_size, case.model.seq_length) == (128256, 8192)
    assert "vocab_size 128256 from the llama3 family's presets" in text(case)
    # a preset that matches the sizes lends its sequence length, and says so
    preset = map_run(record(model={"seq_length": None}))
    assert preset.model.seq_length == 8192 and "seq_length 8192 from preset llama3-70b" in text(preset)


# ---- 2. measured fields as other tables name them ------------------------------------------------------------------
@pytest.mark.parametrize(("measured", "metric", "value"), [
    ({"tokens_per_s_per_gpu_median": "1,664"}, "tokens_per_s_per_gpu", 1664.0),
    ({"iteration_time_s_average": 4.2}, "iteration_time_s", 4.2),
    ({"median_step_time_s": 4.2}, "iteration_time_s", 4.2),
    ({"avg_step_time_ms": 4200}, "iteration_time_s", 4.2),  # 4200 ms = 4.2 s
    ({"iteration_time_s": "850 ms"}, "iteration_time_s", 0.85),  # the unit written beside the number wins
    ({"throughput_tokens_per_sec_per_device": 1664.0}, "tokens_per_s_per_gpu", 1664.0),
    ({"mfu_pct_avg": "41.5%", "model_tflops_per_gpu": None}, "mfu_pct", 41.5),
    ({"mfu_mean": 0.415}, "mfu_pct", 41.5),  # a fraction, as "mfu" is read
])
def test_measured_fields_with_a_statistic_or_another_spelling_are_read_and_said(measured, metric, value):
    case = map_run(record(measured={"tokens_per_s_per_gpu": None, "model_tflops_per_gpu": None} | measured))
    assert case.metric == metric and case.measured == pytest.approx(value)
    key = next(iter(measured))
    assert f"measured {metric} read from {key}=" in text(case)


def test_the_schemas_own_field_and_the_median_come_first():
    both = map_run(record(measured={"tokens_per_s_per_gpu_median": 1000.0}))
    assert both.measured == 1664 and "read from" not in text(both)  # the schema's own name first
    stats = record(measured={"tokens_per_s_per_gpu": None, "tokens_per_s_per_gpu_mean": 1000.0,
                             "tokens_per_s_per_gpu_median": 1100.0})
    assert map_run(stats).measured == 1100.0
    # the time comes before a throughput, as pick_metric prefers it, whatever the names
    assert map_run(record(measured={"step_time_s_p50": 9.0})).metric == "iteration_time_s"


@pytest.mark.parametrize("measured", [
    {"tflops_per_gpu_up_to": 150.0}, {"tokens_per_s_per_gpu_max": 1700.0}, {"tokens_per_s_per_gpu_p90": 1700.0},
    {"tokens_per_s_per_gpu": "12,5"}, {"tokens_per_s_per_gpu": "~1600"}, {"tokens_per_s_per_gpu": True},
])
def test_bounds_spreads_and_ambiguous_numbers_are_not_measurements(measured):
    (result,) = run_validation([record(measured={"tokens_per_s_per_gpu": None, "model_tflops_per_gpu": None}
                                       | measured)])
    assert result.skipped.startswith("no comparable measurement")
    key = next(iter(measured))
    assert key in result.skipped  # named: as the only field given, or as a value not read


def test_numbers_as_text():
    assert [number(t) for t in ("1,234.5", "12.3%", "8,192", "8, derived", "1.234,5", "12,5", "1.2-1.4")] == [
        1234.5, 12.3, 8192, 8, None, None, None]


# ---- 3. the parallel layout ----------------------------------------------------------------------------------------
def test_dp_unstated_or_inconsistent_comes_from_the_gpus_and_is_said():
    """64 GPUs / (tp 4 · pp 8 · cp 1) = 2."""
    unstated = map_run(record())
    assert unstated.plan.dp == 2 and "dp = gpus/(tp*pp*cp) = 2" in text(unstated)
    wrong = map_run(record(parallel={"dp": 5}))
    assert wrong.plan == unstated.plan
    assert "(the recorded dp 5 gives dp*tp*pp*cp = 160, not the 64 GPUs recorded)" in text(wrong)


def test_a_layout_that_cannot_split_the_gpus_names_its_numbers():
    (result,) = run_validation([record(parallel={"tp": 3})])
    assert "tp*pp*cp = 3*8*1 = 24 does not divide hardware.num_gpus = 64" in result.skipped
    (heads,) = run_validation([record(hardware={"num_gpus": 48}, parallel={"tp": 3, "pp": 2, "vp": None})])
    assert "tp=3 does not divide num_heads=64" in heads.skipped


def test_unstated_tp_pp_gpus_and_batches_are_derived_and_said():
    fsdp = map_run(record(parallel={"tp": None, "pp": None, "vp": None, "dp": 64, "zero_or_fsdp": "FSDP"}))
    assert (fsdp.plan.tp, fsdp.plan.pp) == (1, 1)
    assert "tp = pp = 1 (not stated; dp*tp*pp*cp = 64 GPUs as recorded" in text(fsdp)
    # 2 × 4 × 8 = 64 GPUs from the layout
    gpus = map_run(record(hardware={"num_gpus": None}, parallel={"dp": 2}))
    assert gpus.cluster.num_gpus == 64 and "64 GPUs = dp*tp*pp*cp (num_gpus not recorded)" in text(gpus)
    # micro-batch 1 · dp 2 · 128 accumulation steps = 256 sequences; 2,097,152 tokens / 8192 = 256 sequences
    accum = map_run(record(parallel={"global_batch_size": None, "grad_accum": 128}))
    tokens = map_run(record(parallel={"global_batch_size": None, "tokens_per_batch": 2_097_152}))
    assert accum.plan.global_batch == tokens.plan.global_batch == 256
    assert "= micro-batch*dp*grad_accum = 1*2*128" in text(accum)
    assert "parallel.tokens_per_batch 2097152 / seq_length 8192" in text(tokens)


# ---- 4. what a record that cannot be evaluated says ---------------------------------------------------------------
@pytest.mark.parametrize(("over", "reason"), [
    ({"model": {"name": "Foo-13B", "hidden_size": None}}, "model.hidden_size missing and no preset named 'Foo-13B'"),
    ({"model": {"num_layers": -3}}, "model.num_layers=-3 is not a whole number"),
    ({"model": {"hidden_size": 8192.5}}, "model.hidden_size=8192.5 is not a whole number"),
    ({"hardware": {"num_gpus": "sixty-four"}}, "hardware.num_gpus missing"),
    ({"hardware": {"num_gpus": -8}}, "hardware.num_gpus=-8 is not a whole number"),
    # a number no count is, not rebuilt from the layout (which dp = 2 would give: 2 x 4 x 8 = 64)
    ({"hardware": {"num_gpus": -32}, "parallel": {"dp": 2}}, "hardware.num_gpus=-32 is not a whole number"),
    ({"hardware": {"gpu": None}}, "hardware.gpu missing"),
    ({"hardware": {"gpu": "TPU v5p"}}, "no system preset for GPU 'TPU v5p'"),
    ({"measured": {"tokens_per_s_per_gpu": -5, "model_tflops_per_gpu": None}},
     "measured.tokens_per_s_per_gpu=-5 not a positive number"),
    ({"parallel": {"global_batch_size": 255}}, "parallel.global_batch_size 255 is not a multiple of dp*micro_batch"),
])
def test_a_record_it_cannot_evaluate_names_the_field(over, reason):
    (result,) = run_validation([record(**over)])
    assert reason in result.skipped


def test_a_value_it_cannot_read_is_named_in_the_reason_or_the_notes():
    (result,) = run_validation([record(hardware={"num_gpus": "sixty-four"})])
    assert "not read: hardware.num_gpus='sixty-four'" in result.skipped
    case = map_run(record(parallel={"micro_batch_size": [1, 2]}))
    assert "values not read, taken as not stated: parallel.micro_batch_size=[1, 2]" in text(case)
    assert clean_record(clean_record(record(parallel={"tp": "fast"})))["_unread"] == ["parallel.tp='fast'"]


@pytest.mark.parametrize("broken", [
    {"model": "Llama3-70B"}, {"hardware": [1]}, {"parallel": 7}, {"measured": "fast"},
    {"model": {"num_layers": True}}, {"model": {"num_heads": math.nan}}, {"model": {"hidden_size": 10**30}},
    {"parallel": {"tp": -2, "dp": "x"}}, {"parallel": {"micro_batch_size": 10**20}}, {"precision": 8},
])
def test_malformed_values_are_reasons_not_errors(broken):
    (result,) = run_validation([record() | {"id": "b"} | broken])
    assert result.skipped or result.error is not None
    assert "not understood" not in result.skipped


def test_a_record_that_is_not_an_object_is_skipped():
    results = run_validation([record(), "junk", None])
    assert results[0].error is not None
    assert [r.skipped for r in results[1:]] == ["record #2 is a JSON string, not an object",
                                                "record #3 is a JSON null, not an object"]


# ---- 5. mutated records, and real tables' gaps ---------------------------------------------------------------------
JUNK = [None, "", "n/a", "fast", "1,234.5", "12.3%", "1.234,5", [1, 2], {"v": 1}, True, -1, 0, 3.5, math.nan,
        math.inf, 1e30, 10**20, "-8", "8 (derived)", "850 ms"]


def mutate(rng: random.Random, rec: dict, rid: str) -> dict:
    """One to four of: a field deleted, nulled or given junk of another type, a measured key renamed with a
    statistic or a bound, dp perturbed, a section replaced by something not an object."""
    rec = copy.deepcopy(rec) | {"id": rid}
    for _ in range(rng.randint(1, 4)):
        u, section = rng.random(), rng.choice(["model", "hardware", "parallel", "measured"])
        fields = rec.get(section)
        if u < 0.05:
            rec[section] = rng.choice(["x", [1], 3, None])
        elif isinstance(fields, dict) and fields:
            key = rng.choice(list(fields))
            if u < 0.3:
                del fields[key]
            elif u < 0.45:
                fields[key] = None
            elif u < 0.75:
                fields[key] = rng.choice(JUNK)
            elif u < 0.85 and section == "measured":
                fields[key + rng.choice(["_average", "_median", "_p50", "_avg", "_max", "_up_to"])] = fields.pop(key)
            elif isinstance(rec.get("parallel"), dict):
                dp = rec["parallel"].get("dp")
                rec["parallel"]["dp"] = rng.choice([None, 0, -1, 3, 2 * dp if isinstance(dp, int) else 7])
    return rec


@pytest.fixture(scope="module")
def _estimates() -> Iterator[dict]:
    """The estimates the whole-file tests below have made, by their arguments' repr (every field, those left out of
    ``==`` too: a stack's name and supports, a model's source)."""
    made: dict = {}
    yield made
    made.clear()


@pytest.fixture
def estimate_once(_estimates: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """meshplan.estimate.estimate, which evaluate_case imports as it runs, made once per set of arguments in this
    module: a mutant or a variant whose fields come out as a record's own (dp left out and derived again, a measured
    key renamed) is priced with the estimate already made of the same model, cluster, plan, stack and efficiency
    (the file made 2,392 estimates of 611 distinct argument sets without it: 23.2 -> 17.3 s of CPU). estimate() is a
    pure function of its frozen arguments; one that raises is not kept (it raises again)."""
    module = importlib.import_module("meshplan.estimate")  # the submodule, not the package's function attribute
    fresh = module.estimate

    def once(*args, **kwargs):
        key = repr((args, sorted(kwargs.items())))
        if key not in _estimates:
            _estimates[key] = fresh(*args, **kwargs)
        return _estimates[key]

    monkeypatch.setattr(module, "estimate", once)


@pytest.mark.parametrize(("path", "copies"), [(PUBLISHED, 1), (INDEPENDENT, 2)], ids=["published", "independent"])
def test_mutated_records_never_raise_and_every_skip_says_why(path, copies, tmp_path, estimate_once):
    """The seeded mutants, written as a file and read by ``meshplan validate --json``'s code: every run evaluated or
    skipped with a reason that names what it could not read (not an exception's text), and the report renders."""
    if not path.exists():
        pytest.skip(f"{path} not checked out beside the repository")
    rng = random.Random(34)
    mutants = [mutate(rng, r, f"m{i}.{k}") for i, r in enumerate(read_runs(path)) for k in range(copies)]
    file = tmp_path / "mutants.jsonl"
    file.write_text("\n".join(json.dumps(m) for m in mutants))
    runs = json.loads(validate_command(str(file), None, as_json=True))["runs"]
    assert len(runs) == len(mutants)
    for r in runs:
        assert (r.get("error") is not None) != bool(r.get("skipped")), r["id"]
        assert "not understood" not in r.get("skipped", ""), r["skipped"]  # a reason names the field
    results = run_validation(mutants[:40])
    assert "Published runs" in render_text(results, summaries(results))


GPT_STYLE = re.compile(r"gpt|opt|bloom|mpt|turing", re.I)


def variants(runs: list[dict]) -> dict[str, list[dict]]:
    """The file as other tables print it: dp left out, dp contradicting the GPUs, measured keys suffixed
    ``_average``, FFN and kv-heads left out for GPT-style models, and all of those at once."""
    def dp_null(r): r["parallel"]["dp"] = None
    def dp_wrong(r): r["parallel"]["dp"] = 2 * (r["parallel"].get("dp") or 1) + 1
    def average(r): r["measured"] = {k + "_average": v for k, v in r["measured"].items()}
    def sizes(r):
        if GPT_STYLE.search(r["model"]["name"]) and not r["model"].get("num_experts"):
            r["model"].pop("ffn_hidden_size", None)
            r["model"]["num_kv_heads"] = None
    def everything(r):
        for f in (dp_null, average, sizes):
            f(r)
    out = {}
    for f in (dp_null, dp_wrong, average, sizes, everything):
        out[f.__name__] = copy.deepcopy(runs)
        for r in out[f.__name__]:
            f(r)
    return out


@pytest.mark.parametrize("path", [INDEPENDENT, PUBLISHED], ids=["independent", "published"])
def test_real_tables_gaps_leave_at_least_95_percent_evaluated(path, estimate_once):
    """Of the runs whose model family and GPU meshplan supports (those it evaluates from the file as written), at
    least 95 % are evaluated from each variant, and with the same prediction: what was derived is what was left out."""
    if not path.exists():
        pytest.skip(f"{path} not checked out beside the repository")
    runs = read_runs(path)
    base = {r.id: r.predicted for r in validated(path) if r.error is not None}
    chosen = variants(runs) if path == INDEPENDENT else {"everything": variants(runs)["everything"]}
    for name, variant in chosen.items():
        results = [r for r in run_validation(variant) if r.id in base]
        same = sum(1 for r in results if r.predicted is not None and r.predicted == pytest.approx(base[r.id]))
        assert same >= 0.95 * len(base), (name, same, len(base))
