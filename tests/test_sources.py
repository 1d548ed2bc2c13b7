"""Each source's profile (sources.py) as a record's group and framework text pick it, and whole records of each
source mapped to (model, cluster, plan, stack): Megatron-Bridge's recipe defaults, MosaicML's FSDP, Narayanan et
al.'s stated assumptions, torchtitan's pipeline batches, Hugging Face's eager ZeRO-3."""

from __future__ import annotations

import pytest

from meshplan.estimate import estimate
from meshplan.specs.plan import Plan
from meshplan_validation.case import map_run
from meshplan_validation.evaluate import evaluate_case
from meshplan_validation.sources import source_defaults
from published_helpers import record


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
    # Megatron-LM's CI golden values of 2024 for its legacy GPT path: the 2020-22 module code, not Megatron-Core, with
    # the CI's per-parameter logging in the optimizer step
    ("megatron_lm_ci_golden_2024_h100", "Megatron-LM legacy GPT model code (megatron/model, --transformer-impl local)",
     "Megatron-LM CI 2024"),
    ("dlperf_megatron_lm_2021", "OneFlow DLPerf's Megatron-LM", "Megatron-LM 2021"),
    # vTrain's runs: Megatron-DeepSpeed's code without DeepSpeed's engine, before the Megatron-DeepSpeed profile
    ("vtrain_a100_single", "Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed), as data/README.md states",
     "vTrain (Megatron-DeepSpeed, Megatron's optimizer)"),
])
def test_each_source_profile_is_reached(group, framework, profile):
    assert source_defaults({"group": group, "framework": framework}).name == profile


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
    assert est.peak_memory == pytest.approx(est.rank_memory[1])
    # torchtitan logs the caching allocator's reserved peak (sources.SourceDefaults.memory_peak)
    assert result.memory_predicted == pytest.approx(est.reserved_memory) and est.reserved_memory >= est.peak_memory
    assert est.rank_memory[1] > est.rank_memory[0]
    # the last rank keeps m = 8 micro-batches' fp32 logits (4 × 8192 tokens × 128000 / 8 × 4 B = 1.95 GiB each)
    # and 2·m layer inputs (4 × 8192 / 8 tokens × 16384 × 2 B = 128 MiB each) that Megatron-Core would not
    megatron = estimate(case.model, case.cluster, p, case.stack.with_(pipeline_runtime="megatron"))
    kept = 8 * 4 * 8192 * 16000 * 4 + 16 * 4 * 1024 * 16384 * 2
    assert est.rank_memory[1] - megatron.rank_memory[1] == pytest.approx(kept)


@pytest.mark.parametrize(("framework", "profile"), [
    ("DeepSpeed + Megatron-LM (3D parallelism)", "Megatron-DeepSpeed (BLOOM)"),  # MT-NLG's stack, not HF code
    ("Megatron-DeepSpeed", "Megatron-DeepSpeed (BLOOM)"),
    ("DeepSpeed ZeRO-3 + Hugging Face Trainer", "DeepSpeed / Hugging Face"),
    ("PyTorch FSDP (nightlies post-2.2) + SDPA FlashAttention-2, IBM foundation-model-stack (fms-fsdp)",
     "PyTorch FSDP"),
    ("KempnerForge (PyTorch FSDP2 + TP, torch.compile)", "KempnerForge"),
    # not NeMo's Megatron recipes: AutoModel's own bf16 MoE models (source_automodel.py), its dense rows FSDP2's
    ("NeMo AutoModel (PyTorch FSDP2 + EP/PP), kernels: TE + DeepEP", "NeMo AutoModel MoE"),
    ("NeMo AutoModel (PyTorch FSDP2), kernels: TE + fsdp2_prefetch", "PyTorch FSDP2"),
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


def test_hugging_face_stacks_are_eager_zero3_and_megatron_deepspeed_is_not():
    hf = map_run(record(group="some_paper", framework="DeepSpeed ZeRO-3 + HF Transformers",
                        parallel={"tp": 1, "pp": 1, "vp": None, "zero_or_fsdp": None}))
    assert (hf.stack.fusion, hf.stack.cross_entropy, hf.stack.attention_kernel, hf.plan.zero) == (
        "eager", "pytorch", "fa2", 3)
    mds = map_run(record(group="other_paper", framework="Megatron-DeepSpeed", parallel={"zero_or_fsdp": None}))
    # Megatron-LM's module code with its own fused kernels, each launched from eager PyTorch (cost/eager.py "jit")
    assert mds.stack.fusion == "jit" and mds.plan.zero == 1 and mds.stack.name == "megatron-deepspeed"


def test_vtrain_runs_price_the_released_scope():
    """vTrain's runs ran Megatron's own training loop (sources.VTRAIN): not DeepSpeed's per-plan wrapper, fp16
    gradients and no ZeRO; and its released times hold once a step what vTrain's execution graph composes them of
    (benchmarks/measure/small_work_scope.py): the exposed gradient all-reduce and the update, no per-tensor host loop
    (Megatron's fp16 wrapper would cost MDS_FP16_TENSOR, 32.2 us, a tensor: tests/test_optimizer_queued.py)."""
    from meshplan.cost.wrappers import wrapped
    from meshplan_validation.sources import MDS_FP16_TENSOR, MEGATRON_DEEPSPEED
    vtrain = source_defaults({"group": "vtrain_a100_single", "framework": "Megatron-DeepSpeed"})
    assert (vtrain.zero, vtrain.grad_bytes, vtrain.stack.optimizer_wrapper) == (0, 2, "stated")
    assert (vtrain.stack.tensor_host, vtrain.stack.tensor_host_queued) == (0.0, 0.0)
    assert pytest.approx(32.2e-6) == MDS_FP16_TENSOR
    # the module code and its host cost per kernel are the preset's; the TP all-reduces are the graph's CommNodes,
    # after the layer's traced kernels, with no host call (source_vtrain.py)
    for field in ("host_dispatch", "fusion", "flash_attention", "overlap_dp"):
        assert getattr(vtrain.stack, field) == getattr(MEGATRON_DEEPSPEED.stack, field)
    assert (vtrain.stack.collective_host, vtrain.stack.collective_host_stated, vtrain.stack.blocking_collectives) == (
        0.0, True, True)
    assert (vtrain.timed_recompute, vtrain.vocab_floor, vtrain.stack.vocab_multiple) == (False, True, 1)
    assert wrapped(vtrain.stack, Plan(tp=2, precision="fp16")).tensor_host == 0.0
