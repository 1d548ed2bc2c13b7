"""estimate(model, cluster, plan, stack) -> Estimate: the one place that composes costs into a training step.

Per micro-batch, on each pipeline rank (the first holds the embedding, the last the LM head):
    t_rank = Σ_layers (fwd + bwd kernels) + recompute + exposed TP / CP / EP communication + pipeline p2p
Per step, the busiest of the first, the last and a middle rank (channels.py: its m passes each way with the
data-parallel collectives and offload copies that share them, and its optimizer step; every rank where they differ
further, step/ranks.py), and the bubble (a flow shop,
``bubble.flow_bubble``: the other ranks' times once, over v; with equal ranks (p-1)/m for 1F1B and (p-1)/(v·m) for the
interleaved schedule, Narayanan et al. 2021 §2.2):
    t_step = max over the ranks of (m · t_rank + channels + optimizer) + (Σ of the other ranks' t_rank) / v
The pieces, in data-flow order: step/passes.py (ops timed and summed per pass under the overlap rules, stated
there), step/units.py (the per micro-batch units a step repeats), step/stages.py (the ranks and their sends),
bubble.py (the bubble), channels.py (what runs beside the passes), step/memory.py and memory.py (bytes per rank),
step/assemble.py and step/memory_grid.py (the step and its memory, composed once: ``compose`` and ``compose_memory``,
over step/grid.py's settings and ranks, for one plan under its own settings or a batch under the search's grid). The
arithmetic accepts NumPy arrays in the numeric plan fields, so the search evaluates many plans with this same code
(search/scoring.py); ``estimate`` adds the per-op table and the feasibility verdict for one plan.

MFU counts model FLOPs (cost/flops.py): 6·N per token for the matmul parameters N (embedding lookup excluded, LM
head included) plus 6·s·A·(d_qk + d_v) per layer for attention, without causal savings (PaLM, Chowdhery et al.
2022, App. B), against the dense peak of the plan's precision (an fp8 plan against the fp8 peak, so that MFU is at
most 1; ``mfu_bf16`` against the 16-bit peak, the basis NVIDIA's FP8 tables quote). HFU adds the FLOPs of recomputed
forward passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, NamedTuple

from meshplan.collectives.groups import axis_tiers
from meshplan.cost.flops import plan_flops_per_token, recompute_flops_per_token
from meshplan.cost.params import kind_fractions, layers_on_first, layers_on_last, stage_params, trainable
from meshplan.cost.tensors import tensors_on_rank
from meshplan.cost.wrapper_work import work_of
from meshplan.cost.wrappers import partitioned_zero
from meshplan.memory import WEIGHT_BYTES
from meshplan.pipeline.registry import schedule_of
from meshplan.roofline import compute_time, memory_time, overhead, stream_bandwidth, work_time
from meshplan.specs.bands import Band, memory_band, ranking_band, training_band
from meshplan.specs.check import validate
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import FRAMEWORK_STACK, Stack
from meshplan.step.assemble import StepCosts, assemble
from meshplan.step.channels import (
    accumulation_time,
    dp_collectives,
    embedding_sync,
    optimizer_time,
    tied_gradient_bytes,
    zero_counts,
)
from meshplan.step.host import iteration_host, loop_host, optimizer_loops, paid_per_step
from meshplan.step.ranks import assemble_ranks, priced_apart, stage_modes, stage_recompute_flops
from meshplan.step.stages import cadence, run_cadence
from meshplan.step.units import Parts, Units, timed_parts, unit_costs, units_for_recomputes
from meshplan.units import fmt_bytes, fmt_over

COMPONENTS = ("compute", "recompute", "tp", "cp", "ep", "pp", "host", "bubble", "dp", "optimizer", "offload")


@dataclass(frozen=True, slots=True)
class OpRow:
    """One op of the per-op table: per occurrence on the busiest rank, and how often it runs per step."""

    name: str
    phase: str
    kind: str
    count: float
    flops: float
    nbytes: float
    seconds: float
    # compute | memory | network | host (launch-bound: per-expert GEMMs, mlp_moe.host_launched) | overhead (the
    # kernels' fixed time, roofline.overhead, beats their work)
    bound: str

    @property
    def total_seconds(self) -> float:
        return self.count * self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "phase": self.phase, "kind": self.kind, "count": self.count, "flops": self.flops,
                "bytes": self.nbytes, "seconds": self.seconds, "bound": self.bound}


class Detail(NamedTuple):
    """What an Estimate was composed from, kept for its per-op table and for the reports."""

    efficiency: Efficiency
    parts: Parts  # the ops, timed (step/units.py)
    units: Units  # the per micro-batch units a step repeats
    costs: StepCosts  # the step (step/assemble.py)


@dataclass(frozen=True)
class Estimate:
    """One plan's predicted training step: its time by component, memory per GPU, FLOPs and feasibility."""

    model: ModelSpec
    cluster: Cluster
    plan: Plan
    stack: Stack
    step_time: float
    breakdown: dict[str, float]
    memory: dict[str, float]
    peak_memory: float
    model_flops: float  # per step, all GPUs
    hardware_flops: float
    reasons: tuple[str, ...] = ()
    host_memory: float = 0.0  # bytes offloaded to host memory per GPU
    rank_memory: tuple[float, float] = (0.0, 0.0)  # peak memory of the first and of the last pipeline rank
    # what PyTorch's caching allocator reserves at most: ``peak_memory`` and the smaller phase's cached blocks
    # (step/memory.Phases.stranded), the peak torch.cuda.max_memory_reserved reads
    reserved_memory: float = 0.0
    # every pipeline rank's step beside the bubble and its peak memory, where they are priced apart (step/ranks.py)
    stage_steps: tuple[float, ...] = ()
    stage_memory: tuple[float, ...] = ()
    detail: Detail | None = field(default=None, repr=False, compare=False)

    @cached_property
    def ops(self) -> tuple[OpRow, ...]:
        """The per-op table (computed on first use: the search re-estimates plans that never print it)."""
        if self.detail is None:
            raise ValueError("this Estimate has no detail (estimate() attaches it) to tabulate ops from")
        eff, parts, units, costs = self.detail
        return _op_table(self.model, self.cluster, self.plan, self.stack, eff, parts, bool(costs.use_first))

    @property
    def device_memory(self) -> float:
        """The GPU's whole memory use at the step's peak, as nvidia-smi reads it for the process: ``reserved_memory``
        and what the CUDA context and NCCL hold beside the caching allocator (step/device_memory.py; imported here, not
        at start-up, as only a comparison with such a reading needs it)."""
        from meshplan.step.device_memory import beyond_reserved  # noqa: PLC0415

        return self.reserved_memory + beyond_reserved(self.plan, self.cluster.accelerator, self.model)

    @property
    def band(self) -> Band:
        """This step time's band: how far the measured runs of its regime were from their out-of-source predictions
        (specs/bands.py), with the line that says so where no measured run is like it."""
        return training_band(self.model, self.cluster, self.plan, self.stack)

    @property
    def error_band(self) -> float:
        """The relative half-width of this step time's band (``band``)."""
        return self.band.half_width

    @property
    def memory_band(self) -> Band:
        """The peak memory's band (specs/bands.py)."""
        return memory_band(self.model, self.cluster, self.plan, self.stack)

    @property
    def ranking_band(self) -> float:
        """The band within which the search ranks plans of this model as equivalent (specs/bands.py)."""
        return ranking_band(self.model, self.cluster, self.stack)

    @property
    def fits(self) -> bool:
        return not self.reasons

    @property
    def tokens_per_step(self) -> int:
        return self.plan.global_batch * self.model.seq_length

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time

    @property
    def tflops_per_gpu(self) -> float:
        """Model TFLOP/s per GPU (the NeMo / Megatron-Bridge "model TFLOP/s")."""
        return self.model_flops / self.step_time / self.cluster.num_gpus / 1e12

    @property
    def mfu_basis(self) -> str:
        """The precision whose dense peak MFU and HFU are taken against: the one the plan's GEMMs run in."""
        return self.plan.precision

    @property
    def peak_flops_per_gpu(self) -> float:
        """Dense peak FLOP/s per GPU of ``mfu_basis`` (fp16 and bf16 stand in for each other)."""
        return self.cluster.accelerator.flops(self.plan.precision)

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation against the dense peak of the precision that runs (an fp8 plan: the fp8 peak), so
        it is at most 1; ``mfu_bf16`` is the same against the 16-bit peak, as sources that quote it do."""
        return self._utilisation(self.model_flops, self.peak_flops_per_gpu)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation (model FLOPs + recomputed forward FLOPs) against the same peak as ``mfu``."""
        return self._utilisation(self.hardware_flops, self.peak_flops_per_gpu)

    @property
    def mfu_bf16(self) -> float | None:
        """MFU against the 16-bit peak, the basis NVIDIA's FP8 tables quote; None for a plan whose precision runs
        more than twice the 16-bit peak (fp4: 6x on B300), where a 16-bit basis is no utilisation (it passed 1,
        issue 48)."""
        return self._utilisation(self.model_flops, self.cluster.accelerator.half_flops) if self._half_basis else None

    @property
    def hfu_bf16(self) -> float | None:
        return self._utilisation(self.hardware_flops, self.cluster.accelerator.half_flops) if self._half_basis else None

    @property
    def _half_basis(self) -> bool:
        return self.peak_flops_per_gpu <= 2 * self.cluster.accelerator.half_flops

    def _utilisation(self, flops: float, peak_per_gpu: float) -> float:
        """``flops`` per step over the step time, as a share of the cluster's peak at ``peak_per_gpu``."""
        return flops / self.step_time / (peak_per_gpu * self.cluster.num_gpus)

    def to_dict(self, ops: bool = True) -> dict[str, Any]:
        """Everything as plain data; ``ops=False`` leaves out the per-op table."""
        out = _summary(self)
        if ops:
            out["ops"] = [o.as_dict() for o in self.ops]
        return out


def _summary(e: Estimate) -> dict[str, Any]:
    """``Estimate.to_dict`` without the per-op table."""
    return {
        "model": e.model.name, "system": e.cluster.name, "gpus": e.cluster.num_gpus,
        "params": e.model.params(), "active_params": e.model.params(active=True),
        "plan": _plan_dict(e.plan), "tiers": axis_tiers(e.plan, e.cluster), "stack": e.stack.as_dict(),
        "step_time_s": e.step_time, "tokens_per_s": e.tokens_per_s,
        "tokens_per_s_per_gpu": e.tokens_per_s / e.cluster.num_gpus,
        "tflops_per_gpu": e.tflops_per_gpu, "mfu": e.mfu, "hfu": e.hfu, "mfu_basis": e.mfu_basis,
        "peak_flops_per_gpu": e.peak_flops_per_gpu, "mfu_bf16": e.mfu_bf16, "hfu_bf16": e.hfu_bf16,
        "breakdown_s": dict(e.breakdown), "memory_bytes": dict(e.memory),
        "peak_memory_bytes": e.peak_memory, "hbm_bytes": e.cluster.accelerator.hbm_bytes,
        "rank_memory_bytes": {"first": e.rank_memory[0], "last": e.rank_memory[1]},
        "reserved_memory_bytes": e.reserved_memory,
        "host_memory_bytes": e.host_memory,
        **({"stage_steps_s": list(e.stage_steps), "stage_memory_bytes": list(e.stage_memory)} if e.stage_steps else {}),
        "fits": e.fits, "reasons": list(e.reasons), "error_band": e.error_band,
        "band": e.band.to_dict(), "memory_band": e.memory_band.to_dict(),
    }


def _plan_dict(p: Plan) -> dict[str, Any]:
    """The plan's fields as plain data, with its placement as a list and the micro-batches it accumulates."""
    return ({f.name: getattr(p, f.name) for f in fields(p) if f.name not in ("placement", "tags")}
            | {"placement": list(p.placement), "grad_accum": p.grad_accum})


def estimate(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack = FRAMEWORK_STACK,
             eff: Efficiency = DEFAULT) -> Estimate:
    """Predict one training step of ``model`` on ``cluster`` under ``plan``, as the software ``stack`` runs it
    (default: stack.DEFAULT_FRAMEWORK's, Megatron-Core, as on the command line; ``Stack()``: the neutral generic one).

    Raises PlanError if the plan is invalid (divisibility, sizes); a plan that does not fit in memory is a
    valid result with ``fits == False`` and its reason.
    """
    if not isinstance(stack, Stack):  # an Efficiency passed where the stack goes: estimate(..., eff=...)
        raise TypeError(f"stack must be a Stack, not {type(stack).__name__} (pass the efficiency as eff=)")
    validate(model, cluster, plan, stack)
    own = work_of(plan, stack)  # its wrapper's per-micro-batch work, alone: its ranks share its ZeRO setting
    parts = timed_parts(model, cluster, plan, stack, eff, works=(own,) if own else ())
    if priced_apart(model, plan):  # ranks unlike beyond the ends: each priced apart (step/ranks.py)
        by_mode = units_for_recomputes(model, plan, stack, parts, (*stage_modes(plan), plan.recompute), eff)
        units, costs = by_mode[plan.recompute], assemble_ranks(model, cluster, plan, stack, by_mode, eff)
    else:
        units = unit_costs(model, cluster, plan, stack, eff, parts)
        costs = assemble(model, cluster, plan, stack, units, eff)
    tokens = plan.global_batch * model.seq_length
    model_flops = plan_flops_per_token(model, plan) * tokens
    redone = stage_recompute_flops(model, plan, stack) if plan.stage_recompute else recompute_flops_per_token(
        model, plan, stack, parts.ops)
    hardware_flops = model_flops + redone * tokens
    capacity = cluster.accelerator.hbm_bytes
    reasons: tuple[str, ...] = ()
    if costs.peak_memory > capacity:
        reasons += (f"memory {fmt_over(float(costs.peak_memory), capacity)} HBM",)
    if costs.host_memory > cluster.host_memory:
        reasons += (f"offloaded {fmt_bytes(float(costs.host_memory))} > {fmt_bytes(cluster.host_memory)} host memory "
                    "per GPU",)
    return Estimate(model=model, cluster=cluster, plan=plan, stack=stack, step_time=float(costs.step_time),
                    breakdown={k: float(v) for k, v in costs.breakdown.items()},
                    memory={k: float(v) for k, v in costs.memory.items()}, peak_memory=float(costs.peak_memory),
                    host_memory=float(costs.host_memory),
                    rank_memory=(float(costs.rank_memory[0]), float(costs.rank_memory[1])),
                    reserved_memory=float(costs.reserved_memory),
                    stage_steps=tuple(map(float, costs.stage_steps)),
                    stage_memory=tuple(map(float, costs.stage_memory)),
                    model_flops=model_flops, hardware_flops=hardware_flops,
                    reasons=reasons, detail=Detail(eff, parts, units, costs))


def _op_table(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency, parts: Parts,
              first: bool) -> tuple[OpRow, ...]:
    """Every op with its time per occurrence and how many times the busiest rank runs it per step: the first
    (its layers and the embedding) or the last (its layers, the head and the multi-token-prediction depths, each a
    layer of ``mtp_kinds`` and the head again); a single stage runs all of them."""
    m, depths, single = plan.grad_accum, model.mtp_layers, plan.pp == 1
    layers = layers_on_first(model, plan) if first else layers_on_last(model, plan)
    ends = single or not first  # the last stage's head and MTP depths are on the busiest rank
    counts = {kind: m * (layers * f + ends * depths * model.mtp_kinds.count(kind))
              for kind, f in kind_fractions(model).items()} | {
        "embed": m * (single or first), "head": m * ends * (1 + depths), "mtp": m * ends * depths,
        "p2p": m * plan.vpp * (plan.pp > 1)}
    rows = []
    acc = cluster.accelerator
    run = parts.with_work(work_of(plan, stack))  # its optimizer wrapper's per-micro-batch work (cost/wrapper_work.py)
    for group, ops in run.ops.items():
        for op, t in zip(ops, run.times[group], strict=True):
            if op.host and not (op.flops or op.nbytes):  # Python on the host alone (ZeRO-3's hooks): its seconds
                rows.append(OpRow(op.name, op.phase, "host", float(counts[group]), 0.0, 0.0, float(op.host), "host"))
                continue
            if op.kind == "collective":
                bound = "network"
            else:
                compute, memory = compute_time(op, acc, plan.precision, eff), memory_time(op, acc, eff)
                work, fixed = work_time(compute, memory, eff), overhead(op, acc, eff)
                issue = op.launches * op.launch_host  # roofline.op_time's host floor
                bound = "host" if issue > work + fixed else (
                    "overhead" if fixed > work else "compute" if compute >= memory else "memory")
            rows.append(OpRow(op.name, op.phase, op.kind, float(counts[group]), float(op.flops),
                              float(op.nbytes), float(t), bound))
    if stack.microbatch_host:  # the training loop's host work per micro-batch on each rank (step/stages.py)
        rows.append(OpRow("loop/micro_batch", "fwd", "host", float(m), 0.0, 0.0, loop_host(stack, cluster.python_host),
                          "host"))
    rows += _step_rows(model, cluster, plan, stack, eff, first)
    return tuple(r for r in rows if r.count > 0 and (r.seconds > 0 or r.flops > 0))


def _step_rows(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency, first: bool
               ) -> list[OpRow]:
    """Once-per-step ops of the busiest rank: the gradient reduction / parameter gather (before overlap), as often as
    its ZeRO stage runs them (channels.zero_counts: ZeRO-2 and 3 traffic runs per micro-batch, its gradients once
    where the stack accumulates them whole), FSDP's accumulation of them (channels.accumulation_time), a tied
    embedding's all-reduce between the pipeline's ends (channels.embedding_sync), the optimizer step, and the host's
    per-parameter loops around it (step/host.step_host), where the stack prices them."""
    params = stage_params(model, plan, first)
    collectives = dp_collectives(model, cluster, plan, params, eff, stack)
    seconds = collectives._asdict()
    grad_bytes, weight_bytes = trainable(params, plan).total * plan.grad_bytes, params.total * WEIGHT_BYTES
    named = {"all_reduce": ("dp/grad_all_reduce", grad_bytes), "scatter": ("dp/grad_reduce_scatter", grad_bytes),
             "gather": ("dp/param_all_gather", weight_bytes)}
    updates = cadence(plan)[1]  # updates per step (PipeDream: m)
    m, synced, _ = run_cadence(plan, stack)  # micro-batches per run of the DP traffic, its runs (schedule_runs)
    zero = partitioned_zero(plan, stack)  # BF16_Optimizer's partitions without ZeRO (cost/wrappers.py)
    rows = [OpRow(named[kind][0], "step", "collective", float(count * synced), 0.0, float(named[kind][1]),
                  float(seconds[kind]), "network") for kind, count in zero_counts(zero, m, collectives.once).items()]
    tied = embedding_sync(model, cluster, plan, eff)[0]  # the same on both ends
    if tied:
        rows.append(OpRow("pp/embedding_all_reduce", "step", "collective", float(updates), 0.0,
                          float(tied_gradient_bytes(model, plan)), float(tied), "network"))
    for name, seconds_of in ((f"optimizer/{plan.optimizer}", optimizer_time), ("fsdp/grad_accumulate",
                                                                                 accumulation_time)):
        opt = seconds_of(cluster, replace(plan, zero=zero), params, eff, stack)  # step/assemble.py's update_time
        moved = float(opt * stream_bandwidth(cluster.accelerator, eff))
        rows.append(OpRow(name, "step", "memory", float(updates), 0.0, moved, float(opt), "memory"))
    if paid_per_step(stack):
        rank = 0 if first else plan.pp - 1
        host = optimizer_loops(tensors_on_rank(model, plan, stack, rank), plan, stack, cluster.python_host,
                               schedule_of(plan.schedule).weight_copies,  # as step/assemble.py composes it
                               seconds["all_reduce"])
        rows.append(OpRow("optimizer/host", "step", "host", float(updates), 0.0, 0.0, float(host), "host"))
    if stack.iteration_host:  # the training loop's per step, once (step/host.iteration_host)
        rows.append(OpRow("loop/step", "step", "host", 1.0, 0.0, 0.0, iteration_host(stack, cluster.python_host),
                          "host"))
    return rows


@dataclass(frozen=True)
class OpTotal:
    """One op name's totals per step on the busiest rank (all its passes and occurrences)."""

    name: str
    flops: float
    nbytes: float
    seconds: float
    share: float  # of the summed op time (before overlap)
    bound: str


def op_totals(est: Estimate) -> list[OpTotal]:
    """Per-op totals, the most expensive first (the terminal's per-op table, report/text.py, and the report's)."""
    sums: dict[str, list[float]] = {}
    bound: dict[str, str] = {}
    for op in est.ops:
        acc = sums.setdefault(op.name, [0.0, 0.0, 0.0])
        acc[0] += op.count * op.flops
        acc[1] += op.count * op.nbytes
        acc[2] += op.total_seconds
        bound.setdefault(op.name, op.bound)
    total = sum(r[2] for r in sums.values()) or 1.0
    return [OpTotal(name, f, b, t, t / total, bound[name])
            for name, (f, b, t) in sorted(sums.items(), key=lambda kv: -kv[1][2])]
