"""The registry of pipeline runtimes (``Stack.pipeline_runtime``; specs/stack_variants.STACK_CHOICES): one record per
runtime, holding what the cost model does differently under it. Callers read the record
(``stack.pipeline_runtime_mode``), never the runtime's name.

- ``megatron``: Megatron-Core's pipeline schedules (the default).
- ``torch``: torch.distributed.pipelining: every micro-batch's boundary tensors kept to the step's end, each chunk its
  own FSDP2 module, FSDP's gradient sync held to a stage's last micro-batch.
- ``torch-reduce-after``: NeMo AutoModel's (its patched copy of torch 2.8's stage backward): FSDP's gradient sync
  held to a stage's last micro-batch of a run and the gradients reduced after that backward, the compute stream
  waiting for them (``reduces_after``, below). What it keeps per micro-batch is not priced: a run's boundary tensors
  only (each ``step`` clears them), and after pytorch/pytorch#153383 (May 2025) the last stage's outputs only, which
  ``keeps_microbatches``' rule, written for the torch of December 2024 over a whole step, would overstate (it reads
  Kimi K2 on 256 H100 at 78 GiB of the 74.5 the run had).
- ``megatron-2021-01``: Megatron-LM of January 2021, before its scatter/gather of the pipeline's sends.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineRuntime:
    """The pipeline runtime (``Stack.pipeline_runtime``): megatron (Megatron-Core), torch
    (torch.distributed.pipelining) or megatron-2021-01 (Megatron-LM of January 2021, before its scatter/gather)."""

    name: str
    # keeps its boundary tensors per micro-batch to the step's end (memory.pipeline_runtime_memory, step/grid.py) and
    # runs each chunk as its own FSDP2 module (memory.chunk_gradient_share)
    keeps_microbatches: bool = False
    # holds FSDP's gradient sync until a stage's last micro-batch (torch 2.13.0 torch/distributed/pipelining/stage.py
    # backward_maybe_with_nosync, perform_reduce_grad): its units stay gathered over the step, ZeRO-1
    # (specs/check.fsdp_has_zero)
    fsdp_nosync: bool = False
    # reduces a stage's gradients after its last backward of the schedule's run, not beside it: the backward runs with
    # FSDP2's gradient sync off, then the runtime calls every FSDP param group's post_backward by hand (a
    # reduce-scatter each, issued one after another) and _root_post_backward_final_callback, which makes the compute
    # stream wait on the reduce-scatters' events, so nothing of the chunk's backward hides them. NeMo AutoModel's
    # patched copy of the stage's backward (nemo_automodel/components/moe/fsdp_mixin.py
    # patched_backward_maybe_with_nosync @01926a5c: "Manually call post backward for FSDP"), and torch 2.13.0's
    # perform_reduce_grad (torch/distributed/pipelining/stage.py, a REDUCE_GRAD action after a stage's last backward);
    # an earlier torch ran the last backward with the hooks on instead (stage.py backward_maybe_with_nosync:
    # set_requires_gradient_sync(last_backward) around stage_backward, in the 2024 fork tianyu-l/pytorch_intern24
    # @421add67), so the runtime ``torch`` (torchtitan's, at an unverified torch) keeps the overlapped reduction.
    # AutoModel's copy takes its FSDPModule branch (fsdp_mixin.py:254), not the MoEFSDPSyncMixin one (:277-281, which
    # reduces once an optimizer step): moe/parallelizer.py:216-217 @01926a5c also fully_shards the outer
    # *ForCausalLM ("if model != _model: fully_shard_default(model)"), so the stage's submod is an FSDPModule and the
    # elif order picks that branch. Priced by step/channels.step_channels (Collectives.after), added whole to every
    # rank's last backward (the drain's overlap for stages s > 0 ignored: step_channels).
    reduces_after: bool = False
    # each TP rank sends its whole (replicated) activation and gradient to the next stage, with no scatter/gather
    # (cost/pipeline.py): Megatron-LM before 27fc4689 (2021-02-09, "Break up tensors sent between pipeline stages into
    # smaller chunks that can be all-gathered"; Narayanan et al. 2021 §4.1), whose training.py communicate() of
    # 152aab30 (2021-01-11) sends the (seq, micro-batch, hidden) tensor from every TP rank
    sends_whole: bool = False


# the runtimes, the default first (stack_variants.STACK_CHOICES["pipeline_runtime"])
PIPELINE_RUNTIME_RECORDS = (
    PipelineRuntime(name="megatron"),
    PipelineRuntime(name="torch", keeps_microbatches=True, fsdp_nosync=True),
    PipelineRuntime(name="torch-reduce-after", fsdp_nosync=True, reduces_after=True),
    PipelineRuntime(name="megatron-2021-01", sends_whole=True),
)
