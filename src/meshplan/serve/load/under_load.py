"""The search and the recommendation under a load: which serving configurations meet latency targets at a request
rate (or a concurrency), simulated request by request (run.py) rather than in steady state.

Instance shapes come from serve's steady-state search (search.py: every tp, pp, dpa, ep, decode batch and scheme,
priced at once with NumPy), co-located, ranked by output tokens/s per GPU; the ``shapes`` best distinct ones are
simulated. For each, the fewest replicas that meet the targets at the chosen percentile (TTFT and TPOT at p50, p90
or p99, every request completed) are found by doubling then bisection from the steady-state lower bound
(the rate times the mean output over one instance's steady tokens/s, less 8 %); for the first shapes, also the fewest
instances split into prefill and decode pools (disagg.py) below that count. ``recommend``: the deployment of the
fewest GPUs; ``rank``: every shape at the most replicas the GPUs hold, by goodput per GPU. Ties within the serving
error band (5 %) go to the simpler plan: fewer GPUs, then co-located, then smaller tp·pp, then 16 bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from meshplan.serve.engine import Engine
from meshplan.serve.load.arrivals import Requests
from meshplan.serve.load.bound import idle_bound
from meshplan.serve.load.prices import prime
from meshplan.serve.load.run import Choices, load_run_with
from meshplan.serve.load.speculation import Speculation
from meshplan.serve.load.summary import LoadResult
from meshplan.serve.plan import ServePlan
from meshplan.serve.search import search
from meshplan.serve.space import ServeSpace
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec

TIE_BAND = 0.05  # goodput per GPU within 5 % ties (the serving error band of docs/ACCURACY_INFERENCE.md's tables)
SPLIT_SHAPES, SPLIT_TRIES = 3, 12  # shapes tried as prefill / decode pools, and simulations per shape


@dataclass(frozen=True)
class Targets:
    """Latency targets (seconds, 0: none) at a percentile (50, 90, 95 or 99), and what the user chose for every plan
    under the load: the prefix-cache hit share, speculative decoding (None: none) and the scheduler preset (None: the
    engine's)."""

    ttft: float = 0.0
    tpot: float = 0.0
    percentile: int = 99
    prefix_hit: float = 0.0
    speculation: Speculation | None = None
    scheduler: str | None = None

    @property
    def choices(self) -> Choices:
        return Choices(self.prefix_hit, self.speculation, self.scheduler)

    def met(self, r: LoadResult, count: int) -> bool:
        """Every request completed, and the percentile of each target's metric within it."""
        p = self.percentile
        return (r.completed == count and (not self.ttft or r.ttft[p] <= self.ttft)
                and (not self.tpot or r.tpot[p] <= self.tpot))


@dataclass(frozen=True)
class Loaded:
    """One deployment simulated under the load."""

    plan: ServePlan
    result: LoadResult
    meets: bool

    def to_dict(self, price: float | None = None) -> dict[str, Any]:
        p = self.plan
        cost = price * p.num_gpus if price is not None else None
        tokens = self.result.output_tokens_per_s
        return {"plan": p.describe(), "tp": p.tp, "pp": p.pp, "dpa": p.dpa, "ep": p.ep, "batch": p.batch,
                "replicas": p.replicas, "quant": p.quant.label, "kv_cache": p.quant.kv_cache, "gpus": p.num_gpus,
                "meets_targets": self.meets,
                "goodput_per_gpu": self.result.goodput / p.num_gpus, "dollars_per_hour": cost,
                "cost_per_million_tokens": cost / 3600 / tokens * 1e6 if cost is not None and tokens else None,
                **self.result.to_dict()}


def load_shapes(model: ModelSpec, cluster: Cluster, space: ServeSpace, count: int) -> list[tuple[ServePlan, float]]:
    """The ``count`` best distinct co-located instance shapes of the steady-state search (replicas = 1), each with
    one instance's steady output tokens/s, by tokens/s per GPU as the search's arrays priced them (its weighed
    table: no configuration re-estimated one by one); of shapes that differ in their batch limit alone, the best
    one's, and of a shape's replica counts the best per GPU."""
    steady = search(model, cluster, replace(space, disaggregate=False, ttft_slo=0.0, tpot_slo=0.0), top_k=0,
                    keep=True)
    table = steady.weighed
    if table is None or not len(table):
        return []
    c = table.columns
    tokens = np.nan_to_num(c["tokens_per_s"])
    ok = (c["reason"] < 0) & (c["prefill_replicas"] == 0) & (tokens > 0)
    per_gpu = np.where(ok, tokens / np.maximum(c["gpus"], 1), -np.inf)
    seen: set[tuple[int, ...]] = set()
    out: list[tuple[ServePlan, float]] = []
    for i in np.argsort(-per_gpu, kind="stable"):
        if not ok[i] or len(out) == count:
            break
        key = (int(c["tp"][i]), int(c["pp"][i]), int(c["dpa"][i]), int(c["ep"][i]), int(c["quant"][i]))
        if key in seen:
            continue
        seen.add(key)
        one = ServePlan(tp=key[0], pp=key[1], dpa=key[2], ep=key[3], batch=int(c["batch"][i]),
                        quant=table.quants[key[4]])
        out.append((one, float(tokens[i] / c["replicas"][i])))
    return out


def _simulate(model, cluster, plan, reqs, engine, targets, cache=None) -> Loaded:
    """``plan`` under the load (a result kept in ``cache`` is not simulated again)."""
    cache = {} if cache is None else cache
    if ("run", plan) not in cache:
        result = load_run_with(model, cluster, plan, reqs, engine, (targets.ttft, targets.tpot), targets.choices,
                               cache)
        cache[("run", plan)] = Loaded(plan, result, targets.met(result, len(reqs)))
    return cache[("run", plan)]


def fewest(model: ModelSpec, cluster: Cluster, shape: tuple[ServePlan, float], reqs: Requests, engine: Engine,
           targets: Targets, cache: dict | None = None) -> Loaded | None:
    """The fewest replicas of ``shape`` (instance plan, steady tokens/s) that meet ``targets`` on ``reqs``, within
    the cluster's GPUs; None if even the most do not, or if one request alone on an idle instance already misses
    them (bound.py: no replica count can help); ``cache``: instances and results already built (run.py)."""
    one, steady = shape
    cache = {} if cache is None else cache
    most = cluster.num_gpus // one.instance_gpus
    if not idle_bound(model, cluster, one, reqs, engine, targets, cache):
        return None
    if reqs.concurrency or not float(reqs.arrival[-1]) > 0:  # a closed loop, or every request at once
        low = 1
    else:
        rate = len(reqs) / max(float(reqs.arrival[-1]), 1e-9)
        # the steady state's capacity bounds the replicas from below, less the 8 % by which a simulated instance can
        # out-serve it (tests/test_serve_load.py's steady-state limit)
        low = max(1, math.ceil(rate * float(reqs.output_len.mean()) / max(steady, 1e-9) / 1.08))
    if low > most:
        return None
    tried: dict[int, Loaded] = {}

    def at(n: int) -> Loaded:
        if n not in tried:
            tried[n] = _simulate(model, cluster, one.with_(replicas=n), reqs, engine, targets, cache)
        return tried[n]

    high = low
    while not at(high).meets:
        if high == most:
            return None
        high = min(2 * high, most)
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if at(mid).meets else (mid + 1, high)
    return at(high)


def fewest_split(model: ModelSpec, cluster: Cluster, one: ServePlan, reqs: Requests, engine: Engine,
                 targets: Targets, upto: int, cache: dict | None = None) -> Loaded | None:
    """The fewest instances of shape ``one``, up to ``upto``, split into prefill and decode pools (disagg.py) that
    meet ``targets``: each count from 2 up, each split of it, at most SPLIT_TRIES simulations; of the splits that
    meet them at the least count, the one of the highest goodput."""
    if reqs.concurrency:  # a closed loop through two pools is not simulated (disagg.disaggregated)
        return None
    cache = {} if cache is None else cache
    if not idle_bound(model, cluster, one, reqs, engine, targets, cache):
        return None
    tries = 0
    for n in range(2, min(upto, cluster.num_gpus // one.instance_gpus) + 1):
        met = []
        for p in range(1, n):
            if tries == SPLIT_TRIES:
                return None
            tries += 1
            x = _simulate(model, cluster, one.with_(replicas=n - p, prefill_replicas=p), reqs, engine, targets, cache)
            if x.meets:
                met.append(x)
        if met:
            return max(met, key=lambda x: x.result.goodput)
    return None


def _with_splits(model, cluster, space, reqs, targets, shapes_found, cache) -> list[Loaded]:
    """For the first SPLIT_SHAPES shapes (when the space allows pools), the fewest split deployment with fewer
    instances than the co-located one found (or any, where none was)."""
    out: list[Loaded] = []
    if not space.disaggregate:
        return out
    for one, found in shapes_found[:SPLIT_SHAPES]:
        upto = found.plan.replicas - 1 if found is not None and found.meets else cluster.num_gpus
        split = fewest_split(model, cluster, one, reqs, space.engine, targets, upto, cache)
        if split is not None:
            out.append(split)
    return out


def _simplicity(x: Loaded) -> tuple:
    return (x.plan.num_gpus, x.plan.disaggregated, x.plan.tp * x.plan.pp * x.plan.dpa, x.plan.quant.weight_bytes < 2,
            x.plan.batch)


def recommend(model: ModelSpec, cluster: Cluster, space: ServeSpace, reqs: Requests, targets: Targets,
              count: int = 8) -> list[Loaded]:
    """Each shape's fewest-GPU deployment that meets the targets, co-located or split into pools (``fewest_split``
    for the first shapes), fewest GPUs first (ties by goodput per GPU within the band, then simplicity)."""
    shapes = _primed(model, cluster, space, reqs, count)
    cache: dict = {}
    pairs = [(s[0], fewest(model, cluster, s, reqs, space.engine, targets, cache)) for s in shapes]
    found = [f for _, f in pairs if f is not None] + _with_splits(model, cluster, space, reqs, targets, pairs, cache)
    return sorted(found, key=lambda x: (x.plan.num_gpus, -round(x.result.goodput / x.plan.num_gpus / _unit(found)),
                                        _simplicity(x)))


def rank(model: ModelSpec, cluster: Cluster, space: ServeSpace, reqs: Requests, targets: Targets,
         count: int = 8) -> list[Loaded]:
    """Each shape at the fewest replicas meeting the targets (else the most the GPUs hold), those meeting them
    first, by goodput per GPU (ties within the band by simplicity)."""
    out: list[Loaded] = []
    pairs: list[tuple[ServePlan, Loaded | None]] = []
    cache: dict = {}
    for s in _primed(model, cluster, space, reqs, count):
        found = fewest(model, cluster, s, reqs, space.engine, targets, cache)
        pairs.append((s[0], found))
        out.append(found or _simulate(model, cluster, s[0].with_(replicas=cluster.num_gpus // s[0].instance_gpus),
                                      reqs, space.engine, targets, cache))
    out += _with_splits(model, cluster, space, reqs, targets, pairs, cache)
    unit = _unit(out)
    return sorted(out, key=lambda x: (not x.meets, -round(x.result.goodput / x.plan.num_gpus / unit),
                                      _simplicity(x)))


def _primed(model: ModelSpec, cluster: Cluster, space: ServeSpace, reqs: Requests, count: int
            ) -> list[tuple[ServePlan, float]]:
    """``load_shapes``, their price grids priced together (prices.prime): every shape's is read, by the idle bound
    or the simulation."""
    shapes = load_shapes(model, cluster, space, count)
    if len(reqs):
        prime(model, cluster, [one for one, _ in shapes], space.engine, int((reqs.input_len + reqs.output_len).max()),
              float(reqs.input_len[0]))
    return shapes


def _unit(found: list[Loaded]) -> float:
    """The tie band's width in goodput per GPU: 5 % of the best."""
    best = max((x.result.goodput / x.plan.num_gpus for x in found), default=0.0)
    return max(best * TIE_BAND, 1e-12)
