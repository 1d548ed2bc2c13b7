"""What each framework release does where its published table is silent: the sources' documented defaults
(``SourceDefaults``), the stack each ran and its defaults for what a record may leave out of its plan, each with the
file or pull request it comes from; ``source_defaults`` picks a record's by its group and framework text. The map_*.py
modules apply them when they map a record onto a Plan and a Stack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from meshplan.cost.wrappers import DEEPSPEED_FP16
from meshplan.specs.allreduce_table import AllReduceTable
from meshplan.specs.stack import Stack, load_stack
from meshplan_validation.source_automodel import AUTOMODEL_MOE, AUTOMODEL_MOE_STACK, AUTOMODEL_MOE_WHY
from meshplan_validation.source_internevo import INTERNEVO_STACK, INTERNEVO_WHY
from meshplan_validation.source_megatron_jan2021 import JAN2021_RUNTIME, JAN2021_SOURCE, JAN2021_WHY
from meshplan_validation.source_vtrain import VTRAIN_ALLREDUCE, VTRAIN_STACK, VTRAIN_WHY


@dataclass(frozen=True)
class SourceDefaults:
    """What a framework release does when its table does not say: the stack it runs (a preset of stack.py, or one
    with the release's departures from it) and its defaults for what a record may leave out of its plan; each
    carries its source."""

    name: str
    match: str  # regex on "group framework"
    stack: Stack
    sequence_parallel: bool | None  # None: on when tp > 1
    zero: int  # when the record does not say
    grad_bytes: int
    recompute: str  # when the record does not say
    why: str
    whole_batch: bool = False  # no gradient accumulation: an unstated micro-batch is global batch / dp
    # Plan.lora_targets, the source's default (the tables do not state it): every attention and MLP linear
    # (Megatron-Bridge / NeMo 2 peft.LoRA), unless the stack's LoRA adapts the QKV projection only
    lora_targets: str = "all"
    # a pipeline stating neither vp nor its schedule interleaves (the least v dividing a stage's layers), not 1F1B
    interleaved: bool = False
    # attention by PyTorch's SDPA, whose kernel depends on its release (SDPA_CUDNN_FROM; map_kernels.attention_kernel)
    sdpa: bool = False
    # the peak memory its runs report: "allocated" (torch.cuda.max_memory_allocated, Estimate.peak_memory), "reserved"
    # (the caching allocator's reserved peak, Estimate.reserved_memory: torchtitan logs reserved_bytes.all.peak,
    # torchtitan/metrics.py get_peak_stats @021137a) or "device" (nvidia-smi's reading of the process: the reserved
    # bytes, the CUDA context with its kernels and NCCL's buffers, Estimate.device_memory, step/device_memory.py)
    memory_peak: str = "allocated"
    # expert tensor parallelism when the record does not state it (MoE with ep > 1): 1, the expert weights whole on
    # each expert-parallel rank, unless the stack takes Megatron-Core's own default, etp = tp
    # (megatron/training/arguments.py: expert_tensor_parallel_size None → tensor_model_parallel_size; before
    # Megatron-Core 0.10 there was no separate expert TP and the experts were split over the TP group)
    expert_tp_is_tp: bool = False
    # DeepSpeed's engine in fp16 reduces the fp16 gradients themselves: communication_data_type is the model's dtype
    # unless the config names one (deepspeed 0.19.8 runtime/engine.py:1718-1730): 2 gradient bytes for an fp16 run
    fp16_grads: bool = False
    # whether the source's times hold the recompute pass the record states: False where they are composed without it
    # (vTrain's execution graph: source_vtrain.py; the Plan is then priced without recompute)
    timed_recompute: bool = True
    # the model holds vocab_size // tp vocabulary rows a rank, unpadded (vTrain's ShardedGptModel), not V / tp
    vocab_floor: bool = False
    allreduce_table: AllReduceTable | None = None  # the source's node's all-reduce as measured (Cluster's)
    fused_batch: bool = False  # an unstated micro-batch: the least its fused softmax takes (source_megatron_jan2021)
    launch: tuple[int, int] = (1, 1)  # an unstated (tp, micro-batch): its own launch script's (Megatron-LLaMA's)


# PyTorch's scaled_dot_product_attention picks its FlashAttention-2 backend on Hopper and Blackwell; cuDNN's kernel
# comes first only from PyTorch 2.11, whose pip wheels bundle a cuDNN that passes sdp_utils.cpp's
# check_prefer_cudnn_attention (cuDNN > 9.15; pytorch/pytorch#138522 had made it opt-in after the 2.5 bugs). A
# stack built against another cuDNN (an NGC container) may differ; the records rarely say which. Seen on a lent H200:
# PyTorch 2.11.0+cu130 (cuDNN 9.19) ran SDPA's causal forward and backward as cuDNN's sm90 kernels
# (data/measured/gpu/2026-11-26-nvidia-h200-unaligned-gemm.json, "profile").
SDPA_CUDNN_FROM = (2, 11)
# The pytorch-fsdp preset describes PyTorch 2.11+ (cuDNN's attention); the records' profiles default to the releases
# before it, FlashAttention-2, unless the record names its release (map_kernels._sdpa_kernel)
SDPA_ERA = load_stack("pytorch-fsdp").with_(attention_kernel="fa2")
SDPA = ("PyTorch SDPA (FlashAttention-2 on Hopper and Blackwell: sdp_utils.cpp check_prefer_cudnn_attention puts cuDNN "
        "first only with the cuDNN > 9.15 that PyTorch 2.11 bundles)")

# Megatron-LM before FlashAttention and before its communication overlaps (2020-2022 releases, and the Megatron-LM
# model code on DeepSpeed's engine of 2022): unfused softmax attention, DP gradients all-reduced after the backward
# pass, TP and pipeline communication exposed. Megatron-LM's host issues its kernels as the megatron-core preset's
# does (12 us a kernel; TransformerEngine #2053, dgxc-benchmarking cpu_overhead): no CUDA graphs before core_r0.11.0
MEGATRON_HOST = load_stack("megatron-core").host_dispatch
# Megatron-LM pads the vocabulary to a multiple of 128 x tp (--make-vocab-size-divisible-by, default 128, since its
# first release): the presets' vocab_multiple
MEGATRON_VOCAB = load_stack("megatron-core").vocab_multiple
# Megatron-LM's own module code of 2020-22 (megatron/model/transformer.py, which Megatron-DeepSpeed and GPT-NeoX carry
# and Megatron-Core's local layer spec descends from: Python autograd Functions for every parallel linear, the scale-
# mask-softmax module, bias-dropout-add and bias-GeLU functions) issues each kernel with more Python around it: 50 us
# of host time per CUDA kernel, from the fixed cost a of Megatron-Core 0.16.1's local-spec GPT layer per micro-batch
# over its 63 kernels on an H200 host (49-73 us at the host-bound widths and batches, this the low end: the apex and JIT
# fusions of the published releases issue fewer, lighter calls; data/measured/gpu/*-megatron.json,
# docs/SMALL_WORK_GPU.md), against 25 us for a plain-PyTorch layer measured in the same call
MEGATRON_LM_HOST = 50e-6
# Its TP collective is one c10d call (mappings.py _reduce), not a kernel in module Python: at tp 2 the layer makes tp
# 1's Python calls plus 4 all-reduces (data/measured/2026-11-27-megatron-host-cpu-tp.json): megatron-deepspeed's price
MEGATRON_LM_COLLECTIVE = load_stack("megatron-deepspeed").collective_host
# Per parameter tensor per optimizer step (step/host.step_host), counted in Megatron-LM's own code (NVIDIA/Megatron-LM
# 6aad2116, its CI of February 2024, run on CPU: data/measured/2026-11-26-optimizer-host-ops.md): the fp16 optimizer
# wrapper, clip_grads.py's gradient norm and the step's copies run 2 kernel-launching ops + 1 view a tensor, 5 .data
# reads and ~14 Python passes: 2 x 14.5 + 0.6 + 5 x 0.2 + 14 x 0.1 = 32.0 us; the CI's --log-num-zeros-in-grad
# (count_zeros_fp32: count_nonzero, the subtraction from numel, the running sum) and --log-params-norm make it 5
# launching ops + 2 views, 6 .data reads and ~16 passes: 72.5 + 1.2 + 1.2 + 1.6 = 76.5 us
MEGATRON_LM_TENSOR = 32e-6
MEGATRON_LM_CI_TENSOR = 76e-6
# The CI's training loop around the model (the recipe's --timing-log-level 2 --log-interval 1
# --log-timers-to-tensorboard; data/measured/2026-11-26-megatron-ci-loop.md): per step its logging, replayed on this
# host with tensorboard's own writer (benchmarks/measure/megatron_ci_loop.py: 33 scalars and two log lines, 0.96 ms);
# per micro-batch and pipeline rank the timers' torch.cuda.synchronize at every start and stop (megatron/timers.py; ~15
# a micro-batch on a pipelined rank), the sends' synchronise after batch_isend_irecv, the batch's fetch, broadcast and
# attention-mask copy and the loss's NaN check and all-reduce: GPU work to time, so fitted, the one constant, by least
# squares on the fit half of the CI records (its six pipelined runs; tests/test_megatron_ci_loop.py re-fits it), at the
# DGX A100's measured python_host (1.34, presets/hardware/a100.toml), with the GPT convention's biases, dropout and
# learned positions priced (record_fields.GPT_ARCH, Megatron-LM's argument defaults): 0.44 ms (0.26 ms while a TP
# all-reduce was priced as a kernel, MEGATRON_LM_COLLECTIVE; 3.15 ms without the biases, 1.98 ms at python_host 1.57)
MEGATRON_LM_CI_STEP = 1.0e-3
MEGATRON_LM_CI_MICROBATCH = 0.44e-3  # the fit: 0.439 ms
MEGATRON_CORE_TENSOR = load_stack("megatron-core").tensor_host  # Megatron-Core's distributed optimizer: its preset's
# DeepSpeed's FP16_Optimizer (ZeRO-0 fp16: DeepSpeedExamples' Megatron-LM v1 on DeepSpeed's engine), counted in
# DeepSpeed 0.19.8 (cost/wrappers.py: 206.6 us per tensor of the whole model), stated for both of that profile's plans:
# its 2020 ZeRO-1 (stage1.py, not counted, not today's stage_1_and_2.py) taken alike, since OneFlow DLPerf measured
# the two at 161 and 163 ms
DEEPSPEED_FP16_TENSOR = DEEPSPEED_FP16
# Its kernels: the module code with its fusions on (fused softmax and LayerNorm, TorchScript bias-GeLU and bias-dropout-
# add), counted as cost/eager.py's "jit" rows (58 a GPT layer with dropout), not one per fused record
MEGATRON_2021 = Stack(name="megatron-lm-2021", family="megatron", flash_attention=False, overlap_dp=False,
                      host_dispatch=MEGATRON_LM_HOST, collective_host=MEGATRON_LM_COLLECTIVE, fusion="jit",
                      vocab_multiple=MEGATRON_VOCAB, tensor_host=MEGATRON_LM_TENSOR, tensor_sharded=True,
                      source="Megatron-LM 2020-22 (Shoeybi et al. 2019; Narayanan et al. 2021; Korthikanti et al. "
                             "2022): fused-softmax attention, no overlap flags yet")
# Megatron-Core 0.8 with the overlaps its README scaling runs state (--overlap-grad-reduce --overlap-param-gather
# --tp-comm-overlap) and its default of pipeline sends overlapped under interleaving
MEGATRON_CORE_2024 = Stack(name="megatron-core-0.8", family="megatron", overlap_tp=True, overlap_pp=True,
                           host_dispatch=MEGATRON_HOST, vocab_multiple=MEGATRON_VOCAB,
                           tensor_host=MEGATRON_CORE_TENSOR, tensor_sharded=True,
                           source="Megatron-Core r0.8 README scaling runs")


def pytorch_fsdp(name: str, match: str, fsdp: str, grad_bytes: int, who: str) -> SourceDefaults:
    """A PyTorch-native FSDP stack (the pytorch-fsdp preset with this FSDP): full shard with prefetch, SDPA
    attention, F.cross_entropy in eager autograd, element-wise kernels in eager PyTorch unless torch.compile is
    stated, sequence parallelism inside a TP plan, no recompute unless stated."""
    return SourceDefaults(name, match, SDPA_ERA.with_(fsdp=fsdp), None, 3, grad_bytes, "none",
                          f"{who}; full shard with prefetch, {SDPA} attention, F.cross_entropy in eager autograd, "
                          "element-wise kernels in eager PyTorch unless torch.compile is stated, sequence parallelism "
                          "inside a TP plan, no recompute unless stated", sdpa=True)


MEGATRON_DEEPSPEED = SourceDefaults(
    "Megatron-DeepSpeed (BLOOM)", r"bloom|gpt-?neox|megatron.{0,20}deepspeed|deepspeed.{0,20}megatron",
    load_stack("megatron-deepspeed"), False, 1, 4, "full",
    "Megatron-DeepSpeed 2022: no sequence parallelism, BF16_Optimizer (ZeRO-1) with fp32 gradient reduction after the "
    "backward pass, no FlashAttention; EleutherAI's GPT-NeoX is the same construction (Megatron-LM model code on "
    "DeepSpeed's pipeline engine and ZeRO-1)", memory_peak="device")  # BLOOM's memory column: nvidia-smi's
# (chronicles-prequel.md @053adafe: "pdsh -w jean-zay-iam01 ... nvidia-smi", the first node: the first stage's GPUs)

# vTrain's measured runs (Bang et al. 2024; VIA-Research/vTrain f8dda847): "collected using Megatron-DeepSpeed codebase"
# (data/README.md), with no DeepSpeed JSON or --deepspeed anywhere in the repository, and everything it states is
# Megatron's own training path, not DeepSpeed's engine: its configs price "PyTorch DDP's gradient bucketing"
# (src/config.py use_gradient_bucket / ddp_bucket_size, src/predictor.py compute_bucket_assignment: DDP's 1 MB first
# bucket), which only Megatron's --DDP-impl runs (DeepSpeed's engine reduces its own buckets); a "1f1b" schedule; and
# its profiler times apex's FusedAdam bare (src/trainer.py, src/model/fused_adam.py: one multi_tensor_applier call per
# layer group, no wrapper), apex built in its Dockerfile (2386a912). Without --deepspeed, Megatron-DeepSpeed's
# megatron/training.py (4822c87e, September 2023) runs get_megatron_optimizer's Float16OptimizerWithFloat16Params
# around apex FusedAdam (megatron/optimizer/__init__.py returns the bare optimizer only under args.deepspeed): the
# wrapper of Megatron-LM's own code, its per-tensor loops counted in the order they run (MDS_FP16_TENSOR below; the
# unscale, norm and update are multi-tensor launches, cost/multi_tensor.py). fp16 without
# --accumulate-allreduce-grads-in-fp32 (a store_true flag forced on for bf16 only, megatron/arguments.py): the
# gradients stay fp16. No ZeRO (Megatron's own optimizer has no stage; --use-distributed-optimizer is unstated).
# The causal attention mask that Megatron-DeepSpeed built on the CPU for every micro-batch from a2a476e1
# (2023-08-23) until af06d144 (2024-07-08, #411 "keeping attention_mask on device"): get_ltor_masks_and_position_ids
# in megatron/utils.py made torch.tril(torch.ones((1, s, s))) without a device, compared it with 0.5 and then copied
# it to the GPU, after get_batch's broadcast_data had synchronised (sizes_cuda.cpu()): host time the GPU waits out,
# each micro-batch (Stack.microbatch_host). vTrain's 4822c87e lies in that window, and its runs are all at sequence
# 1024: 1.14 ms on one intra-op thread (torchrun's OMP_NUM_THREADS=1), replayed on this project's host as
# megatron_ci_loop.py's replay is and taken as the DGX H100 host's time (data/measured/2026-11-28-cpu-causal-mask.json,
# benchmarks/measure/cpu_causal_mask.py; the 1 MiB pageable copy that follows needs a GPU and is not counted)
MDS_CPU_MASK_1024 = 1.14e-3
# Its optimizer step per parameter tensor, in the order the code runs it (Megatron-DeepSpeed 4822c87e: training.py
# train_step calls optimizer.reduce_model_grads, whose local DDP allreduce_gradients enqueues one NCCL all-reduce of
# the contiguous fp16 grad buffer and returns, then optimizer.step; megatron/optimizer/optimizer.py,
# clip_grads.py; --DDP-impl local and contiguous buffers are the defaults, so params_have_main_grad), priced at the
# units of MEGATRON_LM_TENSOR (a kernel-launching op 14.5 us, a view 0.6 us, a .data read 0.2 us, a Python pass
# 0.1 us; data/measured/2026-11-28-mds-optimizer-order.md):
# - before the step's first synchronisation (found_inf.item() in _unscale_main_grads_and_check_for_nan):
#   _copy_model_grads_to_main_grads's main_grad.float() of the fp16 buffer view (a cast kernel: fp16 gradients
#   without --accumulate-allreduce-grads-in-fp32), hasattr and the two .grad sets, and
#   _collect_main_grad_data_for_unscaling's .grad.data: 1 launching op, 1 .data, 3 passes = 14.5 + 0.2 + 0.3 = 15.0 us;
#   issued while the GPU runs the all-reduce just queued (step/host.optimizer_loops hides it up to that time);
# - after it: clip_grad_norm's two get_parameters, the norm filter (param_is_not_shared, the TP-duplicate test) and
#   clip_grad_norm_fp32's grad.type() check and detach() before total_norm.item() (the second sync); apex FusedAdam's
#   loop (3 .data, 1 pass); _get_model_and_main_params_data_float16 (2 .data) and _multi_tensor_copy_this_to_that,
#   whose `overflow_buf` test reads the fp16 dummy tensor([0]) (a third sync, False) and so copies each tensor with
#   copy_ (a launching op); the next step's zero_grad over two groups: 1 launching op, 1 view, 5 .data, 11 passes =
#   14.5 + 0.6 + 1.0 + 1.1 = 17.2 us, none of it under queued GPU work (the syncs drained it).
# 32.2 us in all (Megatron-LM 6aad2116's same path, MEGATRON_LM_TENSOR, was priced at 5 .data reads and 14 passes)
MDS_FP16_QUEUED = 14.5e-6 + 0.2e-6 + 3 * 0.1e-6
MDS_FP16_TENSOR = MDS_FP16_QUEUED + 14.5e-6 + 0.6e-6 + 5 * 0.2e-6 + 11 * 0.1e-6
# What vTrain's released times hold (their scope, not Megatron's step as counted above): source_vtrain.py
VTRAIN = SourceDefaults("vTrain (Megatron-DeepSpeed, Megatron's optimizer)", r"^vtrain", VTRAIN_STACK, False, 0, 2,
                        "full", VTRAIN_WHY, timed_recompute=False, vocab_floor=True, allreduce_table=VTRAIN_ALLREDUCE)


SOURCES: tuple[SourceDefaults, ...] = (
    VTRAIN, SourceDefaults("InternEvo", r"internevo", INTERNEVO_STACK, False, 1, 2, "none", INTERNEVO_WHY),
    SourceDefaults("Megatron-LM 2020", r"megatron_readme_2020|megatron2020", MEGATRON_2021, False, 0, 2, "full",
                   "Megatron-LM 2020 (before pipeline parallelism): --batch-size is the per-GPU batch, no "
                   "gradient accumulation; no sequence parallelism or TP overlap; fp16 gradients all-reduced after "
                   "the backward pass; unfused softmax attention; --checkpoint-activations in its example scripts",
                   whole_batch=True),
    # dlperf_megatron_lm: OneFlow DLPerf's reproduction of NVIDIA/Megatron-LM at 8aa4619f (2021; DLPerf
    # Megatron-LM/README.md and scripts/mutil_perf_pretrain_gpt_dp_mp_pp.sh: --fp16 --checkpoint-activations);
    # megatron_lm_ci: Megatron-LM's CI golden values of 2024 for its legacy GPT path (megatron/model with
    # --transformer-impl local and no overlap flags: this module code, tests/functional_tests/test_scripts/gpt3/
    # pretrain_gpt3_distributed_test.sh), whose records state their recompute ("none")
    SourceDefaults("Megatron-LM CI 2024", r"megatron_lm_ci",
                   MEGATRON_2021.with_(name="megatron-lm-ci", tensor_host=MEGATRON_LM_CI_TENSOR,
                                       iteration_host=MEGATRON_LM_CI_STEP,
                                       microbatch_host=MEGATRON_LM_CI_MICROBATCH), False, 0, 2, "full",
                   "Megatron-LM 2020-21's module code as its CI ran it in 2024 (megatron/model, --transformer-impl "
                   "local): as Megatron-LM 2021, with the CI's per-parameter logging (--log-num-zeros-in-grad, "
                   "--log-params-norm) in the optimizer step's host time, its logging every step and its "
                   "synchronising timers (--timing-log-level 2) per micro-batch"),
    SourceDefaults(JAN2021_SOURCE, r"megatron_readme_jan2021", MEGATRON_2021.with_(
        pipeline_runtime=JAN2021_RUNTIME), False, 0, 2, "full", JAN2021_WHY, fused_batch=True),
    SourceDefaults("Megatron-LM 2021", r"narayanan|megatron_readme|dlperf_megatron_lm|megatron_lm_ci", MEGATRON_2021,
                   False, 0, 2, "full", "Megatron-LM 2020-21: no sequence parallelism or TP overlap yet, fp16 "
                   "gradients all-reduced after the backward pass, no distributed optimizer, unfused softmax "
                   "attention, full activation checkpointing (--checkpoint-activations in its example scripts)"),
    SourceDefaults("Megatron-LM 2022", r"korthikanti", MEGATRON_2021, False, 0, 2, "full",
                   "Korthikanti et al. 2022: Megatron-LM of 2022 (no TP overlap, no distributed optimizer, "
                   "fused-softmax attention, no FlashAttention), dp = 1 benchmark"),
    # DeepSpeedExamples' Megatron-LM v1 GPT-2 (2020; OneFlow DLPerf's DeepSpeed runs): Megatron-LM's 2019 model code
    # on DeepSpeed's engine, before Megatron's fused softmax and bias-dropout-add (attention by matmul, masking by
    # arithmetic, an eager softmax; dropout and residual apart): its module code unfused, the "gpt" rows (fusion eager)
    SourceDefaults("DeepSpeedExamples Megatron-LM v1", r"deepspeedexamples|dlperf_deepspeed_megatron",
                   load_stack("megatron-deepspeed").with_(name="deepspeedexamples-megatron-v1", fusion="eager",
                                                          optimizer_wrapper="stated",
                                                          tensor_host=DEEPSPEED_FP16_TENSOR), False, 0, 2, "none",
                   "DeepSpeedExamples Megatron-LM v1 (2020): Megatron-LM's 2019 GPT-2 module code, unfused (no fused "
                   "softmax or bias-dropout-add), on DeepSpeed's engine in fp16 (fp16 gradients reduced after the "
                   "backward pass), no tensor parallelism unless stated", fp16_grads=True),
    # BigScience's tr11 (BLOOM) runs on Jean Zay set CUDA_LAUNCH_BLOCKING=1 against a hang at 40+ nodes
    # (bigscience-workshop/bigscience train/tr11-176B-ml/README.md "Important environment variables", and every
    # tr11*.slurm; chronicles-prequel.md "dealing with JZ hanging on the large model", before its topology search)
    replace(MEGATRON_DEEPSPEED, name="Megatron-DeepSpeed (BigScience tr11)", match=r"^bloom|bigscience",
            stack=MEGATRON_DEEPSPEED.stack.with_(name="megatron-deepspeed-tr11", blocking_launches=True),
            why="Megatron-DeepSpeed 2022 as BigScience ran BLOOM on Jean Zay: as Megatron-DeepSpeed (BLOOM) below, "
                "with CUDA_LAUNCH_BLOCKING=1 (the tr11 README's workaround for a hang at 40+ nodes, set in every "
                "tr11 slurm script): each kernel launch returns once the kernel has run, so the host's time adds "
                "to the GPU's"),
    MEGATRON_DEEPSPEED,
    # the framework text's hyphenated name: the group of its README's cost table also holds a DeepSpeed row
    SourceDefaults("Megatron-LLaMA", r"megatron-llama", Stack(
        name="megatron-llama", family="megatron", overlap_dp=False, vocab_multiple=1,
        host_dispatch=MEGATRON_HOST, tensor_host=MEGATRON_CORE_TENSOR, tensor_sharded=True), None, 1, 4, "selective",
                   "Megatron-LLaMA (Alibaba, 2023; a Megatron-LM fork) as its examples/LLaMA/LLaMA_13_standalone.sh "
                   "@46ae7dde runs LLaMA-13B: tp 2 with sequence parallelism, micro-batch 2, --recompute-activations "
                   "--recompute-granularity selective, --make-vocab-size-divisible-by 1, no TP overlap, fp32 grads, "
                   "FlashAttention; Megatron-LM's DistributedOptimizer reduce-scatters the gradients after the last "
                   "micro-batch's backward and all-gathers the parameters after the step, not overlapped (its README: "
                   "'the solution provided by Megatron-LM does not fully overlap GPU computation with communication'); "
                   "its OverlappedDistributedOptimizer, named by a record, overlaps them (map_kernels)", launch=(2, 2)),
    SourceDefaults("Megatron-Core 2024", r"megatron_core", MEGATRON_CORE_2024, None, 1, 4, "none",
                   "Megatron-Core r0.8 README scaling runs: --overlap-grad-reduce --overlap-param-gather "
                   "--tp-comm-overlap (stated), distributed optimizer, fp32 gradient reduction (bf16 default), "
                   "TE fused attention, sequence parallelism with tp > 1, no recompute flag given; pipeline sends "
                   "overlapped with interleaving (megatron/training/arguments.py: --no-overlap-p2p-communication "
                   "is a store_false flag, so overlap_p2p_comm is on unless the schedule is not interleaved)",
                   expert_tp_is_tp=True),
    SourceDefaults("Megatron-Bridge", r"megatron_bridge|mbridge", load_stack("megatron-bridge"), None, 1, 2, "none",
                   "Megatron-Bridge scripts/performance: sequence parallelism with tp > 1, userbuffers TP overlap "
                   "(off for nvfp4), distributed optimizer with overlapped grad reduce / param gather, "
                   "grad_reduce_in_fp32 = False (set_basic_perf_overrides), TE attention, no recompute except "
                   "a few memory-bound recipes; FP8 is current scaling (the performance summary's 'FP8-CS' column); "
                   "pipeline sends overlapped with interleaving (src/megatron/bridge/training/comm_overlap.py: "
                   "overlap_p2p_comm = True, batch_p2p_comm = False when pp > 1 and vp > 1)"),
    # before NeMo: these runs' framework text names the NeMo performance scripts their configs follow
    SourceDefaults("Megatron-LM examples", r"megatron_lm_examples", load_stack("nemo"), None, 1, 4, "none",
                   "Megatron-LM examples/llama (configs follow the NeMo performance scripts): as NeMo, with "
                   "Megatron-LM's own default of pipeline sends overlapped under interleaving "
                   "(--no-overlap-p2p-communication is a store_false flag)", expert_tp_is_tp=True),
    SourceDefaults("NeMo 2.0", r"^(?!.*automodel).*nemo 2\.0", load_stack("nemo"), None, 1, 2, "none",
                   "NeMo 2.0 performance scripts (25.02, 25.04): as NeMo 24.x, FP8 gradients reduced in bf16 (NeMo "
                   "scripts/performance/llm/pretrain_*.py @ 5f6fba5: grad_reduce_in_fp32 False)", expert_tp_is_tp=True),
    SourceDefaults("NeMo 24.x", r"^(?!.*automodel).*nemo", load_stack("nemo"), None, 1, 4, "none",
                   "NeMo 24.03/24.07 performance recipes: sequence parallelism and userbuffers TP overlap with "
                   "tp > 1, distributed optimizer with overlapped grad reduce / param gather, fp32 main grads, "
                   "FlashAttention (TE), no activation recompute; LoRA (NeMo 1.x PEFT, the Framework Launcher's "
                   "peft/llama/squad.yaml leaves lora_tuning.target_modules unset) on the QKV projection only: "
                   "nemo/collections/nlp/parts/peft_config.py get_target_modules defaults to ['attention_qkv']; "
                   "pipeline sends overlapped with interleaving (NeMo-Framework-Launcher "
                   "launcher_scripts/conf/training/gpt3/175b.yaml and llama/llama3_70b.yaml set overlap_p2p_comm: "
                   "true, batch_p2p_comm: false over the model config's False default)",
                   lora_targets="qkv", expert_tp_is_tp=True),
    SourceDefaults("MosaicML llm-foundry", r"mosaic|llm[-_ ]?foundry|\bcomposer\b", load_stack("llm-foundry"), False,
                   3, 4, "none",
                   "llm-foundry benchmarks: PyTorch FSDP (prefetching, overlapped), Composer mixed_precision "
                   "DEFAULT = bf16 params, fp32 gradient reduce-scatter; FlashAttention-2 through MPT's "
                   "attn_impl 'flash' (scripts/train/benchmarking/submit_benchmarks.py: --attn_impl defaults to "
                   "'flash' and installs .[gpu-flash2] in the version that leaves fsdp mixed_precision at DEFAULT, "
                   "as both tables record; sweep.sh passes no --attn_impl), whose flash_attn_fn packs q, k and v "
                   "with flash-attn's unpad_input and scatters the output back with pad_input in every layer, "
                   "after splitting the fused Wqkv output with qkv.split (llmfoundry/models/layers/attention.py); "
                   "PyTorch eager (no torch.compile), the model's "
                   "default loss_fn fused_crossentropy (flash-attn's fused kernel); Composer (0.15, the version "
                   "llm-foundry 0.2.0 pins) evaluates the model's train metrics after every micro-batch's backward "
                   "pass (Trainer._eval_train_metrics), and MPT's are LanguageCrossEntropy and LanguagePerplexity, "
                   "each a torch.nn.CrossEntropyLoss over the full-vocabulary logits"),
    SourceDefaults("torchtitan", r"torchtitan", load_stack("torchtitan"), None, 3, 4, "none",
                   "torchtitan: FSDP2 (reshard after forward, prefetch), mixed_precision_reduce = float32, "
                   "sequence parallelism inside its TP plan, PyTorch SDPA flash backend (FlashAttention-2); async TP "
                   "only where stated; loss = F.cross_entropy(pred.float()) in eager autograd (the loss is not "
                   "compiled at the benchmark commit); the blocks in eager PyTorch unless the row says torch.compile; "
                   "float8 linears scale each tensor from its current amax (torchao Float8Linear, tensorwise dynamic "
                   "scaling); pipeline parallelism by torch.distributed.pipelining, of the PyTorch the December 2024 "
                   "benchmarks name (torch 1963fc8)", sdpa=True, memory_peak="reserved"),
    # Stacks that run Hugging Face model code in eager PyTorch under DeepSpeed ZeRO or accelerate / Trainer FSDP.
    SourceDefaults("DeepSpeed / Hugging Face",
                   r"^(?!.*automodel).*(?:deepspeed|hugging ?face|transformers|accelerate|llama[-_ ]?factory|axolotl)",
                   load_stack("deepspeed"), False, 3, 4, "none",
                   "Hugging Face model code in eager PyTorch (one kernel per aten op; F.cross_entropy on fp32 logits) "
                   "with FlashAttention-2 (attn_implementation='flash_attention_2'), data parallel with ZeRO-3 / FSDP "
                   "full shard (prefetch overlapped), fp32 gradient accumulation (fp16 gradients in an fp16 run), no "
                   "tensor or sequence parallelism, no recompute unless stated", fp16_grads=True),
    # PyTorch-native trainers that shard with FSDP and run PyTorch's own kernels (no Megatron, no Transformer Engine
    # unless the record names it): torchtitan's stack without torchtitan's name. A bare "FSDP" names no stack (Llama
    # 3's "DP(=FSDP)" is Meta's own, fused kernels): the generic profile, sharding as map_training.zero_stage reads.
    # KempnerForge (KempnerInstitute/KempnerForge @01b461a, 3ad9d9a, 5666d0d; torch 2.11.0 in its uv.lock): the FSDP2
    # profile, with its model cast to bf16 before training (kempnerforge/distributed/parallel.py build_parallel_model:
    # model.to(dtype=param_dtype), bf16 by default in config/schema.py) so AdamW keeps bf16 moments and no fp32 master,
    # and its gradient accumulation without communication (training/grad.py maybe_no_sync:
    # set_requires_gradient_sync(False) on every micro-batch but the last; MixedPrecisionPolicy reduce_dtype float32):
    # memory.optimizer_bytes. Its peak memory is torch.cuda.max_memory_allocated / 1024**3 (metrics/memory.py
    # get_memory_stats "peak_gb"), the allocated peak meshplan prices, in GiB. Its loss is F.cross_entropy on the bf16
    # logits, which TP gathers whole to every rank (scripts/train.py:294-295, distributed/tensor_parallel.py:157-163
    # @01b461a): the gathered_bf16 loss (specs/stack_variants.py). Its SDPA runs cuDNN's attention on PyTorch 2.11
    # (SDPA_CUDNN_FROM; its 13B profile lists aten::_cudnn_attention_backward, benchmarks/profiling/
    # 13b_24gpu_profiling.md @a7f8346, uv.lock torch 2.11.0+cu128 there and at all three commits); its blocks hold
    # q_proj, k_proj, v_proj, gate_proj and up_proj as separate nn.Linear (model/attention.py:93-96, model/mlp.py:21-23
    # @3ad9d9a). Its loop synchronises the host twice a micro-batch, so every pass starts drained: the loss's
    # `if (flat_labels == -100).all()` between the forward and the backward (training/loss.py:28 @3ad9d9a and
    # 5666d0d) and `total_loss += loss.item()` after the backward (scripts/train.py:845 @3ad9d9a; :298 @01b461a,
    # whose loss, F.cross_entropy inline, has no branch: the forward passes alone there, taken as both). Its TP plan
    # leaves the token embedding whole on every TP rank (tensor_parallel.py:20-23 @all three): replicated_embedding.
    replace(pytorch_fsdp("KempnerForge", r"kempnerforge", "fsdp2", 4,
                         "KempnerForge (FSDP2 + TP): gradients reduced in fp32 (default_mp_policy reduce_dtype "
                         "float32) and accumulated unsharded between syncs, the model in bf16 without an fp32 master "
                         "copy, F.cross_entropy on bf16 logits gathered to every TP rank, cuDNN's SDPA, separate "
                         "projections, two host synchronisations a micro-batch, the token embedding replicated "
                         "over TP"),
            stack=SDPA_ERA.with_(fsdp="fsdp2", accumulate_unsharded=True, master_weights=False,
                                 cross_entropy="gathered_bf16", attention_kernel="fused", projections="separate",
                                 drained_passes="both", replicated_embedding=True)),
    replace(pytorch_fsdp("NeMo AutoModel MoE", AUTOMODEL_MOE, "fsdp2", 4, AUTOMODEL_MOE_WHY),
            stack=SDPA_ERA.with_(**AUTOMODEL_MOE_STACK)),
    pytorch_fsdp("PyTorch FSDP2", r"^(?!.*megatron).*(?:fsdp2|fully[-_ ]shard|automodel)", "fsdp2", 4,
                 "PyTorch-native FSDP2 trainers (fully_shard; NeMo AutoModel, torchtitan-style stacks): gradients "
                 "reduced in fp32 (MixedPrecisionPolicy reduce_dtype float32, as torchtitan)"),
    # A plain PyTorch training loop (torch.cuda.amp autocast + GradScaler, or DDP), no sharding unless the record
    # states it: the pytorch-fsdp preset's eager PyTorch kernels and host cost without FSDP; AMP keeps fp32 weights, so
    # the gradients are fp32 (torch/amp/grad_scaler.py unscales fp32 .grad tensors). First record: the 1-GPU baseline
    # of kadamrahul18/GPT2-Optimization (src/gpt2.py, run_type baseline).
    SourceDefaults("plain PyTorch", r"^(?!.*(?:megatron|deepspeed)).*plain pytorch",
                   SDPA_ERA.with_(fsdp="none"), None, 0, 4, "none",
                   "plain PyTorch training loops (torch.cuda.amp, DDP): the pytorch-fsdp preset's eager kernels and "
                   "host cost without FSDP, no sharding unless stated, fp32 gradients under AMP", sdpa=True),
    pytorch_fsdp("PyTorch FSDP", r"^(?!.*megatron).*(?:pytorch\W{0,3}fsdp|\bhsdp\b|fms[-_]fsdp)", "fsdp1", 2,
                 "PyTorch-native FSDP (FlatParameter) trainers such as IBM's fms-fsdp: the bf16 mixed-precision "
                 "policy of PyTorch's FSDP tutorial and of fms-fsdp (MixedPrecision param, reduce and buffer dtype "
                 "bfloat16: gradients reduced in bf16)"),
)
# Trainers that pad the vocabulary themselves, without Megatron's code: llm.c pads GPT-2's 50257 to 50304, "padded to
# 128 for CUDA kernel efficiency" (karpathy/llm.c train_gpt2.cu, padded_vocab_size); FlashAttention's training scripts
# to 8 (Dao-AILab/flash-attention training/configs/experiment/owt/gpt2s-flash.yaml and pile/gpt3s-flash.yaml, which
# the other sizes' configs extend: model.config.pad_vocab_size_multiple 8). Otherwise the generic profile below.
# llm.c's loss is its fused classifier (llmc/fused_classifier.cuh: softmax, loss and the logits' gradient in one
# kernel, cost/embed_head.loss_ops "fused_grad"); the FlashAttention scripts' is apex's xentropy kernel
# (configs/experiment/pile/base.yaml and owt/base.yaml: loss_fn src.losses.cross_entropy_apex.CrossEntropyLossApex,
# inplace_backward; the kernel flash-attn's CrossEntropyLoss carries, loss_ops "flash").
SOURCES += tuple(
    SourceDefaults(name, match, Stack(name=name, family=name, vocab_multiple=multiple, cross_entropy=loss), None, 1, 4,
                   "none", f"{name}: as the generic profile (below), with the vocabulary padded to a multiple of "
                   f"{multiple}{extra}", interleaved=True)
    for name, match, multiple, loss, extra in (
        ("llm.c", r"llm\.c|\bllmc", 128, "fused_grad", ", its loss one fused classifier kernel"),
        ("FlashAttention training", r"flash[-_ ]?attention[-_ ]training", 8, "flash", ", its loss apex's xentropy")))
GENERIC = SourceDefaults("generic", r"", Stack(), None, 1, 4, "none",
                         "no source profile matched: sequence parallelism with tp > 1, distributed optimizer, "
                         "fp32 gradients, no recompute, FlashAttention; a pipeline of unstated schedule interleaved "
                         "(Megatron-LM's interleaved 1F1B, which the NeMo / Megatron-Bridge recipes, Meta's Llama 3 "
                         "training and torchtitan run at scale), with the smallest v dividing the layers per stage (a "
                         "heuristic: the records that state their schedule at scale interleave, with v unstated)",
                         interleaved=True)


def source_defaults(record: dict[str, Any]) -> SourceDefaults:
    text = f"{record.get('group', '')} {record.get('framework', '')}".lower()
    return next((s for s in SOURCES if re.search(s.match, text)), GENERIC)
