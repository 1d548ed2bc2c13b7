"""A simulated load's figures, as vLLM's benchmark_serving reports them (benchmarks/serve.py calculate_metrics):
TTFT (arrival to first token), TPOT ((E2E − TTFT) / (O − 1), requests of more than one token), ITL (every gap
between two tokens of a request, all requests' gaps pooled: simulate.py's gaps, each weighted by the sequences that
waited it), E2E latency, each at p50 / p90 / p95 / p99 and their mean; request and output-token throughput over the
run (first arrival to last finish); goodput (DistServe, Zhong et al. 2024, §2.2: the requests per second that meet
every latency target, benchmark_serving's ``--goodput``); preemptions; the KV cache's highest occupancy and its
occupancy over time (the first replica's); Little's law's two sides (mean requests in the system, and throughput ×
mean time in it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from meshplan.serve.load.simulate import Run

PERCENTILES = (50, 90, 95, 99)
GAP_POINTS = 8  # points a run of decode iterations' gaps is spread over (they grow linearly with the context)


@dataclass(frozen=True)
class LoadResult:
    """Latency percentiles (seconds), rates (per second) and counts of a simulated load over every replica."""

    ttft: dict[int, float]
    tpot: dict[int, float]
    e2e: dict[int, float]
    itl: dict[int, float]
    mean: dict[str, float]
    requests_per_s: float
    output_tokens_per_s: float
    goodput: float  # requests/s meeting the targets
    completed: int
    preemptions: int
    refused: int
    duration_s: float
    in_system: float  # time-average of requests in the system (Little's L)
    little: float  # throughput × mean time in the system (Little's λW)
    kv_peak: float  # highest KV-cache occupancy (share of capacity)
    timeline: dict[str, list[float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The figures by name; a latency no request gave (none completed) is None."""
        out: dict[str, Any] = {f"{name}_p{p}_s": _finite(getattr(self, name)[p]) for name in ("ttft", "tpot", "e2e")
                               for p in PERCENTILES}
        out |= {f"{k}_mean_s": _finite(v) for k, v in self.mean.items()}
        return out | {"requests_per_s": self.requests_per_s, "output_tokens_per_s": self.output_tokens_per_s,
                      "goodput_requests_per_s": self.goodput, "completed": self.completed,
                      "preemptions": self.preemptions, "refused": self.refused, "duration_s": self.duration_s,
                      "mean_in_system": self.in_system, "kv_peak": self.kv_peak, "kv_timeline": self.timeline}


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None


def _percentiles(values: np.ndarray) -> dict[int, float]:
    if not len(values):
        return dict.fromkeys(PERCENTILES, float("nan"))
    ordered = np.sort(values)
    return {p: sorted_percentile(ordered, p) for p in PERCENTILES}


def percentile(values: np.ndarray, p: float) -> float:
    """``float(np.percentile(values, p))`` of a non-empty array (``sorted_percentile``)."""
    return sorted_percentile(np.sort(values), p)


def sorted_percentile(ordered: np.ndarray, p: float) -> float:
    """``float(np.percentile(x, p))`` for ``ordered`` = np.sort(x), x not empty, bit for bit: NumPy's default method
    ("linear", Hyndman and Fan's 7th) in its own arithmetic (numpy 2.x lib/_function_base_impl.py ``_quantile``,
    ``_get_indexes``, ``_lerp``): the virtual index (n − 1)·p/100, the values at its floor and the next (the last
    past the end), γ its fraction, a + (b − a)·γ, or b − (b − a)·(1 − γ) where γ ≥ 0.5; NaN where any value is (a
    sort puts NaN last). One sort for every percentile, and np.percentile's import of numpy.ma (its np.unique) left
    out of start-up."""
    n = len(ordered)
    virtual = (n - 1) * (p / 100)
    below = math.floor(virtual)
    lo, hi = (ordered[-1], ordered[-1]) if virtual >= n - 1 else (ordered[below], ordered[below + 1])
    if ordered[-1] != ordered[-1]:  # NaN
        return float("nan")
    gamma = virtual - below
    diff = hi - lo
    return float(hi - diff * (1 - gamma) if gamma >= 0.5 else lo + diff * gamma)


def _weighted(gaps: list[tuple[float, float, int, float]]) -> tuple[dict[int, float], float]:
    """Percentiles and mean of the pooled inter-token gaps: ``count`` gaps evenly from first to last, each of
    ``weight`` sequences (simulate.Run), a run of many spread over GAP_POINTS points."""
    if not gaps:
        return dict.fromkeys(PERCENTILES, float("nan")), float("nan")
    g = np.fromiter(chain.from_iterable(gaps), dtype=float, count=4 * len(gaps)).reshape(-1, 4)  # np.asarray's
    k = np.minimum(g[:, 2], GAP_POINTS)
    at = np.repeat(np.arange(len(g)), k.astype(int))
    step = np.arange(len(at)) - np.repeat(np.cumsum(k) - k, k.astype(int))  # 0 … k − 1 within each row
    frac = np.where(k[at] > 1, step / np.maximum(k[at] - 1, 1), 0.0)
    values = g[at, 0] + frac * (np.where(g[at, 2] > 1, g[at, 1], g[at, 0]) - g[at, 0])
    weights = g[at, 3] * g[at, 2] / k[at]
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(weights[order])
    pick = {p: float(values[min(np.searchsorted(cum, p / 100 * cum[-1]), len(values) - 1)]) for p in PERCENTILES}
    return pick, float(np.sum(values * weights[order]) / cum[-1])


def summarise(runs: list[Run], ttft_slo: float = 0.0, tpot_slo: float = 0.0) -> LoadResult:
    """The figures of ``runs`` (one per replica) together; a target of 0 is none (goodput counts each request
    against the targets)."""
    arrival = np.concatenate([r.arrival for r in runs])
    first = np.concatenate([r.first for r in runs])
    done = np.concatenate([r.done for r in runs])
    out = np.concatenate([np.asarray(r.output_len, dtype=float) for r in runs])
    ok = np.isfinite(done)
    ttft, e2e = (first - arrival)[ok], (done - arrival)[ok]
    many = ok & (out > 1)
    tpot = ((done - first) / np.maximum(out - 1, 1))[many]
    span = float(np.max(done[ok]) - np.min(arrival)) if ok.any() else 0.0
    good = np.ones(len(ttft), dtype=bool)
    if ttft_slo:
        good &= ttft <= ttft_slo
    if tpot_slo:
        good &= np.where(out[ok] > 1, (done - first)[ok] / np.maximum(out[ok] - 1, 1), 0.0) <= tpot_slo
    rate = ok.sum() / span if span else 0.0
    itl, itl_mean = _weighted([gap for r in runs for gap in r.gaps])
    return LoadResult(
        ttft=_percentiles(ttft), tpot=_percentiles(tpot), e2e=_percentiles(e2e), itl=itl,
        mean={k: float(np.mean(v)) if len(v) else float("nan") for k, v in (("ttft", ttft), ("tpot", tpot),
                                                                              ("e2e", e2e))} | {"itl": itl_mean},
        requests_per_s=float(rate), output_tokens_per_s=float(out[ok].sum() / span) if span else 0.0,
        goodput=float(good.sum() / span) if span else 0.0, completed=int(ok.sum()),
        preemptions=sum(r.preemptions for r in runs), refused=sum(r.refused for r in runs), duration_s=span,
        in_system=sum((r.timeline.mean_in_system(span) + (r.lag / span if span else 0.0)) if r.held_s is None
                      else (r.held_s / span if span else 0.0) for r in runs),
        little=float(rate * np.mean(e2e)) if len(e2e) else 0.0,
        kv_peak=max((r.kv_peak for r in runs), default=0.0),
        timeline=runs[0].timeline.sampled() if runs else {})
