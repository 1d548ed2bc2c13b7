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
"""

from __future__ import annotations

from typing import Any

from meshplan_validation.patterns import INTERNEVO, ZERO1_SIZE


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
