"""The RL search: set-ups, the split of the GPUs, each side's layout, its micro-batches and the engine's batch limit,
ranked by time per iteration (the same order as samples per second per GPU on the job's GPUs).

How it reuses the two searches: for each pool size the trainer needs, the training search (search/run.py, the
mini-batch as its global batch, 1D layouts in the frameworks' rank order, as ``plan --emit`` searches them) gives its
``train_plans`` fastest layouts; for each pool size the engine needs, the serving search (serve/search.py, co-located
instances, the mean response, the prompt's cached share) its ``engine_plans`` highest-throughput configurations.
Each pairing is then priced whole (estimate.rl_estimate) with the rollout in closed form (tail.py: the thinning
batch on the simulation's own iteration prices), the pieces shared between pairings priced once (``memo``); the
``simulated`` fastest of each set-up are priced again with the rollout simulated (rollout.py: the engine's scheduler,
its refills and preemptions), and the ranking is theirs.

- colocated: the trainer's layouts on all the GPUs × the engine's configurations × the trainer's offload choices
  (``offloads``), the engine taking what each leaves of the GPU;
- split and async: the rollout pool's sizes are those of ``rollout_gpus``, or, by default, the sizes nearest the
  balance point r* = G · R / (R + W), R and W the colocated best plan's rollout and trainer seconds (each side's
  time scales about as the inverse of its GPUs: r* makes the pools finish together), at most ``splits`` of them
  (a pool that takes part of an NVLink domain is priced as estimate.pool_cluster says).

What does not run is tallied by reason: the training and serving searches' rejections (their counts summed), and the
pairings that do not fit (memory in a phase, no KV cache, a response longer than the KV cache).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from meshplan.errors import SpecError
from meshplan.fields import MEMORY_HEADROOM
from meshplan.rl.estimate import RLEstimate, checked, pool_cluster
from meshplan.rl.job import RLJob
from meshplan.rl.plan import OFFLOADS, RLPlan
from meshplan.rl.setups import SETUPS
from meshplan.rl.sync import SYNC_METHODS
from meshplan.rl.trainer import trained_model
from meshplan.search import Space, search
from meshplan.serve.engine import DEFAULT as DEFAULT_ENGINE
from meshplan.serve.engine import Engine
from meshplan.serve.plan import ServePlan
from meshplan.serve.search import search as serve_search
from meshplan.serve.space import ServeSpace
from meshplan.specs.hardware import System
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import FRAMEWORK_STACK, Stack


@dataclass(frozen=True, kw_only=True)
class RLSpace:
    """What the RL search may choose (module docstring)."""

    setups: tuple[str, ...] = tuple(SETUPS)
    stack: Stack = FRAMEWORK_STACK
    engine: Engine = DEFAULT_ENGINE
    offloads: tuple[str, ...] = tuple(OFFLOADS)
    rollout_gpus: tuple[int, ...] = ()  # split sizes to try; () around the balance point
    splits: int = 3
    train_plans: int = 2
    engine_plans: int = 3
    simulated: int = 2  # plans of each set-up whose rollout is simulated after the screen
    headroom: float = MEMORY_HEADROOM
    sleep_level: int = 2
    sync: str = ""  # the weight transfer of every pairing (rl/sync.py); "": each set-up's own
    storage_bandwidth: float = 40e9  # per node, for the storage transfer (RLPlan.storage_bandwidth)

    def __post_init__(self) -> None:
        for name in self.setups:
            if name not in SETUPS:
                raise SpecError(f"setup={name!r} must be one of {', '.join(SETUPS)}")
        for name in self.offloads:
            if name not in OFFLOADS:
                raise SpecError(f"offload={name!r} must be one of {', '.join(OFFLOADS)}")
        if not self.setups or not self.offloads:
            raise SpecError("rl space: give at least one set-up and one offload choice")
        if self.sync and self.sync not in SYNC_METHODS:
            raise SpecError(f"sync={self.sync!r} must be one of {', '.join(SYNC_METHODS)}")


@dataclass(frozen=True)
class RLSearchResult:
    model: ModelSpec
    system: System
    gpus: int
    job: RLJob
    space: RLSpace
    plans: tuple[RLEstimate, ...]  # feasible, fastest first
    evaluated: int
    rejected: dict[str, int]
    examples: dict[str, str]
    seconds: float
    best: dict[str, RLEstimate] = field(default_factory=dict)  # the fastest feasible plan of each set-up

    @property
    def equivalent(self) -> tuple[bool, ...]:
        """Per plan: whether its iteration time is within the fastest's ranking band (estimate.py)."""
        if not self.plans:
            return ()
        fastest = self.plans[0]
        return tuple(e.iteration_time <= fastest.iteration_time * (1 + fastest.ranking_band) for e in self.plans)

    def to_dict(self) -> dict[str, object]:
        return {"model": self.model.name, "system": self.system.name, "gpus": self.gpus,
                "evaluated": self.evaluated, "feasible": len(self.plans),
                "rejected": {"count": sum(self.rejected.values()), "reasons": dict(self.rejected),
                             "examples": dict(self.examples)},
                "seconds": self.seconds, "best": {k: v.to_dict() for k, v in self.best.items()},
                "plans": [e.to_dict() | {"equivalent": same} for e, same in zip(self.plans, self.equivalent,
                                                                                strict=True)]}


class _Tally:
    """Rejections by reason, each with one example."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def add(self, reason: str, example: str, count: int = 1) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + count
        self.examples.setdefault(reason, example)


def pool_sizes(system: System, gpus: int) -> list[int]:
    """Rollout pool sizes r, 1 ≤ r < G (estimate.pool_cluster prices a pool that takes part of an NVLink domain)."""
    return list(range(1, gpus))


def _trainers(model: ModelSpec, system: System, gpus: int, job: RLJob, space: RLSpace, tally: _Tally) -> list[Plan]:
    """The training search's fastest layouts for the mini-batch on ``gpus`` GPUs (module docstring)."""
    pool = pool_cluster(system, gpus)
    train = Space(global_batch=job.mini_batch, stack=space.stack, headroom=space.headroom, layouts=("1d",),
                  all_placements=False, offload_activations=(False,),
                  precision=pool.accelerator.default_precision)
    found = search(trained_model(model, job), pool, train, top_k=space.train_plans, workers=1)
    for reason, count in found.rejected.items():
        tally.add(f"trainer layout: {reason}", f"on {gpus} GPUs: {found.examples.get(reason, '')}", count)
    return [e.plan for e in found.plans]


def _engines(model: ModelSpec, system: System, gpus: int, job: RLJob, space: RLSpace, tally: _Tally
             ) -> list[ServePlan]:
    """The serving search's highest-throughput co-located configurations on ``gpus`` GPUs (module docstring)."""
    pool = pool_cluster(system, gpus)
    n = job.samples_per_prompt
    cached = int((n - 1) / n * job.input_len) // space.engine.block_size * space.engine.block_size
    serve = ServeSpace(input_len=job.input_len, output_len=max(1, round(job.mean_response)),
                       cached_len=min(cached, job.input_len - 1), disaggregate=False, engine=space.engine)
    try:
        found = serve_search(model, pool, serve, top_k=space.engine_plans)
    except SpecError as exc:
        tally.add(f"engine layout: {exc}", f"on {gpus} GPUs")
        return []
    for reason, count in found.rejected.items():
        tally.add(f"engine layout: {reason}", f"on {gpus} GPUs: {found.examples.get(reason, '')}", count)
    return [e.plan for e in found.plans]


def _pairings(setup: str, gpus: int, trainers: list[Plan], engines: list[ServePlan], space: RLSpace,
              rollout: int) -> Iterator[RLPlan]:
    shared = SETUPS[setup].shared
    for t in trainers:
        for e in engines:
            for offload in (space.offloads if shared else ("none",)):
                yield RLPlan(setup=setup, trainer=t, engine=e, train_gpus=gpus - (0 if shared else rollout),
                             rollout_gpus=gpus if shared else rollout, offload=offload, sleep_level=space.sleep_level,
                             sync=space.sync, storage_bandwidth=space.storage_bandwidth)


def _evaluate(model, system, job, plans: Iterator[RLPlan], space: RLSpace, tally: _Tally, memo: dict,
              simulate: bool = False) -> list[RLEstimate]:
    out = []
    for plan in plans:
        est = checked(model, system, job, plan, space.stack, space.engine, simulate, memo)
        if isinstance(est, str):
            tally.add(f"trainer layout: {est}", plan.describe())
        elif not est.fits:
            tally.add(_kind(est.reasons[0]), f"{plan.describe()}: {est.reasons[0]}")
        else:
            out.append(est)
    return out


def _kind(reason: str) -> str:
    """A pairing's reason without its figures (one tally row per kind): "memory in rollout (all)", "rollout", ..."""
    head = reason.split(":")[0]
    return head if head.startswith("memory") or head in ("trainer", "engine") else reason


def _finalists(model, system, job, screened: list[RLEstimate], space: RLSpace, tally: _Tally, memo: dict
               ) -> list[RLEstimate]:
    """The ``simulated`` fastest screened plans of each set-up, priced again with the rollout simulated."""
    out = []
    for name in space.setups:
        mine = sorted((e for e in screened if e.plan.setup == name), key=lambda e: e.iteration_time)
        if SETUPS[name].streaming:  # a streaming rollout is its steady state either way
            out += mine[: space.simulated]
            continue
        out += _evaluate(model, system, job, (e.plan for e in mine[: space.simulated]), space, tally, memo, True)
    return out


def _balance(best: RLEstimate | None, gpus: int, sizes: list[int], count: int) -> list[int]:
    """The ``count`` pool sizes nearest the balance point (module docstring); the middle one without a colocated
    plan to balance from."""
    if not sizes:
        return []
    if best is None:
        return [sizes[len(sizes) // 2]]
    roll = best.phases.get("rollout", 0.0)
    work = sum(v for k, v in best.phases.items() if k not in ("rollout", "offload", "reload", "wake", "sleep", "sync"))
    target = gpus * roll / (roll + work) if roll + work else gpus / 2
    return sorted(sorted(sizes, key=lambda r: abs(r - target))[:count])


def rl_search(model: ModelSpec, system: System, gpus: int, job: RLJob, space: RLSpace | None = None,
              top_k: int = 10) -> RLSearchResult:
    """Every set-up of ``space`` for ``job`` on ``gpus`` GPUs of ``system`` (module docstring)."""
    space = space or RLSpace()
    start, tally = time.perf_counter(), _Tally()
    memo: dict = {}
    found: list[RLEstimate] = []
    evaluated = 0
    if "colocated" in space.setups:
        plans = list(_pairings("colocated", gpus, _trainers(model, system, gpus, job, space, tally),
                               _engines(model, system, gpus, job, space, tally), space, gpus))
        evaluated += len(plans)
        found += _evaluate(model, system, job, iter(plans), space, tally, memo)
    colocated = min(found, key=lambda e: e.iteration_time, default=None)  # screened: for the balance point
    apart = [s for s in space.setups if not SETUPS[s].shared]
    if apart:
        sizes = pool_sizes(system, gpus)
        chosen = [r for r in space.rollout_gpus if r in sizes] or _balance(colocated, gpus, sizes, space.splits)
        for r in space.rollout_gpus:
            if r not in sizes:
                tally.add("rollout pool: no GPU left to train", f"rollout_gpus={r} of {gpus}")
        for r in chosen:
            trainers = _trainers(model, system, gpus - r, job, space, tally)
            engines = _engines(model, system, r, job, space, tally)
            for setup in apart:
                plans = list(_pairings(setup, gpus, trainers, engines, space, r))
                evaluated += len(plans)
                found += _evaluate(model, system, job, iter(plans), space, tally, memo)
    final = _finalists(model, system, job, found, space, tally, memo)
    ranked = tuple(sorted(final, key=lambda e: (e.iteration_time, e.peak_memory)))
    best = {s: next(e for e in ranked if e.plan.setup == s) for s in space.setups
            if any(e.plan.setup == s for e in ranked)}
    return RLSearchResult(model=model, system=system, gpus=gpus, job=job, space=space, plans=ranked[:top_k],
                          evaluated=evaluated, rejected=tally.counts, examples=tally.examples,
                          seconds=time.perf_counter() - start, best=best)
