"""An analytic bound that prunes the search under a load (under_load.py) before any simulation: a request can go no
faster than alone on an idle instance, whatever the replica count.

Alone, request r's first token comes after its prompt's prefill, ⌈P/budget⌉ iterations of at most the budget
(TurboMind: and one decode step), and its later tokens after one decode step each at its own growing context, at
least the step at its first context (the price grows with the context). Under the load every iteration it waits
for carries at least its own work (the price is monotone in decodes, prompt tokens and context: the roofline's and
the host's costs only add), so each request's TTFT and TPOT are at least these, and so is every percentile over
the requests (a percentile of a vector that is larger term by term is larger). A shape whose idle percentile
misses a target cannot meet it with any number of replicas; it is not simulated.

Saturation: no iteration makes more than ``max_seqs`` tokens (E each with speculative decoding), and one of d
decodes lasts at least price(d, 0, c) at the shortest context c a request decodes at, so an instance's output rate
is at most max over d of d·E / price(d, 0, c) whatever the load (``saturation``).
"""

from __future__ import annotations

import math

import numpy as np

from meshplan.serve.engine import Engine
from meshplan.serve.load.arrivals import Requests
from meshplan.serve.load.run import load_instance
from meshplan.serve.load.summary import percentile
from meshplan.serve.plan import ServePlan
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec


def idle_latency(model: ModelSpec, cluster: Cluster, one: ServePlan, reqs: Requests, engine: Engine, targets,
                 cache: dict, need: tuple[bool, bool] = (True, True)) -> tuple[np.ndarray, np.ndarray]:
    """Each request's TTFT and TPOT alone on an idle instance of ``one`` (module docstring; at most one price per
    distinct prompt or context); ``need``: whether each is wanted (an unwanted one is empty: a TTFT reads the
    prompt-only prices of every prompt length, which may price a whole axis of them, prices.Lone)."""
    longest = int((reqs.input_len + reqs.output_len).max())
    key = (one.with_(replicas=1, prefill_replicas=0), longest)
    if key not in cache:
        cache[key] = load_instance(model, cluster, one, engine, longest, targets.choices)
    sched, price = cache[key]
    first: dict[int, float] = {}
    for prompt in sorted(set(reqs.input_len.tolist())) if need[0] else ():  # (np.unique would import numpy.ma)
        p = int(prompt) - (1 if sched.last_token_decoded else 0)
        fresh = max(p - sched.cached(p), 0)
        chunks = max(math.ceil(fresh / sched.budget), 1)
        t = chunks * price(0, min(fresh, sched.budget), 0.0)
        first[int(prompt)] = t + (price(1, 0, float(prompt)) if sched.last_token_decoded else 0.0)
    prompts = [int(p) for p in reqs.input_len.tolist()]  # (plain numbers: NumPy's own are slow to iterate)
    ttft = np.array([first[p] for p in prompts] if need[0] else [], dtype=float)
    if not need[1]:
        return ttft, np.zeros(0)
    step = {int(c): price(1, 0, float(c)) for c in sorted(set((reqs.input_len + 1).tolist()))}
    tpot = np.array([step[p + 1] for p in prompts]) / sched.step_tokens
    return ttft, tpot[reqs.output_len > 1]


def saturation(sched, price, context: float) -> float:
    """The most output tokens/s an instance can make (module docstring): every decode count up to its max_seqs at
    the shortest context."""
    return max((d * sched.step_tokens / price(float(d), 0.0, context) for d in range(1, sched.max_seqs + 1)),
               default=0.0)


def idle_bound(model: ModelSpec, cluster: Cluster, one: ServePlan, reqs: Requests, engine: Engine, targets,
               cache: dict) -> bool:
    """Whether ``targets`` can be met at their percentile by some replica count of ``one`` (module docstring);
    ``cache``: one search's instances and answers (the same requests and targets throughout)."""
    if not targets.ttft and not targets.tpot:
        return True
    key = ("idle", one.with_(replicas=1, prefill_replicas=0))  # the same requests and targets in one cache (a search)
    if key not in cache:
        ttft, tpot = idle_latency(model, cluster, one, reqs, engine, targets, cache,
                                  (bool(targets.ttft), bool(targets.tpot)))
        p = targets.percentile
        cache[key] = not ((targets.ttft and len(ttft) and percentile(ttft, p) > targets.ttft)
                          or (targets.tpot and len(tpot) and percentile(tpot, p) > targets.tpot))
    return cache[key]
