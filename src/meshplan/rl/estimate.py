"""``rl_estimate(model, system, job, plan, stack, engine) -> RLEstimate``: the one place that composes an RL
iteration from the shared physics: the rollout on serving's (rollout.py), the trainer's passes and updates on
training's (trainer.py), the weight transfer on the collectives model (sync.py), the switches colocation needs
(switches.py), memory per phase (memory.py) and the set-up's timeline (timeline.py).

The engine's share of each GPU: what ``RLPlan.gpu_memory_utilization`` says; else, on its own pool, the engine preset's
(vLLM's gpu_memory_utilization 0.9), and colocated, the preset's share of what the trainer's resident state leaves
(the same margin, taken of the rest: the emitted gpu_memory_utilization is that share of the whole GPU).

The error band: each phase carries its own physics' band (specs/bands.py): the rollout serving's throughput band of
its regime (the engine on the rollout pool's GPUs, a saturated batch, the engine's share of the weights), every other
phase the policy update's (``Estimate.error_band``: training's band of its regime); the iteration's band is their mean
weighted by the phases' seconds (a phase that takes more of the iteration weighs more), and ranking uses the same mean
of the ranking bands (``serving_ranking_band``, ``Estimate.ranking_band``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from meshplan.errors import PlanError
from meshplan.estimate import Estimate
from meshplan.rl.job import RLJob
from meshplan.rl.lengths import response_lengths
from meshplan.rl.memory import PhaseMemory, phase_memory
from meshplan.rl.plan import RLPlan
from meshplan.rl.rollout import Rollout, generation, streaming
from meshplan.rl.switches import Switches, resident, switches
from meshplan.rl.sync import SyncTime, sync_time
from meshplan.rl.tail import screened
from meshplan.rl.timeline import Segment, iteration
from meshplan.rl.trainer import trainer_phases
from meshplan.serve.engine import DEFAULT as DEFAULT_ENGINE
from meshplan.serve.engine import Engine
from meshplan.serve.estimate import plan_columns
from meshplan.serve.memory import Memory as EngineMemory
from meshplan.serve.memory import memory
from meshplan.serve.plan import Workload
from meshplan.specs.bands import serving_band, serving_ranking_band
from meshplan.specs.hardware import Cluster, System
from meshplan.specs.model import ModelSpec
from meshplan.specs.regime import Served, serving_regime
from meshplan.specs.stack import FRAMEWORK_STACK, Stack
from meshplan.units import fmt_bytes


@dataclass(frozen=True)
class RLEstimate:
    """One RL plan's predicted iteration: its phases, timeline, memory per phase and feasibility."""

    model: ModelSpec
    cluster: Cluster  # the job's GPUs
    job: RLJob
    plan: RLPlan
    stack: Stack
    engine: Engine  # as it runs: its memory share set
    phases: dict[str, float]  # seconds per iteration of each phase
    segments: tuple[Segment, ...]
    iteration_time: float
    memory: tuple[PhaseMemory, ...]
    rollout: Rollout
    update: Estimate  # one optimizer step of the policy
    sync: SyncTime
    switches: Switches
    reasons: tuple[str, ...] = ()
    bands: dict[str, float] = field(default_factory=dict)  # phase -> its physics' error band
    ranks: dict[str, float] = field(default_factory=dict)  # phase -> its physics' ranking band

    @property
    def fits(self) -> bool:
        return not self.reasons

    @property
    def num_gpus(self) -> int:
        return self.plan.num_gpus

    @property
    def samples_per_s_per_gpu(self) -> float:
        return self.job.sequences / self.iteration_time / self.num_gpus

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Trained tokens (prompt and response) per second per GPU."""
        return self.job.sequences * self.job.train_seq / self.iteration_time / self.num_gpus

    @property
    def peak_memory(self) -> float:
        return max((m.total for m in self.memory), default=0.0)

    @property
    def error_band(self) -> float:
        """The iteration's band: the phases' bands weighted by their seconds (module docstring)."""
        return _weighted(self.phases, self.bands)

    @property
    def ranking_band(self) -> float:
        return _weighted(self.phases, self.ranks)

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        return {
            "model": self.model.name, "system": self.cluster.name, "gpus": self.num_gpus, "setup": p.setup,
            "job": {"algorithm": self.job.algorithm, "prompts": self.job.prompts,
                    "samples_per_prompt": self.job.samples_per_prompt, "input_len": self.job.input_len,
                    "output_len": self.job.output_len, "mean_output": self.job.mean_response,
                    "lengths": self.job.lengths, "staleness": self.job.staleness},
            "plan": {"train_gpus": p.train_gpus, "rollout_gpus": p.rollout_gpus, "offload": p.offload,
                     "sleep_level": p.sleep_level, "sync": p.sync_method, "trainer": self.update.to_dict(False)["plan"],
                     "engine": plan_columns(p.engine) | {"describe": p.engine.describe()},
                     "memory_utilization": self.engine.memory_utilization, "framework": self.stack.name,
                     "engine_name": self.engine.name},
            "iteration_s": self.iteration_time, "phases_s": dict(self.phases),
            "samples_per_s_per_gpu": self.samples_per_s_per_gpu, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "error_band": self.error_band, "ranking_band": self.ranking_band,
            "timeline": [{"pool": s.pool, "phase": s.phase, "start_s": s.start, "end_s": s.end} for s in self.segments],
            "memory": [{"phase": m.phase, "pool": m.pool, "bytes": m.total, "parts": dict(m.parts)}
                       for m in self.memory],
            "peak_memory_bytes": self.peak_memory, "hbm_bytes": self.cluster.accelerator.hbm_bytes,
            "rollout": {"tokens": self.rollout.tokens, "longest": self.rollout.longest,
                        "tokens_per_s": self.rollout.tokens_per_s,
                        "steady_tokens_per_s": self.rollout.steady_tokens_per_s,
                        "tail_share": self.rollout.tail_share, "preemptions": self.rollout.preemptions},
            "sync": {"gather_s": self.sync.gather, "transfer_s": self.sync.transfer, "host_s": self.sync.host,
                     "bytes": self.sync.weight_bytes, "tensors": self.sync.tensors},
            "fits": self.fits, "reasons": list(self.reasons),
        }


def _weighted(phases: dict[str, float], bands: dict[str, float]) -> float:
    total = sum(phases.values())
    return sum(t * bands.get(p, 0.0) for p, t in phases.items()) / total if total else 0.0


def pool_cluster(system: System, gpus: int) -> Cluster:
    """A pool of ``gpus`` GPUs of ``system``: whole NVLink domains (or part of one) as the system builds it; a pool
    that takes whole domains and part of another (10 GPUs of 8-GPU nodes) priced as its GPUs spread evenly over as
    few domains as its size allows, d GPUs each, d the largest divisor of the pool's size that a domain holds (5 x 2
    for 10 GPUs): its collectives cross domains no less than the real pool's (a stated, conservative
    simplification)."""
    domain = system.network.nvlink_domain or system.cluster(1).nvlink_domain
    if gpus <= domain or gpus % domain == 0:
        return system.cluster(gpus)
    spread = max(d for d in range(1, domain + 1) if gpus % d == 0)
    return system.cluster(gpus, nvlink_domain=spread)


def pools(system: System, plan: RLPlan) -> tuple[Cluster, Cluster, Cluster]:
    """(the job's GPUs, the training pool, the rollout pool) as meshes of ``system`` (``pool_cluster``)."""
    whole = system.cluster(plan.num_gpus)
    if plan.way.shared:
        return whole, whole, whole
    return whole, pool_cluster(system, plan.train_gpus), pool_cluster(system, plan.rollout_gpus)


def engine_share(engine: Engine, plan: RLPlan, hbm: float, held: float) -> Engine:
    """The engine as it runs under ``plan`` (module docstring: its memory share)."""
    if plan.gpu_memory_utilization:
        return engine.with_(memory_utilization=plan.gpu_memory_utilization, memory_basis="total")
    if not plan.way.shared:
        return engine
    left = max(hbm - held, 0.0)
    return engine.with_(memory_utilization=max(engine.memory_utilization * left / hbm, 0.01), memory_basis="total")


def engine_memory(model: ModelSpec, hbm: float, plan: RLPlan, engine: Engine, job: RLJob) -> EngineMemory:
    work = Workload(input_len=job.input_len, output_len=max(1, round(job.mean_response)))
    return memory(model, hbm, plan_columns(plan.engine.with_(replicas=1)), plan.engine.quant, engine,
                  engine.resident(work))


def _memo(memo: dict, key: tuple, make: Callable[[], Any]) -> Any:
    if key not in memo:
        memo[key] = make()
    return memo[key]


def rl_estimate(model: ModelSpec, system: System, job: RLJob, plan: RLPlan, stack: Stack = FRAMEWORK_STACK,
                engine: Engine = DEFAULT_ENGINE, simulate: bool = True, memo: dict | None = None) -> RLEstimate:
    """Predict one iteration of ``job`` placed as ``plan`` on ``system`` (module docstring). Raises PlanError for
    a trainer layout that cannot run the model; a plan that does not fit is a result with its reasons.
    ``simulate``: the synchronous rollout by the engine's simulated scheduler (rollout.py), else by the closed form
    the search screens with (tail.py); ``memo``: the pieces several plans share, priced once (the search's)."""
    memo = {} if memo is None else memo
    whole, train_pool, roll_pool = pools(system, plan)
    hbm = whole.accelerator.hbm_bytes
    done = _memo(memo, ("trainer", plan.trainer, plan.train_gpus, plan.forward_micro_batch),
                 lambda: trainer_phases(model, train_pool, plan.trainer, stack, job, plan.forward_micro_batch))
    held = sum(resident(plan, done.update.memory).values()) if plan.way.shared else 0.0
    running = engine_share(engine, plan, hbm, held)
    emem = engine_memory(model, hbm, plan, running, job)
    lengths = _memo(memo, ("lengths",), lambda: response_lengths(job))
    how = streaming if plan.way.streaming else (generation if simulate else screened)
    roll = _memo(memo, ("rollout", how.__name__, plan.engine, plan.rollout_gpus, running.memory_utilization),
                 lambda: how(model, roll_pool, plan.engine, running, job, lengths) if how is not screened
                 else screened(model, roll_pool, plan.engine, running, job, lengths, memo))
    moved = _memo(memo, ("sync", plan.trainer, plan.engine, plan.sync_method, plan.train_gpus, plan.num_gpus),
                  lambda: sync_time(model, whole, (train_pool, plan.trainer, stack), plan.engine, plan.sync_method,
                                    plan.storage_bandwidth))
    sw = switches(plan, train_pool, done.update.memory, float(emem.weights))
    phases = {"offload": sw.offload, "wake": sw.wake, "sync": moved.seconds, "rollout": roll.seconds,
              "sleep": sw.sleep, "reload": sw.reload, **done.phases}
    phases = {k: v for k, v in phases.items() if v > 0}
    segments, total = iteration(plan.way, phases, job.staleness)
    mem = phase_memory(plan, done.update.memory, emem, done.working, set(phases))
    reasons = _reasons(done.update, roll, mem, hbm, emem, plan)
    regime = serving_regime(model, roll_pool, running, Served(
        mode="saturated", batch=2.0, weights=float(emem.weights), input_len=job.input_len,
        output_len=int(job.mean_response), gpus=plan.engine.instance_gpus))
    bands = {p: serving_band("throughput", regime).half_width if p == "rollout" else done.update.error_band
             for p in phases}
    ranks = {p: serving_ranking_band(regime) if p == "rollout" else done.update.ranking_band for p in phases}
    return RLEstimate(model=model, cluster=whole, job=job, plan=plan, stack=stack, engine=running, phases=phases,
                      segments=segments, iteration_time=total, memory=mem, rollout=roll, update=done.update,
                      sync=moved, switches=sw, reasons=reasons, bands=bands, ranks=ranks)


def _reasons(update: Estimate, roll: Rollout, mem: tuple[PhaseMemory, ...], hbm: float, emem: EngineMemory,
             plan: RLPlan) -> tuple[str, ...]:
    """Why the plan cannot run: the trainer's own reasons, the rollout's, the first phase whose memory exceeds the
    GPU's, an engine left no KV cache."""
    out = [f"trainer: {r}" for r in update.reasons] + [f"rollout: {r}" for r in roll.reasons]
    if float(emem.kv_pool) <= 0:
        out.append(f"engine: no KV cache left of {fmt_bytes(float(emem.capacity))} (its weights "
                   f"{fmt_bytes(float(emem.weights))}{' beside the trainer state' if plan.way.shared else ''})")
    over = [m for m in mem if m.total > hbm]
    if over:
        worst = max(over, key=lambda m: m.total)
        out.append(f"memory in {worst.phase} ({worst.pool}): {fmt_bytes(worst.total)} > {fmt_bytes(hbm)} HBM")
    return tuple(dict.fromkeys(out))


def checked(model: ModelSpec, system: System, job: RLJob, plan: RLPlan, stack: Stack = FRAMEWORK_STACK,
            engine: Engine = DEFAULT_ENGINE, simulate: bool = True, memo: dict | None = None) -> RLEstimate | str:
    """``rl_estimate``, or the reason a trainer layout cannot run the model (for the search's tallies)."""
    try:
        return rl_estimate(model, system, job, plan, stack, engine, simulate, memo)
    except PlanError as exc:
        return str(exc)
