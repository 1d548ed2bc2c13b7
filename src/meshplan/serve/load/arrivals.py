"""Requests: when each arrives, with how many prompt and output tokens.

- ``poisson``: an open loop at ``rate`` requests/s, exponential gaps (vLLM benchmark_serving's ``--request-rate``
  with burstiness 1: "the request arrival time follows a Poisson process"), or a gamma process of that rate with
  shape ``burstiness`` (its ``--burstiness``: below 1 burstier, above 1 more regular).
- ``closed``: ``concurrency`` clients, each sending its next request when the last one finishes (benchmark_serving's
  ``--max-concurrency`` with every request ready at once); arrival times come from the simulation.
- ``trace``: a file of arrival time (s), input and output tokens per request (CSV columns or JSONL keys
  ``arrival_s``, ``input_len``, ``output_len``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.errors import SpecError
from meshplan.serve.load.lengths import Lengths, read_columns


@dataclass(frozen=True)
class Requests:
    """Requests in arrival order: arrival times (s; for a closed loop, ignored), prompt and output tokens, and the
    closed loop's concurrency (0: an open loop)."""

    arrival: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    concurrency: int = 0

    def __len__(self) -> int:
        return len(self.input_len)

    def share(self, k: int, n: int) -> Requests:
        """Replica ``k`` of ``n``'s requests: every n-th from the k-th (a round-robin router), and its share of a
        closed loop's clients; a closed loop of fewer clients than replicas keeps one client on each of the first
        ``concurrency`` replicas and sends the others nothing (a replica without a client gets no request: it is not
        an open loop with every request at t = 0)."""
        if not self.concurrency:
            return Requests(self.arrival[k::n], self.input_len[k::n], self.output_len[k::n])
        busy = min(n, self.concurrency)  # replicas that hold a client
        if k >= busy:
            return Requests(self.arrival[:0], self.input_len[:0], self.output_len[:0], 0)
        clients = self.concurrency // busy + (k < self.concurrency % busy)
        return Requests(self.arrival[k::busy], self.input_len[k::busy], self.output_len[k::busy], clients)


def poisson(rate: float, count: int, lengths: Lengths, seed: int = 0, burstiness: float = 1.0) -> Requests:
    """``count`` requests at ``rate`` per second on average (module docstring); an infinite rate sends every request
    at once (benchmark_serving's ``--request-rate inf``, a burst)."""
    if not rate > 0:
        raise SpecError(f"rate={rate} must be above 0 requests/s")
    rng = np.random.default_rng(seed)
    if rate == np.inf:
        inp, out = lengths.sample(count, rng)
        return Requests(np.zeros(count), inp, out)
    gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), count)  # mean 1/rate, shape = burstiness
    inp, out = lengths.sample(count, rng)
    return Requests(np.cumsum(gaps) - gaps[0], inp, out)


def closed(concurrency: int, count: int, lengths: Lengths, seed: int = 0) -> Requests:
    """``count`` requests sent by ``concurrency`` clients (module docstring)."""
    if concurrency < 1:
        raise SpecError(f"concurrency={concurrency} must be at least 1")
    inp, out = lengths.sample(count, np.random.default_rng(seed))
    return Requests(np.zeros(count), inp, out, concurrency)


def trace(path: str) -> Requests:
    """A trace file's requests, sorted by arrival (module docstring)."""
    arrival, inp, out = read_columns(path, "trace", ("arrival_s", "input_len", "output_len"))
    order = np.argsort(np.asarray(arrival), kind="stable")
    t = np.asarray(arrival, dtype=float)[order]
    return Requests(t - t[0], np.asarray(inp)[order], np.asarray(out)[order])
