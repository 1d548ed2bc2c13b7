"""Latency against load for one configuration: the same requests (one seed, so each level's arrivals are the
last's scaled in time: a property test's coupling) offered at a range of request rates, or of concurrencies, each
simulated (run.py), its p50 and the target percentile of TTFT and TPOT kept: the serving report's latency-vs-rate
curve."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from meshplan.serve.engine import Engine
from meshplan.serve.load.arrivals import Requests
from meshplan.serve.load.run import DEFAULT_CHOICES, Choices, load_run_with
from meshplan.serve.plan import ServePlan
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec

LEVELS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)  # multiples of the load asked for


def at_level(reqs: Requests, factor: float) -> Requests:
    """``reqs`` at ``factor`` times their load: arrivals 1/factor as far apart, or factor times the clients."""
    if reqs.concurrency:
        return replace(reqs, concurrency=max(1, round(reqs.concurrency * factor)))
    return replace(reqs, arrival=reqs.arrival / factor)


def load_sweep(model: ModelSpec, cluster: Cluster, plan: ServePlan, reqs: Requests, engine: Engine,
               percentile: int = 99, choices: Choices = DEFAULT_CHOICES) -> list[dict[str, Any]]:
    """One row per level of LEVELS: the offered load (requests/s or clients), TTFT and TPOT at p50 and
    ``percentile`` (seconds), output tokens/s and preemptions; ``choices``: prefix hits, speculative decoding and
    the scheduler (run.Choices)."""
    rows: list[dict[str, Any]] = []
    cache: dict = {}  # one instance's price grid for every level
    span = float(reqs.arrival[-1]) if len(reqs) > 1 else 0.0
    for factor in LEVELS:
        level = at_level(reqs, factor)
        r = load_run_with(model, cluster, plan, level, engine, (0.0, 0.0), choices, cache)
        offered = float(level.concurrency) if reqs.concurrency else (len(reqs) - 1) / max(span / factor, 1e-12)
        rows.append({"load": offered, "ttft_p50": r.ttft[50], "ttft_p": r.ttft[percentile], "tpot_p50": r.tpot[50],
                     "tpot_p": r.tpot[percentile], "tokens_per_s": r.output_tokens_per_s,
                     "preemptions": r.preemptions, "percentile": percentile})
    return [row for row in rows if np.isfinite(row["ttft_p50"])]
