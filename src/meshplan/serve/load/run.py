"""``load_run(model, cluster, plan, requests, engine) -> LoadResult``: one serving configuration under a load: the
requests shared round-robin among its replicas, each replica's instance simulated (simulate.py) on its scheduler
(scheduler.py) and serve's iteration prices (prices.py), or through prefill and decode pools (disagg.py), the
figures taken over all of them (summary.py)."""

from __future__ import annotations

from meshplan.errors import SpecError
from meshplan.serve import check
from meshplan.serve.engine import DEFAULT as DEFAULT_ENGINE
from meshplan.serve.engine import Engine
from meshplan.serve.estimate import plan_columns
from meshplan.serve.load.arrivals import Requests
from meshplan.serve.load.disagg import disaggregated, transfer_times
from meshplan.serve.load.prices import prices
from meshplan.serve.load.scheduler import scheduler
from meshplan.serve.load.simulate import simulate_instance
from meshplan.serve.load.speculation import Speculation, speculative_prices
from meshplan.serve.load.summary import LoadResult, summarise
from meshplan.serve.plan import ServePlan
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec


def load_run(model: ModelSpec, cluster: Cluster, plan: ServePlan, requests: Requests,
             engine: Engine = DEFAULT_ENGINE, slo: tuple[float, float] = (0.0, 0.0), prefix_hit: float = 0.0,
             spec: Speculation | None = None) -> LoadResult:
    """The figures of ``plan`` serving ``requests`` (module docstring); ``slo``: the TTFT and TPOT targets of the
    goodput (0: none); ``spec``: speculative decoding (speculation.py)."""
    check.servable(model)
    if not len(requests):
        raise SpecError("requests: no request to simulate")
    broken = check.first_problem(check.structural(model, cluster, plan_columns(plan), plan.quant, engine))
    if broken:
        raise SpecError(f"{plan.describe()}: {broken}")
    sched = scheduler(model, cluster, plan, engine, prefix_hit, spec)
    if sched.kv_tokens <= 0:
        raise SpecError(f"{check.MEMORY}: no KV cache is left for {plan.describe()}")
    longest = int((requests.input_len + requests.output_len).max())
    price = (prices(model, cluster, plan, engine, longest) if spec is None
             else speculative_prices(model, cluster, plan, engine, longest, spec))
    if plan.disaggregated:
        moved = transfer_times(model, cluster, plan, engine, requests.input_len)
        return summarise(disaggregated(requests, plan, sched, price, moved), *slo)
    runs = [simulate_instance(requests.share(k, plan.replicas), sched, price) for k in range(plan.replicas)]
    return summarise([r for r in runs if len(r.arrival)], *slo)
