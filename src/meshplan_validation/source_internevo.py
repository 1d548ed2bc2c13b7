"""What InternEvo's ZeRO-1 does with the gradients and the updated weights (its documentation's performance tables,
provenance.py "internevo"): the code of InternLM/InternEvo c628a8c87411 (2024-03-28), the optimizer the records'
reading cites. Each record states its ZeRO group, ``zero1`` (-1: "the size of the zero process group is equal to the
size of the dp process group", configs/7B_sft.py; 8 or 4: optimizer states "distributed within 8 GPUs in a single
node", doc/en/train_performance.md).

- The ZeRO group (internlm/core/context/process_group_initializer.py ``Initializer_Zero1``: zero1 groups of the
  inner data-parallel ranks, at stride tp): the plan's dp / zero1 distributed-optimizer instances
  (Plan.distributed_optimizer_instances, cost/zero_group.py); zero1=-1 one.
- The gradients (hybrid_zero_optim.py ``_reduce_and_copy``): reduce_tensor with dst_rank None, an all-reduce of each
  bucket over ParallelMode.DATA, the whole data-parallel group whatever zero1, in the gradients' own dtype
  (utils.py ``reduce_tensor``: dtype None, the tensor's), the bf16 of the model's parameters (configs/7B_sft.py
  model dtype torch.bfloat16): Stack.grad_sync "all_reduce" of 2-byte gradients (step/param_sync.py).
- The weights (HybridZeroOptimizer.broadcast_params, lines 809-837): one ``dist.broadcast`` per rank of the ZeRO
  group, async on that group, after the step, waited for unless overlap_sync_param, which the 7B configuration leaves
  off (configs/7B_sft.py: hybrid_zero_optimizer overlap_sync_param=False): the "shard_broadcasts" weight sync
  (step/param_sync.py) within the group, exposed before the next forward (overlap_param_gather false).

The layers and the loop (sources.py's InternEvo profile, ``INTERNEVO_STACK``), at the same commit:

- Element-wise work: eager PyTorch module code with apex's fused RMSNorm run on an fp32 upcast of the residual and
  flash-attn's rotary kernel (internlm/model/modeling_internlm.py PackedFlashBaseLayer1D, modules/mlp.py
  FeedForward's ``Silu(w1_o, w3_o)``, modules/embedding.py ApplyRotaryEmbQKV_): ``Stack.fusion`` "eager-apex"
  (specs/fusion.py).
- The loss: flash-attn's CrossEntropyLoss (model/losses/ce_loss.py FlashGPTLMLoss, use_flash_attn and
  parallel_output): ``cross_entropy`` "flash". The attention: flash_attn.modules.mha FlashSelfAttention on the packed
  qkv with cu_seqlens (model/modules/multi_head_attention.py), FlashAttention-2: ``attention_kernel`` "fa2".
- The training metric: train.py builds AccPerplex and get_scheduler_hooks (train/pipeline.py) hands it to
  SchedulerMetricHook, which updates it on every micro-batch's logits (model/metrics.py AccPerplex.update): flash-attn's
  cross-entropy forward with reduction "none" (LossWithTypeId: 4 bytes a logit), two max and one argmax over the
  vocabulary (6), the max subtracted (4), exp_ in place (4) and the sum (2): 20 + 4 bytes a 16-bit logit against the
  22 of one priced metric cross-entropy (cost/embed_head.train_metrics): ``train_metrics`` 1.
"""

from __future__ import annotations

from typing import Any

from meshplan.specs.stack import Stack
from meshplan_validation.patterns import INTERNEVO, ZERO1_SIZE

INTERNEVO_STACK = Stack(name="internevo", family="internevo", fusion="eager-apex", cross_entropy="flash",
                        attention_kernel="fa2", train_metrics=1,
                        source="InternLM/InternEvo @c628a8c87411 (source_internevo.py)")
INTERNEVO_WHY = ("InternEvo @c628a8c87411 (source_internevo.py): eager module code with apex's RMSNorm on fp32 "
                 "upcasts and flash-attn's rotary kernel, flash-attn's cross-entropy and FlashAttention-2 on packed "
                 "sequences, AccPerplex over every micro-batch's logits, ZeRO-1 with bf16 gradients, no sequence "
                 "parallelism (tensor mode mtp), no recompute unless stated")


def zero1_size(record: dict[str, Any], zero: int) -> int | None:
    """The ZeRO group's size an InternEvo record of ZeRO-1 states (-1: the whole data-parallel group); None for any
    other record."""
    text = " ".join(str(record.get(k) or "") for k in ("id", "group", "source", "framework"))
    found = ZERO1_SIZE.search(str((record.get("parallel") or {}).get("zero_or_fsdp") or ""))
    if zero not in (1, 2) or not INTERNEVO.search(text) or not found:
        return None
    return int(found.group(1))


def internevo_sync(record: dict[str, Any], zero: int, notes: list[str]) -> dict[str, Any]:
    """The Stack settings of InternEvo's gradient all-reduce and weight broadcasts for a record of its ZeRO-1
    (module docstring); {} for any other record."""
    if zero1_size(record, zero) is None:
        return {}
    notes.append("gradients all-reduced over the data-parallel group, updated weights sent as one broadcast per "
                 "ZeRO rank after the step, exposed (InternEvo HybridZeroOptimizer _reduce_and_copy, broadcast_params "
                 "@c628a8c; overlap_sync_param=False)")
    return {"grad_sync": "all_reduce", "param_sync": "shard_broadcasts", "overlap_param_gather": False}


def internevo_plan(record: dict[str, Any], dp: int, zero: int, notes: list[str]) -> dict[str, Any]:
    """The Plan settings of a record of InternEvo's ZeRO-1: its ZeRO group's instances, dp / zero1 where the group
    is smaller than dp, and its bf16 gradients (module docstring); {} for any other record."""
    size = zero1_size(record, zero)
    if size is None:
        return {}
    instances = dp // size if 0 < size < dp and dp % size == 0 else 1
    notes.append(f"ZeRO group zero1={size}: {instances} distributed-optimizer instance(s) of {dp // instances} ranks; "
                 "bf16 gradients all-reduced (InternEvo reduce_tensor in the parameters' dtype)")
    return {"distributed_optimizer_instances": instances, "grad_bytes": 2}
