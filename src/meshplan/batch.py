"""PlanBatch: many plans that share their categorical settings, with the numeric axes as NumPy arrays.

The cost code (ops, memory, estimate.step_costs) never branches on a numeric plan field, so it evaluates a
PlanBatch exactly as it evaluates a Plan, one element per plan (DESIGN.md: one code path for one plan or a
million). Categorical settings (schedule, ZeRO stage, recompute mode, sequence parallelism, precision,
placement, overlap and offload flags) are shared by the whole batch: the search groups plans by them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from meshplan.plan import Plan

NUMERIC = ("dp", "tp", "pp", "cp", "ep", "etp", "vpp", "micro_batch", "global_batch")
CATEGORICAL = tuple(f.name for f in fields(Plan) if f.name not in NUMERIC and f.name != "tags")


@dataclass(frozen=True, eq=False)
class PlanBatch:
    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    vpp: np.ndarray
    micro_batch: np.ndarray
    global_batch: np.ndarray
    sequence_parallel: bool = False
    zero: int = 0
    recompute: str = "none"
    recompute_layers: int = 0
    offload_optimizer: bool = False
    offload_activations: bool = False
    precision: str = "bf16"
    grad_bytes: int = 2
    schedule: str = "1f1b"
    placement: tuple[str, ...] = ("tp", "cp", "dp", "pp")
    overlap_tp: bool = False
    overlap_dp: bool = True
    flash_attention: bool = True

    @classmethod
    def of(cls, plans: Sequence[Plan]) -> PlanBatch:
        """Stack plans that agree on every categorical setting."""
        first = plans[0]
        for p in plans[1:]:
            for name in CATEGORICAL:
                if getattr(p, name) != getattr(first, name):
                    raise ValueError(f"plans differ in {name}: {getattr(first, name)!r} vs {getattr(p, name)!r}")
        numeric = {n: np.array([getattr(p, n) for p in plans], dtype=np.int64) for n in NUMERIC}
        return cls(**numeric, **{n: getattr(first, n) for n in CATEGORICAL})

    def __len__(self) -> int:
        return len(self.dp)

    @property
    def grad_accum(self) -> np.ndarray:
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def num_micro_batches(self) -> np.ndarray:
        return self.grad_accum

    @property
    def num_gpus(self) -> np.ndarray:
        return self.dp * self.tp * self.pp * self.cp

    def stride(self, axis: str) -> np.ndarray:
        stride = np.ones_like(self.dp)
        for inner in self.placement:
            if inner == axis:
                return stride
            stride = stride * getattr(self, inner)
        raise ValueError(axis)

    def plan(self, i: int) -> Plan:
        """The i-th plan as a Plan."""
        values = {n: int(getattr(self, n)[i]) for n in NUMERIC}
        return Plan(**values, **{n: getattr(self, n) for n in CATEGORICAL})
