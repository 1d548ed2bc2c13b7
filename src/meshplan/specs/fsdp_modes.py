"""Data parallelism by PyTorch FSDP (``Stack.fsdp``): one record per mode, each holding what the cost model, the
search, RL and the configs do differently under it; callers read the record (``stack.fsdp_mode``) and never compare
the mode's name (tests/test_pipeline_registry.py checks the core for such comparisons).

- ``none``: no FSDP (Megatron's distributed optimizer, DeepSpeed's ZeRO, or plain data parallelism).
- ``fsdp1``: FullyShardedDataParallel with a FlatParameter per wrapped unit (torch/distributed/fsdp/_flat_param.py).
- ``fsdp2``: per-parameter FSDP, ``fully_shard`` (torch/distributed/fsdp/_fully_shard/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, kw_only=True, slots=True)
class FsdpMode:
    """A mode of FSDP (module docstring)."""

    name: str
    # FSDP shards the model: its per-micro-batch gradient preparation (cost/fsdp.py), its own ZeRO default (FULL_SHARD:
    # cli/estimate.py), no separate gradient accumulation (cost/eager.py), its loops not the wrapper's (cost/tensors.py)
    shards: bool
    flat: bool  # one FlatParameter per wrapped unit: one tensor a layer for the optimizer's loops (cost/tensors.py)
    # the ZeRO stages it lacks: FSDP's NO_SHARD is 0, SHARD_GRAD_OP 2, FULL_SHARD 3, and none shards only the
    # optimizer state (1) (torch/distributed/fsdp/api.py ShardingStrategy); without FSDP none
    lacks_zero: tuple[int, ...] = ()
    # the sharded parameter is the model's own tensor in its own dtype: over an fp32 model it is the fp32 master the
    # optimizer updates, and the 16-bit weights exist only gathered, cast by the MixedPrecisionPolicy's param_dtype
    # for the all-gather and freed with the unsharded unit at its reshard (torch/distributed/fsdp/_fully_shard/
    # _fsdp_param.py: _sharded_param_data keeps the original dtype, the all-gather input is cast to param_dtype;
    # torchtitan builds its model in fp32 and shards it with param_dtype bf16, reduce_dtype fp32:
    # pytorch/torchtitan train.py:110-171 and torchtitan/parallelisms/parallelize_llama.py:90-91, 320 @9dec370).
    # Under ZeRO-3 no 16-bit copy persists (memory.model_states): 4 + 12 + 4 = 16 bytes a parameter, not 18.
    sharded_master: bool = False

    def has_zero(self, zero: Any, piped: Any = False) -> Any:
        """Whether it runs ZeRO stage ``zero`` (a number, or an array of them, as the search's grids): a stage it does
        not lack, or ZeRO-1 where ``piped`` (its units on a pipeline stage of a runtime that holds FSDP's gradient
        sync to the last micro-batch: specs/check.fsdp_has_zero). The one statement of the rule: check's reason and
        the search's rule on arrays (specs/refusals.py fsdp_stages) read it."""
        lacked = np.zeros(np.shape(zero), dtype=bool)
        for stage in self.lacks_zero:
            lacked = lacked | (np.asarray(zero) == stage)
        return np.logical_not(lacked) | (np.asarray(piped) & (np.asarray(zero) == 1))


FSDP_MODES: dict[str, FsdpMode] = {m.name: m for m in (
    FsdpMode(name="none", shards=False, flat=False),
    FsdpMode(name="fsdp1", shards=True, flat=True, lacks_zero=(1,)),
    FsdpMode(name="fsdp2", shards=True, flat=False, lacks_zero=(1,), sharded_master=True),
)}
FSDP_NAMES = tuple(FSDP_MODES)


def fsdp_of(name: str) -> FsdpMode:
    """The record of FSDP mode ``name``; a KeyError naming the known ones otherwise."""
    if name not in FSDP_MODES:
        raise KeyError(f"fsdp {name!r} is none of {', '.join(FSDP_NAMES)}")
    return FSDP_MODES[name]
