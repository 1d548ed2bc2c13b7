"""The settings grid a step is composed under (recompute × ZeRO × optimizer offload × activation offload: search.Space's
axes, or one plan's own) and the pipeline ranks it is priced on: the first, the last and, where it may bind, a middle
rank (``middle_may_bind``), with their parameters (``rank_params``). step/assemble.py composes the time over them,
step/memory_grid.py the memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Protocol

import numpy as np

from meshplan.cost.params import StageParams, middle_params, stage_params
from meshplan.kept import Kept
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan, revised
from meshplan.specs.stack import Stack
from meshplan.xp import distinct


class Settings(Protocol):
    """The settings grid a step is composed under: search.Space's axes, or one plan's own (``own_settings``)."""

    @property
    def recompute(self) -> tuple[str, ...]: ...
    @property
    def zero(self) -> tuple[int, ...]: ...
    @property
    def offload_optimizer(self) -> tuple[bool, ...]: ...
    @property
    def offload_activations(self) -> tuple[bool, ...]: ...


@dataclass(frozen=True, slots=True)
class OwnSettings:
    """A grid of one setting: a plan's own."""

    recompute: tuple[str, ...]
    zero: tuple[int, ...]
    offload_optimizer: tuple[bool, ...]
    offload_activations: tuple[bool, ...]


def some_settings(grid: Settings, recomputes: Any, activation_offloads: Any) -> OwnSettings:
    """``grid`` with only the recompute modes and activation-offload settings at these indices (every ZeRO stage and
    optimizer offload): the settings a search composes where the others are refused or cannot fit."""
    return OwnSettings(tuple(grid.recompute[i] for i in recomputes), grid.zero, grid.offload_optimizer,
                       tuple(grid.offload_activations[i] for i in activation_offloads))


def own_settings(plan: Plan) -> OwnSettings:
    """The grid of ``plan``'s own recompute mode, ZeRO stage and offloads: what ``assemble`` composes it under."""
    return OwnSettings((plan.recompute,), (plan.zero,), (plan.offload_optimizer,), (plan.offload_activations,))


def with_settings(plan: Plan, **settings: Any) -> Plan:
    """``plan`` with these categorical settings (itself if it has them already)."""
    return plan if all(getattr(plan, k) == v for k, v in settings.items()) else revised(plan, settings)


def middle_may_bind(model: ModelSpec, stack: Stack, plan: Plan) -> bool:
    """Whether a middle pipeline rank may be the busiest or the heaviest of a plan whose ranks are alike beyond the
    ends (step/ranks.py prices the others): where its layers may carry more parameters than the first's (the first
    rank's dense layers, ``first_k_dense_layers``, in a MoE model) or torch.distributed.pipelining keeps 4·m·v
    boundaries on it against the first's 2·m·(2v − 1) (memory.pipeline_runtime_memory). Else a middle rank holds the
    first's layers without the embedding, as many parameters less the embedding's and fewer micro-batches in flight
    (memory.in_flight_chunks): never busier nor heavier, so the step prices the two ends only; as where no plan (of
    a batch) has a middle rank (p ≤ 2)."""
    heavier = model.first_k_dense_layers > 0 or stack.pipeline_runtime_mode.keeps_microbatches
    return heavier and bool(np.any(plan.pp > 2))


def rank_params(model: ModelSpec, plan: Plan) -> tuple[StageParams, ...]:
    """The parameters of the first, the last and a middle pipeline rank (cost/params.py). One plan's kept by the
    fields they read (``PARAMS_READ``) and the model's identity (held with them): an estimate reads them twice (its
    step, step/assemble.compose, and its memory, step/memory_grid.compose_memory), and the plans a search lists
    share them across dp, placements and settings (a strong-scaling sweep of llama3-70b over 8 GPU counts: 108
    plans estimated, 14 distinct). A batch's computed on its distinct rows of those fields (``_batch_params``)."""
    if type(plan) is not Plan:
        return _batch_params(model, plan)
    return _kept(model, plan, -1, _params, model, plan)


DISTINCT_FROM = 4096  # plans in a batch from which its parameters are computed on its distinct rows


def _batch_params(model: ModelSpec, plan: Plan) -> tuple[StageParams, ...]:
    """``_params`` of a batch (a search's: it has ``select``), computed once per distinct row of the columns of
    ``PARAMS_READ`` (the others are one value for the whole batch) and spread back: the same numbers, each row's
    computed by the same element-wise arithmetic from the same values whichever rows are computed beside it
    (cost/params.py branches on the model and the batch's shared fields only). DeepSeek-V3's search on 2,048 H100s
    asks for 10 batches of 385-16,384 plans holding 17-700 distinct rows (the step's chunks hold every placement and
    micro-batch of a combination), 28 ms in all, 2026-11-30 (issue 83). Below ``DISTINCT_FROM`` plans the Python of
    the computation, not its arrays, sets its time: computed whole (the unique and the spreading would add ~0.7 ms)."""
    select = getattr(plan, "select", None)
    columns = [c for c in (getattr(plan, f) for f in PARAMS_READ) if isinstance(c, np.ndarray) and c.ndim]
    big = select is not None and columns and len(columns[0]) >= DISTINCT_FROM
    rows = _distinct_rows(columns) if big else None
    if rows is None or select is None:
        return _params(model, plan)
    first, inverse = rows

    def spread(value: Any) -> Any:  # a StageParams field: one number per distinct row, or one for all
        return value[inverse] if isinstance(value, np.ndarray) and value.ndim else value

    return tuple(StageParams(*(spread(getattr(p, f.name)) for f in fields(StageParams)))
                 for p in _params(model, select(first)))


def _distinct_rows(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """The first row of each distinct row of integer ``columns`` (one value a row each, non-negative) and each row's
    index among them (xp.distinct); None where a column is not of that kind or fewer than half the rows repeat one
    before (nothing to gain)."""
    n = len(columns[0])
    if not n or any(c.shape != (n,) or c.dtype.kind not in "iu" or int(c.min()) < 0 for c in columns):
        return None
    first, inverse = distinct(np.stack([c.astype(np.int64, copy=False) for c in columns]))
    return (first, inverse) if 2 * len(first) <= n else None


def params_of_rank(model: ModelSpec, plan: Plan, rank: int) -> StageParams:
    """The parameters of rank ``rank`` of one plan (step/ranks.py): an end's of ``rank_params``, a middle rank's
    (``middle_params`` of its own layers) kept likewise by its rank."""
    if rank in (0, plan.pp - 1):
        return rank_params(model, plan)[0 if rank == 0 else 1]
    return _kept(model, plan, rank, middle_params, model, plan, rank)


def _kept(model: ModelSpec, plan: Plan, rank: int, compute: Callable[..., Any], *args: Any) -> Any:
    """``compute(*args)``'s answer kept by the model's identity (held), ``rank`` and the plan's ``PARAMS_READ``."""
    return _KEPT.answer((id(model), rank, *[getattr(plan, f) for f in PARAMS_READ]), model, compute, *args)


def _params(model: ModelSpec, plan: Plan) -> tuple[StageParams, ...]:
    return stage_params(model, plan, True), stage_params(model, plan, False), middle_params(model, plan)


# every field of a plan that cost/params.stage_params and middle_params read (its layers per rank: pp, vpp and the
# stage counts; the weights' split: tp, tp2, ep, etp and the layout; the schedule's placement of the ends; LoRA's
# adapters): plans equal in these have the same parameters (tests/test_kept_answers.py varies every other field)
PARAMS_READ = ("pp", "vpp", "stage_layers", "first_stage_layers", "last_stage_layers", "tp", "tp2", "ep", "etp",
               "tensor_layout", "schedule", "finetune", "lora_rank", "lora_targets")
_KEPT: Kept[Any] = Kept(256)
