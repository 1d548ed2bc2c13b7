"""Disaggregated prefill and decode pools under a load (DistServe, Zhong et al. 2024, §3; Splitwise, Patel et al.
2024, §4): ``prefill_replicas`` instances run the prompts, each request's KV cache then crosses to a decode instance
(metrics.kv_transfer: a point-to-point send over the tier between neighbouring instances), which decodes the rest.

Each pool is simulated as serve's co-located instance is (simulate.py), on its own scheduler: a prefill instance's
requests end at their first token (one output token: the prefill samples it); a decode instance's requests arrive
when their KV cache has landed, hold their prompt's pages from the start (Scheduler.kv_received: every token but the
last is cached) and make the other O − 1 tokens. Requests go round-robin to the prefill instances, then in the same
order to the decode instances. TTFT ends at the prefill's first token, E2E at the decode's last; the KV timeline is
the first decode instance's.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from meshplan.errors import SpecError
from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.engine import Engine
from meshplan.serve.estimate import plan_columns
from meshplan.serve.load.arrivals import Requests
from meshplan.serve.load.prices import Prices
from meshplan.serve.load.scheduler import Scheduler
from meshplan.serve.load.simulate import Run, simulate_instance
from meshplan.serve.load.speculation import SpeculativePrices
from meshplan.serve.metrics import Setting, kv_transfer
from meshplan.serve.plan import ServePlan, Workload
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec


def transfer_times(model: ModelSpec, cluster: Cluster, plan: ServePlan, engine: Engine,
                   input_len: np.ndarray) -> np.ndarray:
    """Each request's KV-cache transfer (metrics.kv_transfer at its prompt length; one price per distinct length)."""
    cols = plan_columns(plan.with_(replicas=1, prefill_replicas=0))
    seconds = {int(n): float(kv_transfer(Setting(model, cluster, cols, plan.quant, engine,
                                                 Workload(input_len=int(n), output_len=1), SERVE_DEFAULT)))
               for n in sorted(set(input_len.tolist()))}  # (np.unique would import numpy.ma: start-up)
    return np.array([seconds[int(n)] for n in input_len])


def disaggregated(requests: Requests, plan: ServePlan, sched: Scheduler, price: Prices | SpeculativePrices,
                  moved: np.ndarray) -> list[Run]:
    """The requests through both pools (module docstring): one Run per request stream, with the prefill pool's
    first tokens and the decode pool's finishes; ``moved``: each request's transfer seconds. A closed loop (a client
    sends its next request when the last one is done) is not simulated across two pools: refused."""
    if requests.concurrency:
        raise SpecError(f"concurrency={requests.concurrency}: a closed loop through prefill and decode pools is not "
                        "simulated; give --rate or --trace for a disaggregated configuration")
    pre = Requests(requests.arrival, requests.input_len, np.ones_like(requests.output_len))
    first = np.full(len(requests), np.nan)
    prefilled = [simulate_instance(pre.share(k, plan.prefill_replicas), sched, price)
                 for k in range(plan.prefill_replicas)]
    for k, run in enumerate(prefilled):
        first[k::plan.prefill_replicas] = run.done
    done = first.copy()
    rest = requests.output_len > 1
    ready = first + moved
    decode_sched = replace(sched, kv_received=True, last_token_decoded=False)
    decoded: list[Run] = []
    order = np.flatnonzero(rest & np.isfinite(first))
    order = order[np.argsort(ready[order], kind="stable")]
    for k in range(plan.replicas):
        mine = order[k::plan.replicas]
        if not len(mine):
            continue
        reqs = Requests(ready[mine], requests.input_len[mine] + 1, requests.output_len[mine] - 1)
        run = simulate_instance(reqs, decode_sched, price)
        done[mine] = run.done
        decoded.append(run)
    timeline = decoded[0].timeline if decoded else prefilled[0].timeline
    finished = np.isfinite(done)
    # requests are in the system from arrival to finish across both pools and the transfer between them: counted
    # from their own times (the one timeline kept is a decode instance's, for the occupancy curve)
    held = float(np.sum(done[finished] - requests.arrival[finished]))
    return [Run(requests.arrival, first, done, requests.input_len, requests.output_len,
                sum(r.preemptions for r in decoded), int(np.sum(~finished)), timeline, held_s=held,
                gaps=[g for r in decoded for g in r.gaps], kv_peak=max((r.kv_peak for r in decoded), default=0.0))]
