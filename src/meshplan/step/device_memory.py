"""What a GPU's whole memory use (nvidia-smi's "Memory-Usage" of the training process: ``Estimate.device_memory``)
holds beyond the caching allocator's reserved bytes (``Estimate.reserved_memory``), which is all the process's
tensors: memory the CUDA driver and NCCL take outside PyTorch's allocator, which neither
torch.cuda.max_memory_allocated nor max_memory_reserved counts.

Both are properties of the GPU (and its driver and links), so they are fields of its hardware preset
(``Accelerator.cuda_context``, ``nccl_pair``, ``nccl_group``) beside their sources; a GPU with no measurement of its
own takes A100's (the fields' defaults), the only ones measured here:

- **The CUDA context with the process's kernels loaded** (``cuda_context``): the driver's per-process state and the
  device code of every module loaded (PyTorch's own kernels, cuBLAS, cuDNN, NCCL). BigScience measured it for the
  runs it reports with nvidia-smi: "40GB A100 takes 1573MiB for cuda kernels", from
  ``python -c "import torch; torch.ones(1).cuda()"`` and nvidia-smi, and 1271 MiB on its 32 GB V100s
  (bigscience-workshop/bigscience train/tr11-176B-ml/chronicles-prequel.md @053adafe, sections "Possible topologies
  for 200B" and "104B topology / memory usage": the A100 and V100 presets). Those CUDA 11 builds load every
  module's kernels at start-up; CUDA 11.7's lazy loading (CUDA_MODULE_LOADING=LAZY) loads a kernel at its first
  launch and takes less, which no measured source here reads.
- **NCCL's buffers, per communicator** (``nccl_bytes``): each communicator holds, on every channel and for every
  peer it connects to, a receive buffer per protocol: Simple's NCCL_BUFFSIZE (4 MiB by default,
  https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-buffsize), LL128's
  120 · 640 · 8 · 8 B (4.7 MiB) and LL's 8 · 512 · 8 · 16 B (0.5 MiB) (NVIDIA/nccl src/include/device.h @80f6bda:
  NCCL_LL128_ELEMS_PER_THREAD, NCCL_LL128_MAX_NTHREADS, NCCL_LL_LINES_PER_THREAD, NCCL_LL_MAX_NTHREADS,
  NCCL_STEPS). "More communicators = more memory used", linear in the channels; a ring connects two peers
  "regardless of the scale", and beyond two nodes the use no longer grows (NCCL's maintainer, NVIDIA/nccl#864,
  #986). Measured on A100s over NVLink after one all-reduce through PyTorch: 544 MB a communicator of two GPUs,
  688 MB one of more, as the issue writes them (NVIDIA/nccl#964: ``nccl_pair``, ``nccl_group`` of the A100
  presets). No such reading of another GPU was found: NCCL's channels, and with them its buffers, follow the GPU's
  links (NVIDIA/nccl#986: more to reach H100's NVLink bandwidth than a PCIe link's), so A100's figures stand in for
  them. PyTorch's ProcessGroupNCCL creates a group's communicator at its first collective, so a rank holds one for
  each group its step runs a collective on (``communicators``).

A pure reading: nothing here moves a step time, a search or the allocated or reserved peak.
"""

from __future__ import annotations

from meshplan.pipeline.registry import schedule_of
from meshplan.specs.hardware import Accelerator
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan


def communicators(plan: Plan, model: ModelSpec | None = None) -> tuple[int, ...]:
    """The sizes of the NCCL communicators a rank of the first pipeline stage runs collectives on in a step: its
    tensor-, context- and expert-parallel groups, its data-parallel group (the gradients' reduction and ZeRO's
    gathers), its pipeline neighbour (the point-to-point pair with the next stage: PyTorch's send / recv make a
    two-rank communicator per pair; DeepSpeed's pipeline engine broadcasts in the pair's own two-rank group,
    deepspeed/runtime/pipe/p2p.py send / recv and _get_send_recv_group), and the model-parallel group (tensor x
    pipeline ranks) over which the gradient norm is all-reduced (Megatron's clip_grad_norm_fp32, DeepSpeed's
    runtime/utils.py clip_grad_norm_ with its mpu), a communicator of its own even where its ranks are the
    tensor-parallel group's, and, where the first and the last stage both hold the word embedding (a tied head or
    multi-token prediction's copy, trained: not under LoRA) on ranks apart, the pair that all-reduces its gradient
    (DeepSpeed's PipelineModule makes a group of the tied module's ranks, runtime/pipe/module.py _index_tied_modules,
    reduced by engine.py _exec_reduce_tied_grads; Megatron-LM its embedding group: step/channels.embedding_sync). A
    group of one rank makes none."""
    tied = model is not None and (model.tied_embeddings or model.mtp_layers > 0) and plan.finetune != "lora"
    ends = 2 if tied and plan.pp > 1 and schedule_of(plan.schedule).ends_apart else 1
    pair = 2 if plan.pp > 1 else 1
    groups = (plan.tp * plan.tp2, plan.cp, plan.ep, plan.dp, pair, plan.tp * plan.tp2 * plan.pp, ends)
    return tuple(n for n in groups if n > 1)


def nccl_bytes(groups: tuple[int, ...], acc: Accelerator) -> float:
    """NCCL's device bytes on ``acc`` for communicators of ``groups`` ranks (its ``nccl_pair`` for two, its
    ``nccl_group`` for more)."""
    return float(sum(acc.nccl_pair if n == 2 else acc.nccl_group for n in groups))


def beyond_reserved(plan: Plan, acc: Accelerator, model: ModelSpec | None = None) -> float:
    """Bytes a GPU ``acc``'s whole memory use holds beyond the caching allocator's reserved peak: the CUDA context
    with its kernels and NCCL's buffers for the rank's communicators (module docstring)."""
    return acc.cuda_context + nccl_bytes(communicators(plan, model), acc)
