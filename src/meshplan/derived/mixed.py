"""Plans on a mixed cluster (specs/pools.py) and their price (issue 84 item 1).

Two layouts, each a registry record (``MIXED_LAYOUTS``), place one plan shape (tp, cp, ep, micro-batch, ZeRO,
recompute …, the same on every GPU, as Megatron-Core's single set of parallel groups requires) on the pools:

- ``pipeline``: the pipeline's stages on the pools in a chosen order, each pool holding a whole number of stages of
  dp·tp·cp GPUs; each rank priced on its own pool's GPUs and network (step.ranks.price_rank, the estimate's own
  per-rank pricing) and the step composed as step/ranks.py composes it, t_step = max_r s_r + (Σ t_r − max t_r)/v.
  A faster pool's stages take more layers (Plan.stage_layers; the stage DP picks them: search/stage_dp.py). The ranks
  beside a boundary between pools send over the link between them (their network at Pools.bandwidth).
- ``data``: the data-parallel replicas on the pools, each pool holding a whole number of replicas of tp·pp·cp GPUs,
  the replicas of pool k running m_k micro-batches a step (a faster pool's more: Sailor's and Cephalo's batch
  shares). Each pool's replicas are priced by ``estimate()`` on that pool as if every replica ran m_k; the step is
  the slowest pool's passes beside its exposed gradient exchange, max_k (t_k − d_k), plus the exchange, which spans
  every pool and so runs at the slowest pool's collectives over the link, max_k d_k (the ring's slowest hop paces it).

A plan fits where every rank fits its own pool's HBM. MFU is taken against the summed peak of every GPU of the pools.
Which frameworks run a layout is its record's (``runs``): a pipeline over pools is Megatron-Core's plan with its
pipeline_model_parallel_layout (uneven layers) or any framework's even split; uneven batch shares are run by none of
the presets (Megatron-LM splits the global batch evenly over its data-parallel ranks, as torchtitan and DeepSpeed do:
Sailor's authors name that the missing piece), only by the research frameworks that introduced them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.cost.flops import plan_flops_per_token
from meshplan.cost.wrapper_work import work_of
from meshplan.estimate import estimate
from meshplan.specs.check import check
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.pools import Pools
from meshplan.specs.stack import Stack
from meshplan.step.ranks import price_rank, rank_bubble
from meshplan.step.units import Units, timed_parts, units_for_recomputes
from meshplan.units import fmt_over


@dataclass(frozen=True)
class PoolLayout:
    """One way to lay a plan on pools: what each pool holds and who runs it."""

    name: str
    holds: str  # what a pool's count counts
    runs_uneven: str  # who runs it with uneven layers / shares (research frameworks, their sources)


MIXED_LAYOUTS = {
    "pipeline": PoolLayout("pipeline", "stages", "Megatron-Core (--pipeline-model-parallel-layout); Metis (Um et "
                           "al., ATC '24, on Alpa) and HexiScale (Yan et al., arXiv 2409.01143) search such splits"),
    "data": PoolLayout("data", "replicas", "Sailor (Strati et al., SOSP '25: its Megatron-DeepSpeed fork takes a "
                   "micro-batch count per GPU), Cephalo (Guo et al., ICS '25: FSDP with per-GPU batches), Whale "
                   "(Jia et al., ATC '22)"),
}


@dataclass(frozen=True, kw_only=True)
class MixedPlan:
    """``plan``'s shape on pools: ``kind`` (a MIXED_LAYOUTS key), the pools in ``order`` (stage order for a pipeline)
    with ``counts`` (stages or replicas each) and, for replicas, ``shares`` (micro-batches a step per replica each)."""

    plan: Plan
    kind: str
    order: tuple[int, ...]
    counts: tuple[int, ...]
    shares: tuple[int, ...] = ()

    @property
    def uneven(self) -> bool:
        """Uneven layers per rank (a pipeline) or batch shares (replicas)."""
        return bool(self.plan.stage_layers) if self.kind == "pipeline" else len(set(self.shares)) > 1

    def describe(self, pools: Pools) -> str:
        names = [pools.pools[k].name for k in self.order]
        if self.kind == "pipeline":
            parts = [f"{n}: {c} stage{'s' * (c > 1)}" for n, c in zip(names, self.counts, strict=True)]
        else:
            parts = [f"{n}: {c} x {s} micro-batches" for n, c, s in zip(names, self.counts, self.shares, strict=True)]
        return f"{self.kind} over pools ({'; '.join(parts)}) {self.plan.describe()}"


@dataclass(frozen=True)
class MixedEstimate:
    """A mixed plan's step, per pool its slowest step and its peak memory, and the reasons it does not fit."""

    model: ModelSpec
    pools: Pools
    mixed: MixedPlan
    stack: Stack
    step_time: float
    pool_steps: tuple[float, ...]  # in ``mixed.order``
    pool_memory: tuple[float, ...]
    model_flops: float
    reasons: tuple[str, ...] = ()
    stage_steps: tuple[float, ...] = ()
    stage_memory: tuple[float, ...] = ()

    @property
    def fits(self) -> bool:
        return not self.reasons

    @property
    def peak_memory(self) -> float:
        return max(self.pool_memory)

    @property
    def tokens_per_step(self) -> int:
        return batch_of(self.mixed) * self.model.seq_length

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time

    @property
    def mfu(self) -> float:
        """Model FLOPs over the step against the summed dense peak of every GPU at the plan's precision."""
        peak = sum(p.gpus * p.system.accelerator.flops(self.mixed.plan.precision) for p in self.pools.pools)
        return self.model_flops / self.step_time / peak

    def to_dict(self) -> dict[str, object]:
        m = self.mixed
        return {"layout": m.kind, "pools": [self.pools.pools[k].name for k in m.order],
                "counts": list(m.counts), "shares": list(m.shares), "plan": m.plan.describe(),
                "stage_layers": list(m.plan.stage_layers), "step_time_s": self.step_time,
                "tokens_per_s": self.tokens_per_s, "mfu": self.mfu, "pool_step_s": list(self.pool_steps),
                "pool_memory_bytes": list(self.pool_memory), "fits": self.fits, "reasons": list(self.reasons)}


def batch_of(mixed: MixedPlan) -> int:
    """Sequences per step: the plan's, or the replicas' shares summed."""
    if mixed.kind == "pipeline":
        return mixed.plan.global_batch
    return sum(c * s for c, s in zip(mixed.counts, mixed.shares, strict=True)) * mixed.plan.micro_batch


def linked(cluster: Cluster, pools: Pools) -> Cluster:
    """``cluster`` with every tier beyond its NVLink domain at most the link between the pools (specs/pools.py)."""
    tiers = (cluster.tiers[0], *(replace(t, bandwidth=min(t.bandwidth, pools.bandwidth),
                                         latency=max(t.latency, pools.latency)) for t in cluster.tiers[1:]))
    return replace(cluster, tiers=tiers)


def problems(model: ModelSpec, pools: Pools, mixed: MixedPlan, stack: Stack) -> list[str]:
    """What is wrong with ``mixed`` on ``pools`` (its counts, the plan on each pool), [] if nothing."""
    plan, sizes = mixed.plan, [pools.pools[k].gpus for k in mixed.order]
    if sorted(mixed.order) != list(range(len(pools.pools))) or len(mixed.counts) != len(sizes):
        return [f"order={mixed.order}: every pool once"]
    per = plan.dp * plan.tp * plan.tp2 * plan.cp if mixed.kind == "pipeline" else plan.tp * plan.tp2 * plan.pp * plan.cp
    total = plan.pp if mixed.kind == "pipeline" else plan.dp
    if [c * per for c in mixed.counts] != sizes or sum(mixed.counts) != total:
        holds = MIXED_LAYOUTS[mixed.kind].holds
        return [f"{mixed.kind} over pools: {', '.join(map(str, mixed.counts))} {holds} of {per} "
                f"GPUs do not fill the pools' {', '.join(map(str, sizes))}"]
    if mixed.kind == "data" and (len(mixed.shares) != len(sizes) or min(mixed.shares, default=0) < 1):
        return ["data over pools: one micro-batch share (1 or more) per pool"]
    out = []
    for k in mixed.order:
        out += check(model, pools.pools[k].cluster(plan.num_gpus), _as_pool(mixed, k), stack)
    return list(dict.fromkeys(out))


def _as_pool(mixed: MixedPlan, k: int) -> Plan:
    """The plan pool ``k`` runs: the pipeline's, or its replicas' with their own micro-batches."""
    if mixed.kind == "pipeline":
        return mixed.plan
    share = mixed.shares[mixed.order.index(k)]
    return mixed.plan.with_(global_batch=mixed.plan.dp * mixed.plan.micro_batch * share)


def rank_pools(mixed: MixedPlan) -> list[int]:
    """The pool of each pipeline rank."""
    return [k for k, c in zip(mixed.order, mixed.counts, strict=True) for _ in range(c)]


def _units(model: ModelSpec, cluster: Cluster, plan: Plan, stack: Stack, eff: Efficiency) -> dict[str, Units]:
    own = work_of(plan, stack)
    parts = timed_parts(model, cluster, plan, stack, eff, works=(own,) if own else ())
    return units_for_recomputes(model, plan, stack, parts, ("none", "selective", "full"), eff)


def rank_clusters(pools: Pools, mixed: MixedPlan) -> list[Cluster]:
    """Each pipeline rank's cluster: its pool's GPUs at the job's size, over the link where it borders another pool."""
    of = rank_pools(mixed)
    own = {k: pools.pools[k].cluster(mixed.plan.num_gpus) for k in set(of)}
    edge = {k: linked(c, pools) for k, c in own.items()}
    return [edge[k] if (r and of[r - 1] != k) or (r + 1 < len(of) and of[r + 1] != k) else own[k]
            for r, k in enumerate(of)]


def _pipeline(model: ModelSpec, pools: Pools, mixed: MixedPlan, stack: Stack, eff: Efficiency) -> MixedEstimate:
    plan, of = mixed.plan, rank_pools(mixed)
    clusters = rank_clusters(pools, mixed)
    units: dict[int, dict[str, Units]] = {}
    ranks = []
    for r, cluster in enumerate(clusters):
        if id(cluster) not in units:
            units[id(cluster)] = _units(model, cluster, plan, stack, eff)
        ranks.append(price_rank(model, cluster, plan, stack, units[id(cluster)], eff, r))
    step = max(c.step for c in ranks) + rank_bubble(plan, [c.times for c in ranks])
    steps = tuple(max(c.step for c, k in zip(ranks, of, strict=True) if k == p) for p in mixed.order)
    memory = tuple(max(float(c.memory.total) for c, k in zip(ranks, of, strict=True) if k == p) for p in mixed.order)
    return MixedEstimate(model, pools, mixed, stack, step, steps, memory,
                         plan_flops_per_token(model, plan) * batch_of(mixed) * model.seq_length,
                         _over(pools, mixed, memory), tuple(c.step for c in ranks),
                         tuple(float(c.memory.total) for c in ranks))


def _data(model: ModelSpec, pools: Pools, mixed: MixedPlan, stack: Stack, eff: Efficiency) -> MixedEstimate:
    own, exchanged = [], []
    for k in mixed.order:
        cluster, plan = pools.pools[k].cluster(mixed.plan.num_gpus), _as_pool(mixed, k)
        own.append(estimate(model, cluster, plan, stack, eff))
        exchanged.append(estimate(model, linked(cluster, pools), plan, stack, eff).breakdown["dp"])
    step = max(e.step_time - e.breakdown["dp"] for e in own) + max(exchanged)
    memory = tuple(e.peak_memory for e in own)
    return MixedEstimate(model, pools, mixed, stack, step, tuple(e.step_time for e in own), memory,
                         plan_flops_per_token(model, mixed.plan) * batch_of(mixed) * model.seq_length,
                         _over(pools, mixed, memory))


def _over(pools: Pools, mixed: MixedPlan, memory: tuple[float, ...]) -> tuple[str, ...]:
    out = []
    for k, used in zip(mixed.order, memory, strict=True):
        hbm = pools.pools[k].system.accelerator.hbm_bytes
        if used > hbm:
            out.append(f"memory on {pools.pools[k].name} {fmt_over(used, hbm)} HBM")
    return tuple(out)


def mixed_estimate(model: ModelSpec, pools: Pools, mixed: MixedPlan, stack: Stack, eff: Efficiency = DEFAULT
                   ) -> MixedEstimate:
    """The step of ``mixed`` on ``pools`` (module docstring); raises SpecError naming what is wrong with it."""
    from meshplan.errors import SpecError

    wrong = problems(model, pools, mixed, stack)
    if wrong:
        raise SpecError("; ".join(wrong))
    return (_pipeline if mixed.kind == "pipeline" else _data)(model, pools, mixed, stack, eff)


def runners(mixed: MixedPlan, stack: Stack, model: ModelSpec) -> tuple[list[str], str]:
    """(the framework presets that run ``mixed``, the research frameworks that do where none does): a pipeline over
    pools is the stack's plan (uneven layers: where it runs Plan.stage_layers); even replicas likewise; uneven
    batch shares none of the presets (Supports.uneven_batch)."""
    from meshplan.specs.stack import frameworks_running

    if mixed.kind == "data" and mixed.uneven:  # none of the presets (Supports.uneven_batch)
        return [], MIXED_LAYOUTS["data"].runs_uneven
    found = frameworks_running(mixed.plan, model)
    return found, "" if found else MIXED_LAYOUTS[mixed.kind].runs_uneven
