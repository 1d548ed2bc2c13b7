"""The response lengths of one iteration's rollouts: ``RLJob.generated`` draws from the job's distribution, seeded, so
one job always gets the same lengths.

- ``fixed``: every response ``output_len`` tokens (the systems papers' setting: generation to the limit, as
  HybridFlow and ReaL time it; no tail).
- ``uniform``: uniform on [(1 − r)·mean, (1 + r)·mean] (vLLM's ``--random-range-ratio``, serve/load/lengths.py),
  capped at ``output_len``; r = ``length_spread``, default 0.5.
- ``lognormal``: a log-normal capped at ``output_len`` (responses that reach the cap are truncated there, as RL
  frameworks truncate at max_response_length), its σ = ``length_spread`` (default serve/load/lengths.SPREAD, 0.9, the
  assumption the load simulator makes for chat lengths: published RL runs state a mean and a cap, not a histogram)
  and its μ chosen so that the capped mean is ``mean_output``: E[min(X, c)] = e^(μ+σ²/2)·Φ((ln c − μ − σ²)/σ) +
  c·(1 − Φ((ln c − μ)/σ)), solved by bisection (monotone in μ). The long tail is what sets a synchronous rollout's
  pace: the longest response of the batch ends the phase.
- ``empirical``: ``output_len`` values from a CSV / JSONL file (serve/load/lengths.read_columns), drawn with
  replacement, capped at the job's ``output_len``.
"""

from __future__ import annotations

import math

import numpy as np

from meshplan.rl.job import RLJob
from meshplan.serve.load.lengths import SPREAD, Lengths, read_columns

UNIFORM_RATIO = 0.5  # the uniform kind's default range ratio (serve's parse_lengths default)


def response_lengths(job: RLJob) -> np.ndarray:
    """The ``job.generated`` response lengths of one iteration (module docstring), integers in 1 … output_len."""
    n, cap = job.generated, job.output_len
    rng = np.random.default_rng(job.seed)
    if job.lengths == "fixed":
        return np.full(n, cap, dtype=np.int64)
    if job.lengths == "uniform":
        ratio = job.length_spread or UNIFORM_RATIO
        drawn = Lengths("uniform", 1, round(job.mean_response), min(ratio, 0.999)).sample(n, rng)[1]
    elif job.lengths == "lognormal":
        sigma = job.length_spread or SPREAD
        mu = capped_mu(job.mean_response, cap, sigma)
        drawn = np.rint(rng.lognormal(mu, sigma, n))
    else:
        (values,) = read_columns(job.lengths_file, "lengths", ("output_len",))
        drawn = np.asarray(values)[rng.integers(0, len(values), n)]
    return np.clip(np.asarray(drawn, dtype=np.int64), 1, cap)


def capped_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X log-normal(μ, σ) (module docstring)."""
    z = (math.log(cap) - mu) / sigma
    return math.exp(mu + sigma**2 / 2) * _phi(z - sigma) + cap * (1 - _phi(z))


def capped_mu(mean: float, cap: float, sigma: float) -> float:
    """The μ whose capped log-normal has mean ``mean`` (bisection on the monotone ``capped_mean``); a mean at the cap
    puts μ far above it (every response truncated)."""
    if mean >= cap:
        return math.log(cap) + 20 * sigma
    low, high = math.log(max(mean, 1.0)) - 20 * sigma, math.log(cap) + 20 * sigma
    for _ in range(100):
        mid = (low + high) / 2
        if capped_mean(mid, sigma, cap) < mean:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _phi(x: float) -> float:
    """The standard normal CDF."""
    return 0.5 * math.erfc(-x / math.sqrt(2))
