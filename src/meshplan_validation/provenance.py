"""Which source a measured run comes from: one paper, one framework's table, one benchmark suite (issue 79). A
constant fitted on measured runs is judged on the runs of a source it was not fitted on, so the unit of hold-out is the
source, not the run or the table: the successive releases of one framework's table (Megatron-Bridge 25.09 to 26.08,
TensorRT-LLM's performance page at v0.17 and v1.0) are one source, since what one release's runs teach a fit carries
to the next release's runs of the same configurations (docs/ACCURACY.md, "One configuration, several releases").

``SOURCES`` maps a record's ``group`` to its source, by a pattern over the group's name, each with what the source is.
A group no pattern matches is a source of its own (tests/test_provenance.py checks that every group of every data
file is matched, so a new file says where its runs come from).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    key: str
    pattern: str  # over the record's group
    what: str


SOURCES: tuple[Source, ...] = (
    # training: data/validation/published_runs.jsonl
    Source("narayanan2021", r"^narayanan2021", "Narayanan et al. 2021 (SC'21), Table 1"),
    Source("megatron_readme", r"^megatron_readme_", "Megatron-LM README performance tables (2020, January 2021)"),
    Source("korthikanti2022", r"^korthikanti2022", "Korthikanti et al. 2022, Tables 4-5"),
    Source("megatron_core_readme", r"^megatron_core_h100_2024", "Megatron-Core README scaling table (H100, 2024)"),
    Source("megatron_bridge", r"^megatron_bridge_", "Megatron-Bridge performance summary, every release (25.09-26.08, "
           "Blackwell Ultra rows included)"),
    Source("nemo", r"^nemo_(24|25|long)", "NeMo performance summaries (24.07, long context, 25.02, 25.04)"),
    Source("nemo_automodel", r"^nemo_automodel", "NeMo AutoModel performance summary"),
    Source("mosaicml", r"^mosaicml", "MosaicML LLM Foundry benchmark table"),
    Source("torchtitan", r"^torchtitan_", "torchtitan benchmark tables (A100 2024, H100 December 2024)"),
    Source("megatron_lm_examples", r"^megatron_lm_examples", "Megatron-LM examples' README figures (Llama)"),
    Source("bloom", r"^bloom$", "BLOOM paper (BigScience 2022)"),
    Source("bigscience_prequel", r"^bloom_prequel", "BigScience BLOOM-prequel topology and throughput search logs"),
    Source("opt", r"^opt$", "OPT paper / logbook (Zhang et al. 2022)"),
    # training: data/validation/small_work.jsonl
    Source("llmc", r"^llmc_", "karpathy/llm.c training scripts' logs"),
    Source("flash_attention_readme", r"^flash_attention_training", "flash-attention training README"),
    Source("dlperf", r"^dlperf_", "OneFlow DLPerf benchmark reports (Megatron-LM, DeepSpeed)"),
    Source("bigpurple", r"^gpt2_optimization_bigpurple", "GPT-2 optimisation study on NYU BigPurple"),
    Source("megatron_lm_ci", r"^megatron_lm_ci_golden", "Megatron-LM CI golden values (DGX A100 and DGX H100)"),
    # training: the vTrain single-node sweep (shared/validation/vtrain_single_node_dev.jsonl)
    Source("vtrain", r"^vtrain_", "vTrain (Bang et al., MICRO 2024) single-node validation sweep"),
    # training: benchmarks/data/independent_runs.jsonl
    Source("llama3_paper", r"^llama3_paper", "The Llama 3 Herd of Models, Table 4"),
    Source("llama1_paper", r"^llama1_paper", "LLaMA paper, section 2.4"),
    Source("mtnlg_paper", r"^mtnlg_paper", "MT-NLG paper, section 2.4"),
    Source("ibm_fsdp", r"^(pytorch_blog_fsdp_ibm|fms_fsdp)", "IBM's PyTorch FSDP blog and fms-fsdp README"),
    Source("kempnerforge", r"^kempnerforge", "KempnerForge scaling reports (H200)"),
    Source("dgxc", r"^dgxc_", "NVIDIA DGX Cloud benchmarking recipes (MaxText, Paxml, Grok-1)"),
    Source("hisohara_rocm", r"^hisohara_rocm", "A ROCm Megatron training log (MI300-class)"),
    Source("internevo", r"^internevo_", "InternEvo README performance tables"),
    Source("gpt_neox_20b", r"^gpt_neox_20b", "GPT-NeoX-20B paper"),
    Source("tinyllama", r"^tinyllama", "TinyLlama README"),
    Source("megatron_llama", r"^megatron_llama", "Megatron-LLaMA README tables"),
    # serving: data/serving/published_serving.jsonl, small_work.jsonl, load_tests.jsonl
    Source("trtllm_perf", r"^trtllm_(perf|serving)_v", "TensorRT-LLM performance overview page (v0.14 serving, v0.17, "
           "v1.0)"),
    Source("trtllm_blog_r1", r"^trtllm_deepseek_r1_blog", "TensorRT-LLM DeepSeek-R1 best-performance blog"),
    Source("trtllm_low_latency", r"^trtllm_low_latency", "TensorRT-LLM low-latency benchmark tables (v0.5)"),
    Source("lmdeploy", r"^lmdeploy_", "LMDeploy benchmark on A100 (FP16)"),
    Source("amd_vllm", r"^amd_mi300x_vllm", "AMD's vLLM MI300X validation README (0.6.6, 0.7.3, 0.10.0)"),
    Source("sglang_blogs", r"^sglang_", "SGLang team's large-EP (H100) and GB200 blog posts"),
    Source("gptfast", r"^gptfast_", "pytorch-labs/gpt-fast README benchmarks"),
    Source("sglang_vs_vllm_readme", r"^sglang030_vs_vllm060",
           "SGLang's benchmark/benchmark_vllm_060 README (load tests)"),
    Source("gpustack_perf_lab", r"^gpustack_", "GPUStack performance lab pages (gpustack/gpustack "
           "docs/performance-lab): vLLM / SGLang / TensorRT-LLM load tests"),
    Source("dstack", r"^dstack_", "dstack's benchmarks of vLLM on 8x MI300X (dstack blog, October 2024; "
           "dstackai/benchmarks amd/inference)"),
    Source("argonne_bench", r"^argonne_llm_inference_bench",
           "Argonne LLM-Inference-Bench (Chitty-Venkata et al. 2024)"),
)


def source_of(group: str) -> str:
    """The key of the source a record of ``group`` comes from (``SOURCES``); the group itself where none matches."""
    for s in SOURCES:
        if re.search(s.pattern, group or ""):
            return s.key
    return group or "unnamed"


def record_source(record: dict) -> str:
    """The source of a record: by its group, or by its id where it has no group (data/serving/load_tests.jsonl)."""
    return source_of(str(record.get("group") or record.get("id") or ""))


def matched(group: str) -> bool:
    """Whether a pattern of ``SOURCES`` names the group's source."""
    return any(re.search(s.pattern, group or "") for s in SOURCES)
