"""The step from its per-micro-batch units: time by component (the busier end rank's passes, channels and
optimizer, and the bubble: stages.py) and memory of the rank with the larger footprint (``StepCosts``). Fields are
floats for one plan or NumPy arrays for many: the search assembles many plans with this same code.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.bubble import flow_bubble
from meshplan.memory import Memory, buffer_memory, model_state_memory, offloaded_optimizer
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import DEFAULT as DEFAULT_STACK
from meshplan.specs.stack import Stack
from meshplan.step.memory import activation_memory, offloaded_activations
from meshplan.step.passes import PassTimes
from meshplan.step.stages import rank_step, stage_times
from meshplan.step.units import Parts, Units, unit_costs
from meshplan.xp import Num, maximum, where

MEMORY = ("weights", "grads", "optimizer", "activations", "buffers")


@dataclass(frozen=True, slots=True)
class StepCosts:
    """Everything the search ranks on. Fields are floats for one plan or arrays for many."""

    breakdown: dict[str, Num]
    step_time: Num
    memory: dict[str, Num]  # of the pipeline rank with the larger footprint
    peak_memory: Num
    stage_fwd: Num  # forward time of one micro-batch on the busiest rank
    stage_bwd: Num
    host_memory: Num = 0.0  # bytes offloaded to this GPU's share of host memory
    # per micro-batch (forward, backward) of the first, a middle and the last pipeline rank, each pass with its own
    # exposed communication (``PassTimes.passes``): what the timeline simulates
    ranks: tuple[tuple[Num, Num], ...] = ()
    rank_memory: tuple[Num, Num] = (0.0, 0.0)  # peak memory of the first and of the last pipeline rank
    use_first: Num = True  # the first pipeline rank takes the longer step (else the last): the breakdown's rank


def assemble(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, u: Units, eff: Efficiency = DEFAULT
             ) -> StepCosts:
    """The step from its per-micro-batch units: the busier of the first and the last pipeline rank (``rank_step``:
    its passes, the data-parallel and offload channels beside them, its optimizer step) plus the bubble; and
    memory."""
    first, last, middle = stage_times(model, plan, stack, u)
    ends = (rank_step(model, cluster, plan, stack, u, first, False, eff),
            rank_step(model, cluster, plan, stack, u, last, True, eff))
    use_first = ends[0].total >= ends[1].total
    pick = {f: where(use_first, getattr(ends[0], f), getattr(ends[1], f)) for f in ("dp", "optimizer", "offload")}
    stage = PassTimes(*(where(use_first, getattr(first, f), getattr(last, f)) for f in PassTimes.__slots__))
    m = plan.grad_accum
    breakdown = {"compute": m * (stage.fwd + stage.bwd), "recompute": m * stage.recompute, "tp": m * stage.tp,
                 "cp": m * stage.cp, "ep": m * stage.ep, "pp": m * stage.pp,
                 "bubble": flow_bubble(plan.schedule, plan.pp, plan.vpp, first.total, last.total, middle.total)} | pick
    states_first, states_last = model_state_memory(model, plan, stack)
    acts_first, acts_last = activation_memory(model, plan, stack, u)
    buffers = buffer_memory(model, plan)
    mem_first = Memory(*states_first, acts_first, buffers)
    mem_last = Memory(*states_last, acts_last, buffers)
    use_mem_first = mem_first.total >= mem_last.total
    memory = {k: where(use_mem_first, getattr(mem_first, k), getattr(mem_last, k)) for k in MEMORY}
    return StepCosts(breakdown=breakdown, step_time=sum(breakdown.values(), 0.0), memory=memory,
                     peak_memory=maximum(mem_first.total, mem_last.total),
                     stage_fwd=stage.fwd, stage_bwd=stage.bwd + stage.recompute,
                     host_memory=offloaded_optimizer(model, plan, stack) + offloaded_activations(model, plan, u),
                     ranks=tuple((r.t_f, r.t_b) for r in (first.passes(), middle.passes(), last.passes())),
                     rank_memory=(mem_first.total, mem_last.total), use_first=use_first)


def step_costs(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack = DEFAULT_STACK,
               eff: Efficiency = DEFAULT, parts: Parts | None = None) -> StepCosts:
    """Step time, its breakdown and memory, without validation (the search validates in bulk)."""
    return assemble(model, cluster, plan, stack, unit_costs(model, cluster, plan, stack, eff, parts), eff)
