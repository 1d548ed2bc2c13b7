"""``load_run(model, cluster, plan, requests, engine) -> LoadResult``: one serving configuration under a load: the
requests shared round-robin among its replicas, each replica's instance simulated (simulate.py) on its scheduler
(scheduler.py) and serve's iteration prices (prices.py), or through prefill and decode pools (disagg.py), the
figures taken over all of them (summary.py). ``load_run_with`` takes the user's choices as one record and a cache of
instances, so that a search pricing one instance shape at several replica counts builds its price grid once.
``repeated``: a published run of N requests offered at a rate, redrawn over seeds (the validation's and
benchmarks/measure/serve_load_published.py's one recipe)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshplan.errors import SpecError
from meshplan.serve import check
from meshplan.serve.efficiency import SERVE_DEFAULT, ServeEfficiency
from meshplan.serve.engine import DEFAULT as DEFAULT_ENGINE
from meshplan.serve.engine import Engine
from meshplan.serve.estimate import plan_columns
from meshplan.serve.load.arrivals import Requests, poisson
from meshplan.serve.load.disagg import disaggregated, transfer_times
from meshplan.serve.load.lengths import Lengths
from meshplan.serve.load.prices import Prices, prices
from meshplan.serve.load.scheduler import Scheduler, scheduler
from meshplan.serve.load.simulate import simulate_instance
from meshplan.serve.load.speculation import Speculation, SpeculativePrices, speculative_prices
from meshplan.serve.load.summary import LoadResult, summarise
from meshplan.serve.plan import ServePlan
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec


@dataclass(frozen=True)
class Choices:
    """What the user chose for every plan under the load: the prefix-cache hit share, speculative decoding (None:
    none) and the scheduler preset (None: the engine's, policy.policy_for)."""

    prefix_hit: float = 0.0
    speculation: Speculation | None = None
    scheduler: str | None = None


DEFAULT_CHOICES = Choices()
LoadInstance = tuple[Scheduler, Prices | SpeculativePrices]


def load_instance(model: ModelSpec, cluster: Cluster, plan: ServePlan, engine: Engine, longest: int,
                  choices: Choices = DEFAULT_CHOICES, eff: ServeEfficiency = SERVE_DEFAULT) -> LoadInstance:
    """One instance's scheduler and iteration prices (contexts up to ``longest`` tokens; ``eff``: the serving
    efficiencies, the validation's trial values where it refits them; a speculative engine's prices keep the
    defaults)."""
    check.servable(model)
    broken = check.first_problem(check.structural(model, cluster, plan_columns(plan), plan.quant, engine))
    if broken:
        raise SpecError(f"{plan.describe()}: {broken}")
    spec = choices.speculation
    sched = scheduler(model, cluster, plan, engine, choices.prefix_hit, spec, choices.scheduler)
    if sched.kv_tokens <= 0:
        raise SpecError(f"{check.MEMORY}: no KV cache is left for {plan.describe()}")
    price = (prices(model, cluster, plan, engine, longest, eff) if spec is None
             else speculative_prices(model, cluster, plan, engine, longest, spec))
    return sched, price


def load_run_with(model: ModelSpec, cluster: Cluster, plan: ServePlan, requests: Requests, engine: Engine,
                  slo: tuple[float, float], choices: Choices, cache: dict | None = None) -> LoadResult:
    """``load_run`` with ``choices`` (module docstring); ``cache``: instances by shape, filled as they are built."""
    if not len(requests):
        raise SpecError("requests: no request to simulate")
    longest = int((requests.input_len + requests.output_len).max())
    key = (plan.with_(replicas=1, prefill_replicas=0), longest)
    if cache is None or key not in cache:
        built = load_instance(model, cluster, plan, engine, longest, choices)
        if cache is None:
            cache = {}
        cache[key] = built
    sched, price = cache[key]
    if plan.disaggregated:
        moved = transfer_times(model, cluster, plan, engine, requests.input_len)
        return summarise(disaggregated(requests, plan, sched, price, moved), *slo)
    runs = [simulate_instance(requests.share(k, plan.replicas), sched, price) for k in range(plan.replicas)]
    return summarise([r for r in runs if len(r.arrival)], *slo)


def load_run(model: ModelSpec, cluster: Cluster, plan: ServePlan, requests: Requests,
             engine: Engine = DEFAULT_ENGINE, slo: tuple[float, float] = (0.0, 0.0), prefix_hit: float = 0.0,
             spec: Speculation | None = None) -> LoadResult:
    """The figures of ``plan`` serving ``requests`` (module docstring); ``slo``: the TTFT and TPOT targets of the
    goodput (0: none); ``spec``: speculative decoding (speculation.py)."""
    return load_run_with(model, cluster, plan, requests, engine, slo, Choices(prefix_hit, spec))


@dataclass(frozen=True)
class Repeated:
    """One load's figures, each the mean over its seeds' draws: mean TTFT, ITL, TPOT and E2E (s), request and output
    token throughput, and the batch it held (the time-average of its running requests from its first arrival to its
    last finish: fill and drain included, Little's L of the running ones)."""

    mean: dict[str, float]
    requests_per_s: float
    output_tokens_per_s: float
    batch: float


def repeated(built: LoadInstance, rate: float, count: int, lengths: Lengths, seeds: Sequence[int]) -> Repeated:
    """``count`` requests at ``rate`` per second (arrivals.poisson; an infinite rate sends them all at once) through
    the instance ``built`` (load_instance), once per seed of ``seeds``, the figures' mean over them (one draw's mean
    gap strays by 1/sqrt(count) from 1/rate: 4.5 % for 500 requests)."""
    sched, price = built
    results = []
    for seed in seeds:
        run = simulate_instance(poisson(rate, count, lengths, seed), sched, price)
        result = summarise([run])
        c = run.timeline.columns()
        held = float(np.sum(c["running"] * c["length_s"])) / result.duration_s if result.duration_s else 0.0
        results.append((result, held))
    return Repeated(mean={k: float(np.mean([r.mean[k] for r, _ in results])) for k in ("ttft", "itl", "tpot", "e2e")},
                    requests_per_s=float(np.mean([r.requests_per_s for r, _ in results])),
                    output_tokens_per_s=float(np.mean([r.output_tokens_per_s for r, _ in results])),
                    batch=float(np.mean([h for _, h in results])))
