"""Published runs: the accuracy regression guard, the record → (model, cluster, plan) mapping, and the
sources' FLOP accounting (validate.py). The guard reads the figures benchmarks/accuracy.py recorded in
docs/accuracy_summary.json and fails if a change makes any of them worse."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.channels import dp_collectives
from meshplan.cost.params import stage_params
from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan_validation.case import map_run
from meshplan_validation.evaluate import evaluate_case, predicted_metric
from meshplan_validation.flops import eq3_flops, flops_basis, megatron_model_flops, palm_flops
from meshplan_validation.map_system import map_cluster
from meshplan_validation.record_fields import fill_from_siblings
from meshplan_validation.records import clean_record, read_runs, unstated_settings
from meshplan_validation.render import fit_check_markdown
from meshplan_validation.result import RunResult
from meshplan_validation.skip import Skip
from meshplan_validation.sources import source_defaults
from meshplan_validation.summary import summaries
from meshplan_validation.validate import run_validation, validate_command

DATA = Path(__file__).parents[1] / "data/validation/published_runs.jsonl"
RECORDED = Path(__file__).parents[1] / "docs/accuracy_summary.json"
needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} not checked out beside the repository")


# ---- the regression guard -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def validation():
    results = run_validation(read_runs(DATA))
    return results, summaries(results)


@needs_data
def test_accuracy_is_no_worse_than_recorded(validation):
    results, summary = validation
    recorded = json.loads(RECORDED.read_text())
    now, then = summary["overall"], recorded["overall"]
    assert now["evaluated"] >= then["evaluated"]
    for key, slack in (("median_abs_error", 0.002), ("p90_abs_error", 0.005), ("max_abs_error", 0.01),
                       ("mean_abs_error", 0.003)):
        assert now[key] <= then[key] + slack, f"{key}: {now[key]:.4f} > recorded {then[key]:.4f}"
    for half in ("in_sample", "out_of_sample"):
        assert summary[half]["median_abs_error"] <= recorded[half]["median_abs_error"] + 0.002
    now, then = summary["complete"], recorded["complete"]  # the runs issue 4's median and p90 targets are set on
    assert now["evaluated"] >= then["evaluated"]
    for key, slack in (("median_abs_error", 0.002), ("p90_abs_error", 0.005), ("max_abs_error", 0.01)):
        assert now[key] <= then[key] + slack, f"complete {key}: {now[key]:.4f} > recorded {then[key]:.4f}"


def test_accuracy_on_the_independent_runs_is_no_worse_than_recorded():
    """benchmarks/data/independent_runs.jsonl (other sources, other stacks; docs/INDEPENDENT.md): every run still
    evaluated and the figures benchmarks/independent.py recorded no worse."""
    root = Path(__file__).parents[1]
    results = run_validation(read_runs(root / "benchmarks/data/independent_runs.jsonl"))
    now = summaries(results)["overall"]
    then = json.loads((root / "docs/independent_summary.json").read_text())
    assert now["evaluated"] >= then["evaluated"] and now["skipped"] <= then["skipped"]
    for key, slack in (("median_abs_error", 0.002), ("p90_abs_error", 0.005), ("mean_abs_error", 0.003)):
        assert now[key] <= then[key] + slack, f"{key}: {now[key]:.4f} > recorded {then[key]:.4f}"
    assert now["not_fitting"] <= then["not_fitting"]


@needs_data
def test_korthikanti_and_memory_are_no_worse_than_recorded(validation):
    results, _ = validation
    recorded = json.loads(RECORDED.read_text())
    times = [abs(r.error) for r in results if r.group == "korthikanti2022" and r.metric == "iteration_time_s"]
    assert len(times) == 8
    assert sum(times) / len(times) <= recorded["korthikanti"]["mean_abs_error"] + 0.002
    assert max(times) <= recorded["korthikanti"]["max_abs_error"] + 0.005
    memory = [abs(r.memory_error) for r in results if r.memory_error is not None]
    assert len(memory) == recorded["memory"]["evaluated"]
    assert statistics.median(memory) <= recorded["memory"]["median_abs_error"] + 0.005
    assert max(memory) <= recorded["memory"]["max_abs_error"] + 0.01


@needs_data
def test_runs_predicted_not_to_fit_are_no_more_than_recorded(validation):
    """Every measured run fitted in memory: meshplan's wrong "does not fit" verdicts must not grow."""
    results, summary = validation
    recorded = json.loads(RECORDED.read_text())["overall"]["not_fitting"]
    assert summary["overall"]["not_fitting"] == sum(1 for r in results if r.error is not None and not r.fits)
    assert summary["overall"]["not_fitting"] <= recorded


def test_not_fitting_counts_evaluated_runs_over_memory_only():
    over = RunResult(id="a", group="g", error=0.1, fits=False, memory_predicted=90 * 2**30,
                     memory_capacity=80 * 2**30)
    under = RunResult(id="b", group="g", error=-0.1, fits=True)
    skipped = RunResult(id="c", group="g", skipped="no sizes", fits=False)
    summary = summaries([over, under, skipped])["overall"]
    assert (summary["evaluated"], summary["skipped"], summary["not_fitting"]) == (2, 1, 1)
    section = "\n".join(fit_check_markdown([over, under, skipped]))
    assert "on 1 of 2" in section and "| a | 90.0 GiB | 80.0 GiB | - |" in section


@needs_data
def test_every_run_is_evaluated_or_skipped_with_a_reason(validation):
    results, _ = validation
    assert len(results) == len(read_runs(DATA))
    for r in results:
        assert (r.error is not None) != bool(r.skipped), r.id
    assert any("hybrid Mamba" in r.skipped for r in results)
    superseded = {r["id"] for r in read_runs(DATA) if r.get("superseded")}
    assert superseded and all(r.error is not None for r in results if r.id in superseded)  # evaluated by default


@needs_data
def test_superseded_runs_can_be_left_out():
    results = run_validation(read_runs(DATA), "megatron_readme_jan2021", exclude_superseded=True)
    assert results and all(r.skipped.startswith("superseded") for r in results)


@needs_data
def test_json_output_has_the_documented_keys():
    out = json.loads(validate_command(str(DATA), "korthikanti2022", True, False))
    assert {"median_abs_error", "mean_abs_error", "p90_abs_error", "max_abs_error", "evaluated",
            "skipped"} <= set(out["summary"])
    run = out["runs"][0]
    assert {"id", "predicted", "measured", "error", "complete_configuration"} <= set(run)
    # Table 5's eight runs state micro and global batch, recompute and precision; the 2,240-GPU pair does not
    assert out["complete"]["evaluated"] == 8 and out["summary"]["evaluated"] == 10
    assert run["error"] == pytest.approx(run["predicted"] / run["measured"] - 1)
    # Korthikanti 2022 ran A100-SXM4-80GB parts: the a100 preset's 81920 MiB is what the memory must fit in
    assert run["memory_capacity_bytes"] == 81920 * 2**20
    assert run["fits"] == (run["memory_predicted_bytes"] <= run["memory_capacity_bytes"])


# ---- the mapping --------------------------------------------------------------------------------------------
def record(**over) -> dict:
    """A Megatron-Bridge-style record: Llama3-70B on 64 H100s, fp8, tp 4 / pp 8 / vp 5."""
    rec = {"id": "x", "group": "megatron_bridge_26.04", "framework": "Megatron-Bridge / Megatron-Core",
           "task": "pretrain", "precision": "fp8",
           "model": {"name": "Llama3-70B", "arch": "dense", "num_layers": 80, "hidden_size": 8192, "num_heads": 64,
                     "num_kv_heads": 8, "ffn_hidden_size": 28672, "vocab_size": 128000, "seq_length": 8192},
           "hardware": {"gpu": "H100", "num_gpus": 64, "gpus_per_node": 8},
           "parallel": {"tp": 4, "pp": 8, "dp": None, "cp": 1, "vp": 5, "ep": None, "micro_batch_size": 1,
                        "global_batch_size": 256, "zero_or_fsdp": "DDP (FSDP=0 in table)"},
           "measured": {"tokens_per_s_per_gpu": 1664, "model_tflops_per_gpu": 731},
           "flops_accounting": "Model TFLOP/sec/GPU (NeMo/Megatron-Bridge model-FLOPs formula)"}
    for key, value in over.items():
        rec[key] = rec[key] | value if isinstance(value, dict) else value
    return rec


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


def test_bridge_record_maps_to_the_recipe_defaults():
    case = map_run(record())
    p = case.plan
    # dp = 64 / (4·8·1) = 2; 256 / (2·1) = 128 micro-batches per step
    assert (p.dp, p.tp, p.pp, p.vpp, p.schedule, p.grad_accum) == (2, 4, 8, 5, "interleaved", 128)
    assert p.sequence_parallel and case.stack.overlap_tp and p.zero == 1 and p.grad_bytes == 2 and p.precision == "fp8"
    assert case.metric == "tokens_per_s_per_gpu" and case.measured == 1664
    text = " | ".join(case.assumptions)
    assert "preset llama3-70b" in text and "vocab 128000 as recorded" in text
    assert "dp = gpus/(tp*pp*cp) = 2" in text and "sequence parallelism on (not stated)" in text
    assert "ZeRO-1 (not stated; Megatron-Bridge default)" in text
    # Megatron-Bridge's comm_overlap.py sets overlap_p2p_comm for every interleaved schedule
    assert case.stack.overlap_pp and "pipeline sends overlapped" in text


@pytest.mark.parametrize(("group", "framework", "profile"), [
    ("megatron_lm_examples_llama", "Megatron-LM examples/llama (configs follow the NeMo performance scripts)",
     "Megatron-LM examples"),  # matched before NeMo, whose pattern its framework text also contains
    ("nemo_24.07", "NeMo 24.07", "NeMo 24.x"),
    ("megatron_bridge_26.04", "Megatron-Bridge", "Megatron-Bridge"),
    ("megatron_llama_readme_scaling_table", "Megatron-LLaMA (Megatron-LM based) with Megatron DistributedOptimizer",
     "Megatron-LLaMA"),
    # the same README's cost table compares a DeepSpeed run: its group names Megatron-LLaMA, its framework does not
    ("megatron_llama_readme_cost_table", "HF transformers LLaMA + DeepSpeed ZeRO-2, FlashAttention enabled",
     "DeepSpeed / Hugging Face"),
])
def test_each_source_profile_is_reached(group, framework, profile):
    assert source_defaults({"group": group, "framework": framework}).name == profile


@pytest.mark.parametrize(("over", "overlap"), [
    ({}, True),
    ({"parallel": {"vp": None}}, False),  # 1F1B: Megatron turns overlap_p2p_comm off without virtual stages
    # NeMo 24.x: the Framework Launcher's recipes set overlap_p2p_comm over the model config's False default
    ({"group": "nemo_24.07", "framework": "NeMo 24.07"}, True),
    ({"group": "torchtitan_h100_2024_12", "framework": "torchtitan"}, False),
])
def test_pipeline_send_overlap_follows_the_stack(over, overlap):
    assert map_run(record(**over)).stack.overlap_pp is overlap


@pytest.mark.parametrize(("group", "framework", "targets"), [
    ("megatron_bridge_26.06", "Megatron-Bridge", "all"),  # peft.LoRA: linear_qkv, linear_proj, linear_fc1, fc2
    ("nemo_24.07", "NeMo 24.07", "qkv"),  # NeMo 1.x PEFT: target_modules defaults to ['attention_qkv']
])
def test_lora_targets_follow_the_source(group, framework, targets):
    case = map_run(record(group=group, framework=framework, task="lora"))
    assert (case.plan.finetune, case.plan.lora_rank, case.plan.lora_targets) == ("lora", 32, targets)
    assert any(a.startswith("LoRA rank 32") for a in case.assumptions)


@pytest.mark.parametrize(("text", "precision"), [("mxfp8", "mxfp8"), ("mxfp8 (32x32 blocks)", "mxfp8"),
                                                ("fp8 (current scaling)", "fp8"), ("float8 linears + bf16", "fp8")])
def test_mxfp8_is_told_apart_from_per_tensor_fp8(text, precision):
    hw = {"gpu": "GB200", "num_gpus": 64, "gpus_per_node": 4}
    assert map_run(record(precision=text, hardware=hw)).plan.precision == precision


@pytest.mark.parametrize(("group", "text", "scaling"), [
    ("megatron_bridge_26.02", "fp8", "current"),  # the performance summary's FP8-CS
    ("nemo_24.07", "fp8", "delayed"),  # Transformer Engine 1.x: DelayedScaling only
    ("nemo_24.07", "fp8 (current scaling)", "current"),  # stated
    ("megatron_bridge_26.02", "fp8 (delayed scaling)", "delayed"),
    ("megatron_bridge_26.02", "fp8 blockwise (128x128 weights, 1x128 activations)", "delayed"),  # no amax pass
])
def test_fp8_scaling_as_stated_else_the_sources_default(group, text, scaling):
    case = map_run(record(group=group, precision=text))
    assert case.stack.fp8_scaling == scaling
    assert f"fp8 {'block-wise' if 'block' in text else scaling} scaling" in " | ".join(case.assumptions)


def test_nvfp4_turns_tp_overlap_off_and_runs_fp4():
    case = map_run(record(precision="nvfp4", hardware={"gpu": "GB200", "num_gpus": 64, "gpus_per_node": 4}))
    assert case.plan.precision == "fp4" and not case.stack.overlap_tp
    assert case.cluster.nvlink_domain == 64  # the NVL72 rack holds all 64 GPUs


QWEN3_30B = {"name": "Qwen3-30B-A3B", "arch": "moe", "num_layers": 48, "hidden_size": 2048, "num_heads": 32,
             "num_kv_heads": 4, "ffn_hidden_size": 6144, "moe_ffn_hidden_size": 768, "num_experts": 128,
             "moe_topk": 8, "vocab_size": 151936, "seq_length": 4096}


@pytest.mark.parametrize(("group", "gpu", "precision", "expected"), [
    ("megatron_bridge_26.04", "GB200", "mxfp8", "per_expert"),  # TE GroupedLinear after the per-layer sync
    ("megatron_bridge_26.06", "GB200", "mxfp8", "grouped"),  # full-iteration CUDA graphs, fused grouped MLP
    ("megatron_bridge_26.08", "GB200", "mxfp8", "grouped"),
    ("megatron_bridge_26.06", "H100", "fp8", "per_expert"),  # the MXFP8 CuTeDSL path is Blackwell-only
])
def test_expert_gemm_launch_follows_the_release(group, gpu, precision, expected):
    case = map_run(record(group=group, precision=precision, model=QWEN3_30B,
                          hardware={"gpu": gpu, "num_gpus": 8, "gpus_per_node": 4 if gpu == "GB200" else 8},
                          parallel={"tp": 1, "pp": 1, "vp": None, "ep": 8, "micro_batch_size": 4,
                                    "global_batch_size": 512}))
    assert case.stack.expert_gemm == expected
    assert any("expert GEMMs" in a for a in case.assumptions)


@pytest.mark.parametrize(("group", "framework", "expected"), [
    # Megatron-Bridge's MoE recipes set expert_tensor_parallel_size = 1
    ("megatron_bridge_26.04", "Megatron-Bridge / Megatron-Core", 1),
    # Megatron-Core's own default (arguments.py: None → tensor_model_parallel_size), which NeMo keeps: tp = 2
    ("nemo_24.07", "NeMo / Megatron-Core", 2),
    # torchtitan keeps the experts whole (its expert_tensor_parallel_degree defaults to 1)
    ("torchtitan_x", "torchtitan", 1),
])
def test_unstated_expert_tensor_parallelism_is_the_stacks_default(group, framework, expected):
    case = map_run(record(group=group, framework=framework, model=QWEN3_30B,
                          hardware={"gpu": "H100", "num_gpus": 16, "gpus_per_node": 8},
                          parallel={"tp": 2, "pp": 1, "vp": None, "ep": 8, "micro_batch_size": 1,
                                    "global_batch_size": 64}))
    # 16 GPUs = dp 8 × tp 2; ep 8 × etp divides tp·cp·dp = 16 either way
    assert (case.plan.tp, case.plan.ep, case.plan.etp) == (2, 8, expected)
    assert any(a.startswith(f"etp = {'tp = 2' if expected == 2 else '1'}") for a in case.assumptions)


def test_gb200_jobs_that_do_not_fill_racks_use_the_largest_dividing_domain():
    case = map_run(record(precision="mxfp8", hardware={"gpu": "GB200", "num_gpus": 256, "gpus_per_node": 4},
                          parallel={"tp": 4, "pp": 16, "vp": 4, "global_batch_size": 1536}))
    assert case.cluster.mesh_shape == (64, 4)  # 256 is not a multiple of 72: 4 domains of 64
    assert any("NVLink domain 64" in a for a in case.assumptions)


def test_mosaic_fsdp_record():
    rec = record(group="mosaicml_llm_foundry", framework="MosaicML Composer + llm-foundry (PyTorch FSDP)",
                 precision="amp_bf16",
                 model={"name": "MPT-7b", "num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 32,
                        "ffn_hidden_size": 16384, "vocab_size": 50368, "seq_length": 2048},
                 hardware={"gpu": "H100 80GB", "num_gpus": 128},
                 parallel={"tp": None, "pp": None, "vp": None, "dp": 128, "micro_batch_size": 6,
                           "global_batch_size": 768, "activation_recompute": "full",
                           "zero_or_fsdp": "PyTorch FSDP FULL_SHARD", "mp_mode": "DEFAULT"},
                 measured={"tokens_per_s_per_gpu": 10475})
    case = map_run(rec)
    p = case.plan
    assert (p.dp, p.tp, p.zero, p.recompute, p.grad_bytes, p.precision) == (128, 1, 3, "full", 4, "bf16")
    assert case.attention_kernel == "fa2" and case.model.name == "mpt-7b"
    stack = case.stack
    assert stack.train_metrics == 2  # Composer's per-micro-batch LanguageCrossEntropy + LanguagePerplexity
    assert stack.fsdp == "fsdp1"  # PyTorch FSDP (FlatParameter) of 2023: its gradient preparation is costed
    assert stack.varlen_attention  # MPT's attn_impl 'flash': flash-attn's unpad / pad copies in every layer
    assert stack.qkv_concat  # MPT splits its Wqkv output with qkv.split: the backward concatenates dq, dk, dv
    assert any(a.startswith("FSDP1 prepares") for a in case.assumptions)
    assert map_run(record()).stack.train_metrics == 0
    assert map_run(record()).stack.fsdp == "none" and not map_run(record()).stack.varlen_attention


def test_narayanan_record_needs_stated_assumptions():
    rec = record(group="narayanan2021_table1", framework="Megatron-LM (April 2021)",
                 precision="fp16 mixed precision", model={"name": "GPT-1T (Megatron)", "num_layers": 128,
                                                          "hidden_size": 25600, "num_heads": 160, "num_kv_heads": 160,
                                                          "ffn_hidden_size": 102400, "vocab_size": 51200,
                                                          "seq_length": 2048},
                 hardware={"gpu": "A100-SXM4-80GB", "num_gpus": 3072},
                 parallel={"tp": 8, "pp": 64, "dp": 6, "vp": None, "micro_batch_size": None, "cp": None,
                           "global_batch_size": 3072, "activation_recompute": "full", "zero_or_fsdp": None,
                           "interleaved_schedule": "used for large runs per paper §5.1 (unspecified v)"},
                 measured={"tokens_per_s_per_gpu": None, "model_tflops_per_gpu": None, "tflops_per_gpu": 163},
                 flops_accounting="Paper Eq.(3): FLOPs per iteration counted WITH activation recomputation")
    case = map_run(rec)
    p = case.plan
    # 128 layers / 64 stages = 2 per stage: the smallest interleaving that divides it is v = 2
    assert (p.micro_batch, p.vpp, p.recompute, p.zero, p.precision, case.stack.flash_attention) == (
        1, 2, "full", 0, "fp16", False)
    assert case.metric == "tflops_per_gpu" and case.basis == "eq3"
    assert "micro-batch 1 (not stated)" in case.assumptions


def test_torchtitan_pipeline_batches_and_fsdp():
    rec = record(group="torchtitan_h100_2024_12", framework="torchtitan", precision="float8 linears + bf16",
                 model={"name": "Llama3.1-405B", "num_layers": 126, "hidden_size": 16384, "num_heads": 128,
                        "num_kv_heads": 8, "ffn_hidden_size": 53248, "vocab_size": 128000, "seq_length": 8192},
                 hardware={"gpu": "H100 SXM 96GB HBM2e (Grand Teton), 500W power limit", "num_gpus": 512},
                 parallel={"tp": 8, "pp": 8, "dp": 8, "vp": None, "micro_batch_size": 32, "global_batch_size": 256,
                           "activation_recompute": "full", "zero_or_fsdp": "FSDP2 (8)", "async_tp": True,
                           "pp_schedule": "1F1B"},
                 measured={"tokens_per_s_per_gpu": 100, "peak_memory_gib": 82.5})
    case = map_run(rec)
    p = case.plan
    # local batch 32 split into pp = 8 micro-batches of 4: 256 / (8·4) = 8 per pipeline
    assert (p.micro_batch, p.grad_accum, p.zero, case.stack.overlap_tp, p.precision) == (4, 8, 1, True, "fp8")
    assert case.cluster.accelerator.tdp_watts == 500 and case.measured_memory == pytest.approx(82.5 * 2**30)
    # torch.distributed.pipelining: the last stage, which keeps every micro-batch's logits, is the peak
    assert case.stack.pipeline_runtime == "torch"
    result = evaluate_case(case)
    est = estimate(case.model, case.cluster, p, case.stack)
    assert result.memory_predicted == pytest.approx(est.peak_memory) == pytest.approx(est.rank_memory[1])
    assert est.rank_memory[1] > est.rank_memory[0]
    # the last rank keeps m = 8 micro-batches' fp32 logits (4 × 8192 tokens × 128000 / 8 × 4 B = 1.95 GiB each)
    # and 2·m layer inputs (4 × 8192 / 8 tokens × 16384 × 2 B = 128 MiB each) that Megatron-Core would not
    megatron = estimate(case.model, case.cluster, p, case.stack.with_(pipeline_runtime="megatron"))
    kept = 8 * 4 * 8192 * 16000 * 4 + 16 * 4 * 1024 * 16384 * 2
    assert est.rank_memory[1] - megatron.rank_memory[1] == pytest.approx(kept)


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


# ---- FLOP accounting ------------------------------------------------------------------------------------------
def test_narayanan_eq3_for_gpt_1t():
    model = load_model("megatron-1t")
    # 96·B·s·l·h²·(1 + s/6h + V/16lh) with B 3072, s 2048, l 128, h 25600, V 51200:
    # 96·3072·2048·128·25600² = 5.0665e19; s/6h = 2048/153600 = 0.013333, V/16lh = 51200/52428800 = 0.000977
    expected = 96 * 3072 * 2048 * 128 * 25600**2 * (1 + 2048 / 153600 + 51200 / (16 * 128 * 25600))
    assert eq3_flops(model, 3072) == pytest.approx(expected)
    assert expected == pytest.approx(5.0665e19 * 1.014310, rel=1e-4)
    # the published 163 TFLOP/s per GPU on 3072 GPUs is then an iteration of 5.139e19 / (163e12 · 3072) = 102.6 s
    assert expected / (163e12 * 3072) == pytest.approx(102.6, rel=1e-3)


def test_megatron_model_flops_is_korthikanti_72_for_a_gpt():
    model = load_model("megatron-22b")  # l 48, h 6144, V 51200, s 2048, F = 4h, MHA
    b, s, n_l, h, v = 4, 2048, 48, 6144, 51200
    korthikanti = 72 * b * s * n_l * h * h * (1 + s / (6 * h) + v / (12 * n_l * h))
    assert megatron_model_flops(model, b) == pytest.approx(korthikanti)


def test_megatron_model_flops_for_llama_with_gqa_and_swiglu():
    model = load_model("llama3-8b")  # l 32, h 4096, A 32, K 8, F 14336, s 8192
    b, s, n_l, h, v = 1, 8192, 32, 4096, model.vocab_size
    # 12·b·s·l·h²·[(1 + K/A + s/h)·1 + (F/h)·3/2 + V/(2lh)] = NeMo's llama formula
    # l·h²·(12 + 12K/A + 18F/h + 12s/h + 6V/(lh)) per token
    nemo = b * s * n_l * h * h * (12 + 12 * 8 / 32 + 18 * 14336 / h + 12 * s / h + 6 * v / (n_l * h))
    assert megatron_model_flops(model, b) == pytest.approx(nemo)


def test_flops_basis_is_read_from_the_source_text():
    assert flops_basis({"flops_accounting": "Paper Eq.(3): FLOPs per iteration counted WITH recompute"}) == "eq3"
    assert flops_basis({"flops_accounting": "Model TFLOP/sec/GPU (NeMo formula)"}) == "model"
    assert flops_basis({"flops_accounting": "basis not specified"}) == "unknown"
    # Llama 3's Table 4: "BF16 Model FLOPs Utilization (MFU; Chowdhery et al.)" counts as PaLM does (6N + 12·l·h·s)
    assert flops_basis({"flops_accounting": "BF16 Model FLOPs Utilization (MFU; Chowdhery et al. (2023))"}) == "palm"


def test_an_mfu_of_unstated_formula_is_compared_as_model_flops_and_says_so():
    case = map_run(record(measured={"tokens_per_s_per_gpu": None, "model_tflops_per_gpu": None, "mfu_pct": 41},
                          flops_accounting=None))
    assert (case.metric, case.measured, case.basis) == ("mfu_pct", 41.0, "model")
    assert any("FLOP formula of the measured TFLOP/s or MFU not stated" in a for a in case.assumptions)


def test_tflops_prediction_uses_the_source_formula():
    rec = record(measured={"tokens_per_s_per_gpu": None})  # no tokens/s: compare on TFLOP/s
    case = map_run(rec)
    assert case.metric == "model_tflops_per_gpu" and case.basis == "model"
    # a 10 s step: Megatron model FLOPs of 256 sequences / (10 s · 64 GPUs)
    expected = megatron_model_flops(case.model, 256) / 10.0 / 64 / 1e12
    assert predicted_metric(case, 10.0) == pytest.approx(expected)
    # and tokens/s/GPU, had it been measured: 256 · 8192 / 10 / 64 = 3276.8
    assert predicted_metric(map_run(record()), 10.0) == pytest.approx(3276.8)


@pytest.mark.parametrize(("stated", "zero"), [
    ("DeepSpeed ZeRO-3", 3), ("zero stage 2", 2), ("zero_stage: 1", 1), (3, 3), ("3", 3), (2.0, 2),
    ("FSDP2 (fully_shard)", 3),
    ("HSDP, hybrid shard within the node", 3), ("PyTorch FSDP SHARD_GRAD_OP", 2),
    ("DDP (FSDP=0 in table; distributed optimizer is the NeMo default but not stated)", 1),  # the source default
    ("none (single data-parallel rank)", 0), ("no", 0),
])
def test_other_sources_state_the_zero_stage_in_their_own_words(stated, zero):
    flat = {"pp": 1, "vp": None, "tp": 8}  # no pipeline: ZeRO-2/3 keep their per-micro-batch reductions
    assert map_run(record(parallel={"zero_or_fsdp": stated} | flat)).plan.zero == zero


@pytest.mark.parametrize("stated", ["DeepSpeed ZeRO-3", "zero stage 2", "FSDP2 (fully_shard)"])
def test_zero_2_and_3_under_pipeline_parallelism_reduce_gradients_once_per_step(stated):
    """DeepSpeed's pipeline engine runs ZeRO-1 only, and PyTorch's pipelined FSDP syncs gradients on the last
    micro-batch: with pp = 8 the plan is ZeRO-1, said so, and charges no per-micro-batch reduce-scatter."""
    case = map_run(record(parallel={"zero_or_fsdp": stated}))
    assert case.plan.pp == 8 and case.plan.zero == 1 and case.stack.fsdp == "none"
    assert any("with pipeline parallelism as ZeRO-1" in a for a in case.assumptions)


def _indep(framework: str, **over) -> dict:
    """A record from a source without a profile of its own (group 'paper')."""
    return record(group="paper", framework=framework, **over)


@pytest.mark.parametrize(("framework", "profile"), [
    ("DeepSpeed + Megatron-LM (3D parallelism)", "Megatron-DeepSpeed (BLOOM)"),  # MT-NLG's stack, not HF code
    ("Megatron-DeepSpeed", "Megatron-DeepSpeed (BLOOM)"),
    ("DeepSpeed ZeRO-3 + Hugging Face Trainer", "DeepSpeed / Hugging Face"),
    ("PyTorch FSDP (nightlies post-2.2) + SDPA FlashAttention-2, IBM foundation-model-stack (fms-fsdp)",
     "PyTorch FSDP"),
    ("KempnerForge (PyTorch FSDP2 + TP, torch.compile)", "PyTorch FSDP2"),
    ("NeMo AutoModel (PyTorch FSDP2 + EP/PP), kernels: TE + DeepEP", "PyTorch FSDP2"),  # not NeMo's Megatron recipes
    ("Meta internal PyTorch stack, 4D parallelism [TP, CP, PP, DP(=FSDP)]", "generic"),
    ("NeMo AutoModel (FSDP2) in the nemo 25.09 container", "PyTorch FSDP2"),  # "nemo" alone is not NeMo's recipes
    ("NeMo AutoModel (Hugging Face transformers, FSDP2)", "PyTorch FSDP2"),  # nor is "Hugging Face" HF Trainer's
    ("NeMo 25.02 container", "NeMo 24.x"),
    ("Megatron-LM --use-torch-fsdp2", "generic"),  # Megatron's kernels under torch FSDP2: not a PyTorch-native stack
    ("Megatron-LM + DeepSpeed", "Megatron-DeepSpeed (BLOOM)"),
    ("GPT-NeoX", "Megatron-DeepSpeed (BLOOM)"),  # EleutherAI's Megatron model code on DeepSpeed
    ("LLM Foundry (Composer, PyTorch FSDP)", "MosaicML llm-foundry"),  # Mosaic's stack without Mosaic's name
    ("Composer", "MosaicML llm-foundry"),
])
def test_a_stack_is_read_from_its_framework_text(framework, profile):
    assert source_defaults({"group": "paper", "framework": framework}).name == profile


@pytest.mark.parametrize(("framework", "kernel"), [
    ("PyTorch FSDP + SDPA FlashAttention-2", "fa2"),  # named
    ("NeMo AutoModel (PyTorch FSDP2), kernels: TE + DeepEP", "fused"),  # Transformer Engine runs cuDNN's kernel
    ("KempnerForge (PyTorch FSDP2 + TP, torch.compile)", "fa2"),  # SDPA of an unstated PyTorch: FlashAttention-2
    ("KempnerForge (PyTorch 2.11 FSDP2 + TP, torch.compile)", "fused"),  # PyTorch 2.11 SDPA prefers cuDNN
    ("MaxText (JAX/XLA)", "fused"),  # generic
    ("PyTorch FSDP2, torch==2.11.0, SDPA", "fused"),  # SDPA by release
    ("PyTorch FSDP2 in the NGC PyTorch 24.07 container", "fa2"),  # an NGC tag is no PyTorch 2.x release
    ("custom trainer, SDPA, PyTorch 2.4", "fa2"),  # SDPA named outside an SDPA profile, before 2.11
    ("custom trainer, SDPA, PyTorch 2.12", "fused"),
    ("PyTorch FSDP2 + FlashAttention v3", "fused"), ("PyTorch FSDP2 + FA-3", "fused"),
    ("PyTorch FSDP2 + flash-attn 3", "fused"),
    ("HF Trainer (DeepSpeed ZeRO-3), Transformer Engine disabled", "fa2"),  # a negated name names nothing
    ("HF Trainer (DeepSpeed ZeRO-3), no TE", "fa2"),
    ("Megatron-LM, NVTE_FLASH_ATTN=0", "fused"),  # TE falls back to cuDNN's fused kernel, flash stays on
    ("NeMo AutoModel, kernels: TE + DeepEP + FlexAttn", "fa2"),  # FlexAttention runs the attention, TE the linears
    ("torchtitan, flex_attention", "fa2"),
])
def test_the_attention_kernel_follows_the_stack_text(framework, kernel):
    case = map_run(_indep(framework, parallel={"pp": 1, "vp": None, "tp": 8}))
    assert case.stack.attention_kernel == kernel and case.stack.flash_attention


@pytest.mark.parametrize("framework", [
    "ROCm/Megatron-LM fork; USE_FLASH_ATTN=0", "Megatron-LM --no-flash-attn", "trainer.yaml use_flash_attn: false",
    "HF Trainer, attn_implementation='eager'", "Megatron-LM, NVTE_FLASH_ATTN=0 NVTE_FUSED_ATTN=0",
    "Megatron-LM without flash attention",
])
def test_a_stack_that_turns_flash_attention_off_runs_unfused_attention(framework):
    case = map_run(_indep(framework, parallel={"pp": 1, "vp": None, "tp": 8}))
    assert not case.stack.flash_attention
    assert any("turns flash attention off" in a for a in case.assumptions)


def test_a_stack_that_names_flash_attention_runs_it_where_its_source_predates_it():
    """Megatron-DeepSpeed's profile (BLOOM's 2022 stack) has no flash attention; a record that names it runs it."""
    flat = {"pp": 1, "vp": None, "tp": 8}
    old = map_run(_indep("Megatron-DeepSpeed", parallel=flat)).stack
    new = map_run(_indep("Megatron-DeepSpeed --use-flash-attn-v2", parallel=flat)).stack
    assert not old.flash_attention
    assert new.flash_attention and new.attention_kernel == "fa2"


def test_a_gpu_count_no_server_multiple_divides_still_maps():
    """6 H100s in servers of 4: no NVLink domain of a multiple of 4 divides 6; the domain is gcd(6, 4) = 2."""
    cluster, notes = map_cluster({"gpu": "H100", "num_gpus": 6, "gpus_per_node": 4})
    assert cluster.num_gpus == 6 and cluster.tiers[0].size == 2
    assert any("NVLink domain 2" in n for n in notes)


def test_a_pipeline_of_unstated_schedule_interleaves_under_the_generic_profile():
    """80 layers over pp = 8: 10 per stage, the smallest v dividing them is 2 (Narayanan's rule for an unstated v);
    a Megatron-Bridge record that states no vp runs 1F1B, as its table means."""
    generic = map_run(_indep("Meta internal", parallel={"vp": None})).plan
    assert (generic.vpp, generic.schedule) == (2, "interleaved")
    bridge = map_run(record(parallel={"vp": None})).plan
    assert (bridge.vpp, bridge.schedule) == (1, "1f1b")


def test_servers_smaller_than_the_presets_nvlink_domain_bound_it():
    """An H200 record of 4-GPU servers: NVLink domains of 4, not the DGX's 8; a GB200 record's 4-GPU compute trays
    stay in the preset's 72-GPU NVLink domain."""
    h200 = map_run(_indep("x", hardware={"gpu": "H200", "num_gpus": 64, "gpus_per_node": 4}))
    assert h200.cluster.tiers[0].size == 4 and any("NVLink domain 4" in a for a in h200.assumptions)
    gb200 = map_run(_indep("x", hardware={"gpu": "GB200", "num_gpus": 64, "gpus_per_node": 4}))
    assert gb200.cluster.tiers[0].size == 64  # 64 GPUs of a 72-GPU domain


def test_a_moe_record_without_a_dense_ffn_or_with_uneven_heads_still_maps():
    """Grok-1-like sizes (all layers MoE: F from the experts) and GPT-OSS-like heads (64 heads of 64 on a hidden size
    of 2880, not of 2880 / 64 = 45) that no preset matches; heads that do not split the hidden size (48 on 2000)
    without a head_dim are a reason to skip, not an error."""
    moe = {"name": "some-moe", "arch": "moe", "num_layers": 4, "hidden_size": 2880, "num_heads": 64,
           "num_kv_heads": 8, "ffn_hidden_size": None, "head_dim": 64, "vocab_size": 32000, "seq_length": 4096,
           "num_experts": 8, "moe_topk": 2, "moe_ffn_hidden_size": 5760}
    case = map_run(_indep("x", model=moe, parallel={"tp": 1, "pp": 1, "vp": None}))
    assert (case.model.ffn_hidden_size, case.model.moe_ffn_hidden_size, case.model.head_dim) == (5760, 5760, 64)
    with pytest.raises(Skip, match="head_dim is not recorded"):
        map_run(_indep("x", model=moe | {"hidden_size": 2000, "num_heads": 48, "head_dim": None},
                       parallel={"tp": 1, "pp": 1, "vp": None}))


@pytest.mark.parametrize(("stated", "recompute"), [
    (True, "full"), (False, "none"), ("gradient checkpointing", "full"), ("no activation checkpointing", "none"),
    ("full (not selective)", "full"), ("Full recompute; TP overlap off", "full"), (0, "none"),
    ("selective", "selective"), ("not stated", "none"),  # not stated: Megatron-Bridge's default, none
])
def test_recompute_in_other_words(stated, recompute):
    case = map_run(record(parallel={"activation_recompute": stated}))
    assert case.plan.recompute == recompute
    assert any(("not stated" in a) == (stated == "not stated") for a in case.assumptions if "recompute" in a)



# ---- records from other sources ------------------------------------------------------------------------------
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


def test_palm_flops_basis_for_sources_that_count_6n():
    model = load_model("llama3-8b")
    assert flops_basis({"flops_accounting": "MFU with 6*N + 12*l*h*s FLOPs per token (PaLM)"}) == "palm"
    # 6·N (matmul parameters: no input embedding, the untied LM head counts) + 12·l·h·s, per token
    n = model.params() - model.vocab_size * model.hidden_size
    per_token = 6 * n + 12 * model.num_layers * model.hidden_size * model.seq_length
    assert palm_flops(model, 2) == pytest.approx(2 * model.seq_length * per_token)


@pytest.mark.parametrize(("gpu", "preset"), [
    ("NVIDIA H800 80GB", "h800"), ("A800-SXM4-80GB", "a800"), ("H20", "h20"), ("H200", "h200"),
    ("GH200", "gh200"), ("AMD Instinct MI300X", "mi300x"), ("MI325X", "mi325x"), ("MI355X", "mi355x"),
    ("L40S", "l40s"), ("NVIDIA H100 PCIe", "h100-pcie"), ("8xH20", "h20"), ("NVIDIA GH200 480GB", "gh200"),
])
def test_other_gpus_map_to_their_presets(gpu, preset):
    case = map_run(record(hardware={"gpu": gpu, "num_gpus": 64, "gpus_per_node": 8}, precision="bf16"))
    assert f"hardware: {preset} preset" in case.assumptions


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


def test_hugging_face_stacks_are_eager_zero3_and_megatron_deepspeed_is_not():
    hf = map_run(record(group="some_paper", framework="DeepSpeed ZeRO-3 + HF Transformers",
                        parallel={"tp": 1, "pp": 1, "vp": None, "zero_or_fsdp": None}))
    assert (hf.stack.fusion, hf.stack.cross_entropy, hf.stack.attention_kernel, hf.plan.zero) == (
        "eager", "pytorch", "fa2", 3)
    mds = map_run(record(group="other_paper", framework="Megatron-DeepSpeed", parallel={"zero_or_fsdp": None}))
    assert mds.stack.fusion == "fused" and mds.plan.zero == 1


QWEN3_235B = QWEN3_30B | {"name": "Qwen3-235B-A22B", "num_layers": 94, "hidden_size": 4096, "num_heads": 64,
                          "ffn_hidden_size": 12288, "moe_ffn_hidden_size": 1536}


@pytest.mark.parametrize(("group", "gpu", "overlap", "precision"), [
    ("megatron_bridge_26.04", "H100", True, "fp8"),  # QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_*: moe_a2a_overlap=True
    ("megatron_bridge_25.11", "H100", True, "fp8"),
    ("megatron_bridge_25.09", "H100", False, "fp8"),  # before the Megatron-Bridge recipe files that say so
    ("megatron_bridge_26.04", "GB200", False, "mxfp8"),  # the Blackwell recipes leave it off
    # from 26.06 the GB200 MXFP8 recipes run the full-iteration CUDA graph path, which overlaps the all-to-all
    # (Megatron-Bridge PR #4249, #4606)
    ("megatron_bridge_26.06", "GB200", True, "mxfp8"),
    ("megatron_bridge_26.08", "GB200", True, "mxfp8"),
    ("megatron_bridge_26.06", "GB200", False, "bf16"),
])
def test_ep_overlap_follows_the_release_recipe(group, gpu, overlap, precision):
    case = map_run(record(group=group, model=QWEN3_235B, precision=precision,
                          hardware={"gpu": gpu, "num_gpus": 256, "gpus_per_node": 8},
                          parallel={"tp": 2, "pp": 8, "vp": 4, "ep": 32, "micro_batch_size": 1,
                                    "global_batch_size": 2048}))
    assert case.stack.overlap_ep is overlap


@pytest.mark.parametrize(("group", "gpu", "overlap"), [
    ("megatron_bridge_25.09", "H100", True),  # qwen3_235b_a22b_llm_pretrain.py: tp_comm_overlap=True
    ("megatron_bridge_25.11", "H100", False),  # qwen3_llm_pretrain.py ..._config_h100: tp_comm_overlap=False
    ("megatron_bridge_26.06", "H100", False),  # perf_recipes/qwen/h100/qwen3_moe.py: tp_comm_overlap=False
    ("megatron_bridge_26.04", "B200", True),  # the Blackwell functions set True
])
def test_tp_overlap_follows_the_release_recipe(group, gpu, overlap):
    case = map_run(record(group=group, model=QWEN3_235B, precision="fp8",
                          hardware={"gpu": gpu, "num_gpus": 256, "gpus_per_node": 8},
                          parallel={"tp": 2, "pp": 8, "vp": 4, "ep": 32, "micro_batch_size": 1,
                                    "global_batch_size": 2048}))
    assert case.stack.overlap_tp is overlap
    assert any("tp_comm_overlap=False" in note for note in case.assumptions) is (not overlap)


@pytest.mark.parametrize(("group", "precision", "kernel"), [
    ("megatron_bridge_26.06", "mxfp8", "fp8"),  # PR #4249 / #4606: the GB200 MXFP8 path runs FP8 attention
    ("megatron_bridge_26.08", "mxfp8", "fp8"),
    ("megatron_bridge_26.04", "mxfp8", "fused"),  # before the 26.06 recipes
    ("megatron_bridge_26.06", "bf16", "fused"),
])
def test_fp8_attention_follows_the_release_recipe(group, precision, kernel):
    case = map_run(record(group=group, model=QWEN3_235B, precision=precision,
                          hardware={"gpu": "GB200", "num_gpus": 256, "gpus_per_node": 4},
                          parallel={"tp": 1, "pp": 8, "vp": 3, "ep": 32, "micro_batch_size": 1,
                                    "global_batch_size": 8192}))
    assert case.stack.attention_kernel == kernel
    assert any("FP8 attention" in note for note in case.assumptions) is (kernel == "fp8")


@pytest.mark.parametrize(("group", "gpu", "precision", "pp", "vp", "ep", "overlap"), [
    # DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2: deepep, pp 8, vp 2, ep 32, moe_a2a_overlap=True
    ("megatron_bridge_26.04.01", "B200", "mxfp8", 8, 2, 32, True),
    ("megatron_bridge_26.04", "B200", "mxfp8", 16, None, 8, False),  # _B200_V1 / _V2: hybridep, overlap off
    # _GB200_FP8_MX_V1 / _V2, the 26.06 MXFP8 recipe (full-iteration CUDA graphs): moe_a2a_overlap=True
    ("megatron_bridge_26.06", "GB200", "mxfp8", 4, 4, 64, True),
    ("megatron_bridge_26.04", "GB200", "mxfp8", 4, 4, 64, False),
    ("megatron_bridge_25.11", "GB200", "mxfp8", 8, 4, 32, False),  # a GB200 ep 32 layout is not the B200 one
])
def test_deepseek_ep_overlap_follows_the_recipe_of_the_layout(group, gpu, precision, pp, vp, ep, overlap):
    sizes = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size")
    case = map_run(record(group=group, precision=precision,
                          model={k: None for k in sizes} | {"name": "DeepSeek-V3", "arch": "moe"},
                          hardware={"gpu": gpu, "num_gpus": 256, "gpus_per_node": 4 if gpu == "GB200" else 8},
                          parallel={"tp": 1, "pp": pp, "vp": vp, "ep": ep, "micro_batch_size": 1,
                                    "global_batch_size": 4096}))
    assert case.stack.overlap_ep is overlap


def test_hfu_adds_the_recomputed_forward_to_model_flops():
    from meshplan.cost.flops import recompute_flops_per_token

    rec = record(measured={"tokens_per_s_per_gpu": None, "model_tflops_per_gpu": None, "hfu_pct": 40.0},
                 parallel={"activation_recompute": "full"})
    case = map_run(rec)
    assert case.metric == "hfu_pct" and case.basis == "model"
    tokens = case.plan.global_batch * case.model.seq_length
    hardware = (megatron_model_flops(case.model, case.plan.global_batch)
                + recompute_flops_per_token(case.model, case.plan, case.stack) * tokens)
    peak = case.cluster.accelerator.half_flops * case.cluster.num_gpus
    assert predicted_metric(case, 10.0) == pytest.approx(100 * hardware / 10.0 / peak)


@pytest.mark.parametrize(("gpu", "layers"), [("GB200", 40), ("GB300", 20)])  # llama3_workload_base_configs.py
def test_grace_blackwell_megatron_fsdp_recipes_offload_activations(gpu, layers):
    case = map_run(record(hardware={"gpu": gpu, "num_gpus": 64, "gpus_per_node": 4},
                          parallel={"tp": 1, "pp": 1, "vp": None, "micro_batch_size": 2, "global_batch_size": 256,
                                    "zero_or_fsdp": "Megatron FSDP (64)"}))
    assert case.plan.offload_activations and case.plan.offload_layers == layers and case.plan.zero == 3
    h100 = map_run(record(parallel={"zero_or_fsdp": "Megatron FSDP (64)", "tp": 1, "pp": 1, "vp": None}))
    assert not h100.plan.offload_activations  # the H100 recipes do not offload


def test_flags_written_as_text_and_values_that_are_not_numbers():
    off = map_run(record(parallel={"sequence_parallel": "false", "async_tp": "no"}))
    assert not off.plan.sequence_parallel and not off.stack.overlap_tp
    on = map_run(record(parallel={"sequence_parallel": "true"}))
    assert on.plan.sequence_parallel
    (result,) = run_validation([record(measured={"tokens_per_s_per_gpu": "nan", "model_tflops_per_gpu": None})])
    assert result.skipped and "no comparable measurement" in result.skipped


def test_the_gpu_count_comes_from_nodes_or_from_the_parallel_sizes():
    by_nodes = map_run(record(hardware={"gpu": "H100", "num_gpus": None, "num_nodes": 8, "gpus_per_node": 8}))
    assert by_nodes.cluster.num_gpus == 64 and any("8 nodes x 8" in a for a in by_nodes.assumptions)
    by_sizes = map_run(record(hardware={"gpu": "H100", "num_gpus": None}, parallel={"dp": 2}))
    assert by_sizes.cluster.num_gpus == 2 * 4 * 8  # dp 2 × tp 4 × pp 8


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


@needs_data
def test_no_mutated_record_raises():
    """Records from other files: fields nulled, dropped or replaced by junk are skipped with a reason or
    evaluated, never raised (a seeded fuzz of the published records)."""
    import copy
    import random

    rng = random.Random(7)
    records = read_runs(DATA)
    junk = ["", "n/a", "unknown", 0, -1, 3.5, "8", True, [1], {"a": 1}, "nan"]
    for trial in range(300):
        rec = copy.deepcopy(rng.choice(records)) | {"id": f"fuzz{trial}"}
        for section in ("parallel", "model", "hardware", "measured"):
            fields = rec.get(section) or {}
            for key in list(fields):
                u = rng.random()
                if u < 0.12:
                    fields[key] = None
                elif u < 0.17:
                    del fields[key]
                elif u < 0.22:
                    fields[key] = rng.choice(junk)
        (result,) = run_validation([rec])
        assert result.skipped or result.error is not None


def _accuracy_script():
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "accuracy.py"
    spec = importlib.util.spec_from_file_location("accuracy_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recompute_hfu_table_compares_like_with_like():
    """Two runs of one model: HFU 60 % with recompute (mb 10 × 2048 tokens), 40 % without (mb 2): measured ratio
    60 / 40 = 1.50; meshplan reads the first 10 % slow and the second 25 % fast, so its ratio is
    1.5 · 0.9 / 1.25 = 1.08. A long-sequence run (attention-bound) stays out of the table."""
    acc = _accuracy_script()

    def rec(rid, mode, hfu, mb, seq=2048):
        return {"id": rid, "group": "mosaicml_llm_foundry", "precision": "amp_bf16",
                "hardware": {"gpu": "H100 80GB"}, "model": {"name": "MPT-13b", "seq_length": seq},
                "parallel": {"activation_recompute": mode, "micro_batch_size": mb}, "measured": {"hfu_pct": hfu}}

    records = [rec("a", "full", 60.0, 10), rec("b", "none", 40.0, 2), rec("c", "full", 90.0, 1, seq=32768)]
    results = [RunResult(id="a", group="m", error=-0.1), RunResult(id="b", group="m", error=0.25),
               RunResult(id="c", group="m", error=0.0)]
    lines = acc.recompute_hfu(results, records)
    assert lines[-1] == "| H100 80GB | MPT-13b | 60.0% (20,480) | 40.0% (4,096) | 1.50 | 1.08 |"


def test_release_floor_counts_what_one_prediction_per_configuration_must_miss():
    """One configuration measured at 100, 110 and 130 tokens/s/GPU in three releases: a prediction p is within
    ±12 % of x when x·0.88 ≤ p ≤ x·1.12, windows [88, 112], [96.8, 123.2], [114.4, 145.6]; at most two overlap, so
    one run must miss. Within ±25 % the windows [75, 125], [82.5, 137.5], [97.5, 162.5] share [97.5, 125]: none
    must. The same configuration twice in one group is a stack variant, not a release, and is left out."""
    acc = _accuracy_script()
    assert acc.most_within([100.0, 110.0, 130.0], 0.12) == 2
    assert acc.most_within([100.0, 110.0, 130.0], 0.25) == 3

    def rec(rid, value):
        return {"id": rid, "model": {"name": "m", "seq_length": 8192}, "hardware": {"gpu": "H100", "num_gpus": 8},
                "precision": "fp8", "task": "pretrain", "parallel": {"tp": 1},
                "measured": {"tokens_per_s_per_gpu": value}}

    by_id = {r["id"]: r for r in (rec("a", 100.0), rec("b", 110.0), rec("c", 130.0), rec("d", 100.0), rec("e", 90.0))}
    results = [RunResult(id=i, group=g, error=0.0) for i, g in
               (("a", "bridge_1"), ("b", "bridge_2"), ("c", "bridge_3"))]
    assert [[r.id for r, _ in g] for g in acc.repeated_configurations(results, by_id)] == [["a", "b", "c"]]
    variants = [RunResult(id="d", group="titan", error=0.0), RunResult(id="e", group="titan", error=0.0)]
    assert acc.repeated_configurations(variants, by_id) == []
    # the doc section: one configuration, three runs, meshplan's errors 0, 0 and 0 (none outside any tolerance)
    lines = acc.release_floor(results, by_id)
    assert "| within ±12 % | 1 | 0 |" in lines and "| within ±25 % | 0 | 0 |" in lines
    assert acc.release_groups(results) == "3 bridge"
    assert acc.release_groups([RunResult(id="x", group="megatron_bridge_26.04.01")]) == "1 megatron_bridge"


def test_memory_share_is_the_predicted_peak_over_the_gpus_memory():
    assert RunResult(id="a", group="g", memory_predicted=60e9, memory_capacity=80e9).memory_share == 0.75
    assert RunResult(id="b", group="g").memory_share == 0.0


def test_a100_of_unstated_memory_is_dated_by_its_source():
    """The A100 80GB was announced in November 2020: a 2020 source's A100 is the 40 GB part (1,555 GB/s HBM2);
    a later one keeps the 80 GB assumption, and a stated size is taken as stated."""
    a100 = {"gpu": "A100 (DGX-A100)", "num_gpus": 64, "gpus_per_node": 8}
    old = map_run(record(source="Megatron-LM README (Sep 2020) weak-scaling tables", precision="bf16",
                         hardware=a100))
    assert old.cluster.accelerator.name == "A100 SXM4 40GB"
    assert any(a.startswith("A100 40 GB: the source dates from 2020") for a in old.assumptions)
    later = map_run(record(source="Narayanan et al. 2021", precision="bf16", hardware=a100))
    assert later.cluster.accelerator.name == "A100 SXM4 80GB"
    stated = map_run(record(source="a 2020 table", precision="bf16", hardware=a100 | {"gpu": "A100 80GB"}))
    assert stated.cluster.accelerator.name == "A100 SXM4 80GB"


def test_an_mi250x_record_of_four_per_server_says_how_its_gpus_are_counted():
    """The preset is one GCD; 4 MI250X per server are packages (8 GCDs): the count is kept and the doubt stated."""
    cluster, notes = map_cluster({"gpu": "AMD MI250X", "num_gpus": 64, "gpus_per_node": 4})
    assert cluster.num_gpus == 64
    assert any("if it counts packages of 2 GCDs" in n for n in notes)


@pytest.mark.parametrize(("interconnect", "per_node", "nics", "gbps"), [
    ("inter-machine 4 x 100Gb RoCE; intra-node NVLink", 8, 0.5, 100),  # InternEvo: 4 NICs per 8-GPU server
    ("4 x 200Gbps RDMA inter-node; NVLink intra-node", 8, 0.5, 200),  # Megatron-LLaMA
    ("NVLink within node; Omni-Path inter-node (4 links per node per BLOOM README)", 8, 0.5, 100),
    ("NVLink 4 inter-gpu connects, 4 OmniPath links per node", None, 0.5, 100),  # per_node unstated: the server's 8
    ("InfiniBand HDR via 4 ConnectX-6 HCAs per node with GPUDirect RDMA", 8, 0.5, 200),
    ("8x200Gb/s HDR InfiniBand per node", 8, 1.0, 200),  # the DGX A100's own network
    ("RDMA backend network 400 Gb/s per GPU", 8, 1.0, 400),
])
def test_the_network_a_record_states_replaces_the_presets(interconnect, per_node, nics, gbps):
    """4 NICs of 100 Gb/s per 8-GPU server: 0.5 NIC of 12.5 GB/s per GPU."""
    hw = {"gpu": "A100 80GB", "num_gpus": 64, "gpus_per_node": per_node, "interconnect": interconnect}
    cluster, notes = map_cluster(hw)
    network = load_system("a100").cluster(64, nics_per_gpu=nics, nic_bandwidth=gbps * 1e9 / 8)
    assert cluster.tiers[-1] == network.tiers[-1]
    assert any(n.startswith("network as stated") for n in notes)


def megatron_llama_case(optimizer: str):
    return map_run(record(group="megatron_llama_readme_scaling_table", precision="bf16",
                          framework=f"Megatron-LLaMA (Megatron-LM based) with {optimizer}",
                          parallel={"tp": 1, "pp": 1, "vp": None, "zero_or_fsdp": optimizer,
                                    "distributed_optimizer": True}))


def test_megatron_llamas_distributed_optimizer_is_not_overlapped():
    """Megatron-LLaMA's README: Megatron-LM's DistributedOptimizer reduce-scatters the gradients after the last
    micro-batch and all-gathers the weights after the step; its OverlappedDistributedOptimizer overlaps them. Without
    the overlap the step pays both whole: dp = t(reduce-scatter of the 4-byte gradients) + t(all-gather of the
    2-byte weights) over the 64 data-parallel ranks."""
    plain = megatron_llama_case("Megatron DistributedOptimizer")
    overlapped = megatron_llama_case("OverlappedDistributedOptimizer (reduce-scatter overlapped with compute)")
    assert not plain.stack.overlap_dp and overlapped.stack.overlap_dp
    assert any(n.startswith("DP communication overlapped (stated") for n in overlapped.assumptions)
    p = plain.plan
    assert (p.dp, p.zero, p.grad_bytes) == (64, 1, 4)
    _, gather, scatter = dp_collectives(plain.model, plain.cluster, p, stage_params(plain.model, p, first=True),
                                        DEFAULT)
    assert evaluate_case(plain).breakdown["dp"] == pytest.approx(gather + scatter)
    assert evaluate_case(overlapped).breakdown["dp"] < 0.5 * (gather + scatter)


def test_an_unstated_network_keeps_the_presets():
    cluster, notes = map_cluster({"gpu": "A100 80GB", "num_gpus": 64, "interconnect": "not stated"})
    assert cluster.tiers[-1] == load_system("a100").cluster(64).tiers[-1]
    assert not any(n.startswith("network") for n in notes)


@pytest.mark.parametrize(("framework", "fusion"), [
    ("lit-gpt, PyTorch FSDP, FlashAttention-2, fused layernorm, fused SwiGLU (xformers), fused rotary", "fused"),
    ("PyTorch FSDP with Apex fused ops", "fused"),
    ("PyTorch FSDP, Liger kernels", "fused"),
    ("PyTorch FSDP, torch.compile", "fused"),
    ("PyTorch FSDP", "eager"),
])
def test_an_eager_stack_that_names_fused_kernels_runs_them(framework, fusion):
    case = map_run(_indep(framework, parallel={"pp": 1, "vp": None, "tp": 8}))
    assert case.stack.fusion == fusion


@pytest.mark.parametrize(("framework", "gpus", "ep"), [
    # NeMo AutoModel's table leaves EP blank for gpt-oss; its benchmark configs set ep_size to the dp ranks
    ("NeMo AutoModel (PyTorch FSDP2 + EP/PP), kernels: TE + DeepEP + FlexAttn", 64, 64),
    ("NeMo AutoModel (PyTorch FSDP2 + EP/PP), kernels: TE + DeepEP + FlexAttn", 8, 8),
    ("PyTorch FSDP2 with HybridEP", 256, 128),  # 128 experts: ep = gcd(dp, experts) = 128
    ("PyTorch FSDP2", 64, 1),  # no expert-parallel dispatcher named: ep 1, said
])
def test_an_unstated_ep_follows_the_dispatcher_the_stack_names(framework, gpus, ep):
    sizes = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size")
    case = map_run(_indep(framework, precision="bf16",
                          model={k: None for k in sizes} | {"name": "gpt-oss-120b", "arch": "moe", "seq_length": 4096},
                          hardware={"gpu": "H100", "num_gpus": gpus, "gpus_per_node": 8},
                          parallel={"tp": 1, "pp": 1, "vp": None, "ep": None, "micro_batch_size": 2,
                                    "global_batch_size": 2 * gpus, "zero_or_fsdp": f"FSDP2 (FSDP={gpus})"}))
    assert case.plan.ep == ep
    assert any(a.startswith(f"ep {ep}") and "not stated" in a for a in case.assumptions)


def gpt_oss_record(group: str) -> dict:
    """GPT-OSS-120B on 64 GB200s as Megatron-Bridge's tables print it: ep 64, micro-batch 4, 4,096 tokens."""
    return record(group=group, precision="bf16", hardware={"gpu": "GB200", "num_gpus": 64, "gpus_per_node": 4},
                  model={"name": "GPT-OSS-120B", "arch": "moe", "num_layers": 36, "hidden_size": 2880,
                         "num_heads": 64, "num_kv_heads": 8, "ffn_hidden_size": 2880, "vocab_size": 201088,
                         "seq_length": 4096, "num_experts": 128, "moe_topk": 4, "moe_ffn_hidden_size": 2880},
                  parallel={"tp": 1, "pp": 1, "cp": 1, "vp": None, "ep": 64, "micro_batch_size": 4,
                            "global_batch_size": 1280})


def test_learnable_sinks_run_in_the_fused_kernel_from_the_release_that_ships_it():
    """TE 2.8 + cuDNN 9.13.1 run GPT-OSS's learnable sinks in cuDNN's fused kernel (TE PR #2148; the NeMo image's
    cuDNN, NVIDIA-NeMo/RL#1685): 25.11 on. An older release (TE 2.7) falls back to the unfused kernel, which keeps
    every layer's probabilities for the backward pass: b·h·s²·2 bytes = 4·64·4096²·2 = 8.59 GB per layer, 36 of them
    on this single-stage layout (309 GB), more than a GB200 holds: the published runs cannot have used it."""
    fused, unfused = (map_run(gpt_oss_record(g)) for g in ("megatron_bridge_25.11", "megatron_bridge_25.09"))
    assert fused.stack.flash_attention and not unfused.stack.flash_attention
    assert any("sinks in cuDNN's fused kernel" in a for a in fused.assumptions)
    assert any(a.startswith("unfused attention: learnable attention sinks") for a in unfused.assumptions)
    probabilities = 4 * 64 * 4096**2 * 2
    assert probabilities == pytest.approx(8.59e9, rel=1e-3)
    fits, spills = (evaluate_case(c) for c in (replace(fused, plan=unfused.plan,
                                                       stack=unfused.stack.with_(flash_attention=True)),
                                               unfused))
    # the fused kernel keeps its softmax statistics instead (b·h·s fp32 numbers, 0.1 % of that)
    assert spills.memory_predicted - fits.memory_predicted == pytest.approx(36 * probabilities, rel=0.01)
    assert 36 * probabilities > spills.memory_capacity
    assert fits.fits and not spills.fits


LLAMA31_405B = {"name": "Llama3.1-405B", "num_layers": 126, "hidden_size": 16384, "num_heads": 128,
                "num_kv_heads": 8, "ffn_hidden_size": 53248, "vocab_size": 128000, "seq_length": 8192}


@pytest.mark.parametrize(("name", "pp", "vp", "last"), [
    ("Llama3.1-405B", 16, 8, 7),  # 126 + 2 slots over 16 ranks: 8 each, the last one's loss slot leaves 7 layers
    ("Llama3.1-405B", 8, 8, 15),  # 128 / 8 = 16, one of them the loss
    ("Llama3-70B", 4, 5, 0),  # the 70B recipe does not count them: an even split
    ("Qwen3-235B-A22B", 8, 3, 11),  # qwen3_235b_a22b_pretrain_config: 94 + 2 slots, 96 / 8 − 1
])
def test_the_405b_recipe_counts_the_embedding_and_the_loss_as_pipeline_layers(name, pp, vp, last):
    model = {"Llama3.1-405B": LLAMA31_405B, "Qwen3-235B-A22B": QWEN3_235B}.get(name, {})
    case = map_run(record(model=model, hardware={"gpu": "GB200", "num_gpus": 256, "gpus_per_node": 4},
                          parallel={"tp": 4, "pp": pp, "vp": vp, "global_batch_size": 1536}))
    assert case.plan.last_stage_layers == last
    assert any("account_for_embedding" in note for note in case.assumptions) is bool(last)


def test_a_megatron_core_stack_that_cannot_split_the_layers_otherwise_counts_the_embedding_and_the_loss():
    """NeMo runs Llama 3.1 405B (126 layers) at pp 8, vp 8: 64 model chunks, which 126 layers do not fill evenly and
    128 slots do (2 each), so the last rank holds 128/8 − 1 = 15 decoder layers; at vp 7 (56 chunks) neither splits."""
    def last(group, vp, framework="NeMo 25.04"):
        rec = record(group=group, framework=framework, model=LLAMA31_405B,
                     hardware={"gpu": "GB200", "num_gpus": 256, "gpus_per_node": 4},
                     parallel={"tp": 4, "pp": 8, "vp": vp, "global_batch_size": 1536})
        return map_run(rec).plan.last_stage_layers

    assert last("nemo_2504_gb200_perf_summary", 8) == 15
    assert last("nemo_2504_gb200_perf_summary", 7) == 0
    assert last("torchtitan_x", 8, "torchtitan (FSDP2)") == 0  # not a Megatron-Core stack
